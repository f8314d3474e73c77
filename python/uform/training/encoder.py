"""The encoder on a device: embedding (bytes, and media patches through their patch embeddings), a
bidirectional segment-masked stack, the final norm, and the masked, reconstruction, contrastive,
late-interaction and choices heads (math in docs/encoder.md).

``encoder_registry`` fixes the flat parameter order (and the checkpoint's tensor names);
``EncoderModel`` is the encoder's resident state (``uform.nn.resident``: parameters, gradient and
AdamW moments on one device) with one step over it: forward, both losses, backward into the flat
gradient; the trainer then applies AdamW.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import kernels as K
from .. import layouts
from ..engine import Buffer, Device
from ..nn.cache import RecentCache
from ..nn.resident import AdamW, HostState, ResidentState, named_tensors, registry_size, tensor_registry
from ..nn.tokens import CrossEntropyHead, TokenInputs
from ..nn.transformer import StackGeometry, TransformerStack, layer_tensors
from .enums import Objective
from .media_step import KIND_NAMED, POSITION_AXES, MediaBatch
from .choices import ChoiceBatch
from .late_interaction import LateBatch
from .vocabulary import BYTE_COUNT, VOCABULARY_SIZE

HEAD_DIM = 64
MLP_RATIO = 4
NORM_EPS = 1e-5
ROPE_BASE = 10000.0
DECAYED = ("embedding", "wq", "wk", "wv", "wo", "w_up", "w_down", "masked_head", "patch_embedding",
           "position_embedding", "reconstruction", "token_head")


@dataclass(frozen=True)
class EncoderGeometry:
    hidden: int
    depth: int
    groups: int
    objective: Objective
    max_columns: int
    media: tuple[tuple[str, int], ...] = ()
    """(name, width) of each media modality the run trains, in ``media_step.MEDIA_KINDS`` order: width is the
    values one token carries (patch or tube pixels, frame samples)."""
    late_width: int = 0
    """The late-interaction token vectors' width; 0 when the run trains no late interaction."""
    late_rows: tuple[int, int] = (0, 0)
    """The query and document token rows a step holds at most (the late-interaction capacities)."""

    @property
    def masked(self) -> bool:
        return self.objective != Objective.CONTRASTIVE

    @property
    def contrastive(self) -> bool:
        return self.objective != Objective.MASKED

    def stack(self) -> StackGeometry:
        heads = self.hidden // HEAD_DIM
        return StackGeometry(width=self.hidden, heads=heads, kv_heads=heads, head_dim=HEAD_DIM,
                             mlp=MLP_RATIO * self.hidden, layers=self.depth, norm_eps=NORM_EPS,
                             rope_base=ROPE_BASE, causal=False)


def encoder_registry(geometry: EncoderGeometry) -> list[dict]:
    """Name, shape, offset and size of every tensor, in flat order."""
    shapes = [("embedding", (VOCABULARY_SIZE, geometry.hidden)), *geometry.stack().tensor_shapes(),
              ("final_norm", (geometry.hidden,))]
    if geometry.masked:
        shapes.append(("masked_head", (geometry.hidden, VOCABULARY_SIZE)))
    if geometry.contrastive:
        shapes += [("temperature.log_scale", (geometry.groups,)), ("temperature.bias", (geometry.groups,))]
    if geometry.late_width:
        shapes += [("late_interaction.token_head", (geometry.hidden, geometry.late_width)),
                   ("late_interaction.log_scale", (geometry.groups,)), ("late_interaction.bias", (geometry.groups,))]
    for name, width in geometry.media:
        # the position embedding right after the patch embedding: one [width + position width, H] matrix
        shapes += [(f"{name}.patch_embedding", (width, geometry.hidden)),
                   (f"{name}.position_embedding", (KIND_NAMED[name].position_width, geometry.hidden))]
        if geometry.masked:
            shapes.append((f"{name}.reconstruction", (geometry.hidden, width)))
    return tensor_registry(shapes)


def decays(name: str) -> bool:
    """Whether AdamW's weight decay applies to a tensor: matrices yes, gains and temperatures no."""
    return name.rsplit(".", 1)[-1] in DECAYED


ADAMW = AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, decays=decays)


def initial_parameters(geometry: EncoderGeometry, seed: int, inverse_temperature: float, bias: float,
                       late_inverse_temperature: float = 1.0, late_bias: float = 0.0) -> np.ndarray:
    """Tensor n drawn from Philox(key=[seed, n]): normal σ = 0.02; gains 1; the temperatures (pooled and late
    interaction) as configured."""
    registry = encoder_registry(geometry)
    flat = np.empty(registry_size(registry), np.float32)
    for n, (name, part) in enumerate(named_tensors(flat, registry).items()):
        if name.endswith("norm"):
            part[...] = 1.0
        elif name == "temperature.log_scale":
            part[...] = np.log(inverse_temperature)
        elif name == "temperature.bias":
            part[...] = bias
        elif name == "late_interaction.log_scale":
            part[...] = np.log(late_inverse_temperature)
        elif name == "late_interaction.bias":
            part[...] = late_bias
        else:
            rng = np.random.Generator(np.random.Philox(key=[seed, n]))
            part[...] = (rng.standard_normal(part.size) * 0.02).reshape(part.shape)
    return flat


@dataclass
class StepBatch:
    """One device's step, packed and resolved on the host (int32 arrays; pair targets float32). Segments are
    numbered in the world's order (every device's, docs/mesh.md); a device alone is its own world."""

    tokens: np.ndarray           # (rows, columns) corrupted inputs
    targets: np.ndarray          # (rows, columns) original bytes at covered positions, −1 elsewhere
    positions: np.ndarray        # (rows, columns), or (rows, columns, 3): time, row, column
    token_segments: np.ndarray   # (rows, columns) world segment index of each position, −1 for padding
    segment_starts: np.ndarray   # (S,) flat token index of each of this device's segments' first position
    segment_lengths: np.ndarray  # (S,) the positions each pools over: all but a media item's hidden tokens
    groups: np.ndarray           # (W,) temperature group of each of the world's W segments
    sign: np.ndarray             # (W, W) +1 attract, −1 repel, 0 skipped
    weight: np.ndarray           # (W, W) weights with the form's normalisation folded in
    form: int                    # kernels.FORM_WEIGHTED_SIGMOID or FORM_RANKED
    ranked_norm: float
    covered: int                 # positions the masked loss reads, in the world
    world_segments: np.ndarray = None  # (S,) the world index of each of this device's segments; None: 0 … S−1
    world_lengths: np.ndarray = None   # (W,) every world segment's length; None: segment_lengths
    media: MediaBatch | None = None  # the media tokens' rows, if the step has media items
    late: LateBatch | None = None    # the late-interaction rows and targets, if the run trains it
    choices: ChoiceBatch | None = None  # the items making a choice, if the run trains choices
    pooled_segments: np.ndarray = None  # (rows, columns) token_segments, −1 at hidden media tokens; None: the same
    spans: np.ndarray = field(init=False)  # (rows·columns, 2) each position's attention span, made with the batch
    tiles: np.ndarray = field(init=False)  # (T, 2) attention's tiles for the spans (layouts.attention_tiles)

    def __post_init__(self):
        if self.world_segments is None:
            self.world_segments = np.arange(len(self.segment_starts), dtype=np.int32)
        if self.world_lengths is None:
            self.world_lengths = self.segment_lengths
        if self.pooled_segments is None:
            self.pooled_segments = self.token_segments
        rows, columns = self.tokens.shape  # here, so that a batch prepared ahead has its spans ready too
        self.spans = layouts.attention_spans(rows * columns, columns, self.token_segments)
        self.tiles = layouts.attention_tiles(self.spans)

    @property
    def world_segment_count(self) -> int:
        return int(self.world_lengths.size)

    def media_rows(self) -> MediaBatch | None:
        """The media rows, or None when the step packed no media token."""
        return self.media if self.media is not None and self.media.modalities else None


@dataclass
class StepLosses:
    masked: float
    contrastive: float
    total: float
    pooled: np.ndarray | None    # (S, hidden) unit-norm full-width embeddings as scored, if asked
    reconstruction: dict[str, float] = field(default_factory=dict)  # each media modality's mean squared error
    late_interaction: float = 0.0  # the late-interaction term, weighted
    choices: float = 0.0         # the choices term over the items that made a choice, unweighted


@dataclass
class LocalOutputs:
    """What one device's step gives the world after its forward (``EncoderModel.step_phases``)."""

    pooled: np.ndarray | None  # (S, hidden) mean final states of this device's segments, if exchanged


QUEUED = "queued"
"""What a step's second phase yields once every kernel of the step is queued on the device, before it reads any
loss back (``EncoderModel.step_phases``): the host works meanwhile (a trainer packs its next deferred batches)."""


@dataclass
class WorldOutputs:
    """What the world gives every device's step back: the pooled states of every segment in world order (None:
    this device's are the world's, pooled in place)."""

    pooled: np.ndarray | None


def masked_mean(losses: list[np.ndarray], covered: int) -> float:
    """The masked loss of the world: the exact sum of every position's loss (math.fsum, so no order or split
    changes it), over the covered count."""
    if not covered:
        return 0.0
    values = np.concatenate([loss[loss != 0] for loss in losses]).astype(np.float64)
    return math.fsum(values.tolist()) / covered


def finish_phases(phases, masked: float):
    """Send the world's masked loss into a step's last phase and answer what the step returns."""
    try:
        phases.send(masked)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a step's phases yielded past their masked losses")


@dataclass
class PrefixBuffers:
    """One matryoshka width's unit-norm prefixes of the pooled embeddings, their gradient, 1/norms and the pair
    loss of each row (read back once the step's work is queued)."""

    u: Buffer
    du: Buffer
    inverse: Buffer
    row_losses: Buffer


@dataclass
class ContrastiveBuffers:
    """The contrastive head's buffers over S segments: the pair targets, pooled embeddings, scores and
    gradients, the full-width unit embeddings as scored, and one PrefixBuffers per matryoshka width."""

    starts: Buffer
    lengths: Buffer
    groups: Buffer
    sign: Buffer
    weight: Buffer
    pooled: Buffer
    dpooled: Buffer
    temperature: Buffer
    cos: Buffer
    dcos: Buffer
    dlog_scale: Buffer
    dbias: Buffer
    full: Buffer
    full_inverse: Buffer
    prefixes: list[PrefixBuffers]

    @classmethod
    def allocate(cls, device: Device, segments: int, hidden: int, widths: tuple[int, ...]) -> ContrastiveBuffers:
        d, S, H = device, segments, hidden
        return cls(starts=d.empty(S, np.int32), lengths=d.empty(S, np.int32), groups=d.empty(S, np.int32),
                   sign=d.empty((S, S)), weight=d.empty((S, S)), pooled=d.empty((S, H)), dpooled=d.empty((S, H)),
                   temperature=d.empty((S, 2)), cos=d.empty((S, S)), dcos=d.empty((S, S)),
                   dlog_scale=d.empty(S), dbias=d.empty(S), full=d.empty((S, H)), full_inverse=d.empty(S),
                   prefixes=[PrefixBuffers(u=d.empty((S, width)), du=d.empty((S, width)), inverse=d.empty(S),
                                           row_losses=d.empty(S)) for width in widths])


@dataclass
class PoolingBuffers:
    """The buffers of embedding S segments at one width: their spans, mean states, unit prefixes, 1/norms."""

    starts: Buffer
    lengths: Buffer
    pooled: Buffer
    unit: Buffer
    inverse: Buffer


@dataclass
class ModalityBuffers:
    """One media modality's rows at capacity (a row per token of the step); a step uses their first rows."""

    inputs: Buffer         # (n, width + position width) every token's pixels or samples and position features
    tokens: Buffer         # (n,) int32 their flat token indices
    d_embedded: Buffer     # (n, hidden) the gradient at their patch and position embeddings
    targets: Buffer        # (n, width) the hidden tokens' reconstruction targets
    hidden: Buffer         # (n,) int32 their flat token indices
    states: Buffer         # (n, hidden) their final-norm states
    d_states: Buffer       # (n, hidden) and the gradient there
    prediction: Buffer     # (n, width) the reconstruction head's output
    d_prediction: Buffer   # (n, width)
    row_losses: Buffer     # (n,)

    @classmethod
    def allocate(cls, device: Device, n: int, width: int, position_width: int, hidden: int) -> ModalityBuffers:
        d = device
        return cls(inputs=d.empty((n, width + position_width)), tokens=d.empty(n, np.int32),
                   d_embedded=d.empty((n, hidden)),
                   targets=d.empty((n, width)), hidden=d.empty(n, np.int32), states=d.empty((n, hidden)),
                   d_states=d.empty((n, hidden)), prediction=d.empty((n, width)), d_prediction=d.empty((n, width)),
                   row_losses=d.empty(n))


@dataclass
class MediaBuffers:
    """The media tokens' buffers: every modality's shown patch embeddings stacked (the embedding adds row
    row_of[t] to token t's id row), and each modality's rows."""

    row_of: Buffer
    embedded: Buffer
    modalities: dict[str, ModalityBuffers]


@dataclass
class LateBuffers:
    """The late-interaction head's buffers at capacity (query rows Q, document rows D, segments S): the
    gathered final states, the token vectors before and after L2 normalisation, MaxSim's maxima and
    their rows, the scores and pair-loss buffers, and the gradients of each."""

    query_index: Buffer      # (Q,) int32 flat token index of each query row
    query_segment: Buffer    # (Q,) int32 its segment
    query_starts: Buffer     # (S,) int32 each segment's first query row
    query_counts: Buffer     # (S,) int32 and its query rows (0: not a query)
    document_index: Buffer   # (D,) the same for the document rows
    document_segment: Buffer
    document_starts: Buffer
    document_counts: Buffer
    query_states: Buffer     # (Q, hidden)
    document_states: Buffer  # (D, hidden)
    query_raw: Buffer        # (Q, width) states · token_head
    document_raw: Buffer
    query_unit: Buffer       # (Q, width) L2-normalised
    document_unit: Buffer
    query_inverse: Buffer    # (Q,) 1/norms
    document_inverse: Buffer
    best: Buffer             # (Q, S) MaxSim's maxima
    arg: Buffer              # (Q, S) int32 the document row of each
    scores: Buffer           # (S, S)
    d_scores: Buffer
    sign: Buffer
    weight: Buffer
    temperature: Buffer      # (S, 2)
    row_losses: Buffer       # (S,)
    dlog_scale: Buffer
    dbias: Buffer

    @classmethod
    def allocate(cls, device: Device, query_rows: int, document_rows: int, segments: int, hidden: int,
                 width: int) -> LateBuffers:
        d, Q, D, S = device, query_rows, document_rows, segments
        return cls(query_index=d.empty(Q, np.int32), query_segment=d.empty(Q, np.int32),
                   query_starts=d.empty(S, np.int32), query_counts=d.empty(S, np.int32),
                   document_index=d.empty(D, np.int32), document_segment=d.empty(D, np.int32),
                   document_starts=d.empty(S, np.int32), document_counts=d.empty(S, np.int32),
                   query_states=d.empty((Q, hidden)), document_states=d.empty((D, hidden)),
                   query_raw=d.empty((Q, width)), document_raw=d.empty((D, width)),
                   query_unit=d.empty((Q, width)), document_unit=d.empty((D, width)),
                   query_inverse=d.empty(Q), document_inverse=d.empty(D), best=d.empty((Q, S)),
                   arg=d.empty((Q, S), np.int32), scores=d.empty((S, S)), d_scores=d.empty((S, S)),
                   sign=d.empty((S, S)), weight=d.empty((S, S)), temperature=d.empty((S, 2)), row_losses=d.empty(S),
                   dlog_scale=d.empty(S), dbias=d.empty(S))


@dataclass
class ChoiceBuffers:
    """The choices head's buffers for up to C items (each offering at most 256 bytes): the MASK positions,
    the legal bytes and targets as a tape, the states there, the masked head's logits, the probabilities,
    losses and gradients."""

    positions: Buffer        # (C,) int32 flat token index of each item's MASK position
    offsets: Buffer          # (C + 1,) int32
    choice_bytes: Buffer     # (256·C,) int32
    targets: Buffer          # (256·C,)
    probabilities: Buffer    # (256·C,)
    losses: Buffer           # (C,)
    states: Buffer           # (C, hidden)
    d_states: Buffer
    logits: Buffer           # (C, vocabulary)
    d_logits: Buffer

    @classmethod
    def allocate(cls, device: Device, items: int, hidden: int, vocabulary: int) -> ChoiceBuffers:
        d, C, T = device, items, BYTE_COUNT * items
        return cls(positions=d.empty(C, np.int32), offsets=d.empty(C + 1, np.int32), choice_bytes=d.empty(T, np.int32),
                   targets=d.empty(T), probabilities=d.empty(T), losses=d.empty(C), states=d.empty((C, hidden)),
                   d_states=d.empty((C, hidden)), logits=d.empty((C, vocabulary)), d_logits=d.empty((C, vocabulary)))


@dataclass
class EncoderBuffers:
    """One step geometry's buffers: the tokens, their packed segments, the final-norm states y (and their
    rstd and gradient dy), and the heads the objective has."""

    tokens: TokenInputs
    pooled_segments: Buffer
    y: Buffer
    rstd: Buffer
    dy: Buffer
    embedding_partials: Buffer | None  # (rows, vocabulary, hidden): each packed row's embedding gradient (identical
    # mode's training)
    masked: CrossEntropyHead | None
    contrastive: ContrastiveBuffers | None
    media: MediaBuffers | None
    tiles: Buffer | None = None  # attention's tile table for the batch in `tokens` (TokenInputs.write_spans)


class EncoderModel(ResidentState):
    """The encoder's resident state on `device` (``uform.nn.resident``) and one training step over it."""

    def __init__(self, device: Device, geometry: EncoderGeometry, state: HostState, widths: tuple[int, ...], *,
                 training: bool = True, numerics: str = "identical"):
        super().__init__(device, encoder_registry(geometry), state, ADAMW, training=training, numerics=numerics)
        self.geometry = geometry
        self.widths = widths
        self.layer_weights = layer_tensors(self.weights, geometry.depth)
        self.layer_grads = layer_tensors(self.weight_grads, geometry.depth) if training else None
        # Identical mode sums over tokens a packed row at a time (the row tree: docs/mesh.md); fast mode, which
        # depends on the split anyway, keeps the canonical chunks, which a GPU runs faster.
        self.row_length = 0 if self.fast else geometry.max_columns
        self.stack = TransformerStack(device, geometry.stack(), geometry.max_columns, fast=self.fast,
                                      row_length=self.row_length, training=training)
        self._buffers = RecentCache(self._allocate)
        self._pooling = RecentCache(self._allocate_pooling)
        self._late = RecentCache(lambda key: LateBuffers.allocate(self.device, *key, geometry.hidden,
                                                                  geometry.late_width))
        self._choice_buffers = RecentCache(lambda segments: ChoiceBuffers.allocate(
            self.device, segments, geometry.hidden, VOCABULARY_SIZE))
        # encode_tokens' buffers (indices, states, raw and unit vectors, 1/norms) for up to n rows
        self._vectors = RecentCache(lambda n: (self.device.empty(n, np.int32), self.device.empty((n, geometry.hidden)),
                                               self.device.empty((n, geometry.late_width)),
                                               self.device.empty((n, geometry.late_width)), self.device.empty(n)))
        self._last_buffers: EncoderBuffers | None = None

    def buffers(self, n: int, columns: int, segments: int) -> EncoderBuffers:
        """The buffers of n tokens in rows of `columns` packing `segments` segments, made on first use (the
        few most recent geometries' are kept: ``uform.nn.cache``)."""
        return self._buffers((n, columns, segments))

    def _allocate(self, key: tuple[int, int, int]) -> EncoderBuffers:
        n, columns, segments = key
        d, g = self.device, self.geometry
        masked = CrossEntropyHead.allocate(d, n, VOCABULARY_SIZE) if g.masked else None
        contrastive = ContrastiveBuffers.allocate(d, segments, g.hidden, self.widths) \
            if g.contrastive and segments else None
        media = MediaBuffers(
            row_of=d.empty(n, np.int32), embedded=d.empty((n, g.hidden)),
            modalities={name: ModalityBuffers.allocate(d, n, width, KIND_NAMED[name].position_width, g.hidden)
                        for name, width in g.media},
        ) if g.media else None
        rows = n // columns
        return EncoderBuffers(
            tokens=TokenInputs.allocate(d, n, VOCABULARY_SIZE, POSITION_AXES, rows=rows),
            pooled_segments=d.empty(n, np.int32), y=d.empty((n, g.hidden)), rstd=d.empty(n),
            dy=d.empty((n, g.hidden)),
            embedding_partials=d.empty((rows, VOCABULARY_SIZE, g.hidden)) if self.training and self.row_length
            else None,
            masked=masked, contrastive=contrastive, media=media)

    def _forward(self, batch: StepBatch) -> tuple[EncoderBuffers, Buffer]:
        """The tower over a packed batch up to the final norm (in buffers.y); answers the buffers and the
        stack's output h."""
        rows, columns = batch.tokens.shape
        buffers = self.buffers(rows * columns, columns, batch.world_segment_count)
        n = rows * columns
        self._last_buffers = buffers
        tokens = buffers.tokens
        tokens.ids.write(batch.tokens.reshape(-1))
        positions = batch.positions if batch.positions.ndim == 3 else \
            np.repeat(batch.positions[..., None], POSITION_AXES, -1)
        tokens.positions.write(positions.reshape(n, POSITION_AXES))
        buffers.pooled_segments.write(batch.pooled_segments.reshape(-1))
        buffers.tiles = tokens.write_spans(batch.spans, batch.tiles)
        media = batch.media_rows()
        if media is not None:
            self._embed_media(buffers, media)
            tokens.embed(self.stack.buffers(n).input, self.weights["embedding"], buffers.media.embedded,
                         buffers.media.row_of)
        else:
            tokens.embed(self.stack.buffers(n).input, self.weights["embedding"])
        h = self.stack.forward(self.layer_weights, n, tokens.positions, tokens.spans, buffers.tiles)
        K.rmsnorm_forward(buffers.y, buffers.rstd, h, self.weights["final_norm"], NORM_EPS)
        return buffers, h

    def embeddings(self, batch: StepBatch, width: int) -> np.ndarray:
        """Forward only: every packed segment's mean final state, its first `width` dims L2-normalised,
        (segments, width) float32."""
        buffers, _ = self._forward(batch)
        p = self._pool(buffers.y, batch, width)
        K.l2_normalize_forward(p.unit, p.inverse, p.pooled, width, self.geometry.hidden)
        return p.unit.numpy()

    def _pool(self, y: Buffer, batch: StepBatch, width: int) -> PoolingBuffers:
        """The pooling buffers of this device's segments at `width`, their mean final states (of y) in pooled."""
        p = self._pooling((len(batch.segment_starts), width))
        p.starts.write(batch.segment_starts)
        p.lengths.write(batch.segment_lengths)
        K.pool_forward(p.pooled, y, p.starts, p.lengths, self.geometry.hidden)
        return p

    def _allocate_pooling(self, key: tuple[int, int]) -> PoolingBuffers:
        segments, width = key
        d = self.device
        return PoolingBuffers(starts=d.empty(segments, np.int32), lengths=d.empty(segments, np.int32),
                              pooled=d.empty((segments, self.geometry.hidden)), unit=d.empty((segments, width)),
                              inverse=d.empty(segments))

    # ---- one step ------------------------------------------------------------------------------------

    def step_losses(self, batch: StepBatch, **options) -> StepLosses:
        """Forward and losses of a device alone (its own world); with_gradient also the whole backward into
        self.gradients. The options are ``step_phases``'."""
        phases = self.step_phases(batch, exchange=False, **options)
        next(phases)
        phases.send(WorldOutputs(pooled=None))  # QUEUED
        masked_losses = next(phases)
        return finish_phases(phases, masked_mean([masked_losses], batch.covered) if masked_losses is not None
                             else 0.0)

    def step_phases(self, batch: StepBatch, *, exchange: bool, text_weight: float, with_gradient: bool,
                    want_pooled: bool = False, media_weights: dict[str, float] | None = None,
                    late_weight: float = 0.0, choices_weight: float = 0.0):
        """One device's step in four phases, as a generator (docs/mesh.md). The first runs the forward and the
        heads that read this device's positions alone, then yields its ``LocalOutputs`` (with `exchange`, its
        segments' pooled states, downloaded); the world answers ``WorldOutputs`` (every segment's pooled state,
        or None to pool this device's in place), with which the second queues the contrastive head over the
        world's segments and, with_gradient, the whole backward into self.gradients, and yields ``QUEUED``; the
        third only then reads the losses back (so the device never waits for the host mid-step) and yields this
        device's per-position masked losses (None without the masked head); the world answers its masked loss,
        and the generator returns the StepLosses. media_weights: each media modality's reconstruction weight (by name);
        late_weight and choices_weight the weights of the late-interaction and choices terms."""
        g = self.geometry
        n, H = batch.tokens.size, g.hidden
        media_weights = media_weights or {}
        buffers, h = self._forward(batch)
        tokens = buffers.tokens
        media = batch.media_rows()

        masked_losses = None
        dy_written = False
        if g.masked:
            masked_losses, dy_written = self._masked(buffers, batch, text_weight, with_gradient)
        reconstruction = {}
        if g.masked and g.media:
            reconstruction, dy_written = self._reconstruct(buffers, media, media_weights, with_gradient, dy_written)
        choices = 0.0
        if batch.choices is not None and batch.choices.count:
            choices, dy_written = self._choices(buffers, batch.choices, choices_weight, with_gradient, dy_written)
        exchanged = self._pool_local(buffers, batch) if buffers.contrastive is not None and exchange else None
        world = yield LocalOutputs(pooled=exchanged)

        row_losses = []
        if buffers.contrastive is not None:
            row_losses = self._contrastive(buffers, batch, world.pooled, with_gradient, dy_written)
            dy_written = dy_written or with_gradient
        late = 0.0
        if batch.late is not None:
            late = late_weight * self._late_interaction(buffers, batch, late_weight, with_gradient)
        if with_gradient:
            if not dy_written:
                K.fill(buffers.dy, 0.0)
            work = self.stack.buffers(n).work
            rows = self.row_length
            K.rmsnorm_backward(work.dh, work.dgain_rows, buffers.dy, h, self.weights["final_norm"], buffers.rstd)
            K.column_sum(self.weight_grads["final_norm"], work.dgain_rows, n, H, partial=work.partial,
                         row_length=rows)
            dh = self.stack.backward(self.layer_weights, self.layer_grads, n, tokens.positions, tokens.spans,
                                     buffers.tiles)
            tokens.embedding_backward(self.weight_grads["embedding"], dh, batch.tokens, row_length=rows,
                                      partials=buffers.embedding_partials, fast=self.fast)
            if g.media:
                self._patch_embedding_backward(buffers, media, dh)
        yield QUEUED
        contrastive = sum(float(np.sum(losses.numpy(), dtype=np.float64)) for losses in row_losses) \
            * (1.0 / len(row_losses) if row_losses else 0.0)
        pooled = None
        if want_pooled and buffers.contrastive is not None:
            c = buffers.contrastive
            K.l2_normalize_forward(c.full, c.full_inverse, c.pooled, H, H)
            pooled = c.full.numpy()
        masked = yield masked_losses.numpy() if masked_losses is not None else None
        weight = text_weight if g.masked else 0.0
        total = weight * masked + sum(media_weights.get(name, 0.0) * loss
                                      for name, loss in reconstruction.items()) + contrastive + late \
            + choices_weight * choices
        return StepLosses(masked=masked, contrastive=contrastive, total=total, pooled=pooled,
                          reconstruction=reconstruction, late_interaction=late, choices=choices)

    # ---- media: patch embeddings in, reconstruction heads out -----------------------------------------

    def _input_embedding(self, flat: Buffer, name: str) -> Buffer:
        """A modality's patch and position embeddings as one [width + position width, H] matrix of the flat
        parameters or gradient (the two lie back to back in the flat order)."""
        patch = next(entry for entry in self.registry if entry["name"] == f"{name}.patch_embedding")
        rows = patch["shape"][0] + KIND_NAMED[name].position_width
        return flat.view(patch["offset"], (rows, self.geometry.hidden))

    def _embed_media(self, buffers: EncoderBuffers, media: MediaBatch) -> None:
        """Each modality's tokens through its patch and position embeddings (E = inputs·W, inputs a token's values
        then its position features), stacked in order."""
        H = self.geometry.hidden
        stacked = 0
        for name, _ in self.geometry.media:
            rows = media.modalities.get(name)
            if rows is None or rows.tokens.size == 0:
                continue
            b, count = buffers.media.modalities[name], rows.tokens.size
            weight = self._input_embedding(self.parameters, name)
            inputs = b.inputs.view(0, (count, weight.shape[0]))
            inputs.write(rows.inputs)
            b.tokens.view(0, count).write(rows.tokens)
            K.gemm(buffers.media.embedded.view(stacked * H, (count, H)), inputs, weight, count, H, weight.shape[0])
            stacked += count
        buffers.media.row_of.write(media.row_of)

    def _patch_embedding_backward(self, buffers: EncoderBuffers, media: MediaBatch | None, dh: Buffer) -> None:
        """dW = inputsᵀ·dE for each modality's patch and position embeddings, dE the input gradient at its tokens
        (zero without any)."""
        H = self.geometry.hidden
        for name, _ in self.geometry.media:
            gradient = self._input_embedding(self.gradients, name)
            rows = media.modalities.get(name) if media is not None else None
            if rows is None or rows.tokens.size == 0:
                K.fill(gradient, 0.0)
                continue
            b, count = buffers.media.modalities[name], rows.tokens.size
            d_embedded = b.d_embedded.view(0, (count, H))
            K.gather_rows(d_embedded, dh, b.tokens.view(0, count), H)
            width = gradient.shape[0]
            K.gemm(gradient, b.inputs.view(0, (count, width)), d_embedded, width, H, count, transpose_a=True)

    def _reconstruct(self, buffers: EncoderBuffers, media: MediaBatch | None, weights: dict[str, float],
                     with_gradient: bool, dy_written: bool) -> tuple[dict[str, float], bool]:
        """Each modality's reconstruction head over its hidden tokens: prediction = y·R, loss = the mean over
        hidden tokens of the mean squared error against the normalised targets; the gradient (scaled by the
        modality's weight) goes into dy. A modality with no hidden token has loss 0 and a zero gradient."""
        H = self.geometry.hidden
        losses = {}
        for name, width in self.geometry.media:
            gradient = self.weight_grads[f"{name}.reconstruction"]
            rows = media.modalities.get(name) if media is not None else None
            if rows is None or rows.hidden.size == 0:
                if with_gradient:
                    K.fill(gradient, 0.0)
                continue
            b, count = buffers.media.modalities[name], rows.hidden.size
            hidden, states = b.hidden.view(0, count), b.states.view(0, (count, H))
            targets, prediction = b.targets.view(0, (count, width)), b.prediction.view(0, (count, width))
            d_prediction, row_losses = b.d_prediction.view(0, (count, width)), b.row_losses.view(0, count)
            hidden.write(rows.hidden)
            targets.write(rows.targets)
            head = self.weights[f"{name}.reconstruction"]
            K.gather_rows(states, buffers.y, hidden, H)
            K.gemm(prediction, states, head, count, width, H)
            K.mse_rows(row_losses, d_prediction if with_gradient else None, prediction, targets,
                       grad_scale=weights.get(name, 0.0) / count)
            losses[name] = float(np.sum(row_losses.numpy(), dtype=np.float64) / count)
            if not with_gradient:
                continue
            if not dy_written:
                K.fill(buffers.dy, 0.0)
                dy_written = True
            d_states = b.d_states.view(0, (count, H))
            K.gemm(gradient, states, d_prediction, H, width, count, transpose_a=True)
            K.gemm(d_states, d_prediction, head, count, H, width, transpose_b=True)
            K.scatter_rows(buffers.dy, d_states, hidden, H, accumulate=True)
        return losses, dy_written

    def _masked(self, buffers: EncoderBuffers, batch: StepBatch, text_weight: float,
                with_gradient: bool) -> tuple[Buffer, bool]:
        """The masked head over this device's positions: the buffer of their losses and, with_gradient, the head's
        gradient (summed by packed rows) and dy, each scaled by text_weight over the world's covered count."""
        head = buffers.masked
        head.forward(buffers.y, self.weights["masked_head"])
        scale = text_weight / batch.covered if batch.covered else 0.0
        head.score(batch.targets, grad_scale=scale, with_gradient=with_gradient)
        if with_gradient:
            head.backward(self.weight_grads["masked_head"], buffers.dy, buffers.y, self.weights["masked_head"],
                          row_length=self.row_length)
        return head.losses, with_gradient

    def _pool_local(self, buffers: EncoderBuffers, batch: StepBatch) -> np.ndarray:
        """The mean final state of each of this device's segments, (S, hidden) float32, downloaded for the world."""
        H = self.geometry.hidden
        if len(batch.segment_starts) == 0:
            return np.empty((0, H), np.float32)
        return self._pool(buffers.y, batch, H).pooled.numpy()

    def _contrastive(self, buffers: EncoderBuffers, batch: StepBatch, world_pooled: np.ndarray | None,
                     with_gradient: bool, accumulate: bool) -> list[Buffer]:
        """The contrastive head over the world's segments (every device computes it whole, so negatives span the
        world; None: this device's segments are the world's, pooled here); the gradient reaches this device's
        tokens through their world segment indices. Answers each Matryoshka width's buffer of row losses."""
        H = self.geometry.hidden
        c = buffers.contrastive
        S = c.lengths.size
        c.lengths.write(batch.world_lengths)
        c.groups.write(batch.groups)
        c.sign.write(batch.sign)
        c.weight.write(batch.weight)
        if world_pooled is None:
            c.starts.write(batch.segment_starts)
            K.pool_forward(c.pooled, buffers.y, c.starts, c.lengths, H)
        else:
            c.pooled.write(world_pooled)
        K.row_temperature(c.temperature, self.weights["temperature.log_scale"], self.weights["temperature.bias"],
                          c.groups)
        share = 1.0 / len(self.widths)
        for k, (width, prefix) in enumerate(zip(self.widths, c.prefixes)):
            u, du, inverse = prefix.u, prefix.du, prefix.inverse
            K.l2_normalize_forward(u, inverse, c.pooled, width, H)
            K.gemm(c.cos, u, u, S, S, width, transpose_b=True)
            K.pair_loss(prefix.row_losses, c.dcos, c.dlog_scale, c.dbias, c.cos, c.sign, c.weight, c.temperature,
                        form=batch.form, ranked_norm=batch.ranked_norm, grad_scale=share)
            if not with_gradient:
                continue
            K.group_sums(self.weight_grads["temperature.log_scale"], c.dlog_scale, c.groups, accumulate=k > 0)
            K.group_sums(self.weight_grads["temperature.bias"], c.dbias, c.groups, accumulate=k > 0)
            # cos = u·uᵀ, so du = dcos·u + dcosᵀ·u
            K.gemm(du, c.dcos, u, S, width, S)
            K.gemm(du, c.dcos, u, S, width, S, transpose_a=True, accumulate=True)
            if k == 0 and width < H:
                K.fill(c.dpooled, 0.0)
            K.l2_normalize_backward(c.dpooled, du, u, inverse, width, H, accumulate=k > 0 or width < H)
        if with_gradient:
            K.pool_backward(buffers.dy, c.dpooled, buffers.pooled_segments, c.lengths, H, accumulate=accumulate)
        return [prefix.row_losses for prefix in c.prefixes]

    # ---- late interaction -------------------------------------------------------------------------------

    def _token_vectors(self, y: Buffer, tokens: np.ndarray, index: Buffer, states: Buffer, raw: Buffer, unit: Buffer,
                       inverse: Buffer) -> None:
        """The unit token vectors of the final states y at the flat token indices `tokens`: gathered into
        states, projected by the token head into raw, L2-normalised into unit (1/norms in inverse)."""
        H, W, n = self.geometry.hidden, self.geometry.late_width, tokens.size
        if n == 0:
            return
        index.view(0, n).write(tokens)
        K.gather_rows(states.view(0, (n, H)), y, index.view(0, n), H)
        K.gemm(raw.view(0, (n, W)), states.view(0, (n, H)), self.weights["late_interaction.token_head"], n, W, H)
        K.l2_normalize_forward(unit.view(0, (n, W)), inverse.view(0, n), raw.view(0, (n, W)), W, W)

    def _late_interaction(self, buffers: EncoderBuffers, batch: StepBatch, weight: float,
                          with_gradient: bool) -> float:
        """The late-interaction term before its weight (docs/encoder.md): unit token vectors of the query and
        document rows, hard MaxSim scores between every query and document segment, and the pair loss of
        their scaled and biased scores against the late-interaction targets; with_gradient writes the token
        head's and temperatures' gradients and adds the states' gradient (times weight) into dy."""
        g, late = self.geometry, batch.late
        H, W, S = g.hidden, g.late_width, len(batch.segment_starts)
        Q, D = late.query_tokens.size, late.document_tokens.size
        if Q == 0 or D == 0 or not late.sign.any():
            if with_gradient:
                for name in ("late_interaction.token_head", "late_interaction.log_scale", "late_interaction.bias"):
                    K.fill(self.weight_grads[name], 0.0)
            return 0.0
        b = self._late((*g.late_rows, S))
        self._token_vectors(buffers.y, late.query_tokens, b.query_index, b.query_states, b.query_raw, b.query_unit,
                            b.query_inverse)
        self._token_vectors(buffers.y, late.document_tokens, b.document_index, b.document_states, b.document_raw,
                            b.document_unit, b.document_inverse)
        for buffer, values in ((b.query_segment, late.query_segment), (b.document_segment, late.document_segment)):
            buffer.view(0, values.size).write(values)
        for buffer, values in ((b.query_starts, late.query_starts), (b.query_counts, late.query_counts),
                               (b.document_starts, late.document_starts), (b.document_counts, late.document_counts),
                               (b.sign, late.sign), (b.weight, late.weight)):
            buffer.write(values)
        query_unit, document_unit = b.query_unit.view(0, (Q, W)), b.document_unit.view(0, (D, W))
        arg = b.arg.view(0, (Q, S))
        K.maxsim_forward(b.best.view(0, (Q, S)), arg, query_unit, document_unit, b.document_starts,
                         b.document_counts, W)
        K.maxsim_scores(b.scores, b.best.view(0, (Q, S)), b.query_starts, b.query_counts, b.document_counts)
        groups = buffers.contrastive.groups
        K.row_temperature(b.temperature, self.weights["late_interaction.log_scale"],
                          self.weights["late_interaction.bias"], groups)
        K.pair_loss(b.row_losses, b.d_scores, b.dlog_scale, b.dbias, b.scores, b.sign, b.weight, b.temperature,
                    form=late.form, ranked_norm=late.ranked_norm, grad_scale=weight)
        loss = float(np.sum(b.row_losses.numpy(), dtype=np.float64))
        if not with_gradient:
            return loss
        K.group_sums(self.weight_grads["late_interaction.log_scale"], b.dlog_scale, groups)
        K.group_sums(self.weight_grads["late_interaction.bias"], b.dbias, groups)
        # The backward reuses the forward's buffers once they are read for the last time: the unit vectors'
        # gradients (then, in place, the raw vectors') go into the *_raw buffers, and the states' gradients
        # into the *_states buffers after the token head's gradient has read the states.
        d_query_unit, d_document_unit = b.query_raw.view(0, (Q, W)), b.document_raw.view(0, (D, W))
        K.maxsim_backward(d_query_unit, d_document_unit, b.d_scores, arg, query_unit, document_unit,
                          b.query_segment.view(0, Q), b.document_segment.view(0, D), S, W)
        head, d_head = self.weights["late_interaction.token_head"], self.weight_grads["late_interaction.token_head"]
        for k, (n, index, states, d_unit, unit, inverse) in enumerate((
                (Q, b.query_index, b.query_states, d_query_unit, query_unit, b.query_inverse),
                (D, b.document_index, b.document_states, d_document_unit, document_unit, b.document_inverse))):
            K.l2_normalize_backward(d_unit, d_unit, unit, inverse.view(0, n), W, W)
            K.gemm(d_head, states.view(0, (n, H)), d_unit, H, W, n, transpose_a=True, accumulate=k > 0)
            d_states = states.view(0, (n, H))
            K.gemm(d_states, d_unit, head, n, H, W, transpose_b=True)
            K.scatter_rows(buffers.dy, d_states, index.view(0, n), H, accumulate=True)
        return loss

    # ---- calibrated choices -------------------------------------------------------------------------------

    def _choice_logits(self, buffers: EncoderBuffers, choices: ChoiceBatch) -> ChoiceBuffers:
        """The masked head's logits at each choosing item's MASK position, with its legal bytes uploaded."""
        H, C, total = self.geometry.hidden, choices.count, choices.choice_bytes.size
        b = self._choice_buffers(choices.capacity)
        b.positions.view(0, C).write(choices.positions)
        b.offsets.view(0, C + 1).write(choices.offsets)
        b.choice_bytes.view(0, total).write(choices.choice_bytes)
        K.gather_rows(b.states.view(0, (C, H)), buffers.y, b.positions.view(0, C), H)
        K.gemm(b.logits.view(0, (C, VOCABULARY_SIZE)), b.states.view(0, (C, H)), self.weights["masked_head"], C,
               VOCABULARY_SIZE, H)
        return b

    def _choices(self, buffers: EncoderBuffers, choices: ChoiceBatch, weight: float, with_gradient: bool,
                 dy_written: bool) -> tuple[float, bool]:
        """The choices term before its weight: the mean over the choosing items of the soft-target
        cross-entropy of the masked head's softmax over their legal bytes; with_gradient adds its gradient
        (times weight) into the masked head's gradient and dy."""
        H, V, C, total = self.geometry.hidden, VOCABULARY_SIZE, choices.count, choices.choice_bytes.size
        b = self._choice_logits(buffers, choices)
        b.targets.view(0, total).write(choices.targets)
        losses, d_logits = b.losses.view(0, C), b.d_logits.view(0, (C, V))
        K.choice_loss(b.probabilities.view(0, total), losses, d_logits if with_gradient else None,
                      b.logits.view(0, (C, V)), b.offsets.view(0, C + 1), b.choice_bytes.view(0, total),
                      b.targets.view(0, total), grad_scale=weight / C)
        loss = float(np.sum(losses.numpy(), dtype=np.float64) / C)
        if not with_gradient:
            return loss, dy_written
        if not dy_written:
            K.fill(buffers.dy, 0.0)
        states, d_states = b.states.view(0, (C, H)), b.d_states.view(0, (C, H))
        K.gemm(self.weight_grads["masked_head"], states, d_logits, H, V, C, transpose_a=True, accumulate=True)
        K.gemm(d_states, d_logits, self.weights["masked_head"], C, H, V, transpose_b=True)
        K.scatter_rows(buffers.dy, d_states, b.positions.view(0, C), H, accumulate=True)
        return loss, True

    def choice_probabilities(self, batch: StepBatch) -> np.ndarray:
        """Forward only: each choosing item's probabilities over its legal bytes, as one float32 tape."""
        buffers, _ = self._forward(batch)
        choices = batch.choices
        total = choices.choice_bytes.size
        b = self._choice_logits(buffers, choices)
        C = choices.count
        K.choice_loss(b.probabilities.view(0, total), None, None, b.logits.view(0, (C, VOCABULARY_SIZE)),
                      b.offsets.view(0, C + 1), b.choice_bytes.view(0, total), None)
        return b.probabilities.view(0, total).numpy()

    def late_token_vectors(self, batch: StepBatch, tokens: np.ndarray) -> np.ndarray:
        """Forward only: the unit token vectors (rows, width) float32 at the flat token indices `tokens` (at most
        the batch's positions)."""
        buffers, _ = self._forward(batch)
        index, states, raw, unit, inverse = self._vectors(batch.tokens.size)
        self._token_vectors(buffers.y, tokens, index, states, raw, unit, inverse)
        return unit.view(0, (tokens.size, self.geometry.late_width)).numpy()

    def masked_predictions(self) -> np.ndarray:
        """The argmax byte of the last forward's masked-head logits at every position (ties: lowest id)."""
        return np.argmax(self._last_buffers.masked.logits.numpy(), axis=1)
