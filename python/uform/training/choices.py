"""Calibrated choices on the host: the state an item's choice follows, and where the head reads it.

An item offering choices is the state its answer follows: its bytes are shown uncorrupted, with the
MASK id appended, and a state longer than a row is cut at its head (its last ``columns − 1`` bytes
are kept, so the MASK stays beside the text it answers). The masked head's logits at that MASK
position, restricted to the item's legal bytes, are its distribution (``docs/encoder.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .packing import Packed
from .tapes import tape_entries
from .vocabulary import MASK


@dataclass(frozen=True, eq=False)
class ChoiceBatch:
    """The packed items that make a choice, in segment order."""

    positions: np.ndarray      # (C,) int32 flat token index of each item's MASK position
    offsets: np.ndarray        # (C + 1,) int32 into choice_bytes
    choice_bytes: np.ndarray   # int32 legal bytes, item after item
    targets: np.ndarray | None  # float32 target probabilities beside them; None to only read probabilities
    capacity: int              # items the device buffers hold (the batch's segments)
    items: np.ndarray          # (C,) int32 the step's item index of each

    @property
    def count(self) -> int:
        return int(self.positions.size)


def choice_state(text: bytes, columns: int) -> tuple[np.ndarray, bool]:
    """(token ids, cut): the text's bytes with MASK appended, cut at its head to fit `columns` positions."""
    keep = np.frombuffer(text, np.uint8)[-(columns - 1):] if columns > 1 else np.empty(0, np.uint8)
    return np.append(keep.astype(np.int32), np.int32(MASK)), len(text) > columns - 1


def choice_batch(packed: Packed, choosing_items: np.ndarray, choice_offsets: np.ndarray, choice_bytes: np.ndarray,
                 choice_targets: np.ndarray | None, capacity: int) -> ChoiceBatch:
    """The ChoiceBatch of the packed items flagged in `choosing_items` (a bool per item), their legal bytes
    and targets read from the step's choices tape."""
    columns = packed.tokens.shape[1]
    segments = np.flatnonzero(choosing_items[packed.item_of_segment])
    items = packed.item_of_segment[segments]
    positions = (packed.segment_row[segments].astype(np.int64) * columns + packed.segment_start[segments]
                 + packed.segment_length[segments] - 1)
    chosen, offsets = tape_entries(choice_offsets, items)
    return ChoiceBatch(positions=positions.astype(np.int32), offsets=offsets.astype(np.int32),
                       choice_bytes=choice_bytes[chosen].astype(np.int32),
                       targets=None if choice_targets is None else choice_targets[chosen].astype(np.float32),
                       capacity=capacity, items=items.astype(np.int32))
