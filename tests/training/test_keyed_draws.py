"""The keyed draws behind span corruption: Philox4x64-10 against numpy's own Philox and Random123's answer,
and ``corrupt`` against a plain, segment-at-a-time reading of ``uform.training.masking``'s module doc
(``uform.reference.masking``)."""

import numpy as np
import pytest

from uform.reference.masking import UINT64, corrupt_segment, numpy_block
from uform.training import Masking, corrupt, pack_items
from uform.training.philox import below, philox4x64, stream_words, uniforms
from uform.training.vocabulary import IGNORED_TARGET


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
            expected = corrupt_segment(tokens, derived, seed, step,
                                                 offset + int(packed.item_of_segment[segment]))
        else:
            expected = tokens, [IGNORED_TARGET] * len(tokens)
        assert inputs[row, window].tolist() == expected[0]
        assert targets[row, window].tolist() == expected[1]
    assert (targets[packed.segment_ids < 0] == IGNORED_TARGET).all()
