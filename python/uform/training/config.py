"""The run's configuration: keyword-built frozen structures where every zero derives.

Each class mirrors one C struct (``uform_batch_shape_t``, ``uform_masking_t``,
...) field by field, so a field left out is zero and the library derives it.
``derived()`` answers the copy with every derivable zero replaced; the tables
below are the documented defaults. A zero always derives: a field cannot be set
to exactly zero where a default exists (pass a tiny value instead).

Defaults:

- ``ImageShape`` (defined in ``uform.media.config``, beside the code that cuts
  images, as are the other two): ``channels`` 4 (RGBA end to end). A zero
  ``patch_side`` leaves images out of the run.
- ``VideoShape``: ``tube_frames`` 2, ``frame_stride`` 1, ``channels`` 3. A zero
  ``patch_side`` leaves video out.
- ``AudioShape``: ``sample_rate`` 16000. A zero ``chunk_samples`` leaves audio out.
- ``BatchShape``: nothing derives; rows, segments and columns are refused at zero.
  A zero ``max_bags_per_device`` keeps every item its own routing unit, a zero
  ``max_choices_per_item`` makes no choices. A missing nested shape derives to
  the zero shape, which leaves that modality out.
- ``Masking``: 0.15 of text positions covered, spans of mean 16 bytes, of those
  0.8 shown as MASK and 0.1 as a random byte; 0.75 of image patches, video tubes
  and audio frames masked; every head weighs 1.
- ``Contrastive``: no Matryoshka prefixes (the full width alone), one temperature
  group, ``pair_loss`` SIGMOID (``DERIVED`` is the sigmoid form for pooled
  embeddings); ``inverse_temperature`` 10 and ``bias`` -10 under SIGMOID (SigLIP's
  start), else 1 and 0; ``ambient_repulsion_weight`` 1; ``max_edges_per_device``
  the batch's ``max_segments_per_device``.
- ``LateInteraction``: ``weight`` does not derive (zero trains no token head);
  ``width`` 128, ``inverse_temperature`` 1, ``bias`` 0, ``max_query_span`` 64,
  ``max_query_tokens_per_device`` ``max_query_span`` for every segment,
  ``max_documents_per_device`` the batch's segments, ``max_document_tokens_per_device``
  the batch's tokens (rows times columns), ``pair_loss`` RANKED (``DERIVED`` is the
  ranked form for token vectors).
- ``Choices``: the seed names the struct but none of its fields; the one field
  every binding uses is ``weight`` (``choices: { weight: 1 }`` in the JavaScript
  seed), so that is the one field here. Zero trains no choices; it does not derive.
- ``Schedule``: peak 5e-4, floor 1e-5, warmup ``min(steps // 10, 400)``; ``steps``
  never derives and zero is refused; ``gradient_clip_norm`` zero clips nothing.

:func:`validate_run` checks a whole run before anything is built and answers a
:class:`DerivedRun` holding every config derived. It checks every config, whether
or not the objective reads it, so a mistake surfaces before it matters.
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass, fields, replace
from typing import Any, Iterable

import numpy as np

from ..media.config import AudioShape, ImageShape, VideoShape
from ..nn.resident import MAX_LEARNING_RATE
from .enums import Negatives, Objective, PairLossForm
from ..errors import ErrorCode, UFormError

MAX_MATRYOSHKA_DIMENSIONS = 8
"""Matryoshka prefix widths a run scores at most."""
WIDTH_ALIGNMENT = 8
"""Every Matryoshka width and the late-interaction width are multiples of this."""
MAX_SCALE = 1e6
"""The largest loss weight, inverse temperature or |bias| a run accepts: far past any useful value, and small
enough that the products a step forms of them stay finite in float32."""
FLOAT32_MAX = float(np.finfo(np.float32).max)
HIDDEN_ALIGNMENT = 128
"""The embedding width is a multiple of this: whole attention heads of 64."""


def _invalid(name: str, message: str) -> UFormError:
    return UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: {message}")


def _as_enum(enum: type, name: str, value: Any):
    try:
        return enum(value)
    except ValueError:
        raise _invalid(name, f"{value!r} is not a {enum.__name__}") from None


def _derive(config, defaults: dict[str, Any]):
    """``config`` with each zero field named in ``defaults`` replaced by its default."""
    return replace(config, **{name: getattr(config, name) or default for name, default in defaults.items()})


def _as_shape(shape_type: type, name: str, value):
    """A nested shape from the shape itself, None, or a tuple of its leading fields in order."""
    if value is None or isinstance(value, shape_type):
        return value
    if isinstance(value, (tuple, list)):
        names = [f.name for f in fields(shape_type)]
        if len(value) > len(names):
            raise _invalid(name, f"a {shape_type.__name__} tuple holds at most {len(names)} fields "
                                 f"({', '.join(names)}), got {len(value)}")
        return shape_type(**dict(zip(names, value)))
    raise _invalid(name, f"expected a {shape_type.__name__}, a tuple of its fields or None, got {type(value).__name__}")


@dataclass(frozen=True, kw_only=True)
class BatchShape:
    """What one device's step carries at most, whatever the modality mix, fixed at creation."""

    max_rows_per_device: int = 0
    """Rows one device's step packs."""
    max_segments_per_device: int = 0
    """Items one device's step carries across all its rows, which is also its pooling axis."""
    max_columns_per_row: int = 0
    """Positions one row spans, the sequence length."""
    max_bags_per_device: int = 0
    """Bags one device's step carries; zero keeps every item its own routing unit."""
    max_choices_per_item: int = 0
    """Legal bytes one item offers to choose from at most; zero makes no choices."""
    image: ImageShape | None = None
    """The image geometry; also taken as a tuple ``(patch_side, channels)``."""
    video: VideoShape | None = None
    """The video geometry; also taken as a tuple ``(patch_side, tube_frames, frame_stride, channels)``."""
    audio: AudioShape | None = None
    """The audio geometry; also taken as a tuple ``(chunk_samples, sample_rate)``."""

    def __post_init__(self):
        object.__setattr__(self, "image", _as_shape(ImageShape, "BatchShape.image", self.image))
        object.__setattr__(self, "video", _as_shape(VideoShape, "BatchShape.video", self.video))
        object.__setattr__(self, "audio", _as_shape(AudioShape, "BatchShape.audio", self.audio))

    def derived(self) -> BatchShape:
        """Every nested shape present and derived; a missing one becomes the zero shape, leaving it out."""
        return replace(self,
                       image=(self.image or ImageShape()).derived(),
                       video=(self.video or VideoShape()).derived(),
                       audio=(self.audio or AudioShape()).derived())


@dataclass(frozen=True, kw_only=True)
class Masking:
    """How the masked objective corrupts a batch and weighs its heads; every zero derives."""

    token_mask_probability: float = 0.0
    """Fraction of text positions covered by spans; 0.15."""
    token_mean_span: float = 0.0
    """Mean geometric span length in bytes; 16."""
    replace_fraction: float = 0.0
    """Of covered positions, the share shown as MASK; 0.8."""
    random_fraction: float = 0.0
    """Of covered positions, the share replaced by a random byte, the rest kept clean; 0.1."""
    image_mask_ratio: float = 0.0
    """Fraction of image patches masked; 0.75."""
    video_mask_ratio: float = 0.0
    """Fraction of video tubes masked, tubed across time; 0.75."""
    audio_mask_ratio: float = 0.0
    """Fraction of audio frames masked; 0.75."""
    text_weight: float = 0.0
    """The weight of the text head; 1."""
    image_weight: float = 0.0
    """The weight of the image head; 1."""
    video_weight: float = 0.0
    """The weight of the video head; 1."""
    audio_weight: float = 0.0
    """The weight of the audio head; 1."""

    _DEFAULTS = {
        "token_mask_probability": 0.15, "token_mean_span": 16.0, "replace_fraction": 0.8, "random_fraction": 0.1,
        "image_mask_ratio": 0.75, "video_mask_ratio": 0.75, "audio_mask_ratio": 0.75,
        "text_weight": 1.0, "image_weight": 1.0, "video_weight": 1.0, "audio_weight": 1.0,
    }

    def derived(self) -> Masking:
        return _derive(self, self._DEFAULTS)


def _as_widths(value: Iterable[int]) -> tuple[int, ...]:
    name = "Contrastive.matryoshka_dimensions"
    if isinstance(value, (str, bytes)):
        raise _invalid(name, f"expected a sequence of widths, got {type(value).__name__}")
    try:
        return tuple(operator.index(width) for width in value)
    except TypeError:
        raise _invalid(name, f"expected a sequence of integer widths, got {value!r}") from None


@dataclass(frozen=True, kw_only=True)
class Contrastive:
    """How the contrastive loss scores the pooled embeddings; every zero derives."""

    matryoshka_dimensions: tuple[int, ...] | None = None
    """Matryoshka prefix widths, strictly ascending, each a multiple of 8, at most 8; empty scores the full width."""
    temperature_groups: int = 0
    """Learnable inverse temperature and bias pairs, one per group a step's items select; 1."""
    inverse_temperature: float = 0.0
    """The starting inverse temperature of every group; 10 under the sigmoid form, else 1."""
    bias: float = 0.0
    """The starting logit bias of every group; -10 under the sigmoid form, else 0."""
    negatives: Negatives = Negatives.AMBIENT
    """Which pairs repel."""
    ambient_repulsion_weight: float = 0.0
    """The weight of every pair no edge names, under ``Negatives.AMBIENT``; 1."""
    max_edges_per_device: int = 0
    """Edges one device's step names per edge set at most; the batch's ``max_segments_per_device``."""
    pair_loss: PairLossForm = PairLossForm.DERIVED
    """The pair loss over each anchor's row; sigmoid."""

    def __post_init__(self):
        if self.matryoshka_dimensions is not None:
            object.__setattr__(self, "matryoshka_dimensions", _as_widths(self.matryoshka_dimensions))
        object.__setattr__(self, "negatives", _as_enum(Negatives, "Contrastive.negatives", self.negatives))
        object.__setattr__(self, "pair_loss", _as_enum(PairLossForm, "Contrastive.pair_loss", self.pair_loss))

    def derived(self, batch: BatchShape) -> Contrastive:
        """The derived copy; ``batch`` supplies the default edge capacity."""
        pair_loss = PairLossForm.SIGMOID if self.pair_loss == PairLossForm.DERIVED else self.pair_loss
        sigmoid = pair_loss == PairLossForm.SIGMOID
        return replace(
            _derive(self, {
                "temperature_groups": 1,
                "inverse_temperature": 10.0 if sigmoid else 1.0,
                "bias": -10.0 if sigmoid else 0.0,
                "ambient_repulsion_weight": 1.0,
                "max_edges_per_device": batch.max_segments_per_device,
            }),
            matryoshka_dimensions=self.matryoshka_dimensions or (),
            pair_loss=pair_loss,
        )


@dataclass(frozen=True, kw_only=True)
class LateInteraction:
    """How the late-interaction loss scores the token vectors of queries and documents; every zero derives."""

    weight: float = 0.0
    """The loss weight; zero trains no token head (it does not derive)."""
    width: int = 0
    """The token vectors' width, a multiple of 8; 128."""
    inverse_temperature: float = 0.0
    """The starting inverse temperature of every contrastive group; 1."""
    bias: float = 0.0
    """The starting logit bias of every contrastive group; 0."""
    max_query_span: int = 0
    """Tokens one query item contributes at most: its first positions; 64."""
    max_query_tokens_per_device: int = 0
    """Query token rows one device's step holds at most; ``max_query_span`` for every segment."""
    max_documents_per_device: int = 0
    """Document items one device's step holds at most; the batch's ``max_segments_per_device``."""
    max_document_tokens_per_device: int = 0
    """Document token rows one device's step holds at most; the batch's rows times columns."""
    pair_loss: PairLossForm = PairLossForm.DERIVED
    """The pair loss over each query's row of hard MaxSim scores; ranked."""

    def __post_init__(self):
        object.__setattr__(self, "pair_loss", _as_enum(PairLossForm, "LateInteraction.pair_loss", self.pair_loss))

    def derived(self, batch: BatchShape) -> LateInteraction:
        """The derived copy; ``batch`` supplies the default capacities."""
        max_query_span = self.max_query_span or 64
        return replace(
            _derive(self, {
                "width": 128,
                "inverse_temperature": 1.0,
                "max_query_tokens_per_device": max_query_span * batch.max_segments_per_device,
                "max_documents_per_device": batch.max_segments_per_device,
                "max_document_tokens_per_device": batch.max_rows_per_device * batch.max_columns_per_row,
            }),
            max_query_span=max_query_span,
            pair_loss=PairLossForm.RANKED if self.pair_loss == PairLossForm.DERIVED else self.pair_loss,
        )


@dataclass(frozen=True, kw_only=True)
class Choices:
    """The calibrated choices term: trains the byte decoder on each item's legal bytes and their targets.

    The seed names this struct without listing its fields; ``weight`` is the one
    every binding's example uses. It is read when positive, which needs the
    batch's ``max_choices_per_item``.
    """

    weight: float = 0.0
    """The loss weight; zero trains no choices (it does not derive)."""

    def derived(self) -> Choices:
        """Nothing derives; answered for symmetry with the other configs."""
        return self


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """The learning-rate schedule: a linear warmup to the peak, then a cosine decay to the floor; and the update's
    gradient clipping."""

    learning_rate: float = 0.0
    """The peak learning rate; zero derives 5e-4."""
    min_learning_rate: float = 0.0
    """The floor the cosine settles at; zero derives 1e-5."""
    warmup_steps: int = 0
    """Steps from zero to the peak; zero derives a tenth of ``steps``, at most 400."""
    steps: int = 0
    """Steps the run takes across resumes, which the cosine spans; zero is refused."""
    gradient_clip_norm: float = 0.0
    """The largest global L2 norm of the gradient an update applies: a larger one is scaled by
    ``gradient_clip_norm / (norm + 1e-6)`` first, as PyTorch's ``clip_grad_norm_`` and OpenCLIP's
    ``--grad-clip-norm`` do. Zero clips nothing (it does not derive). Not one of the seeds' fields."""

    def derived(self) -> Schedule:
        return _derive(self, {"learning_rate": 5e-4, "min_learning_rate": 1e-5,
                              "warmup_steps": min(self.steps // 10, 400)})


@dataclass(frozen=True, kw_only=True)
class DerivedRun:
    """A validated run with every config derived, as :func:`validate_run` answers it."""

    depth: int
    hidden: int
    batch: BatchShape
    objective: Objective
    masking: Masking
    contrastive: Contrastive
    late_interaction: LateInteraction
    choices: Choices
    schedule: Schedule


def _check_field_types(prefix: str, config) -> None:
    """Every ``int`` field a non-negative integer, every ``float`` field a number finite in float32."""
    for f in fields(config):
        value = getattr(config, f.name)
        name = f"{prefix}.{f.name}"
        if f.type == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise _invalid(name, f"must be an integer, got {value!r}")
            if value < 0:
                raise _invalid(name, f"must be non-negative, got {value}")
        elif f.type == "float":
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not abs(value) <= FLOAT32_MAX:
                raise _invalid(name, f"must be a number finite in float32, got {value!r}")


def _require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise _invalid(name, message)


def _check_batch(batch: BatchShape) -> None:
    for name in ("max_rows_per_device", "max_segments_per_device", "max_columns_per_row"):
        _require(getattr(batch, name) > 0, f"batch.{name}", "must be positive, got 0")


def _check_masking(masking: Masking) -> None:
    for name in ("token_mask_probability", "replace_fraction", "random_fraction",
                 "image_mask_ratio", "video_mask_ratio", "audio_mask_ratio"):
        value = getattr(masking, name)
        _require(0.0 <= value <= 1.0, f"masking.{name}", f"must lie in [0, 1], got {value}")
    _require(masking.replace_fraction + masking.random_fraction <= 1.0, "masking.random_fraction",
             f"replace_fraction {masking.replace_fraction} plus random_fraction {masking.random_fraction} "
             f"exceeds 1 (a zero derives 0.8 and 0.1)")
    _require(masking.token_mean_span >= 1.0, "masking.token_mean_span",
             f"must be at least 1 byte, got {masking.token_mean_span}")
    for name in ("text_weight", "image_weight", "video_weight", "audio_weight"):
        _check_weight(f"masking.{name}", getattr(masking, name))


def _check_weight(name: str, value: float) -> None:
    _require(0.0 <= value <= MAX_SCALE, name, f"must lie in [0, {MAX_SCALE:g}], got {value}")


def _check_contrastive(contrastive: Contrastive, hidden: int) -> None:
    name = "contrastive.matryoshka_dimensions"
    widths = contrastive.matryoshka_dimensions
    _require(len(widths) <= MAX_MATRYOSHKA_DIMENSIONS, name,
             f"at most {MAX_MATRYOSHKA_DIMENSIONS} widths, got {len(widths)}")
    _require(all(a < b for a, b in zip(widths, widths[1:])), name,
             f"must be strictly ascending, got {tuple(widths)}")
    for width in widths:
        _require(width > 0 and width % WIDTH_ALIGNMENT == 0, name,
                 f"every width must be a positive multiple of {WIDTH_ALIGNMENT}, got {width}")
        _require(width <= hidden, name, f"width {width} exceeds hidden {hidden}")
    _require(0.0 < contrastive.inverse_temperature <= MAX_SCALE, "contrastive.inverse_temperature",
             f"must lie in (0, {MAX_SCALE:g}], got {contrastive.inverse_temperature}")
    _require(abs(contrastive.bias) <= MAX_SCALE, "contrastive.bias",
             f"must lie in [-{MAX_SCALE:g}, {MAX_SCALE:g}], got {contrastive.bias}")
    _check_weight("contrastive.ambient_repulsion_weight", contrastive.ambient_repulsion_weight)


def _check_late_interaction(late: LateInteraction, objective: Objective) -> None:
    _check_weight("late_interaction.weight", late.weight)
    _require(late.weight == 0.0 or objective != Objective.MASKED, "late_interaction.weight",
             "late interaction scores the relations, which a MASKED objective does not read; use CONTRASTIVE "
             "or JOINT")
    _require(late.width % WIDTH_ALIGNMENT == 0, "late_interaction.width",
             f"must be a multiple of {WIDTH_ALIGNMENT}, got {late.width}")
    _require(0.0 < late.inverse_temperature <= MAX_SCALE, "late_interaction.inverse_temperature",
             f"must lie in (0, {MAX_SCALE:g}], got {late.inverse_temperature}")
    _require(abs(late.bias) <= MAX_SCALE, "late_interaction.bias",
             f"must lie in [-{MAX_SCALE:g}, {MAX_SCALE:g}], got {late.bias}")


def _check_choices(choices: Choices, batch: BatchShape, objective: Objective) -> None:
    _check_weight("choices.weight", choices.weight)
    _require(choices.weight == 0.0 or objective != Objective.CONTRASTIVE, "choices.weight",
             "choices are read by the masked head, which a CONTRASTIVE objective does not have; use MASKED or "
             "JOINT")
    _require(choices.weight == 0.0 or batch.max_choices_per_item > 0, "choices.weight",
             "a positive weight needs batch.max_choices_per_item, which is 0")


def _check_schedule(schedule: Schedule) -> None:
    _require(schedule.steps > 0, "schedule.steps", "must be positive, got 0")
    _require(0.0 < schedule.learning_rate <= MAX_LEARNING_RATE, "schedule.learning_rate",
             f"must lie in (0, {MAX_LEARNING_RATE}], got {schedule.learning_rate}")
    _require(0.0 <= schedule.min_learning_rate <= schedule.learning_rate, "schedule.min_learning_rate",
             f"must lie in [0, learning_rate {schedule.learning_rate}], got {schedule.min_learning_rate} "
             f"(a zero derives 1e-5)")
    _require(schedule.warmup_steps <= schedule.steps, "schedule.warmup_steps",
             f"{schedule.warmup_steps} exceeds steps {schedule.steps}")
    _require(schedule.gradient_clip_norm >= 0.0, "schedule.gradient_clip_norm",
             f"must be 0 (no clipping) or positive, got {schedule.gradient_clip_norm}")


def _as_config(config_type: type, name: str, value):
    if value is None:
        return config_type()
    if not isinstance(value, config_type):
        raise _invalid(name, f"expected a {config_type.__name__}, got {type(value).__name__}")
    return value


def validate_run(depth: int, hidden: int, batch: BatchShape | None, objective: Objective,
                 masking: Masking | None = None, contrastive: Contrastive | None = None,
                 late_interaction: LateInteraction | None = None, choices: Choices | None = None,
                 schedule: Schedule | None = None) -> DerivedRun:
    """Refuses an invalid run with ``UFormError(INVALID_ARGUMENT)`` naming the field; answers it derived.

    A missing config is the all-zero one. Types are checked on the given values,
    ranges on the derived ones, so a message about a derived field says so.
    """
    for name, value in (("depth", depth), ("hidden", hidden)):
        _require(isinstance(value, numbers.Integral) and not isinstance(value, bool), name,
                 f"must be an integer, got {value!r}")
        _require(value > 0, name, f"must be positive, got {value}")
    _require(hidden % HIDDEN_ALIGNMENT == 0, "hidden",
             f"must be a multiple of {HIDDEN_ALIGNMENT} (whole heads of 64), got {hidden}")
    objective = _as_enum(Objective, "objective", objective)

    batch = _as_config(BatchShape, "batch", batch)
    masking = _as_config(Masking, "masking", masking)
    contrastive = _as_config(Contrastive, "contrastive", contrastive)
    late_interaction = _as_config(LateInteraction, "late_interaction", late_interaction)
    choices = _as_config(Choices, "choices", choices)
    schedule = _as_config(Schedule, "schedule", schedule)
    for prefix, config in (("batch", batch), ("batch.image", batch.image), ("batch.video", batch.video),
                           ("batch.audio", batch.audio), ("masking", masking), ("contrastive", contrastive),
                           ("late_interaction", late_interaction), ("choices", choices), ("schedule", schedule)):
        if config is not None:
            _check_field_types(prefix, config)

    batch = batch.derived()
    _check_batch(batch)
    run = DerivedRun(depth=operator.index(depth), hidden=operator.index(hidden), batch=batch, objective=objective,
                     masking=masking.derived(), contrastive=contrastive.derived(batch),
                     late_interaction=late_interaction.derived(batch), choices=choices.derived(),
                     schedule=schedule.derived())
    _check_masking(run.masking)
    _check_contrastive(run.contrastive, run.hidden)
    _check_late_interaction(run.late_interaction, run.objective)
    _check_choices(run.choices, run.batch, run.objective)
    _check_schedule(run.schedule)
    return run
