"""Cutting decoded pixels into the patches and tubes the encoder reads, with their targets and positions.

**Images** (``(H, W, C)`` uint8 from :func:`.images.decode_image`) keep their
native resolution and aspect: no square crop, no fixed size.

1. *Grid.* With patch side ``p``, an image is ``ceil(H / p)`` rows by
   ``ceil(W / p)`` columns of patches, read in row-major order (row 0 left to
   right, then row 1, ...). The last row and column are padded past the image
   with zero pixels (0 in every channel, alpha included, so padding is
   transparent black). Padded pixels are part of their patch like any other: in
   the input, in the target's mean and variance, and in the loss.
2. *Downscale (NaViT-style).* When the grid holds more patches than the room
   given (``max_patches``, a row's ``max_columns_per_row`` positions), the image is
   resized by the largest factor ``s`` whose grid fits, aspect kept:
   ``s = max over r = 1..max_patches of min(r·p / H, floor(max_patches / r)·p / W)``
   (r rows and as many columns as the room leaves them: the optimum lies on such
   a grid). The new size is found in integers: ``(r·p, floor(r·p·W / H))`` when the
   rows bind, ``(floor(c·p·H / W), c·p)`` when the columns do, each side at least 1,
   so rounding only shrinks it and its grid of at most ``r × c`` always fits -- no
   adjustment step is needed. The resize is Pillow's ``BICUBIC`` (an antialiased
   convolution when shrinking; RGBA is resized premultiplied by its alpha).

**Video** (``(T, H, W, C)`` uint8 from :func:`.video.decode_video`) is cut into
tubes of ``tube_frames`` frames × ``p`` × ``p`` pixels.

1. Frames are grouped by ``tube_frames`` into time slices; a clip whose frame count
   is not a multiple is padded by repeating its last frame. Each slice is a grid of
   ``ceil(H / p) × ceil(W / p)`` tubes, padded spatially with zeros like an image.
   Tubes are read time slice by time slice, row-major within a slice.
2. If one slice alone holds more tubes than the room, every frame is downscaled by
   the image rule with the room as the bound, so one slice fits.
3. A clip whose slices do not all fit keeps its first ``floor(room / tubes per
   slice)`` slices (their frames, before any padding) and is reported as
   truncated; nothing else of a too-long clip is sampled.

**Values.** Each patch is flattened in ``(y, x, c)`` order and each tube in
``(t, y, x, c)`` order (time outermost, channel innermost), so input ``k`` of a
patch is its pixel ``(y, x)`` channel ``c`` at ``k = (y·p + x)·C + c`` (plus
``t·p·p·C`` in a tube). The model input is ``float32(pixel) / 255`` in [0, 1]. The
reconstruction target is MAE's per-patch normalised pixels: with ``v`` the patch's
inputs (every pixel and channel of it, padding included),
``target = (v − mean(v)) / sqrt(var(v) + 1e-6)``, the variance the population
one (divided by the count, not count − 1), computed in float64 and stored float32.

**Positions** are int32 per patch: ``(row, column)`` for images and
``(time, row, column)`` for video, ``time`` counting slices.

:func:`image_patches` and :func:`video_tubes` answer one :class:`Patches` per item,
every step a numpy array operation (reshapes and transposes, no per-pixel loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from PIL import Image

from ..errors import ErrorCode, UFormError
from .items import normalised_targets

RESAMPLING = Image.Resampling.BICUBIC
"""The Pillow filter a too-large image or frame is downscaled with."""


@dataclass(frozen=True, eq=False)
class Patches:
    """One item cut into patches (an image) or tubes (a video): what the encoder reads and reconstructs.
    :attr:`inputs` and :attr:`targets` are computed from :attr:`blocks` when first read: a step converts the
    pixels of all its items at once, and a contrastive one never needs the targets."""

    blocks: np.ndarray
    """``(count, width)`` uint8: each patch's pixels, flattened ``(t, y, x, c)``."""
    positions: np.ndarray
    """``(count, 2)`` int32 ``(row, column)`` for an image, ``(count, 3)`` ``(time, row, column)`` for a video."""
    grid: tuple[int, ...]
    """``(rows, columns)`` for an image, ``(times, rows, columns)`` for a video; their product is ``count``."""
    size: tuple[int, int]
    """``(height, width)`` of the pixels cut, after any downscale."""
    source_size: tuple[int, int]
    """``(height, width)`` as decoded."""
    frames: int
    """Frames cut, before the last tube's padding; 1 for an image."""
    source_frames: int
    """Frames decoded (after ``frame_stride``); 1 for an image."""

    @cached_property
    def inputs(self) -> np.ndarray:
        """``(count, width)`` float32 in [0, 1]: each patch's pixels / 255."""
        return pixel_inputs(self.blocks)

    @cached_property
    def targets(self) -> np.ndarray:
        """``(count, width)`` float32: each patch's pixels normalised by its own mean and variance."""
        return pixel_targets(self.blocks)

    @property
    def count(self) -> int:
        return int(self.blocks.shape[0])

    @property
    def downscaled(self) -> bool:
        return self.size != self.source_size

    @property
    def truncated(self) -> bool:
        return self.frames < self.source_frames


def _check_geometry(patch_side: int, max_patches: int) -> None:
    for name, value in (("patch_side", patch_side), ("max_patches", max_patches)):
        if value < 1:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: must be positive, got {value}")


def _grid(height: int, width: int, patch_side: int) -> tuple[int, int]:
    return -(-height // patch_side), -(-width // patch_side)


def fitted_size(height: int, width: int, patch_side: int, max_patches: int) -> tuple[int, int]:
    """``(height, width)`` an image is cut at: its own if its grid fits ``max_patches``, else the downscale."""
    _check_geometry(patch_side, max_patches)
    rows, columns = _grid(height, width, patch_side)
    if rows * columns <= max_patches:
        return height, width
    r = np.arange(1, max_patches + 1, dtype=np.int64)
    c = max_patches // r
    rows_bind = r * width <= c * height  # r·p / H <= c·p / W
    scale = np.where(rows_bind, r * patch_side / height, c * patch_side / width)
    best = int(np.argmax(scale))
    r, c = int(r[best]), int(c[best])
    if rows_bind[best]:
        fitted = r * patch_side, r * patch_side * width // height
    else:
        fitted = c * patch_side * height // width, c * patch_side
    return max(fitted[0], 1), max(fitted[1], 1)


def _resized(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``(H, W, 3 or 4)`` uint8 resized to ``size`` = ``(height, width)`` with :data:`RESAMPLING`."""
    if pixels.shape[:2] == size:
        return pixels
    return np.asarray(Image.fromarray(pixels).resize((size[1], size[0]), RESAMPLING))


def _padded(pixels: np.ndarray, rows: int, columns: int, patch_side: int) -> np.ndarray:
    """``(..., H, W, C)`` zero-padded to ``(..., rows·p, columns·p, C)``."""
    *lead, height, width, channels = pixels.shape
    padded = np.zeros((*lead, rows * patch_side, columns * patch_side, channels), np.uint8)
    padded[..., :height, :width, :] = pixels
    return padded


def pixel_inputs(blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``(count, width)`` uint8 patches as the encoder reads them: float32 pixel / 255 (into ``out`` when given)."""
    return np.divide(blocks, np.float32(255), out=out, dtype=np.float32)


def pixel_targets(blocks: np.ndarray) -> np.ndarray:
    """``(count, width)`` uint8 patches' reconstruction targets: pixel / 255 normalised per patch."""
    return normalised_targets(blocks / 255.0)


@lru_cache(maxsize=256)
def grid_positions(*extents: int) -> np.ndarray:
    """``(product, len(extents))`` int32: every index of the grid, the last axis fastest (one read-only array
    per grid, shared by every item cut to it)."""
    axes = np.meshgrid(*(np.arange(extent, dtype=np.int32) for extent in extents), indexing="ij")
    positions = np.stack([axis.reshape(-1) for axis in axes], axis=1)
    positions.flags.writeable = False
    return positions


def image_patches(pixels: np.ndarray, patch_side: int, max_patches: int) -> Patches:
    """One image's patches, at most ``max_patches`` of them; see the module doc."""
    height, width, channels = pixels.shape
    size = fitted_size(height, width, patch_side, max_patches)
    rows, columns = _grid(*size, patch_side)
    padded = _padded(_resized(pixels, size), rows, columns, patch_side)
    blocks = (padded.reshape(rows, patch_side, columns, patch_side, channels)
              .transpose(0, 2, 1, 3, 4)
              .reshape(rows * columns, patch_side * patch_side * channels))
    return Patches(blocks=blocks, positions=grid_positions(rows, columns), grid=(rows, columns),
                   size=size, source_size=(height, width), frames=1, source_frames=1)


def frames_kept(height: int, width: int, patch_side: int, tube_frames: int, max_tubes: int) -> int:
    """The most frames of height × width that ``video_tubes`` cuts into at most ``max_tubes`` tubes: what a
    decoder need convert of a longer clip (``media.video.decode_clip``)."""
    rows, columns = _grid(*fitted_size(height, width, patch_side, max_tubes), patch_side)
    return max_tubes // (rows * columns) * tube_frames


def video_tubes(frames: np.ndarray, patch_side: int, tube_frames: int, max_tubes: int,
                source_frames: int | None = None) -> Patches:
    """One clip's tubes, at most ``max_tubes`` of them; see the module doc. ``source_frames``: how many frames
    the clip had, when ``frames`` holds only its first ``frames_kept`` (default: ``len(frames)``)."""
    if tube_frames < 1:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"tube_frames: must be positive, got {tube_frames}")
    _, height, width, channels = frames.shape
    count = frames.shape[0] if source_frames is None else source_frames
    size = fitted_size(height, width, patch_side, max_tubes)
    rows, columns = _grid(*size, patch_side)
    times = min(-(-count // tube_frames), max_tubes // (rows * columns))
    kept = min(count, times * tube_frames)
    resized = np.stack([_resized(frame, size) for frame in frames[:kept]])
    repeated = np.concatenate([resized, np.repeat(resized[-1:], times * tube_frames - kept, axis=0)])
    padded = _padded(repeated, rows, columns, patch_side)
    blocks = (padded.reshape(times, tube_frames, rows, patch_side, columns, patch_side, channels)
              .transpose(0, 2, 4, 1, 3, 5, 6)
              .reshape(times * rows * columns, tube_frames * patch_side * patch_side * channels))
    return Patches(blocks=blocks, positions=grid_positions(times, rows, columns),
                   grid=(times, rows, columns), size=size, source_size=(height, width), frames=kept,
                   source_frames=count)
