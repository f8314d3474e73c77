import pytest

from uform.datasets import mine_standard_library_pairs


@pytest.fixture(scope="session")
def standard_library_pairs():
    """The seed-0 mining, done once for the whole session (it parses the stdlib: about 1.5 s)."""
    return mine_standard_library_pairs(seed=0)
