"""Patches and tubes against a plain numpy reference, and the downscale and truncation rules."""

import numpy as np
import pytest
from PIL import Image

from uform.media import fitted_size, image_patches, video_tubes
from uform.errors import UFormError

RNG = np.random.default_rng(2)


def reference_patch(padded: np.ndarray, row: int, column: int, p: int) -> np.ndarray:
    return padded[row * p:(row + 1) * p, column * p:(column + 1) * p].reshape(-1)


def reference_target(values: np.ndarray) -> np.ndarray:
    return (values - values.mean()) / np.sqrt(values.var() + 1e-6)


def zero_padded(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    padded = np.zeros((*pixels.shape[:-3], height, width, pixels.shape[-1]), np.uint8)
    padded[..., :pixels.shape[-3], :pixels.shape[-2], :] = pixels
    return padded


@pytest.mark.parametrize("height, width, channels, p", [(32, 48, 4, 16), (21, 34, 4, 8), (5, 3, 3, 4), (1, 1, 4, 2)])
def test_image_patches_match_a_patch_by_patch_reference(height, width, channels, p):
    pixels = RNG.integers(0, 256, (height, width, channels), dtype=np.uint8)
    patches = image_patches(pixels, p, 10_000)
    rows, columns = -(-height // p), -(-width // p)
    padded = zero_padded(pixels, rows * p, columns * p)
    assert patches.grid == (rows, columns) and patches.count == rows * columns and not patches.downscaled
    for k, (row, column) in enumerate(patches.positions):
        assert (row, column) == divmod(k, columns)
        raw = reference_patch(padded, row, column, p)
        np.testing.assert_array_equal(patches.inputs[k], raw.astype(np.float32) / np.float32(255))
        np.testing.assert_allclose(patches.targets[k], reference_target(raw / 255.0), rtol=1e-6, atol=1e-6)
    assert patches.inputs.dtype == patches.targets.dtype == np.float32 and patches.positions.dtype == np.int32


def test_padding_is_zero_in_every_channel_and_counts_in_the_target():
    pixels = np.full((3, 3, 4), 255, np.uint8)
    patches = image_patches(pixels, 4, 1)
    block = patches.inputs[0].reshape(4, 4, 4)
    assert (block[:3, :3] == 1).all() and (block[3] == 0).all() and (block[:, 3] == 0).all()
    assert patches.targets[0].reshape(4, 4, 4)[3, 3, 0] < 0 < patches.targets[0][0]


def grid_at_scale(height: int, width: int, p: int, scale: float) -> int:
    """Patches of an image scaled by ``scale`` without rounding its size: ceil(s·H / p) · ceil(s·W / p)."""
    return int(np.ceil(scale * height / p) * np.ceil(scale * width / p))


@pytest.mark.parametrize("seed", range(40))
def test_fitted_size_is_the_largest_that_fits(seed):
    rng = np.random.default_rng(seed)
    height, width = (int(v) for v in rng.integers(1, 2000, 2))
    p, room = int(rng.integers(1, 33)), int(rng.integers(1, 300))
    size = fitted_size(height, width, p, room)
    patches = -(-size[0] // p) * -(-size[1] // p)
    assert patches <= room
    if size == (height, width):
        assert -(-height // p) * -(-width // p) <= room
        return
    assert size[0] <= height and size[1] <= width
    if min(size) == 1:
        return  # a side clamped at one pixel: the aspect cannot be kept
    # the binding side is an exact multiple of p, so its ratio is the scale used (the other was floored),
    # and that scale is the supremum of those whose unrounded grid fits
    scale = max(size[0] / height, size[1] / width)
    assert min(size[0] / height, size[1] / width) > scale - 1 / min(size)
    below, above = (grid_at_scale(height, width, p, scale * (1 + nudge)) for nudge in (-1e-9, 1e-9))
    assert below <= room < above


def test_a_too_large_image_is_downscaled_with_pillow_bicubic():
    pixels = RNG.integers(0, 256, (100, 150, 4), dtype=np.uint8)
    patches = image_patches(pixels, 16, 12)
    # 3 rows × 4 columns bind at the columns: scale 64 / 150, so 150 × 100 becomes 64 × floor(42.67)
    assert patches.downscaled and patches.size == (42, 64) and patches.grid == (3, 4)
    expected = np.asarray(Image.fromarray(pixels).resize((64, 42), Image.Resampling.BICUBIC))
    padded = zero_padded(expected, 48, 64)
    np.testing.assert_array_equal(patches.inputs[5] * 255, reference_patch(padded, 1, 1, 16).astype(np.float32))


def test_video_tubes_match_a_tube_by_tube_reference():
    frames = RNG.integers(0, 256, (5, 10, 13, 3), dtype=np.uint8)
    p, tube = 4, 2
    tubes = video_tubes(frames, p, tube, 1000)
    repeated = np.concatenate([frames, frames[-1:]])  # 5 frames pad to 6 by repeating the last
    padded = zero_padded(repeated, 12, 16)
    assert tubes.grid == (3, 3, 4) and tubes.frames == 5 and not tubes.truncated
    for k, (time, row, column) in enumerate(tubes.positions):
        assert (time, row, column) == (k // 12, k % 12 // 4, k % 4)
        raw = np.stack([padded[time * tube + t, row * p:(row + 1) * p, column * p:(column + 1) * p]
                        for t in range(tube)]).reshape(-1)
        np.testing.assert_array_equal(tubes.inputs[k], raw.astype(np.float32) / np.float32(255))
        np.testing.assert_allclose(tubes.targets[k], reference_target(raw / 255.0), rtol=1e-6, atol=1e-6)


def test_a_long_clip_keeps_its_first_whole_slices_and_says_truncated():
    frames = RNG.integers(0, 256, (9, 8, 8, 3), dtype=np.uint8)
    tubes = video_tubes(frames, 4, 2, 4 * 3 + 3)  # 4 tubes a slice: 3 slices fit of 5
    assert tubes.grid == (3, 2, 2) and tubes.frames == 6 and tubes.source_frames == 9 and tubes.truncated
    np.testing.assert_array_equal(tubes.inputs, video_tubes(frames[:6], 4, 2, 1000).inputs)


def test_a_clip_whose_one_slice_is_too_large_is_downscaled_frame_by_frame():
    frames = RNG.integers(0, 256, (3, 40, 40, 3), dtype=np.uint8)
    tubes = video_tubes(frames, 8, 1, 4)
    assert tubes.size == (16, 16) and tubes.grid == (1, 2, 2) and tubes.truncated and tubes.downscaled
    expected = np.asarray(Image.fromarray(frames[0]).resize((16, 16), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(tubes.inputs.reshape(2, 2, 8, 8, 3).transpose(0, 2, 1, 3, 4).reshape(16, 16, 3)
                                  * np.float32(255), expected.astype(np.float32))


@pytest.mark.parametrize("call", [lambda: image_patches(np.zeros((4, 4, 4), np.uint8), 0, 4),
                                  lambda: image_patches(np.zeros((4, 4, 4), np.uint8), 4, 0),
                                  lambda: video_tubes(np.zeros((2, 4, 4, 3), np.uint8), 4, 0, 4)])
def test_geometry_arguments_must_be_positive(call):
    with pytest.raises(UFormError, match="must be positive"):
        call()
