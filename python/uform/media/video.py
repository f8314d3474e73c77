"""Decoding one VIDEO item to frames: RGB uint8, every ``frame_stride``-th frame.

A VIDEO item is the bytes of an MP4 or WebM file, or an already decoded
``numpy.uint8`` array shaped ``(T, H, W, C)`` with ``C`` 1 (gray), 3 (RGB) or 4
(RGBA). :func:`decode_video` answers ``(frames, H, W, 3)`` uint8 RGB
(``VideoShape.channels`` derives 3, the one count video decodes to):

- **Sampling.** Frames are numbered from 0 in presentation order, the order the
  decoder gives them; frames 0, ``frame_stride``, 2·``frame_stride``, ... are kept.
  An array is sampled the same way along its first axis; its gray is copied into
  R, G and B and its alpha dropped.
- **Files** are read from memory with PyAV, demuxed as the format their signature
  names (:mod:`.formats`), and the first video stream is decoded; each kept frame
  is converted by ``VideoFrame.to_ndarray(format="rgb24")`` (FFmpeg's swscale, the
  stream's own colour matrix). Rotation metadata is not applied. The stream's
  codec must be one of :data:`VIDEO_CODECS`. Every frame has the first one's size.
  :func:`decode_clip` converts only the first frames a caller will use (a training step's
  tubes: ``media.patches.frames_kept``) and counts the rest, which are decoded and checked
  all the same, so a long clip costs the memory of the frames it is cut into.
- **Decompression bombs.** Every decoded frame costs its pixels, kept or not.
  Before decoding, the stream's width × height, times its frame count where the
  container states one, must not pass ``max_pixels`` (:data:`MAX_VIDEO_PIXELS` by
  default); while decoding, a running count of decoded pixels is held to the same
  limit, so a stream that hides its length is stopped as soon as it passes.
  Arrays are already in memory and are not limited.
- **Truncation.** A file cut short is refused. An MP4's top-level boxes must tile
  the file (a box running past its end is a truncated file, a box size under 8
  bytes a corrupt one), checked before demuxing. For a container that holds the
  video stream alone and states its duration (a WebM's segment duration), a clip
  whose last decoded frame ends more than half a frame before that duration is
  refused as truncated. A WebM that also carries audio and is cut at a cluster
  boundary decodes as the shorter clip it now is. Anything else the demuxer or
  decoder rejects is refused as corrupt or truncated.

Refusals (``INVALID_ARGUMENT``, naming the item; see :mod:`.items`): bytes that
are not an MP4 or WebM file (an image, an AVI, a Matroska file, unrecognised
bytes), no video stream, another codec, a corrupt or truncated file, no frames,
frames that change size, too many pixels, and an array that is not uint8, not
four axes, empty, or of another channel count.
"""

from __future__ import annotations

import io

import av
import numpy as np

from ..errors import ErrorCode, UFormError
from .formats import VIDEO_FORMATS
from .items import encoded_format, item_error, uint8_array

MAX_VIDEO_PIXELS = 1 << 28
"""The default limit on decoded frames times pixels per frame of one clip: 268,435,456 (129 frames of 1080p).

Kept frames hold 3 bytes a pixel, so one clip's frames take at most 768 MiB (at ``frame_stride`` 1)."""
VIDEO_CODECS = ("h264", "hevc", "mpeg4", "vp8", "vp9", "av1")
"""The codecs (FFmpeg's names) a VIDEO item's stream may use."""
_DEMUXERS = {"MP4": "mp4", "WEBM": "webm"}
_TRUNCATION_TOLERANCE = 0.5
"""How much of a frame's duration the last frame may end short of the stated duration."""


def _check_arguments(frame_stride: int, channels: int) -> None:
    if channels != 3:
        raise UFormError(ErrorCode.UNSUPPORTED, f"channels: video decodes to 3 (RGB) channels, got {channels}")
    if frame_stride < 1:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"frame_stride: must be positive, got {frame_stride}")


def _check_mp4_boxes(data: bytes, item: int) -> None:
    """Refuses an MP4 whose top-level boxes do not tile the file: cut short, or a box size that makes no sense."""
    offset = 0
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset:offset + 4], "big")
        if size == 1 and offset + 16 <= len(data):
            size = int.from_bytes(data[offset + 8:offset + 16], "big")
        elif size == 0:
            return
        if size < 8:
            raise item_error(item, f"a corrupt MP4 box of {size} bytes at byte {offset}")
        offset += size
    if offset > len(data):
        raise item_error(item, f"a truncated MP4 file: its boxes run to byte {offset} of {len(data)}")


def _rgb(frames: np.ndarray) -> np.ndarray:
    """``(T, H, W, 1|3|4)`` uint8 as ``(T, H, W, 3)``: gray copied to R, G, B; alpha dropped."""
    if frames.shape[-1] == 1:
        return np.repeat(frames, 3, axis=-1)
    return np.ascontiguousarray(frames[..., :3])


def _stated_end(container) -> float | None:
    """Seconds from the container's start to its stated end when the video stream is all it holds, else None."""
    if len(container.streams) != 1 or not container.duration:
        return None
    return container.duration / av.time_base


def _frame_seconds(frame, stream) -> float:
    """How long ``frame`` shows: its own duration, else one frame at the stream's average rate."""
    if frame.duration:
        return float(frame.duration * frame.time_base)
    return float(1 / stream.average_rate) if stream.average_rate else 0.0


def _video_stream(container, item: int, max_pixels: int):
    """The first video stream, its codec and its stated size checked before anything is decoded."""
    if not container.streams.video:
        raise item_error(item, "no video stream")
    stream = container.streams.video[0]
    codec = stream.codec_context.name
    if codec not in VIDEO_CODECS:
        raise item_error(item, f"the {codec} codec; VIDEO items use {', '.join(VIDEO_CODECS)}")
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height * max(stream.frames, 1) > max_pixels:
        raise item_error(item, f"{stream.frames} frames of {width} × {height} pass the limit of {max_pixels} "
                               f"pixels (a decompression bomb?)")
    return stream


def _check_complete(container, stream, last, item: int) -> None:
    """Refuses a clip whose last frame ends short of the duration its container states (module doc)."""
    stated_end = _stated_end(container)
    if stated_end is None:
        return
    start = (container.start_time or 0) / av.time_base
    length = _frame_seconds(last, stream)
    end = float(last.time) - start + length
    if end < stated_end - _TRUNCATION_TOLERANCE * length:
        raise item_error(item, f"truncated: the frames end at {end:.3f} s of the {stated_end:.3f} s the file states")


def _decode_stream(container, item: int, frame_stride: int, max_pixels: int, frames_kept) -> tuple[np.ndarray, int]:
    """The kept RGB frames of ``container``'s first video stream, with every check of the module doc, and how
    many frames the sampling kept (``decode_clip``)."""
    stream = _video_stream(container, item, max_pixels)
    kept, sampled, limit, decoded_pixels, first, last = [], 0, None, 0, None, None
    for index, frame in enumerate(container.decode(stream)):
        decoded_pixels += frame.width * frame.height
        if decoded_pixels > max_pixels:
            raise item_error(item, f"frame {index} passes the limit of {max_pixels} decoded pixels "
                                   f"(a decompression bomb?)")
        if first is None:
            first = frame
            limit = None if frames_kept is None else frames_kept(frame.height, frame.width)
        if (frame.width, frame.height) != (first.width, first.height):
            raise item_error(item, f"frame {index} is {frame.width} × {frame.height}; frame 0 was "
                                   f"{first.width} × {first.height}")
        if index % frame_stride == 0:
            sampled += 1
            if limit is None or len(kept) < limit:
                kept.append(frame.to_ndarray(format="rgb24"))
        last = frame
    if last is None:
        raise item_error(item, "no frames")
    _check_complete(container, stream, last, item)
    return np.stack(kept), sampled


def decode_video(content, item: int = 0, *, frame_stride: int = 1, channels: int = 3,
                 max_pixels: int = MAX_VIDEO_PIXELS) -> np.ndarray:
    """``(frames, H, W, 3)`` uint8 RGB of one VIDEO item, every ``frame_stride``-th frame; see the module doc.

    ``item`` is the item's index in the step, named by every refusal.
    """
    return decode_clip(content, item, frame_stride=frame_stride, channels=channels, max_pixels=max_pixels)[0]


def decode_clip(content, item: int = 0, *, frame_stride: int = 1, channels: int = 3,
                max_pixels: int = MAX_VIDEO_PIXELS, frames_kept=None) -> tuple[np.ndarray, int]:
    """``decode_video``'s frames, of which only the first ``frames_kept(height, width)`` (of the first frame's
    size) are converted to RGB when given, and how many frames the sampling kept in all: the rest are still
    decoded, counted and checked, but a long clip's frames past what its tubes use take no memory."""
    _check_arguments(frame_stride, channels)
    if isinstance(content, np.ndarray):
        sampled = uint8_array(content, item, 4, "(T, H, W, C)", (1, 3, 4))[::frame_stride]
        limit = None if frames_kept is None else frames_kept(sampled.shape[1], sampled.shape[2])
        return _rgb(sampled[:limit]), sampled.shape[0]
    data, form = encoded_format(content, item, "VIDEO", VIDEO_FORMATS, "MP4 or WebM")
    if form == "MP4":
        _check_mp4_boxes(data, item)
    try:
        with av.open(io.BytesIO(data), format=_DEMUXERS[form]) as container:
            return _decode_stream(container, item, frame_stride, max_pixels, frames_kept)
    except UFormError:
        raise
    except Exception as error:
        raise item_error(item, f"a corrupt or truncated {form} file: {error}") from None
