"""The keyed draws behind span corruption: Philox4x64-10 against numpy's own Philox and Random123's answer,
and ``corrupt`` against a plain, segment-at-a-time reading of ``uform.training.masking``'s module doc."""

import math

import numpy as np
import pytest

from uform.training import Masking, corrupt, pack_items
from uform.training.masking import COVERAGE_STREAM, CUT_STREAM, SHOWN_STREAM, SPAN_STREAM
from uform.training.philox import below, philox4x64, stream_words, uniforms
from uform.training.vocabulary import IGNORED_TARGET, MASK

UINT64 = 1 << 64


def numpy_block(key, counter):
    """The Philox block at a 256-bit counter by numpy, which steps its counter (with carry) before each block."""
    value = (sum(word << (64 * lane) for lane, word in enumerate(counter)) - 1) % (UINT64 ** 4)
    start = [(value >> (64 * lane)) % UINT64 for lane in range(4)]
    return np.random.Philox(key=np.array(key, np.uint64), counter=np.array(start, np.uint64)).random_raw(4)


def test_blocks_are_numpys_philox_for_every_key_and_counter():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, UINT64, (40, 2), dtype=np.uint64, endpoint=False)
    counters = rng.integers(0, UINT64, (40, 4), dtype=np.uint64, endpoint=False)
    counters[:5] = 0  # counter 0 and the carries into the higher words
    counters[5:10, 1:] = 0
    got = philox4x64((keys[:, 0], keys[:, 1]), tuple(counters.T))
    for key, counter, block in zip(keys, counters, got):
        np.testing.assert_array_equal(block, numpy_block([int(k) for k in key], [int(c) for c in counter]))


def test_the_zero_block_is_random123s_known_answer():
    block = philox4x64((np.uint64(0), np.uint64(0)), (np.uint64(0),) * 4)[0]
    assert [int(word) for word in block] == [0x16554D9ECA36314C, 0xDB20FE9D672D0FDC, 0xD7E772CEE186176B,
                                             0x7E68B68AEC7BA23B]


def test_stream_words_are_the_blocks_lanes_in_order():
    key1 = np.array([5, 9, 5], np.uint64)
    counts = np.array([7, 0, 2])
    words = stream_words(3, key1, [2, 2, 4], counts)
    expected = [int(numpy_block([3, int(k)], [w // 4, stream, 0, 0])[w % 4])
                for k, stream, count in zip(key1, (2, 2, 4), counts) for w in range(count)]
    assert words.tolist() == expected


def test_uniforms_and_bounded_values_cover_their_ranges():
    words = np.array([0, UINT64 - 1, 1 << 63, (1 << 11) - 1], np.uint64)
    assert uniforms(words).tolist() == [0.0, 1 - 2.0 ** -53, 0.5, 0.0]
    assert below(words, np.array([10, 10, 10, 10])).tolist() == [0, 9, 5, 0]
    drawn = below(stream_words(1, np.arange(64, dtype=np.uint64), 0, 1000), 7)
    np.testing.assert_allclose(np.bincount(drawn, minlength=7) / drawn.size, 1 / 7, rtol=0.03)


def segment_words(seed, step, item, stream, count):
    key1 = (step << 32) | item
    return [int(numpy_block([seed, key1], [w // 4, stream, 0, 0])[w % 4]) for w in range(count)]


def reference_corrupt_segment(tokens, masking, seed, step, item):
    """Steps 1-4 of the module doc for one segment, one draw at a time, in plain Python."""
    n = len(tokens)
    p, m = masking.token_mask_probability, masking.token_mean_span
    (u,) = segment_words(seed, step, item, COVERAGE_STREAM, 1)
    k = min(math.floor(p * n + (u >> 11) * 2.0 ** -53), math.floor(p * n) + 1, n)
    covered = []
    if k:
        q, thresholds = 1.0 - 1.0 / m, []
        for _ in range(k - 1):
            thresholds.append((thresholds[-1] if thresholds else 1.0) * q)
        spans, reach = [], 0
        for word in segment_words(seed, step, item, SPAN_STREAM, k):
            big_u = (word >> 11) * 2.0 ** -53
            length = 1 + sum(big_u < threshold for threshold in thresholds)
            spans.append(min(length, k - reach))
            reach += spans[-1]
            if reach == k:
                break
        free = n - k
        if len(spans) - 1 > free:
            spans = spans[:free] + [sum(spans[free:])]
        spare = free - (len(spans) - 1)
        cuts = sorted(((word >> 32) * (spare + 1)) >> 32
                      for word in segment_words(seed, step, item, CUT_STREAM, len(spans)))
        before = 0
        for i, (cut, length) in enumerate(zip(cuts, spans)):
            covered += range(cut + i + before, cut + i + before + length)
            before += length
    inputs, targets = list(tokens), [IGNORED_TARGET] * n
    for i, (position, word) in enumerate(zip(covered, segment_words(seed, step, item, SHOWN_STREAM, k))):
        v, byte = (word >> 11) * 2.0 ** -53, word & 0xFF
        targets[position] = tokens[position]
        if v < masking.replace_fraction:
            inputs[position] = MASK
        elif v < masking.replace_fraction + masking.random_fraction:
            inputs[position] = byte
    return inputs, targets


@pytest.mark.parametrize("masking", [Masking(), Masking(token_mask_probability=0.5, token_mean_span=3),
                                     Masking(token_mask_probability=0.9, token_mean_span=1.5),
                                     Masking(token_mask_probability=1.0, token_mean_span=1),
                                     Masking(token_mask_probability=0.3, token_mean_span=40, replace_fraction=0.2,
                                             random_fraction=0.7)])
def test_corrupt_is_the_module_docs_draws_segment_by_segment(masking):
    rng = np.random.default_rng(7)
    contents = [bytes(rng.integers(97, 123, n, dtype=np.uint8)) for n in rng.integers(1, 300, 40)]
    packed = pack_items(contents, None, 12, 512, 48)
    text = np.arange(packed.segment_count) % 5 != 3  # some segments stand for media: left alone
    seed, step, offset = (1 << 64) - 3, 77, 1000
    inputs, targets = corrupt(packed, masking, seed=seed, step=step, item_offset=offset, text_segments=text)
    derived = masking.derived()
    for segment in range(packed.segment_count):
        row, start = packed.segment_row[segment], packed.segment_start[segment]
        window = slice(start, start + packed.segment_length[segment])
        tokens = packed.tokens[row, window].tolist()
        if text[segment]:
            expected = reference_corrupt_segment(tokens, derived, seed, step,
                                                 offset + int(packed.item_of_segment[segment]))
        else:
            expected = tokens, [IGNORED_TARGET] * len(tokens)
        assert inputs[row, window].tolist() == expected[0]
        assert targets[row, window].tolist() == expected[1]
    assert (targets[packed.segment_ids < 0] == IGNORED_TARGET).all()
