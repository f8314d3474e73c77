"""Packing items into a device's fixed grid of rows.

A device's step carries at most ``max_rows`` rows of ``max_columns`` positions
and ``max_segments`` segments across them (``BatchShape``). Every item becomes
one *segment* of token ids: a text's UTF-8 bytes, a byte per position, or a media
item's ids, a patch (tube, frame) per position, given as an int32 array (its
patches were already fitted to a row, ``uform.media``). Packing is deterministic:

1. An item longer than a row is cut to its first ``max_columns`` tokens
   (``truncated`` counts the packed items that were cut).
2. Items are grouped into bags -- items sharing a bag id -- taken in the order
   of each bag's first item, and within a bag in item order. With no bags every
   item is its own bag, so segments follow item order.
3. Each bag is placed whole or not at all: its segments go first-fit (each to
   the lowest-numbered row with room for it), and if any does not fit, or the
   bag would pass ``max_segments`` segments or ``max_bags`` bags, the whole bag
   is dropped (``dropped`` counts its segments) and packing goes on with the
   next bag, which may be smaller. A world of several devices packs its rows as
   one grid, every device a block of ``block_rows`` rows (docs/mesh.md): a bag
   goes whole into the first block where its segments fit first-fit, so it stays
   on one device. A bag of one segment lands where it would in one grid.

Positions no segment covers hold ``vocabulary.PAD``, segment id -1 and position
0. The grid keeps its full ``(max_rows, max_columns)`` shape whatever fills it,
since device buffers are sized by the batch shape. Positions restart at 0 in
every segment, so attention and pooling stay within ``segment_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .arrays import group_entries
from ..errors import ErrorCode, UFormError
from .vocabulary import PAD


@dataclass(frozen=True, eq=False)
class Packed:
    """One device's packed items: the token grid, its segment map, and what did not fit."""

    tokens: np.ndarray
    """``(rows, columns)`` int32: the token id at each position, ``PAD`` where no segment is."""
    segment_ids: np.ndarray
    """``(rows, columns)`` int32: the packed segment covering each position, -1 for padding."""
    positions: np.ndarray
    """``(rows, columns)`` int32: each position's offset inside its segment from 0; 0 for padding."""
    item_of_segment: np.ndarray
    """``(segments,)`` int32: the item index each packed segment holds."""
    segment_of_item: np.ndarray
    """``(items,)`` int32: the packed segment holding each item, -1 for a dropped item."""
    segment_row: np.ndarray
    """``(segments,)`` int32: the row each segment lies in."""
    segment_start: np.ndarray
    """``(segments,)`` int32: the column each segment starts at."""
    segment_length: np.ndarray
    """``(segments,)`` int32: the positions each segment covers, at most a row."""
    flat: np.ndarray
    """``(packed positions,)`` int64: the flat grid index of every packed token, segment after segment,
    each segment's tokens in order; ``grid.reshape(-1)[flat] = values`` places per-token values."""
    truncated: int
    """Packed items cut at a row's width."""
    dropped: int
    """Segments dropped whole, with their bag, for lack of room."""

    @property
    def segment_count(self) -> int:
        return int(self.item_of_segment.size)


def _place_first_fit(fill: list[int], lengths: list[int],
                     max_columns: int) -> tuple[list[int], list[int], list[int]] | None:
    """``(rows, starts, new_fill)`` placing every length first-fit over the rows' ``fill``; None if one does not
    fit. Plain lists: a bag is a few segments over a few dozen rows, where numpy's per-call cost dominates."""
    fill = fill.copy()
    rows, starts = [], []
    for length in lengths:
        limit = max_columns - length
        row = next((row for row, used in enumerate(fill) if used <= limit), None)
        if row is None:
            return None
        rows.append(row)
        starts.append(fill[row])
        fill[row] += length
    return rows, starts, fill


def _bag_members(bags: np.ndarray | None, item_count: int) -> list[list[int]]:
    """Item indices of every bag, bags in order of their first item, members in item order (None: every item
    its own bag)."""
    if bags is None:
        return [[item] for item in range(item_count)]
    if bags.size == 0:
        return []
    _, first, inverse = np.unique(bags, return_index=True, return_inverse=True)
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    order = np.argsort(rank[inverse], kind="stable")
    return [members.tolist() for members in
            np.split(order, np.cumsum(np.bincount(rank[inverse], minlength=first.size))[:-1])]


def _place_in_a_block(fill: list[int], lengths: list[int], max_columns: int,
                      block_rows: int) -> tuple[list[int], list[int], list[int]] | None:
    """``_place_first_fit`` within the first block of ``block_rows`` rows that holds every length."""
    for begin in range(0, len(fill), block_rows):
        placement = _place_first_fit(fill[begin:begin + block_rows], lengths, max_columns)
        if placement is not None:
            rows, starts, block_fill = placement
            return [row + begin for row in rows], starts, fill[:begin] + block_fill + fill[begin + block_rows:]
    return None


def _place_bags(lengths: np.ndarray, bags: np.ndarray | None, max_rows: int, max_columns: int, max_segments: int,
                max_bags: int, block_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(item_of_segment, segment_row, segment_start, dropped)``: every bag placed whole or dropped whole."""
    fill = [0] * max_rows
    lengths = lengths.tolist()
    items, rows, starts = [], [], []
    bag_count = dropped = 0
    for members in _bag_members(bags, len(lengths)):
        placement = None
        if len(items) + len(members) <= max_segments and (max_bags == 0 or bag_count < max_bags):
            placement = _place_in_a_block(fill, [lengths[item] for item in members], max_columns, block_rows)
        if placement is None:
            dropped += len(members)
            continue
        bag_rows, bag_starts, fill = placement
        items += members
        rows += bag_rows
        starts += bag_starts
        bag_count += 1
    return (np.array(items, np.int64), np.array(rows, np.int64), np.array(starts, np.int64), dropped)


def token_ids(content: bytes | np.ndarray) -> np.ndarray:
    """An item's token ids: a text's bytes, or the ids a media item was given."""
    if isinstance(content, np.ndarray):
        return content.astype(np.int32, copy=False)
    return np.frombuffer(content, np.uint8).astype(np.int32)


def pack_items(contents: Sequence[bytes | np.ndarray], bags, max_rows: int, max_columns: int, max_segments: int,
               max_bags: int = 0, block_rows: int = 0) -> Packed:
    """Packs every item's tokens (:func:`token_ids`) as one segment into ``max_rows`` rows of ``max_columns``;
    see the module doc.

    ``bags`` holds one bag id per item, or None for every item its own bag;
    ``max_bags`` caps the bags packed, zero leaving them uncapped; ``block_rows`` (0: all the rows) keeps each
    bag within one block of that many rows (a device's, in a world of several).
    """
    item_count = len(contents)
    bags = None if bags is None else np.asarray(bags)
    if bags is not None and bags.shape != (item_count,):
        raise UFormError(ErrorCode.SHAPE_MISMATCH, f"bags: {bags.size} entries for {item_count} items")
    full_lengths = np.fromiter(map(len, contents), np.int64, count=item_count)
    lengths = np.minimum(full_lengths, max_columns)
    item_of_segment, segment_row, segment_start, dropped = _place_bags(lengths, bags, max_rows, max_columns,
                                                                       max_segments, max_bags, block_rows or max_rows)
    segment_count = item_of_segment.size
    segment_length = lengths[item_of_segment]

    packed_contents = [contents[item][:max_columns] for item in item_of_segment.tolist()]
    if all(isinstance(content, bytes) for content in packed_contents):  # text alone: one conversion of all its bytes
        data = np.frombuffer(b"".join(packed_contents), np.uint8).astype(np.int32)
    else:
        data = np.concatenate([np.empty(0, np.int32), *map(token_ids, packed_contents)])
    _, segment_of_position, within = group_entries(segment_length)
    flat = (segment_row * max_columns + segment_start)[segment_of_position] + within

    tokens = np.full(max_rows * max_columns, PAD, np.int32)
    segment_ids = np.full(max_rows * max_columns, -1, np.int32)
    positions = np.zeros(max_rows * max_columns, np.int32)
    tokens[flat] = data
    segment_ids[flat] = segment_of_position
    positions[flat] = within
    segment_of_item = np.full(item_count, -1, np.int32)
    segment_of_item[item_of_segment] = np.arange(segment_count)

    grid = (max_rows, max_columns)
    return Packed(tokens=tokens.reshape(grid), segment_ids=segment_ids.reshape(grid),
                  positions=positions.reshape(grid), item_of_segment=item_of_segment.astype(np.int32),
                  segment_of_item=segment_of_item, segment_row=segment_row.astype(np.int32),
                  segment_start=segment_start.astype(np.int32), segment_length=segment_length.astype(np.int32),
                  flat=flat.astype(np.int64), truncated=int(np.count_nonzero(full_lengths[item_of_segment] > max_columns)), dropped=dropped)
