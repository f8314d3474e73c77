"""Small media files written in the tests themselves, with Pillow and PyAV."""

import io

import av
import numpy as np
from PIL import Image


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
