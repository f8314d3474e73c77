"""Exact mask counts per item, keyed draws, and a step's items joined by batch_patches."""

import numpy as np
import pytest

from uform.media import batch_patches, image_patches, mask_patches, masked_count, video_tubes
from uform.errors import ErrorCode, UFormError


@pytest.mark.parametrize("patches, ratio, expected", [
    (0, 0.75, 0), (1, 0.75, 0), (2, 0.75, 1), (2, 0.0, 1), (2, 1.0, 1), (4, 0.75, 3), (10, 0.75, 8),
    (10, 0.25, 3), (10, 0.05, 1), (6, 0.25, 2), (196, 0.75, 147), (5, 0.9, 4), (100, 0.999, 99),
])
def test_masked_count_rounds_half_up_and_leaves_one_either_side(patches, ratio, expected):
    assert masked_count(patches, ratio) == expected


@pytest.mark.parametrize("patches", [1, 2, 3, 7, 64, 197])
@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.75])
def test_every_item_masks_exactly_its_count(patches, ratio):
    for item in range(5):
        mask = mask_patches(patches, ratio, seed=7, step=3, item=item)
        assert mask.dtype == bool and mask.shape == (patches,) and mask.sum() == masked_count(patches, ratio)


def test_draws_are_keyed_by_seed_step_and_item_alone():
    first = mask_patches(64, 0.75, seed=1, step=2, item=3)
    np.testing.assert_array_equal(first, mask_patches(64, 0.75, seed=1, step=2, item=3))
    for other in ({"seed": 2, "step": 2, "item": 3}, {"seed": 1, "step": 3, "item": 3},
                  {"seed": 1, "step": 2, "item": 4}):
        assert not np.array_equal(first, mask_patches(64, 0.75, **other))


def test_the_draw_is_the_documented_permutation():
    rng = np.random.Generator(np.random.Philox(key=np.array([5, (9 << 32) | 2], np.uint64)))
    expected = np.zeros(20, bool)
    expected[rng.permutation(20)[:15]] = True
    np.testing.assert_array_equal(mask_patches(20, 0.75, seed=5, step=9, item=2), expected)


def test_a_ratio_outside_zero_to_one_is_refused():
    with pytest.raises(UFormError, match=r"ratio: must lie in \[0, 1\]"):
        masked_count(4, 1.5)


RNG = np.random.default_rng(3)
IMAGES = [image_patches(RNG.integers(0, 256, shape, dtype=np.uint8), 4, 6)
          for shape in [(8, 8, 4), (3, 13, 4), (40, 40, 4)]]


def test_batch_joins_items_in_order_with_offsets_and_keyed_masks():
    batch = batch_patches(IMAGES, items=[4, 0, 9], ratio=0.75, seed=11, step=2)
    counts = [p.count for p in IMAGES]
    np.testing.assert_array_equal(batch.offsets, np.cumsum([0, *counts]))
    np.testing.assert_array_equal(batch.items, [4, 0, 9])
    for k, (patches, item) in enumerate(zip(IMAGES, [4, 0, 9])):
        rows = slice(batch.offsets[k], batch.offsets[k + 1])
        np.testing.assert_array_equal(batch.inputs[rows], patches.inputs)
        np.testing.assert_array_equal(batch.targets[rows], patches.targets)
        np.testing.assert_array_equal(batch.positions[rows], patches.positions)
        np.testing.assert_array_equal(batch.masked[rows], mask_patches(patches.count, 0.75, 11, 2, item))
    assert batch.downscaled == 1 and batch.truncated == 0


def test_an_items_mask_does_not_depend_on_its_neighbours():
    alone = batch_patches(IMAGES[2:], items=[9], ratio=0.75, seed=11, step=2)
    together = batch_patches(IMAGES, items=[4, 0, 9], ratio=0.75, seed=11, step=2)
    np.testing.assert_array_equal(alone.masked, together.masked[together.offsets[2]:])


def test_batch_refuses_mixed_widths_and_miscounted_items_and_takes_none():
    clip = video_tubes(RNG.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8), 4, 2, 8)
    for call in (lambda: batch_patches([IMAGES[0], clip], [0, 1], 0.75, 0, 0),
                 lambda: batch_patches(IMAGES, [0, 1], 0.75, 0, 0)):
        with pytest.raises(UFormError) as refusal:
            call()
        assert refusal.value.code == ErrorCode.SHAPE_MISMATCH
    empty = batch_patches([], [], 0.75, 0, 0)
    assert empty.inputs.shape == (0, 0) and empty.offsets.tolist() == [0] and empty.masked.size == 0
