"""Which patches (images) and tubes (video) of an item the masked objective hides.

An item of ``n`` patches has exactly ``k`` masked:

    k = floor(ratio · n + 1/2)       rounded half up (not Python's half-to-even round)
    k = min(max(k, 1), n − 1)        when n ≥ 2: something is hidden and something seen
    k = 0                            when n is 1: a lone patch stays visible

``ratio`` is ``Masking.image_mask_ratio`` for images and ``video_mask_ratio`` for
video (0.75 derived). Which ``k`` is a uniform draw without replacement: the
first ``k`` entries of ``rng.permutation(n)``, where ``rng`` is
:func:`uform.draws.corruption_generator` of ``(seed, step, item)``,
a numpy generator under the key of text corruption's words (an item has one
modality, so no two draws share a key). The draw depends on nothing else, so every device
and host masks an item alike, wherever packing puts it.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ErrorCode, UFormError
from ..draws import corruption_generator


def masked_count(patch_count: int, ratio: float) -> int:
    """``k`` of the module doc: how many of ``patch_count`` patches are masked at ``ratio``."""
    if not 0.0 <= ratio <= 1.0:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"ratio: must lie in [0, 1], got {ratio}")
    if patch_count < 2:
        return 0
    return min(max(math.floor(ratio * patch_count + 0.5), 1), patch_count - 1)


def mask_patches(patch_count: int, ratio: float, seed: int, step: int, item: int) -> np.ndarray:
    """``(patch_count,)`` bool, True where a patch is masked: exactly ``masked_count`` of them, keyed draws."""
    chosen = corruption_generator(seed, step, item).permutation(patch_count)[:masked_count(patch_count, ratio)]
    masked = np.zeros(patch_count, bool)
    masked[chosen] = True
    return masked
