"""The key of an item's random draws at a step: ``[seed, (step << 32) | item]``, ``item`` its index in the step.

Every draw of a step that concerns one item (text corruption's Philox words, ``uform.training.masking``; media
masking's patches, ``uform.media.masking``) is under this key and depends on nothing else, so every device, host
and process draws an item alike, wherever packing puts it. A seed is 64 bits, a step and an item 32.
"""

from __future__ import annotations

import operator

import numpy as np

from .errors import ErrorCode, UFormError

_UINT32_LIMIT = 1 << 32
_UINT64_LIMIT = 1 << 64


def check_key(seed: int, step: int, items: list[int]) -> None:
    """Refuses a seed, step or item index (Python ints) that does not fit the key ``[seed, (step << 32) | item]``."""
    checks = [("seed", operator.index(seed), _UINT64_LIMIT), ("step", operator.index(step), _UINT32_LIMIT)]
    checks += [("item", item, _UINT32_LIMIT) for item in items]
    for name, value, limit in checks:
        if not 0 <= value < limit:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: must lie in [0, {limit}), got {value}")


def item_key(seed: int, step: int, item: int) -> np.ndarray:
    """The Philox key of ``item``'s draws at ``step``: [seed, (step << 32) | item]."""
    check_key(seed, step, [operator.index(item)])
    return np.array([seed, (step << 32) | item], dtype=np.uint64)


def corruption_generator(seed: int, step: int, item: int) -> np.random.Generator:
    """A numpy generator under ``item``'s key at ``step`` (media masking draws its patches from it)."""
    return np.random.Generator(np.random.Philox(key=item_key(seed, step, item)))
