"""decode_image against Pillow's own decoding of the same files, and every refusal."""

import io

import numpy as np
import pytest
from media_files import encode_image, encode_video, moving_frames, png_header
from PIL import Image, ImageOps

from uform.media import decode_image, sniff_format
from uform.errors import ErrorCode, UFormError

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (21, 34, 3), dtype=np.uint8)
RGBA = RNG.integers(0, 256, (21, 34, 4), dtype=np.uint8)
GRAY = RNG.integers(0, 256, (21, 34), dtype=np.uint8)


def pillow_rgba(data: bytes) -> np.ndarray:
    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGBA"))


def palette_png() -> bytes:
    image = Image.fromarray(GRAY % 16).convert("P")
    out = io.BytesIO()
    image.save(out, "PNG", transparency=3)
    return out.getvalue()


FILES = {
    "png-rgb": encode_image(RGB, "PNG"),
    "png-rgba": encode_image(RGBA, "PNG"),
    "png-gray": encode_image(GRAY, "PNG"),
    "png-gray-alpha": encode_image(RGBA[..., :2], "PNG"),
    "png-palette-transparency": palette_png(),
    "jpeg-rgb": encode_image(RGB, "JPEG", quality=90),
    "jpeg-gray": encode_image(GRAY, "JPEG"),
    "webp-lossless-rgba": encode_image(RGBA, "WEBP", lossless=True, exact=True),
    "webp-lossy-rgb": encode_image(RGB, "WEBP", quality=80),
}


@pytest.mark.parametrize("name", FILES)
def test_files_decode_as_pillow_does(name):
    data = FILES[name]
    pixels = decode_image(data)
    assert pixels.dtype == np.uint8 and pixels.shape == (21, 34, 4)
    np.testing.assert_array_equal(pixels, pillow_rgba(data))


def test_opaque_and_gray_files_get_alpha_255_and_three_equal_channels():
    assert (decode_image(FILES["jpeg-rgb"])[..., 3] == 255).all()
    gray = decode_image(FILES["png-gray"])
    np.testing.assert_array_equal(gray[..., :3], np.repeat(GRAY[..., None], 3, axis=-1))
    np.testing.assert_array_equal(decode_image(FILES["png-rgba"]), RGBA)
    np.testing.assert_array_equal(decode_image(FILES["webp-lossless-rgba"]), RGBA)


def test_sixteen_bit_gray_takes_its_high_byte():
    deep = (RNG.integers(0, 1 << 16, (9, 11))).astype(np.uint16)
    pixels = decode_image(encode_image(deep, "PNG"))
    np.testing.assert_array_equal(pixels[..., 0], deep >> 8)
    np.testing.assert_array_equal(pixels[..., 3], 255)


def test_exif_orientation_is_applied():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90° clockwise
    data = encode_image(RGB, "JPEG", exif=exif.tobytes())
    pixels = decode_image(data)
    assert pixels.shape == (34, 21, 4)
    np.testing.assert_array_equal(pixels, pillow_rgba(data))


def test_three_channels_drop_alpha():
    np.testing.assert_array_equal(decode_image(FILES["png-rgba"], channels=3), RGBA[..., :3])


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_arrays_become_rgba(channels):
    array = RGBA[..., :channels]
    pixels = decode_image(array)
    expected = {1: np.repeat(array, 3, axis=-1), 3: array, 4: array[..., :3]}[channels]
    np.testing.assert_array_equal(pixels[..., :3], expected)
    np.testing.assert_array_equal(pixels[..., 3], RGBA[..., 3] if channels == 4 else 255)


PNG = FILES["png-rgb"]
REFUSED = {
    "a video": (encode_video(moving_frames(2), "mp4", "mpeg4"), "an MP4 video; IMAGE items hold JPEG, PNG or WebP"),
    "a gif": (encode_image(GRAY, "GIF"), "a GIF image"),
    "unrecognised": (b"hello, world, this is text", "bytes starting b'hello, world'"),
    "truncated png": (PNG[:len(PNG) // 2], "a corrupt or truncated PNG image"),
    "truncated header": (PNG[:20], "an unreadable PNG header (corrupt, truncated or zero-size)"),
    "corrupt jpeg": (FILES["jpeg-rgb"][:200] + bytes(200), "a corrupt or truncated JPEG"),
    "zero width": (png_header(0, 5), "an unreadable PNG header (corrupt, truncated or zero-size)"),
    "bomb": (png_header(8193, 4096), "8193 × 4096 = 33558528 pixels, past the limit of 33554432"),
    "pillow's bomb": (png_header(100_000, 100_000), "past Pillow's own limit"),
    "text": ("a picture", "IMAGE items are bytes or a uint8 array, got str"),
    "float array": (RGB.astype(np.float32), "uint8 array, got dtype float32"),
    "two axes": (GRAY, "shaped (H, W, C), got 2 axes"),
    "two channels": (RGBA[..., :2], "2 channels"),
    "empty": (RGB[:0], "an empty array"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refusals_name_the_item_and_the_problem(name):
    content, words = REFUSED[name]
    with pytest.raises(UFormError) as refusal:
        decode_image(content, 3)
    assert refusal.value.code == ErrorCode.INVALID_ARGUMENT
    assert refusal.value.message.startswith("item 3: ") and words in refusal.value.message, refusal.value.message


def test_the_pixel_limit_is_checked_before_decoding():
    with pytest.raises(UFormError, match=r"item 0: 34 × 21 = 714 pixels, past the limit of 713"):
        decode_image(PNG, max_pixels=713)
    assert decode_image(PNG, max_pixels=714).shape == (21, 34, 4)


def test_other_channel_counts_are_unsupported():
    with pytest.raises(UFormError) as refusal:
        decode_image(PNG, channels=1)
    assert refusal.value.code == ErrorCode.UNSUPPORTED


@pytest.mark.parametrize("name, expected", [("png-rgb", "PNG"), ("jpeg-rgb", "JPEG"), ("webp-lossy-rgb", "WEBP")])
def test_signatures_name_the_format(name, expected):
    assert sniff_format(FILES[name]) == expected
