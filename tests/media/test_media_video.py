"""decode_video against PyAV's own decoding of the same files, sampling, and every refusal."""

import io

import av
import numpy as np
import pytest
from media_files import encode_image, encode_video, moving_frames, pyav_frames

from uform.media import decode_video, sniff_format
from uform.errors import ErrorCode, UFormError


@pytest.mark.parametrize("name", ["mp4-h264", "mp4-mpeg4", "webm-vp8"])
@pytest.mark.parametrize("stride", [1, 3])
def test_files_decode_as_pyav_does_every_stride_th_frame(clips, name, stride):
    frames = decode_video(clips[name], frame_stride=stride)
    assert frames.dtype == np.uint8 and frames.shape == (len(range(0, 7, stride)), 48, 64, 3)
    np.testing.assert_array_equal(frames, pyav_frames(clips[name])[::stride])


def test_formats_are_told_by_their_signature(clips):
    assert [sniff_format(clips[name]) for name in ("mp4-h264", "webm-vp8")] == ["MP4", "WEBM"]


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_arrays_become_rgb_every_stride_th_frame(channels):
    array = np.random.default_rng(1).integers(0, 256, (5, 6, 7, channels), dtype=np.uint8)
    frames = decode_video(array, frame_stride=2)
    expected = np.repeat(array, 3, axis=-1) if channels == 1 else array[..., :3]
    np.testing.assert_array_equal(frames, expected[::2])


def audio_only_mp4() -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as file:
        stream = file.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        file.mux(stream.encode(frame))
        file.mux(stream.encode())
    return out.getvalue()


FRAMES = moving_frames(4)


def corrupt_samples(mp4: bytes) -> bytes:
    """``mp4`` with the first 200 bytes of its media data (the ``mdat`` box's body) set to 0xFF."""
    start = mp4.index(b"mdat") + 4
    return mp4[:start] + b"\xff" * 200 + mp4[start + 200:]


def refused_files(clips) -> dict[str, tuple[bytes, str]]:
    mp4, webm = clips["mp4-h264"], clips["webm-vp8"]
    return {
        "a png": (encode_image(FRAMES[0], "PNG"), "a PNG image; VIDEO items hold MP4 or WebM files"),
        "matroska": (encode_video(FRAMES, "matroska", "libx264"), "a Matroska video; VIDEO items hold MP4 or WebM"),
        "avi": (encode_video(FRAMES, "avi", "mpeg4"), "an AVI video"),
        "mjpeg codec": (encode_video(FRAMES, "mp4", "mjpeg", "yuvj420p"), "the mjpeg codec; VIDEO items use h264"),
        "no video stream": (audio_only_mp4(), "no video stream"),
        "truncated mp4": (mp4[:len(mp4) * 3 // 4], "a truncated MP4 file: its boxes run to byte"),
        "zeroed mp4": (mp4[:40] + bytes(len(mp4) - 40), "a corrupt or truncated MP4 file"),
        "corrupt mp4 box": (mp4[:32] + (4).to_bytes(4, "big") + mp4[36:], "a corrupt MP4 box of 4 bytes at byte 32"),
        "corrupt mp4 samples": (corrupt_samples(mp4), "a corrupt or truncated MP4 file"),
        "truncated webm": (webm[:len(webm) * 3 // 4], "truncated: the frames end at"),
        "unrecognised": (b"\x00" * 64, "bytes starting"),
        "text": ("a clip", "VIDEO items are bytes or a uint8 array, got str"),
        "float array": (FRAMES.astype(np.float32), "uint8 array, got dtype float32"),
        "three axes": (FRAMES[0], "shaped (T, H, W, C), got 3 axes"),
        "two channels": (FRAMES[..., :2], "2 channels"),
        "no frames": (FRAMES[:0], "an empty array"),
    }


def test_refusals_name_the_item_and_the_problem(clips):
    for name, (content, words) in refused_files(clips).items():
        with pytest.raises(UFormError) as refusal:
            decode_video(content, 5)
        assert refusal.value.code == ErrorCode.INVALID_ARGUMENT, name
        message = refusal.value.message
        assert message.startswith("item 5: ") and words in message, (name, message)


def test_the_pixel_limit_is_checked_from_the_header_and_while_decoding(clips):
    clip_pixels = 7 * 48 * 64
    with pytest.raises(UFormError, match=r"item 2: 7 frames of 64 × 48 pass the limit"):
        decode_video(clips["mp4-h264"], 2, max_pixels=clip_pixels - 1)
    with pytest.raises(UFormError, match=r"item 2: frame 6 passes the limit of"):
        decode_video(clips["webm-vp8"], 2, max_pixels=clip_pixels - 1)  # WebM states no frame count
    assert decode_video(clips["webm-vp8"], max_pixels=clip_pixels).shape[0] == 7


def test_bad_arguments_are_refused(clips):
    with pytest.raises(UFormError) as refusal:
        decode_video(clips["mp4-h264"], channels=4)
    assert refusal.value.code == ErrorCode.UNSUPPORTED
    with pytest.raises(UFormError, match="frame_stride: must be positive"):
        decode_video(clips["mp4-h264"], frame_stride=0)
