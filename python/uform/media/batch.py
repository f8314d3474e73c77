"""Every media item of a step in one set of arrays: patches back to back, with their masks.

:func:`batch_patches` joins the :class:`.patches.Patches` of a step's image (or
video) items in the order given, item ``k``'s rows at
``offsets[k]:offsets[k + 1]``, and draws each item's mask (:mod:`.masking`) with
its index in the step, so the masks match whichever subset of items a process
prepares. All items must share one patch width and one position rank (one
``patch_side``, ``channels`` and ``tube_frames``): ``SHAPE_MISMATCH`` otherwise.
No items give arrays with no rows (and width 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ErrorCode, UFormError
from .masking import mask_patches
from .patches import Patches


@dataclass(frozen=True, eq=False)
class PatchBatch:
    """The patches of several items back to back, with each patch's mask."""

    inputs: np.ndarray
    """``(patches, width)`` float32: every item's :attr:`Patches.inputs`, in item order."""
    targets: np.ndarray
    """``(patches, width)`` float32: every item's normalised targets."""
    positions: np.ndarray
    """``(patches, 2 or 3)`` int32: every patch's position inside its item."""
    masked: np.ndarray
    """``(patches,)`` bool: True where the masked objective hides the patch."""
    offsets: np.ndarray
    """``(items + 1,)`` int64: item ``k``'s patches are rows ``offsets[k]:offsets[k + 1]``."""
    items: np.ndarray
    """``(items,)`` int32: each item's index in the step, the key of its mask."""
    truncated: int
    """Items cut short (clips whose later frames did not fit)."""
    downscaled: int
    """Items resized to fit."""


def batch_patches(patches: Sequence[Patches], items: Sequence[int], ratio: float, seed: int,
                  step: int) -> PatchBatch:
    """Joins ``patches`` (one per item, ``items`` their step indices), masking ``ratio`` of each; see the module doc."""
    if len(items) != len(patches):
        raise UFormError(ErrorCode.SHAPE_MISMATCH, f"items: {len(items)} entries for {len(patches)} patched items")
    shapes = {(p.inputs.shape[1], p.positions.shape[1]) for p in patches}
    if len(shapes) > 1:
        raise UFormError(ErrorCode.SHAPE_MISMATCH,
                         f"patches: items differ in (patch width, position axes): {sorted(shapes)}")
    width, axes = shapes.pop() if shapes else (0, 0)
    counts = np.fromiter((p.count for p in patches), np.int64, count=len(patches))
    masks = [mask_patches(p.count, ratio, seed, step, int(item)) for p, item in zip(patches, items)]
    return PatchBatch(
        inputs=np.concatenate([np.empty((0, width), np.float32), *(p.inputs for p in patches)]),
        targets=np.concatenate([np.empty((0, width), np.float32), *(p.targets for p in patches)]),
        positions=np.concatenate([np.empty((0, axes), np.int32), *(p.positions for p in patches)]),
        masked=np.concatenate([np.empty(0, bool), *masks]),
        offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        items=np.asarray(items, np.int32).reshape(-1),
        truncated=sum(p.truncated for p in patches),
        downscaled=sum(p.downscaled for p in patches),
    )
