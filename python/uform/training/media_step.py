"""The media items of a step: prepared on the decode pool, then placed among the packed tokens.

An IMAGE, VIDEO or AUDIO item enters the encoder as one segment of tokens, one per patch (image),
tube (video) or frame (audio); ``uform.media`` cuts them (``docs/media.md``, ``docs/audio.md``),
at most a row's ``max_columns_per_row`` of them. Each token's input is its modality's embedding
row (``vocabulary.IMAGE_TOKEN`` …) plus its *patch embedding*, a linear map of its pixels or
samples, and of its absolute position (:func:`position_features`); a token the masked objective
hides shows its modality's mask row and its position, and its modality's reconstruction head
predicts its normalised pixels or samples (MAE's target) from the final hidden state. Rotary
positions have three axes (time, row, column): an image patch sits at (0, row, column), a video
tube at (time, row, column), an audio frame at (f, f, f) and a text byte at (p, p, p), which rotates
exactly as one-axis positions do.

Rotary positions are relative, and a mean over a segment's states cannot say where in an image a
thing lies; the absolute features let it (``docs/encoder.md``, "Media tokens", has the measurement).
Within a media segment the shown tokens are packed first and the hidden ones after them, so that
the pooled embedding, the mean over the segment's first ``StepBatch.segment_lengths`` positions,
is the mean of the tokens that show content.

:func:`submit_items` starts decoding and cutting a step's media items on a
:class:`uform.media.DecodePool` and answers at once, so a step's decoding can run while the device
works on the step before it;
:func:`place_media` runs after packing: it draws each item's mask (keyed by seed, step and item,
``uform.media.mask_patches``), writes the token ids of the packed grid, and gathers the rows the
model reads into a :class:`MediaBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache, partial

import numpy as np

from ..media import mask_patches, prepare_image, prepare_video
from ..media.audio import prepare_audio, sample_targets
from ..media.patches import grid_positions, pixel_inputs, pixel_targets
from ..media.pool import DecodeJob, DecodePool
from .config import BatchShape, Masking
from .enums import Modality
from .packing import Packed
from .vocabulary import AUDIO_MASK, AUDIO_TOKEN, IMAGE_MASK, IMAGE_TOKEN, VIDEO_MASK, VIDEO_TOKEN

POSITION_AXES = 3
"""Rotary position columns of every encoder token: time, row, column."""
POSITION_FREQUENCIES = 8
"""Frequencies of each axis's absolute position features: periods 4, 8, …, 512 positions."""


def position_features(positions: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``(tokens, 2·POSITION_FREQUENCIES·len(axes))`` float32: for each of the ``axes`` of the ``(tokens, 3)``
    rotary positions (0 time, 1 row, 2 column) and each k < POSITION_FREQUENCIES, ``sin(p·ω_k)`` then
    ``cos(p·ω_k)`` with ``ω_k = π / 2^(k+1)``, computed in float64 (the angle reduced to one period first,
    where it is exact) and rounded to float32. Positions 512 apart get the same features (rotary positions still
    tell them apart), so each axis reads one row of :func:`_position_table` per position."""
    return _position_table()[positions[:, list(axes)] % POSITION_PERIOD].reshape(len(positions), -1)


POSITION_PERIOD = 2 ** (POSITION_FREQUENCIES + 1)
"""The longest period of the absolute position features, in positions: every period divides it."""


@lru_cache(maxsize=1)
def _position_table() -> np.ndarray:
    """``(POSITION_PERIOD, 2·POSITION_FREQUENCIES)`` float32: one axis's features at positions 0 … period − 1."""
    periods = 2.0 ** (np.arange(POSITION_FREQUENCIES) + 2)
    p = np.arange(POSITION_PERIOD, dtype=np.float64)[:, None]
    angles = 2 * np.pi * (np.mod(p, periods) / periods)
    table = np.stack([np.sin(angles), np.cos(angles)], -1).reshape(POSITION_PERIOD, -1).astype(np.float32)
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class MediaKind:
    """What the encoder keeps per media modality: its tensor name prefix, token ids and masking fields."""

    modality: Modality
    name: str
    token: int
    mask_token: int
    position_axes: tuple[int, ...]
    """The rotary axes its tokens' absolute position features read (0 time, 1 row, 2 column)."""

    @property
    def position_width(self) -> int:
        """The absolute position features one token carries after its values."""
        return 2 * POSITION_FREQUENCIES * len(self.position_axes)

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
    MediaKind(Modality.IMAGE, "image", IMAGE_TOKEN, IMAGE_MASK, position_axes=(1, 2)),
    MediaKind(Modality.VIDEO, "video", VIDEO_TOKEN, VIDEO_MASK, position_axes=(0, 1, 2)),
    MediaKind(Modality.AUDIO, "audio", AUDIO_TOKEN, AUDIO_MASK, position_axes=(0,)),
)
KIND_OF = {kind.modality: kind for kind in MEDIA_KINDS}
KIND_NAMED = {kind.name: kind for kind in MEDIA_KINDS}


def media_geometry(batch: BatchShape) -> tuple[tuple[str, int], ...]:
    """(name, token width) of each media modality a (derived) batch shape trains, in MEDIA_KINDS order."""
    return tuple((kind.name, kind.width(batch)) for kind in MEDIA_KINDS if kind.width(batch) > 0)


@dataclass(frozen=True, eq=False)
class MediaItem:
    """One prepared media item: a token per patch, tube or frame, its values as decoded (the conversion to what
    the model reads is :func:`place_media`'s, once for a whole step)."""

    values: np.ndarray
    """``(tokens, width)``: uint8 pixels of each patch or tube, or float32 samples of each frame."""
    positions: np.ndarray
    """``(tokens, 3)`` int32: (time, row, column) of each token."""
    truncated: bool
    """Whether a clip or recording was cut to fit a row."""

    @property
    def count(self) -> int:
        return int(self.values.shape[0])


def model_inputs(values: np.ndarray, out: np.ndarray) -> None:
    """Writes into ``out`` (tokens, width) float32 what the patch embedding reads of ``values``: pixels / 255 in
    [0, 1] (``pixel_inputs``), or the samples as they are."""
    if values.dtype == np.uint8:
        pixel_inputs(values, out)
    else:
        out[...] = values


def reconstruction_targets(values: np.ndarray) -> np.ndarray:
    """``(tokens, width)`` float32 MAE targets of the tokens' values: each normalised by its own mean and
    variance (pixels as pixel / 255)."""
    return pixel_targets(values) if values.dtype == np.uint8 else sample_targets(values)


def prepare_item(modality: int, content, item: int, *, batch: BatchShape) -> MediaItem:
    """Decode and cut one media item for the run's (derived) batch shape; refusals name the item."""
    room = batch.max_columns_per_row
    if modality == Modality.AUDIO:
        frames = prepare_audio(content, item, shape=batch.audio, max_frames=room)
        return MediaItem(frames.frames, _frame_positions(len(frames.frames)), bool(frames.truncated))
    if modality == Modality.IMAGE:
        patches = prepare_image(content, item, shape=batch.image, max_patches=room)
        positions = _image_positions(patches.grid)
    else:
        patches = prepare_video(content, item, shape=batch.video, max_tubes=room)
        positions = patches.positions
    return MediaItem(patches.blocks, positions, bool(patches.truncated))


@lru_cache(maxsize=256)
def _image_positions(grid: tuple[int, int]) -> np.ndarray:
    """``(rows·columns, 3)`` int32 (0, row, column) of an image grid's patches, one read-only array per grid."""
    patches = grid_positions(*grid)
    positions = np.concatenate([np.zeros((len(patches), 1), np.int32), patches], 1)
    positions.flags.writeable = False
    return positions


@lru_cache(maxsize=256)
def _frame_positions(count: int) -> np.ndarray:
    """``(count, 3)`` int32 (f, f, f) of an audio item's frames, one read-only array per count."""
    positions = np.repeat(np.arange(count, dtype=np.int32)[:, None], POSITION_AXES, 1)
    positions.flags.writeable = False
    return positions


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
    prepare = partial(_prepare_step_item, modalities=np.asarray(modalities), batch=batch)
    return PendingMedia(items, pool.submit(prepare, [contents[i] for i in items], items))


def _prepare_step_item(content, item: int, *, modalities: np.ndarray, batch: BatchShape):
    """:func:`prepare_item` of a step's item ``item`` of ``modalities`` (a module-level function, so that a pool of
    processes can run it)."""
    return prepare_item(int(modalities[item]), content, item, batch=batch)


def media_tokens(item: MediaItem, kind: MediaKind) -> np.ndarray:
    """The token ids a media item packs as: its modality's id per token (masks are drawn after packing)."""
    return np.full(item.count, kind.token, np.int32)


@dataclass
class ModalityRows:
    """One modality's rows in a step, in packed order."""

    inputs: np.ndarray
    """``(tokens, width + position width)`` float32: every token's values (zeros for a hidden token), then its
    absolute position features: what the patch and position embeddings read."""
    tokens: np.ndarray
    """``(tokens,)`` int32: the flat token index of each."""
    targets: np.ndarray
    """``(hidden, width)`` float32: the reconstruction targets of the hidden tokens."""
    hidden: np.ndarray
    """``(hidden,)`` int32: the flat token index of each hidden token."""


@dataclass
class MediaBatch:
    """A step's media as the model reads it."""

    row_of: np.ndarray
    """``(tokens,)`` int32: each token's row in the inputs of every modality stacked in ``MEDIA_KINDS`` order,
    −1 for text and padding."""
    hidden_of_segment: np.ndarray
    """``(segments,)`` int32: the hidden tokens each packed segment ends with (0 for text)."""
    modalities: dict[str, ModalityRows] = field(default_factory=dict)
    truncated: int = 0

    @property
    def hidden_tokens(self) -> np.ndarray:
        """The flat token index of every hidden token, of every modality."""
        return np.concatenate([rows.hidden for rows in self.modalities.values()]) if self.modalities else \
            np.empty(0, np.int32)


def place_media(packed: Packed, tokens: np.ndarray, positions: np.ndarray, modalities: np.ndarray,
                items: dict[int, MediaItem], masking: Masking | None, seed: int, step: int) -> MediaBatch:
    """Draw every packed media item's mask (``masking`` None: nothing hidden), write its token ids into
    ``tokens`` and its positions into ``positions`` (flat views of the grid), the shown tokens first and the
    hidden ones after them, and gather its rows: each modality's values converted, position features computed
    and hidden targets normalised in one call over the whole step."""
    ends = np.cumsum(packed.segment_length)
    starts = ends - packed.segment_length
    row_of = np.full(tokens.size, -1, np.int32)
    batch = MediaBatch(row_of=row_of, hidden_of_segment=np.zeros(len(packed.item_of_segment), np.int32))
    stacked = 0
    for kind in MEDIA_KINDS:
        segments = np.flatnonzero(modalities[packed.item_of_segment] == kind.modality)
        if not segments.size:
            continue
        placed = [items[int(packed.item_of_segment[segment])] for segment in segments]
        counts = packed.segment_length[segments].astype(np.int64)
        owner = np.repeat(np.arange(segments.size), counts)  # each token's segment among this kind's
        masked = np.concatenate([
            mask_patches(int(count), kind.mask_ratio(masking), seed, step, int(packed.item_of_segment[segment]))
            for segment, count in zip(segments, counts)]) if masking is not None else np.zeros(owner.size, bool)
        first = np.cumsum(counts) - counts  # each segment's first token among this kind's
        slots = packed.flat[np.repeat(starts[segments] - first, counts) + np.arange(owner.size)]
        values = np.concatenate([item.values for item in placed])
        token_positions = np.concatenate([item.positions for item in placed])
        if masked.any():  # the source of each slot: within a segment, its shown tokens in order, then its hidden ones
            source = np.lexsort((masked, owner))
            values, token_positions, hidden_slot = values[source], token_positions[source], masked[source]
        else:
            hidden_slot = masked
        positions[slots] = token_positions
        tokens[slots[hidden_slot]] = kind.mask_token
        width = values.shape[1]
        inputs = np.empty((owner.size, width + kind.position_width), np.float32)
        model_inputs(values, inputs[:, :width])
        inputs[hidden_slot, :width] = 0.0
        inputs[:, width:] = position_features(token_positions, kind.position_axes)
        rows = ModalityRows(inputs=inputs, tokens=slots.astype(np.int32),
                            targets=reconstruction_targets(values[hidden_slot]),
                            hidden=slots[hidden_slot].astype(np.int32))
        batch.hidden_of_segment[segments] = np.bincount(owner[masked], minlength=segments.size)
        batch.truncated += sum(item.truncated for item in placed)
        row_of[rows.tokens] = stacked + np.arange(rows.tokens.size, dtype=np.int32)
        stacked += rows.tokens.size
        batch.modalities[kind.name] = rows
    return batch
