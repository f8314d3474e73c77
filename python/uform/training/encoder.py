"""The encoder on a device: embedding (bytes, and media patches through their patch embeddings), a
bidirectional segment-masked stack, the final norm, and the masked, reconstruction and contrastive
heads (math in docs/encoder.md).

``encoder_registry`` fixes the flat parameter order (and the checkpoint's tensor names);
``EncoderModel`` is the encoder's resident state (``uform.nn.resident``: parameters, gradient and
AdamW moments on one device) with one step over it: forward, both losses, backward into the flat
gradient; the trainer then applies AdamW.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import kernels as K
from ..engine import Buffer, Device
from ..nn.cache import RecentCache
from ..nn.resident import AdamW, HostState, ResidentState, named_tensors, registry_size, tensor_registry
from ..nn.tokens import CrossEntropyHead, TokenInputs
from ..nn.transformer import StackGeometry, TransformerStack, layer_tensors
from .enums import Objective
from .media_step import POSITION_AXES, MediaBatch
from .vocabulary import VOCABULARY_SIZE

HEAD_DIM = 64
MLP_RATIO = 4
NORM_EPS = 1e-5
ROPE_BASE = 10000.0
DECAYED = ("embedding", "wq", "wk", "wv", "wo", "w_up", "w_down", "masked_head", "patch_embedding", "reconstruction")


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
    for name, width in geometry.media:
        shapes.append((f"{name}.patch_embedding", (width, geometry.hidden)))
        if geometry.masked:
            shapes.append((f"{name}.reconstruction", (geometry.hidden, width)))
    return tensor_registry(shapes)


def decays(name: str) -> bool:
    """Whether AdamW's weight decay applies to a tensor: matrices yes, gains and temperatures no."""
    return name.rsplit(".", 1)[-1] in DECAYED


ADAMW = AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, decays=decays)


def initial_parameters(geometry: EncoderGeometry, seed: int, inverse_temperature: float, bias: float) -> np.ndarray:
    """Tensor n drawn from Philox(key=[seed, n]): normal σ = 0.02; gains 1; the temperatures as configured."""
    registry = encoder_registry(geometry)
    flat = np.empty(registry_size(registry), np.float32)
    for n, (name, part) in enumerate(named_tensors(flat, registry).items()):
        if name.endswith("norm"):
            part[...] = 1.0
        elif name == "temperature.log_scale":
            part[...] = np.log(inverse_temperature)
        elif name == "temperature.bias":
            part[...] = bias
        else:
            rng = np.random.Generator(np.random.Philox(key=[seed, n]))
            part[...] = (rng.standard_normal(part.size) * 0.02).reshape(part.shape)
    return flat


@dataclass
class StepBatch:
    """One device's step, packed and resolved on the host (int32 arrays; pair targets float32)."""

    tokens: np.ndarray           # (rows, columns) corrupted inputs
    targets: np.ndarray          # (rows, columns) original bytes at covered positions, −1 elsewhere
    positions: np.ndarray        # (rows, columns), or (rows, columns, 3): time, row, column
    token_segments: np.ndarray   # (rows, columns) packed segment index, −1 for padding
    segment_starts: np.ndarray   # (S,) flat token index of each segment's first position
    segment_lengths: np.ndarray  # (S,)
    groups: np.ndarray           # (S,) temperature group of each segment
    sign: np.ndarray             # (S, S) +1 attract, −1 repel, 0 skipped
    weight: np.ndarray           # (S, S) weights with the form's normalisation folded in
    form: int                    # kernels.FORM_WEIGHTED_SIGMOID or FORM_RANKED
    ranked_norm: float
    covered: int                 # positions the masked loss reads
    media: MediaBatch | None = None  # the media tokens' rows, if the step has media items

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


@dataclass
class PrefixBuffers:
    """One matryoshka width's unit-norm prefixes of the pooled embeddings, their gradient and 1/norms."""

    u: Buffer
    du: Buffer
    inverse: Buffer


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
    row_losses: Buffer
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
                   temperature=d.empty((S, 2)), cos=d.empty((S, S)), dcos=d.empty((S, S)), row_losses=d.empty(S),
                   dlog_scale=d.empty(S), dbias=d.empty(S), full=d.empty((S, H)), full_inverse=d.empty(S),
                   prefixes=[PrefixBuffers(u=d.empty((S, width)), du=d.empty((S, width)), inverse=d.empty(S))
                             for width in widths])


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

    inputs: Buffer         # (n, width) the shown tokens' pixels or samples
    visible: Buffer        # (n,) int32 their flat token indices
    d_embedded: Buffer     # (n, hidden) the gradient at their patch embeddings
    targets: Buffer        # (n, width) the hidden tokens' reconstruction targets
    hidden: Buffer         # (n,) int32 their flat token indices
    states: Buffer         # (n, hidden) their final-norm states
    d_states: Buffer       # (n, hidden) and the gradient there
    prediction: Buffer     # (n, width) the reconstruction head's output
    d_prediction: Buffer   # (n, width)
    row_losses: Buffer     # (n,)

    @classmethod
    def allocate(cls, device: Device, n: int, width: int, hidden: int) -> ModalityBuffers:
        d = device
        return cls(inputs=d.empty((n, width)), visible=d.empty(n, np.int32), d_embedded=d.empty((n, hidden)),
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
class EncoderBuffers:
    """One step geometry's buffers: the tokens, their packed segments, the final-norm states y (and their
    rstd and gradient dy), and the heads the objective has."""

    tokens: TokenInputs
    token_segments: Buffer
    y: Buffer
    rstd: Buffer
    dy: Buffer
    masked: CrossEntropyHead | None
    contrastive: ContrastiveBuffers | None
    media: MediaBuffers | None


class EncoderModel(ResidentState):
    """The encoder's resident state on `device` (``uform.nn.resident``) and one training step over it."""

    def __init__(self, device: Device, geometry: EncoderGeometry, state: HostState, widths: tuple[int, ...], *,
                 training: bool = True):
        super().__init__(device, encoder_registry(geometry), state, ADAMW, training=training)
        self.geometry = geometry
        self.widths = widths
        self.layer_weights = layer_tensors(self.weights, geometry.depth)
        self.layer_grads = layer_tensors(self.weight_grads, geometry.depth) if training else None
        self.stack = TransformerStack(device, geometry.stack(), geometry.max_columns)
        self._buffers = RecentCache(self._allocate)
        self._pooling = RecentCache(self._allocate_pooling)
        self._last_buffers: EncoderBuffers | None = None

    def buffers(self, n: int, columns: int, segments: int) -> EncoderBuffers:
        """The buffers of n tokens in rows of `columns` packing `segments` segments, made on first use (the
        few most recent geometries' are kept: ``uform.nn.cache``)."""
        return self._buffers((n, columns, segments))

    def _allocate(self, key: tuple[int, int, int]) -> EncoderBuffers:
        n, _, segments = key
        d, g = self.device, self.geometry
        masked = CrossEntropyHead.allocate(d, n, VOCABULARY_SIZE) if g.masked else None
        contrastive = ContrastiveBuffers.allocate(d, segments, g.hidden, self.widths) \
            if g.contrastive and segments else None
        media = MediaBuffers(
            row_of=d.empty(n, np.int32), embedded=d.empty((n, g.hidden)),
            modalities={name: ModalityBuffers.allocate(d, n, width, g.hidden) for name, width in g.media},
        ) if g.media else None
        return EncoderBuffers(
            tokens=TokenInputs.allocate(d, n, VOCABULARY_SIZE, POSITION_AXES),
            token_segments=d.empty(n, np.int32), y=d.empty((n, g.hidden)), rstd=d.empty(n),
            dy=d.empty((n, g.hidden)), masked=masked, contrastive=contrastive, media=media)

    def _forward(self, batch: StepBatch) -> tuple[EncoderBuffers, Buffer]:
        """The tower over a packed batch up to the final norm (in buffers.y); answers the buffers and the
        stack's output h."""
        rows, columns = batch.tokens.shape
        n, S = rows * columns, len(batch.segment_starts)
        buffers = self.buffers(n, columns, S)
        self._last_buffers = buffers
        tokens = buffers.tokens
        tokens.ids.write(batch.tokens.reshape(-1))
        positions = batch.positions if batch.positions.ndim == 3 else \
            np.repeat(batch.positions[..., None], POSITION_AXES, -1)
        tokens.positions.write(positions.reshape(n, POSITION_AXES))
        buffers.token_segments.write(batch.token_segments.reshape(-1))
        tokens.spans.write(K.attention_spans(n, columns, batch.token_segments))
        media = batch.media_rows()
        if media is not None:
            self._embed_media(buffers, media)
            tokens.embed(self.stack.buffers(n).input, self.weights["embedding"], buffers.media.embedded,
                         buffers.media.row_of)
        else:
            tokens.embed(self.stack.buffers(n).input, self.weights["embedding"])
        h = self.stack.forward(self.layer_weights, n, tokens.positions, tokens.spans)
        K.rmsnorm_forward(buffers.y, buffers.rstd, h, self.weights["final_norm"], NORM_EPS)
        return buffers, h

    def embeddings(self, batch: StepBatch, width: int) -> np.ndarray:
        """Forward only: every packed segment's mean final state, its first `width` dims L2-normalised,
        (segments, width) float32."""
        H = self.geometry.hidden
        buffers, _ = self._forward(batch)
        segments = len(batch.segment_starts)
        p = self._pooling((segments, width))
        p.starts.write(batch.segment_starts)
        p.lengths.write(batch.segment_lengths)
        K.pool_forward(p.pooled, buffers.y, p.starts, p.lengths, H)
        K.l2_normalize_forward(p.unit, p.inverse, p.pooled, width, H)
        return p.unit.numpy()

    def _allocate_pooling(self, key: tuple[int, int]) -> PoolingBuffers:
        segments, width = key
        d = self.device
        return PoolingBuffers(starts=d.empty(segments, np.int32), lengths=d.empty(segments, np.int32),
                              pooled=d.empty((segments, self.geometry.hidden)), unit=d.empty((segments, width)),
                              inverse=d.empty(segments))

    # ---- one step ------------------------------------------------------------------------------------

    def step_losses(self, batch: StepBatch, *, text_weight: float, with_gradient: bool,
                    want_pooled: bool = False, media_weights: dict[str, float] | None = None) -> StepLosses:
        """Forward and losses; with_gradient also the whole backward into self.gradients. media_weights:
        each media modality's reconstruction weight (by name)."""
        g = self.geometry
        n, H = batch.tokens.size, g.hidden
        media_weights = media_weights or {}
        buffers, h = self._forward(batch)
        tokens = buffers.tokens
        media = batch.media_rows()

        masked = contrastive = 0.0
        dy_written = False
        if g.masked:
            masked, dy_written = self._masked(buffers, batch, text_weight, with_gradient)
        reconstruction = {}
        if g.masked and g.media:
            reconstruction, dy_written = self._reconstruct(buffers, media, media_weights, with_gradient, dy_written)
        pooled = None
        if buffers.contrastive is not None:
            contrastive, pooled = self._contrastive(buffers, batch, with_gradient, dy_written, want_pooled)
            dy_written = dy_written or with_gradient
        weight = text_weight if g.masked else 0.0
        total = weight * masked + sum(media_weights.get(name, 0.0) * loss
                                      for name, loss in reconstruction.items()) + contrastive
        losses = StepLosses(masked=masked, contrastive=contrastive, total=total, pooled=pooled,
                            reconstruction=reconstruction)
        if not with_gradient:
            return losses
        if not dy_written:
            K.fill(buffers.dy, 0.0)
        work = self.stack.buffers(n).work
        K.rmsnorm_backward(work.dh, work.dgain_rows, buffers.dy, h, self.weights["final_norm"], buffers.rstd)
        K.column_sum(self.weight_grads["final_norm"], work.dgain_rows, n, H, partial=work.partial)
        dh = self.stack.backward(self.layer_weights, self.layer_grads, n, tokens.positions, tokens.spans)
        tokens.embedding_backward(self.weight_grads["embedding"], dh, batch.tokens)
        if g.media:
            self._patch_embedding_backward(buffers, media, dh)
        return losses

    # ---- media: patch embeddings in, reconstruction heads out -----------------------------------------

    def _embed_media(self, buffers: EncoderBuffers, media: MediaBatch) -> None:
        """Each modality's shown tokens through its patch embedding (E = inputs·W), stacked in order."""
        H = self.geometry.hidden
        stacked = 0
        for name, width in self.geometry.media:
            rows = media.modalities.get(name)
            if rows is None or rows.visible.size == 0:
                continue
            b, shown = buffers.media.modalities[name], rows.visible.size
            inputs = b.inputs.view(0, (shown, width))
            inputs.write(rows.inputs)
            b.visible.view(0, shown).write(rows.visible)
            K.gemm(buffers.media.embedded.view(stacked * H, (shown, H)), inputs,
                   self.weights[f"{name}.patch_embedding"], shown, H, width)
            stacked += shown
        buffers.media.row_of.write(media.row_of)

    def _patch_embedding_backward(self, buffers: EncoderBuffers, media: MediaBatch | None, dh: Buffer) -> None:
        """dW = inputsᵀ·dE for each modality, dE the input gradient at its shown tokens (zero without any)."""
        H = self.geometry.hidden
        for name, width in self.geometry.media:
            gradient = self.weight_grads[f"{name}.patch_embedding"]
            rows = media.modalities.get(name) if media is not None else None
            if rows is None or rows.visible.size == 0:
                K.fill(gradient, 0.0)
                continue
            b, shown = buffers.media.modalities[name], rows.visible.size
            d_embedded = b.d_embedded.view(0, (shown, H))
            K.gather_rows(d_embedded, dh, b.visible.view(0, shown), H)
            K.gemm(gradient, b.inputs.view(0, (shown, width)), d_embedded, width, H, shown, transpose_a=True)

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
                with_gradient: bool) -> tuple[float, bool]:
        head = buffers.masked
        head.forward(buffers.y, self.weights["masked_head"])
        scale = text_weight / batch.covered if batch.covered else 0.0
        head.score(batch.targets, grad_scale=scale, with_gradient=with_gradient)
        loss = float(np.sum(head.losses.numpy(), dtype=np.float64) / batch.covered) if batch.covered else 0.0
        if with_gradient:
            head.backward(self.weight_grads["masked_head"], buffers.dy, buffers.y, self.weights["masked_head"])
        return loss, with_gradient

    def _contrastive(self, buffers: EncoderBuffers, batch: StepBatch, with_gradient: bool, accumulate: bool,
                     want_pooled: bool) -> tuple[float, np.ndarray | None]:
        H = self.geometry.hidden
        c = buffers.contrastive
        S = c.starts.size
        c.starts.write(batch.segment_starts)
        c.lengths.write(batch.segment_lengths)
        c.groups.write(batch.groups)
        c.sign.write(batch.sign)
        c.weight.write(batch.weight)
        K.pool_forward(c.pooled, buffers.y, c.starts, c.lengths, H)
        pooled = None
        if want_pooled:
            K.l2_normalize_forward(c.full, c.full_inverse, c.pooled, H, H)
            pooled = c.full.numpy()
        K.row_temperature(c.temperature, self.weights["temperature.log_scale"], self.weights["temperature.bias"],
                          c.groups)
        total = 0.0
        share = 1.0 / len(self.widths)
        for k, (width, prefix) in enumerate(zip(self.widths, c.prefixes)):
            u, du, inverse = prefix.u, prefix.du, prefix.inverse
            K.l2_normalize_forward(u, inverse, c.pooled, width, H)
            K.gemm(c.cos, u, u, S, S, width, transpose_b=True)
            K.pair_loss(c.row_losses, c.dcos, c.dlog_scale, c.dbias, c.cos, c.sign, c.weight, c.temperature,
                        form=batch.form, ranked_norm=batch.ranked_norm, grad_scale=share)
            total += float(np.sum(c.row_losses.numpy(), dtype=np.float64))
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
            K.pool_backward(buffers.dy, c.dpooled, buffers.token_segments, c.lengths, H, accumulate=accumulate)
        return total * share, pooled

    def masked_predictions(self) -> np.ndarray:
        """The argmax byte of the last forward's masked-head logits at every position (ties: lowest id)."""
        return np.argmax(self._last_buffers.masked.logits.numpy(), axis=1)
