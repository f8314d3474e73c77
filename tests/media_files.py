"""Small media files written in the tests themselves, with Pillow and PyAV."""

import io
import struct
import zlib

import av
import numpy as np
import soundfile
from PIL import Image

import uform


def moving_frames(count: int, height: int = 48, width: int = 64) -> np.ndarray:
    """``(count, height, width, 3)`` uint8: smooth colour ramps that shift with time, cheap to encode."""
    t, y, x = np.meshgrid(np.arange(count), np.arange(height), np.arange(width), indexing="ij")
    return np.stack([(x * 4 + t * 9) % 256, (y * 5 + t * 7) % 256, (x + y + t * 30) % 256], axis=-1).astype(np.uint8)


def encode_image(pixels: np.ndarray, form: str, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, form, **options)
    return out.getvalue()


def encode_video(frames: np.ndarray, container: str, codec: str, pix_fmt: str = "yuv420p",
                 audio: bool = False) -> bytes:
    """The bytes of ``frames`` encoded with ``codec`` in ``container`` at 10 frames a second."""
    out = io.BytesIO()
    with av.open(out, "w", format=container) as file:
        stream = file.add_stream(codec, rate=10)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = pix_fmt
        for frame in frames:
            file.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        file.mux(stream.encode())
    return out.getvalue()


def pyav_frames(data: bytes) -> np.ndarray:
    """Every frame of ``data``'s first video stream as PyAV decodes it to rgb24: the reference."""
    with av.open(io.BytesIO(data)) as file:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in file.decode(video=0)])


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header(width: int, height: int) -> bytes:
    """A PNG claiming ``width`` × ``height`` RGB, with one short IDAT chunk of zeros."""
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(bytes(64))))


def encode_audio(samples: np.ndarray, rate: int, form: str = "WAV", subtype: str | None = None) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=form, subtype=subtype)
    return out.getvalue()


def sample_files(seed: int = 5) -> dict[str, bytes]:
    """Small files of every kind the trainer takes: PNG (with alpha), JPEG, WebP, MP4, WebM, WAV and FLAC."""
    rng = np.random.default_rng(seed)
    pixels = lambda h, w, c=3: rng.integers(0, 256, (h, w, c), dtype=np.uint8)  # noqa: E731
    hum = (0.2 * np.sin(np.arange(900) * 0.3)).astype(np.float32)
    return {
        "png": encode_image(pixels(10, 14, 4), "PNG"), "jpeg": encode_image(pixels(9, 8), "JPEG", quality=90),
        "webp": encode_image(pixels(12, 12), "WEBP", lossless=True),
        "mp4": encode_video(moving_frames(5, 16, 16), "mp4", "libx264"),
        "webm": encode_video(moving_frames(4, 16, 24), "webm", "libvpx"),
        "wav": encode_audio(hum, 8000, "WAV", "FLOAT"), "flac": encode_audio(hum[::-1].copy(), 11025, "FLAC"),
    }


MEDIA_SHAPES = dict(image=uform.ImageShape(patch_side=4), video=uform.VideoShape(patch_side=8),
                    audio=uform.AudioShape(chunk_samples=64, sample_rate=8000))
"""The media geometry of the trainer tests: 4-pixel image patches, 8-pixel tubes of two frames, 64-sample frames."""


def mixed_items(files: dict[str, bytes]):
    """(modalities, contents, relations): captions and media in pairs, text 2k attracting item 2k + 1."""
    M = uform.Modality
    items = [(M.TEXT, "a red square"), (M.IMAGE, files["png"]), (M.TEXT, "a blue dot"), (M.IMAGE, files["jpeg"]),
             (M.TEXT, "green noise"), (M.IMAGE, files["webp"]), (M.TEXT, "colours moving"), (M.VIDEO, files["mp4"]),
             (M.TEXT, "colours drifting"), (M.VIDEO, files["webm"]), (M.TEXT, "a soft hum"), (M.AUDIO, files["wav"]),
             (M.TEXT, "a hum backwards"), (M.AUDIO, files["flac"])]
    partners = [i ^ 1 for i in range(len(items))]
    return [m for m, _ in items], [c for _, c in items], uform.Relations(attract=(np.arange(len(items) + 1), partners))
