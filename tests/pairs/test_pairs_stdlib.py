"""Pairs mined from the standard library's source: count, bounds, determinism, no duplicates."""

import sys

import pytest

from uform.datasets import MAX_QUERY_BYTES, MIN_QUERY_BYTES, mine_standard_library_pairs, standard_library_files
from uform.pairs import Pair
from uform.datasets.stdlib import _signature, first_sentence


@pytest.fixture
def mined(standard_library_pairs):
    return standard_library_pairs


def test_count_and_bounds(mined):
    print(f"\nmined {len(mined)} pairs on Python {sys.version.split()[0]}")
    assert len(mined) > 2000
    for pair in mined:
        assert isinstance(pair, Pair) and pair.weight == 1.0 and pair.group == 0
        assert MIN_QUERY_BYTES <= len(pair.query.encode("utf-8")) <= MAX_QUERY_BYTES
        assert pair.query == pair.query.strip() and "\n" not in pair.query
        assert pair.document.startswith(("def ", "async def ")) and pair.document.count("(") >= 1


def test_no_duplicates(mined):
    assert len({p.query for p in mined}) == len(mined)
    assert len({p.document for p in mined}) == len(mined)


def test_deterministic_for_a_seed(mined):
    assert mine_standard_library_pairs(limit=300, seed=0) == mined[:300]
    other = mine_standard_library_pairs(seed=1)
    assert set(other) == set(mined) and other != mined


def test_files_skip_tests_private_and_gui_modules():
    files = standard_library_files()
    assert "os.py" in files and "json/__init__.py" in files and files == sorted(files)
    for path in files:
        parts = path.split("/")
        assert not {"test", "tests", "idlelib", "tkinter", "lib2to3", "site-packages", "ensurepip",
                    "turtledemo"} & set(parts), path
        assert not any(p.startswith("_") for p in parts[:-1]), path


def test_limit_is_checked():
    with pytest.raises(ValueError, match="limit"):
        mine_standard_library_pairs(limit=-1)


def test_first_sentence():
    assert first_sentence("Return x, e.g. a list. More text.") == "Return x, e.g. a list."
    assert first_sentence("Compute the thing\n   over two lines.\n\nDetails.") == "Compute the thing over two lines."
    assert first_sentence("Version 1.5 is fine. Next.") == "Version 1.5 is fine."
    assert first_sentence("No full stop here\n\nSecond paragraph.") == "No full stop here"


def test_signature_rebuilds_arguments():
    import ast
    tree = ast.parse(
        "def f(a, /, b=1, *args, c, d=2, **kw) -> int: pass\n"
        "class A:\n"
        " def m(self, x, y=3): pass\n"
        " def n(self=0, x=1): pass\n"
        " @staticmethod\n"
        " def s(x): pass\n"
        " @classmethod\n"
        " async def c(cls, *, k=None): pass\n")
    assert _signature(tree.body[0], None) == "def f(a, /, b=1, *args, c, d=2, **kw) -> int"
    methods = [_signature(node, "A") for node in tree.body[1].body]
    assert methods == ["def A.m(x, y=3)", "def A.n(x=1)", "def A.s(x)", "async def A.c(*, k=None)"]
