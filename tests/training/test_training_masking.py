"""Span corruption: its statistics on long text, and keyed determinism per (seed, step, item)."""

import numpy as np
import pytest

from uform.training import MASK, PAD, ErrorCode, Masking, UFormError, corrupt, pack_items
from uform.draws import corruption_generator

LENGTH = 200_000


def letters(seed, length):
    return bytes(np.random.default_rng(seed).integers(97, 123, length, dtype=np.uint8))


@pytest.fixture(scope="module")
def long_text():
    packed = pack_items([letters(0, LENGTH)], None, 1, LENGTH, 1)
    inputs, targets = corrupt(packed, Masking(), seed=42, step=7)
    return packed, inputs[0], targets[0]


def runs(mask):
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def test_coverage_is_the_token_mask_probability(long_text):
    _, _, targets = long_text
    assert abs((targets >= 0).mean() - 0.15) < 0.002


def test_spans_have_the_mean_span(long_text):
    _, _, targets = long_text
    assert abs(runs(targets >= 0).mean() - 16) < 1.0


def test_covered_positions_split_80_10_10(long_text):
    packed, inputs, targets = long_text
    covered = targets >= 0
    original = packed.tokens[0]
    shown = inputs[covered]
    assert abs((shown == MASK).mean() - 0.8) < 0.01
    randomized = (shown != MASK) & (shown != original[covered])
    assert abs(randomized.mean() - 0.1 * 255 / 256) < 0.01
    assert shown.min() >= 0 and shown[shown != MASK].max() < 256


def test_targets_are_the_covered_bytes_and_the_rest_is_untouched(long_text):
    packed, inputs, targets = long_text
    covered = targets >= 0
    np.testing.assert_array_equal(targets[covered], packed.tokens[0][covered])
    np.testing.assert_array_equal(inputs[~covered], packed.tokens[0][~covered])
    assert inputs.dtype == np.int32 and targets.dtype == np.int32


def test_short_segments_are_covered_in_expectation():
    contents = [letters(seed, 5) for seed in range(2000)]
    packed = pack_items(contents, None, 100, 100, 2000)
    _, targets = corrupt(packed, Masking(), seed=1, step=1)
    assert abs((targets >= 0).sum() / (5 * 2000) - 0.15) < 0.02


def test_padding_is_never_a_target():
    packed = pack_items([b"abc", b"defgh"], None, 2, 64, 4)
    inputs, targets = corrupt(packed, Masking(token_mask_probability=1.0), seed=3, step=2)
    padding = packed.segment_ids < 0
    assert (targets[padding] == -1).all() and (inputs[padding] == PAD).all()
    assert (targets[~padding] >= 0).all()


def test_explicit_fractions_are_honoured():
    packed = pack_items([letters(5, 20_000)], None, 1, 20_000, 1)
    inputs, targets = corrupt(packed, Masking(token_mask_probability=0.5, token_mean_span=3, replace_fraction=0.5,
                                              random_fraction=0.5), seed=0, step=1)
    covered = targets >= 0
    assert abs(covered.mean() - 0.5) < 0.01
    assert abs(runs(covered[0]).mean() - 3) < 0.2
    assert abs((inputs[covered] == MASK).mean() - 0.5) < 0.02


def item_view(packed, arrays, item):
    segment = packed.segment_of_item[item]
    row, start, length = packed.segment_row[segment], packed.segment_start[segment], packed.segment_length[segment]
    return [array[row, start:start + length] for array in arrays]


def test_an_item_is_corrupted_the_same_whatever_shares_its_batch():
    target = letters(9, 300)
    first = pack_items([letters(1, 100), letters(2, 50), target], None, 2, 512, 8)
    second = pack_items([letters(3, 480), letters(4, 7), target], None, 2, 512, 8)
    assert first.segment_row[2] != second.segment_row[2] or first.segment_start[2] != second.segment_start[2]
    a = item_view(first, corrupt(first, Masking(), seed=11, step=5), 2)
    b = item_view(second, corrupt(second, Masking(), seed=11, step=5), 2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_item_offset_keys_by_the_global_item_index():
    target = letters(9, 300)
    alone = pack_items([target], None, 1, 512, 1)
    batch = pack_items([letters(1, 100)] * 5 + [target], None, 2, 512, 8)
    a = item_view(alone, corrupt(alone, Masking(), seed=11, step=5, item_offset=5), 0)
    b = item_view(batch, corrupt(batch, Masking(), seed=11, step=5), 5)
    np.testing.assert_array_equal(a[0], b[0])


def test_steps_seeds_and_items_draw_afresh_and_repeats_do_not():
    packed = pack_items([letters(9, 2000), letters(9, 2000)], None, 2, 2000, 2)
    base = corrupt(packed, Masking(), seed=11, step=5)
    np.testing.assert_array_equal(base[0], corrupt(packed, Masking(), seed=11, step=5)[0])
    assert not np.array_equal(base[1], corrupt(packed, Masking(), seed=11, step=6)[1])
    assert not np.array_equal(base[1], corrupt(packed, Masking(), seed=12, step=5)[1])
    assert not np.array_equal(base[1][0], base[1][1])


def test_the_key_refuses_what_does_not_fit():
    with pytest.raises(UFormError) as error:
        corruption_generator(0, 1 << 32, 0)
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert str(error.value).startswith("step:")
    with pytest.raises(UFormError):
        corruption_generator(-1, 0, 0)


@pytest.mark.parametrize("item_offset", [-1, (1 << 32) - 1, 1 << 63, 1 << 80])
def test_corrupt_refuses_item_indices_past_the_key(item_offset):
    """Each segment's key holds its item index in 32 bits: an offset that puts an item outside [0, 2^32) is
    refused naming the item, before any draw, and the packed batch is left as it was."""
    packed = pack_items([letters(1, 40), letters(2, 30)], None, 1, 128, 4)
    before = packed.tokens.copy()
    with pytest.raises(UFormError) as error:
        corrupt(packed, Masking(), seed=1, step=2, item_offset=item_offset)
    assert error.value.code == ErrorCode.INVALID_ARGUMENT and str(error.value).startswith("item:")
    np.testing.assert_array_equal(packed.tokens, before)
