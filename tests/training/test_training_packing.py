"""pack_items against a plain per-byte reference, and its truncation, drop and bag rules."""

import numpy as np
import pytest

from uform.training import PAD, ErrorCode, UFormError, pack_items


def reference_pack(contents, bags, rows, columns, max_segments, max_bags=0):
    """The module doc's rules, one byte at a time."""
    if bags is None:
        bags = list(range(len(contents)))
    order = []
    for bag in bags:
        if bag not in order:
            order.append(bag)
    fill = [0] * rows
    tokens = [[PAD] * columns for _ in range(rows)]
    segment_ids = [[-1] * columns for _ in range(rows)]
    positions = [[0] * columns for _ in range(rows)]
    placed, dropped, truncated, bag_count = [], 0, 0, 0
    for bag in order:
        members = [item for item, b in enumerate(bags) if b == bag]
        trial, spots = list(fill), []
        for item in members:
            length = min(len(contents[item]), columns)
            row = next((r for r in range(rows) if trial[r] + length <= columns), None)
            if row is None:
                break
            spots.append((item, row, trial[row]))
            trial[row] += length
        fits = len(spots) == len(members) and len(placed) + len(members) <= max_segments
        if not fits or (max_bags and bag_count >= max_bags):
            dropped += len(members)
            continue
        fill, bag_count = trial, bag_count + 1
        for item, row, start in spots:
            segment = len(placed)
            text = contents[item][:columns]
            truncated += len(contents[item]) > columns
            for offset, byte in enumerate(text):
                tokens[row][start + offset] = byte
                segment_ids[row][start + offset] = segment
                positions[row][start + offset] = offset
            placed.append((item, row, start, len(text)))
    return dict(tokens=tokens, segment_ids=segment_ids, positions=positions, placed=placed, dropped=dropped,
                truncated=truncated)


def assert_matches_reference(contents, bags, rows, columns, max_segments, max_bags=0):
    packed = pack_items(contents, bags, rows, columns, max_segments, max_bags)
    expected = reference_pack(contents, bags, rows, columns, max_segments, max_bags)
    for name in ("tokens", "segment_ids", "positions"):
        array = getattr(packed, name)
        assert array.dtype == np.int32 and array.shape == (rows, columns)
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
    placed = np.array(expected["placed"], dtype=np.int64).reshape(-1, 4)
    np.testing.assert_array_equal(packed.item_of_segment, placed[:, 0])
    np.testing.assert_array_equal(packed.segment_row, placed[:, 1])
    np.testing.assert_array_equal(packed.segment_start, placed[:, 2])
    np.testing.assert_array_equal(packed.segment_length, placed[:, 3])
    assert (packed.truncated, packed.dropped) == (expected["truncated"], expected["dropped"])
    return packed


@pytest.mark.parametrize("seed", range(12))
def test_random_batches_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    count = int(rng.integers(0, 30))
    columns = int(rng.integers(4, 40))
    contents = [bytes(rng.integers(0, 256, int(rng.integers(1, 2 * columns)), dtype=np.uint8)) for _ in range(count)]
    bags = None if seed % 3 == 0 else rng.integers(0, max(count // 2, 1), count).tolist()
    packed = assert_matches_reference(contents, bags, int(rng.integers(1, 6)), columns, int(rng.integers(1, 25)),
                                      max_bags=int(rng.integers(0, 4)) if seed % 4 == 1 else 0)
    kept = packed.segment_of_item >= 0
    np.testing.assert_array_equal(packed.segment_of_item[packed.item_of_segment], np.arange(packed.segment_count))
    assert packed.segment_count + packed.dropped == count == kept.size


def test_items_become_segments_of_their_bytes_in_item_order():
    packed = assert_matches_reference([b"hello", "h\u00e9".encode(), b"xyz"], None, 2, 8, 8)
    assert packed.tokens[0].tolist() == [104, 101, 108, 108, 111, 104, 0xC3, 0xA9]
    assert packed.tokens[1].tolist() == [120, 121, 122] + [PAD] * 5
    assert packed.segment_ids[0].tolist() == [0] * 5 + [1] * 3
    assert packed.positions[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert packed.positions[1].tolist() == [0, 1, 2, 0, 0, 0, 0, 0]
    assert packed.segment_ids[1].tolist() == [2, 2, 2] + [-1] * 5


def test_long_items_are_cut_at_a_row_and_counted():
    packed = assert_matches_reference([b"a" * 20, b"bb", b"c" * 9], None, 3, 8, 8)
    assert packed.truncated == 2 and packed.dropped == 0
    assert packed.segment_length.tolist() == [8, 2, 8]


def test_first_fit_fills_earlier_rows_before_later_ones():
    packed = assert_matches_reference([b"aaaaa", b"bbbbbb", b"cc", b"dd", b"e"], None, 2, 8, 8)
    assert packed.segment_row.tolist() == [0, 1, 0, 1, 0]
    assert packed.segment_start.tolist() == [0, 0, 5, 6, 7]


def test_a_bag_that_does_not_fit_is_dropped_whole_and_smaller_ones_still_pack():
    contents = [b"aaaaaa", b"bbbbbb", b"cccccc", b"dd"]
    packed = assert_matches_reference(contents, [0, 1, 1, 2], 2, 8, 8)
    assert packed.item_of_segment.tolist() == [0, 3]
    assert packed.dropped == 2
    assert packed.segment_of_item.tolist() == [0, -1, -1, 1]


def test_bag_members_stay_together_in_first_appearance_order():
    packed = assert_matches_reference([b"a", b"b", b"c", b"d", b"e"], [7, 3, 7, 3, 9], 1, 8, 8)
    assert packed.item_of_segment.tolist() == [0, 2, 1, 3, 4]


def test_the_segment_cap_drops_whole_bags():
    packed = assert_matches_reference([b"a", b"b", b"c", b"d"], [0, 1, 1, 2], 4, 8, 2)
    assert packed.item_of_segment.tolist() == [0, 3]
    assert packed.dropped == 2


def test_the_bag_cap_drops_whole_bags():
    packed = assert_matches_reference([b"a", b"b", b"c", b"d"], [0, 1, 1, 2], 4, 8, 8, max_bags=2)
    assert packed.item_of_segment.tolist() == [0, 1, 2]
    assert packed.dropped == 1


def test_an_empty_batch_packs_to_padding():
    packed = pack_items([], None, 2, 4, 4)
    assert packed.segment_count == 0 and (packed.tokens == PAD).all() and (packed.segment_ids == -1).all()


def test_bags_must_agree_with_the_items():
    with pytest.raises(UFormError) as error:
        pack_items([b"a", b"b"], [0], 1, 4, 4)
    assert error.value.code == ErrorCode.SHAPE_MISMATCH
    assert str(error.value) == "bags: 1 entries for 2 items"
