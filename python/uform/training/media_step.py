"""The media items of a step: prepared on the decode pool, then placed among the packed tokens.

An IMAGE, VIDEO or AUDIO item enters the encoder as one segment of tokens, one per patch (image),
tube (video) or frame (audio); ``uform.media`` cuts them (``docs/media.md``, ``docs/audio.md``),
at most a row's ``max_columns_per_row`` of them. Each token's input is its modality's embedding
row (``vocabulary.IMAGE_TOKEN`` …) plus its *patch embedding*, a linear map of its pixels or
samples; a token the masked objective hides shows its modality's mask row instead, and the
modality's reconstruction head predicts its normalised pixels or samples (MAE's target) from the
final hidden state. Rotary positions have three axes (time, row, column): an image patch sits at
(0, row, column), a video tube at (time, row, column), an audio frame at (f, f, f) and a text byte
at (p, p, p), which rotates exactly as one-axis positions do.

:func:`submit_items` starts decoding and cutting a step's media items on a
:class:`uform.media.DecodePool` and answers at once, so a step's decoding can run while the device
works on the step before it;
:func:`place_media` runs after packing: it draws each item's mask (keyed by seed, step and item,
``uform.media.mask_patches``), writes the token ids of the packed grid, and gathers the rows the
model reads into a :class:`MediaBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..media import mask_patches, prepare_image, prepare_video
from ..media.audio import prepare_audio
from ..media.pool import DecodeJob, DecodePool
from .config import BatchShape, Masking
from .enums import Modality
from .packing import Packed
from .vocabulary import AUDIO_MASK, AUDIO_TOKEN, IMAGE_MASK, IMAGE_TOKEN, VIDEO_MASK, VIDEO_TOKEN

POSITION_AXES = 3
"""Rotary position columns of every encoder token: time, row, column."""


@dataclass(frozen=True)
class MediaKind:
    """What the encoder keeps per media modality: its tensor name prefix, token ids and masking fields."""

    modality: Modality
    name: str
    token: int
    mask_token: int

    def width(self, batch: BatchShape) -> int:
        """The values one token carries (pixels of a patch or tube, samples of a frame); 0 leaves it out."""
        if self.modality == Modality.IMAGE:
            shape = batch.image
            return shape.patch_side ** 2 * shape.channels if shape and shape.patch_side else 0
        if self.modality == Modality.VIDEO:
            shape = batch.video
            return shape.tube_frames * shape.patch_side ** 2 * shape.channels if shape and shape.patch_side else 0
        shape = batch.audio
        return shape.chunk_samples if shape and shape.chunk_samples else 0

    def mask_ratio(self, masking: Masking) -> float:
        return getattr(masking, f"{self.name}_mask_ratio")

    def weight(self, masking: Masking) -> float:
        return getattr(masking, f"{self.name}_weight")


MEDIA_KINDS = (
    MediaKind(Modality.IMAGE, "image", IMAGE_TOKEN, IMAGE_MASK),
    MediaKind(Modality.VIDEO, "video", VIDEO_TOKEN, VIDEO_MASK),
    MediaKind(Modality.AUDIO, "audio", AUDIO_TOKEN, AUDIO_MASK),
)
KIND_OF = {kind.modality: kind for kind in MEDIA_KINDS}


def media_geometry(batch: BatchShape) -> tuple[tuple[str, int], ...]:
    """(name, token width) of each media modality a (derived) batch shape trains, in MEDIA_KINDS order."""
    return tuple((kind.name, kind.width(batch)) for kind in MEDIA_KINDS if kind.width(batch) > 0)


@dataclass(frozen=True, eq=False)
class MediaItem:
    """One prepared media item: a token per patch, tube or frame."""

    inputs: np.ndarray
    """``(tokens, width)`` float32: pixels in [0, 1] or samples, what the patch embedding reads."""
    targets: np.ndarray
    """``(tokens, width)`` float32: the normalised pixels or samples the reconstruction head predicts."""
    positions: np.ndarray
    """``(tokens, 3)`` int32: (time, row, column) of each token."""
    truncated: bool
    """Whether a clip or recording was cut to fit a row."""


def prepare_item(modality: int, content, item: int, *, batch: BatchShape) -> MediaItem:
    """Decode and cut one media item for the run's (derived) batch shape; refusals name the item."""
    room = batch.max_columns_per_row
    if modality == Modality.AUDIO:
        frames = prepare_audio(content, item, shape=batch.audio, max_frames=room)
        positions = np.repeat(frames.positions.astype(np.int32)[:, None], POSITION_AXES, 1)
        return MediaItem(frames.frames, frames.targets, positions, bool(frames.truncated))
    if modality == Modality.IMAGE:
        patches = prepare_image(content, item, shape=batch.image, max_patches=room)
        positions = np.concatenate([np.zeros((patches.count, 1), np.int32), patches.positions], 1)
    else:
        patches = prepare_video(content, item, shape=batch.video, max_tubes=room)
        positions = patches.positions
    return MediaItem(patches.inputs, patches.targets, positions.astype(np.int32), bool(patches.truncated))


@dataclass
class PendingMedia:
    """A step's media items being prepared on the decode pool."""

    items: list[int]
    job: DecodeJob | None

    def result(self) -> dict[int, MediaItem]:
        """Every media item prepared, by item index; the first refusal (in item order) raises."""
        return dict(zip(self.items, self.job.result())) if self.job is not None else {}


@dataclass
class PreparedMedia:
    """A step's media items prepared already, by item index."""

    items: dict[int, MediaItem]

    def result(self) -> dict[int, MediaItem]:
        return self.items


def submit_items(modalities: np.ndarray, contents: list, batch: BatchShape, pool: DecodePool) -> PendingMedia:
    """Start preparing every media item of a step on the pool; answers at once."""
    items = [int(i) for i in np.flatnonzero(modalities != Modality.TEXT)]
    if not items:
        return PendingMedia([], None)

    def prepare(content, item):
        return prepare_item(int(modalities[item]), content, item, batch=batch)

    return PendingMedia(items, pool.submit(prepare, [contents[i] for i in items], items))


def media_tokens(item: MediaItem, kind: MediaKind) -> np.ndarray:
    """The token ids a media item packs as: its modality's id per token (masks are drawn after packing)."""
    return np.full(item.inputs.shape[0], kind.token, np.int32)


@dataclass
class ModalityRows:
    """One modality's rows in a step, in packed order."""

    inputs: np.ndarray
    """``(visible, width)`` float32: the inputs of the tokens shown."""
    visible: np.ndarray
    """``(visible,)`` int32: the flat token index of each shown token."""
    targets: np.ndarray
    """``(hidden, width)`` float32: the reconstruction targets of the hidden tokens."""
    hidden: np.ndarray
    """``(hidden,)`` int32: the flat token index of each hidden token."""


@dataclass
class MediaBatch:
    """A step's media as the model reads it."""

    row_of: np.ndarray
    """``(tokens,)`` int32: each token's row in the shown inputs of every modality stacked in
    ``MEDIA_KINDS`` order, −1 for text, padding and hidden tokens."""
    modalities: dict[str, ModalityRows] = field(default_factory=dict)
    truncated: int = 0


def place_media(packed: Packed, tokens: np.ndarray, positions: np.ndarray, modalities: np.ndarray,
                items: dict[int, MediaItem], masking: Masking | None, seed: int, step: int) -> MediaBatch:
    """Draw every packed media item's mask (``masking`` None: nothing hidden), write its token ids into
    ``tokens`` and its positions into ``positions`` (flat views of the grid), and gather its rows."""
    ends = np.cumsum(packed.segment_length)
    starts = ends - packed.segment_length
    row_of = np.full(tokens.size, -1, np.int32)
    batch = MediaBatch(row_of=row_of)
    shown_before = 0
    for kind in MEDIA_KINDS:
        inputs, visible, targets, hidden = [], [], [], []
        for segment, item in enumerate(packed.item_of_segment):
            if modalities[item] != kind.modality:
                continue
            prepared = items[int(item)]
            flat = packed.flat[starts[segment]:ends[segment]]
            positions[flat] = prepared.positions
            count = flat.size
            masked = (mask_patches(count, kind.mask_ratio(masking), seed, step, int(item))
                      if masking is not None else np.zeros(count, bool))
            tokens[flat[masked]] = kind.mask_token
            inputs.append(prepared.inputs[~masked])
            visible.append(flat[~masked])
            targets.append(prepared.targets[masked])
            hidden.append(flat[masked])
            batch.truncated += prepared.truncated
        if not inputs:
            continue
        rows = ModalityRows(inputs=np.concatenate(inputs), visible=np.concatenate(visible).astype(np.int32),
                            targets=np.concatenate(targets), hidden=np.concatenate(hidden).astype(np.int32))
        row_of[rows.visible] = shown_before + np.arange(rows.visible.size, dtype=np.int32)
        shown_before += rows.visible.size
        batch.modalities[kind.name] = rows
    return batch
