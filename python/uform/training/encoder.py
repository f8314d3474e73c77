"""The text encoder on a device: embedding, a bidirectional segment-masked stack, the final norm,
and the masked and contrastive heads (math in docs/encoder.md).

``encoder_registry`` fixes the flat parameter order (and the checkpoint's tensor names);
``EncoderModel`` keeps parameters, gradient and AdamW moments resident on one device and
runs one step: forward, both losses, backward into the flat gradient, AdamW.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels as K
from ..engine import Buffer, Device
from ..nn.transformer import LAYER_TENSORS, StackGeometry, TransformerStack, embedding_backward, flat_views, \
    layer_views
from .enums import Objective
from .vocabulary import VOCABULARY_SIZE

HEAD_DIM = 64
MLP_RATIO = 4
NORM_EPS = 1e-5
ROPE_BASE = 10000.0
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01
DECAYED = ("embedding", "wq", "wk", "wv", "wo", "w_up", "w_down", "masked_head")


@dataclass(frozen=True)
class EncoderGeometry:
    hidden: int
    depth: int
    groups: int
    objective: Objective
    max_columns: int

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
    shapes = [("embedding", (VOCABULARY_SIZE, geometry.hidden))]
    layer = geometry.stack().layer_shapes()
    for i in range(geometry.depth):
        shapes += [(f"layers.{i}.{name}", layer[name]) for name in LAYER_TENSORS]
    shapes.append(("final_norm", (geometry.hidden,)))
    if geometry.masked:
        shapes.append(("masked_head", (geometry.hidden, VOCABULARY_SIZE)))
    if geometry.contrastive:
        shapes += [("temperature.log_scale", (geometry.groups,)), ("temperature.bias", (geometry.groups,))]
    registry, offset = [], 0
    for name, shape in shapes:
        size = int(np.prod(shape))
        registry.append({"name": name, "shape": shape, "offset": offset, "size": size})
        offset += size
    return registry


def decays(name: str) -> bool:
    """Whether AdamW's weight decay applies to a tensor: matrices yes, gains and temperatures no."""
    return name.rsplit(".", 1)[-1] in DECAYED


def initial_parameters(geometry: EncoderGeometry, seed: int, inverse_temperature: float, bias: float) -> np.ndarray:
    """Tensor n drawn from Philox(key=[seed, n]): normal σ = 0.02; gains 1; the temperatures as configured."""
    registry = encoder_registry(geometry)
    flat = np.empty(registry[-1]["offset"] + registry[-1]["size"], np.float32)
    for n, entry in enumerate(registry):
        part = flat[entry["offset"]:entry["offset"] + entry["size"]]
        name = entry["name"]
        if name.endswith("norm"):
            part[:] = 1.0
        elif name == "temperature.log_scale":
            part[:] = np.log(inverse_temperature)
        elif name == "temperature.bias":
            part[:] = bias
        else:
            rng = np.random.Generator(np.random.Philox(key=[seed, n]))
            part[:] = rng.standard_normal(entry["size"]) * 0.02
    return flat


@dataclass
class StepBatch:
    """One device's step, packed and resolved on the host (int32 arrays; pair targets float32)."""

    tokens: np.ndarray           # (rows, columns) corrupted inputs
    targets: np.ndarray          # (rows, columns) original bytes at covered positions, −1 elsewhere
    positions: np.ndarray        # (rows, columns)
    token_segments: np.ndarray   # (rows, columns) packed segment index, −1 for padding
    segment_starts: np.ndarray   # (S,) flat token index of each segment's first position
    segment_lengths: np.ndarray  # (S,)
    groups: np.ndarray           # (S,) temperature group of each segment
    sign: np.ndarray             # (S, S) +1 attract, −1 repel, 0 skipped
    weight: np.ndarray           # (S, S) weights with the form's normalisation folded in
    form: int                    # kernels.FORM_WEIGHTED_SIGMOID or FORM_RANKED
    ranked_norm: float
    covered: int                 # positions the masked loss reads


@dataclass
class StepLosses:
    masked: float
    contrastive: float
    total: float
    pooled: np.ndarray | None    # (S, hidden) unit-norm full-width embeddings as scored, if asked


class EncoderModel:
    """Parameters, gradient and AdamW moments resident on `device`, and one training step over them."""

    def __init__(self, device: Device, geometry: EncoderGeometry, parameters: np.ndarray, m: np.ndarray,
                 v: np.ndarray, widths: tuple[int, ...]):
        self.device = device
        self.geometry = geometry
        self.widths = widths
        self.registry = encoder_registry(geometry)
        self.parameters = device.put(parameters)
        self.gradients = device.zeros(parameters.size)
        self.m, self.v = device.put(m), device.put(v)
        self.p = flat_views(self.parameters, self.registry)
        self.g = flat_views(self.gradients, self.registry)
        self.stack = TransformerStack(device, geometry.stack(), geometry.max_columns)
        self._io: dict[tuple[int, int, int], dict[str, Buffer]] = {}
        self._last_io: tuple[int, int, int] | None = None
        self._decay_runs = self._runs()

    def _runs(self) -> list[tuple[int, int, bool]]:
        """Contiguous (offset, size, decays) runs of the flat vector, one AdamW launch each."""
        runs: list[list] = []
        for entry in self.registry:
            decay = decays(entry["name"])
            if runs and runs[-1][2] == decay:
                runs[-1][1] += entry["size"]
            else:
                runs.append([entry["offset"], entry["size"], decay])
        return [tuple(run) for run in runs]

    def download_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.parameters.numpy(), self.m.numpy(), self.v.numpy()

    def io(self, n: int, columns: int, segments: int) -> dict[str, Buffer]:
        key = (n, columns, segments)
        if key not in self._io:
            d, H, S = self.device, self.geometry.hidden, segments
            io = dict(ids=d.empty(n, np.int32), targets=d.empty(n, np.int32), positions=d.empty(n, np.int32),
                      token_segments=d.empty(n, np.int32), spans=d.empty((n, 2), np.int32), y=d.empty((n, H)), rstd=d.empty(n), dy=d.empty((n, H)),
                      order=d.empty(n, np.int32), offsets=d.empty(VOCABULARY_SIZE + 1, np.int32))
            if self.geometry.masked:
                io.update(logits=d.empty((n, VOCABULARY_SIZE)), dlogits=d.empty((n, VOCABULARY_SIZE)),
                          token_losses=d.empty(n))
            if self.geometry.contrastive and S:
                io.update(starts=d.empty(S, np.int32), lengths=d.empty(S, np.int32), groups=d.empty(S, np.int32),
                          sign=d.empty((S, S)), weight=d.empty((S, S)), pooled=d.empty((S, H)),
                          dpooled=d.empty((S, H)), temperature=d.empty((S, 2)), cos=d.empty((S, S)),
                          dcos=d.empty((S, S)), row_losses=d.empty(S), dlog_scale=d.empty(S), dbias=d.empty(S),
                          full=d.empty((S, H)), full_inverse=d.empty(S))
                for k, width in enumerate(self.widths):
                    io[f"u{k}"], io[f"du{k}"], io[f"inverse{k}"] = d.empty((S, width)), d.empty((S, width)), d.empty(S)
            self._io[key] = io
        return self._io[key]

    # ---- one step ------------------------------------------------------------------------------------

    def step_losses(self, batch: StepBatch, *, text_weight: float, with_gradient: bool,
                    want_pooled: bool = False) -> StepLosses:
        """Forward and losses; with_gradient also the whole backward into self.gradients."""
        g = self.geometry
        rows, columns = batch.tokens.shape
        n, S, H = rows * columns, len(batch.segment_starts), g.hidden
        io = self.io(n, columns, S)
        self._last_io = (n, columns, S)
        io["ids"].write(batch.tokens.reshape(-1))
        io["positions"].write(batch.positions.reshape(-1))
        io["token_segments"].write(batch.token_segments.reshape(-1))
        io["spans"].write(K.attention_spans(n, columns, batch.token_segments))
        K.embedding_forward(self.stack.input_buffer(n), self.p["embedding"], io["ids"], H)
        layers_p = layer_views(self.p, g.depth)
        h = self.stack.forward(layers_p, n, io["positions"], io["spans"])
        K.rmsnorm_forward(io["y"], io["rstd"], h, self.p["final_norm"], NORM_EPS)

        masked = contrastive = 0.0
        dy_written = False
        if g.masked:
            masked, dy_written = self._masked(io, batch, n, text_weight, with_gradient)
        pooled = None
        if g.contrastive and S:
            contrastive, pooled = self._contrastive(io, batch, n, S, with_gradient, dy_written, want_pooled)
            dy_written = dy_written or with_gradient
        weight = text_weight if g.masked else 0.0
        losses = StepLosses(masked=masked, contrastive=contrastive, total=weight * masked + contrastive,
                            pooled=pooled)
        if not with_gradient:
            return losses
        if not dy_written:
            K.fill(io["dy"], 0.0)
        _, work = self.stack.buffers(n)
        K.rmsnorm_backward(work["dh"], work["dgain_rows"], io["dy"], h, self.p["final_norm"], io["rstd"])
        K.column_sum(self.g["final_norm"], work["dgain_rows"], n, H, partial=work["partial"])
        dh = self.stack.backward(layers_p, layer_views(self.g, g.depth), n, io["positions"], io["spans"])
        embedding_backward(self.g["embedding"], dh, batch.tokens, io["order"], io["offsets"], H)
        return losses

    def _masked(self, io, batch: StepBatch, n: int, text_weight: float, with_gradient: bool) -> tuple[float, bool]:
        H = self.geometry.hidden
        K.gemm(io["logits"], io["y"], self.p["masked_head"], n, VOCABULARY_SIZE, H)
        io["targets"].write(batch.targets.reshape(-1))
        scale = text_weight / batch.covered if batch.covered else 0.0
        K.cross_entropy(io["token_losses"], io["dlogits"] if with_gradient else None, io["logits"], io["targets"],
                        grad_scale=scale)
        loss = float(np.sum(io["token_losses"].numpy(), dtype=np.float64) / batch.covered) if batch.covered else 0.0
        if with_gradient:
            K.gemm(self.g["masked_head"], io["y"], io["dlogits"], H, VOCABULARY_SIZE, n, transpose_a=True)
            K.gemm(io["dy"], io["dlogits"], self.p["masked_head"], n, H, VOCABULARY_SIZE, transpose_b=True)
        return loss, with_gradient

    def _contrastive(self, io, batch: StepBatch, n: int, S: int, with_gradient: bool, accumulate: bool,
                     want_pooled: bool) -> tuple[float, np.ndarray | None]:
        H = self.geometry.hidden
        io["starts"].write(batch.segment_starts)
        io["lengths"].write(batch.segment_lengths)
        io["groups"].write(batch.groups)
        io["sign"].write(batch.sign)
        io["weight"].write(batch.weight)
        K.pool_forward(io["pooled"], io["y"], io["starts"], io["lengths"], H)
        pooled = None
        if want_pooled:
            K.l2_normalize_forward(io["full"], io["full_inverse"], io["pooled"], H, H)
            pooled = io["full"].numpy()
        K.row_temperature(io["temperature"], self.p["temperature.log_scale"], self.p["temperature.bias"],
                          io["groups"])
        total = 0.0
        share = 1.0 / len(self.widths)
        for k, width in enumerate(self.widths):
            u, du, inverse = io[f"u{k}"], io[f"du{k}"], io[f"inverse{k}"]
            K.l2_normalize_forward(u, inverse, io["pooled"], width, H)
            K.gemm(io["cos"], u, u, S, S, width, transpose_b=True)
            K.pair_loss(io["row_losses"], io["dcos"], io["dlog_scale"], io["dbias"], io["cos"], io["sign"],
                        io["weight"], io["temperature"], form=batch.form, ranked_norm=batch.ranked_norm,
                        grad_scale=share)
            total += float(np.sum(io["row_losses"].numpy(), dtype=np.float64))
            if not with_gradient:
                continue
            K.group_sums(self.g["temperature.log_scale"], io["dlog_scale"], io["groups"], accumulate=k > 0)
            K.group_sums(self.g["temperature.bias"], io["dbias"], io["groups"], accumulate=k > 0)
            # cos = u·uᵀ, so du = dcos·u + dcosᵀ·u
            K.gemm(du, io["dcos"], u, S, width, S)
            K.gemm(du, io["dcos"], u, S, width, S, transpose_a=True, accumulate=True)
            if k == 0 and width < H:
                K.fill(io["dpooled"], 0.0)
            K.l2_normalize_backward(io["dpooled"], du, u, inverse, width, H, accumulate=k > 0 or width < H)
        if with_gradient:
            K.pool_backward(io["dy"], io["dpooled"], io["token_segments"], io["lengths"], H, accumulate=accumulate)
        return total * share, pooled

    def masked_predictions(self) -> np.ndarray:
        """The argmax byte of the last forward's masked-head logits at every position (ties: lowest id)."""
        return np.argmax(self._io[self._last_io]["logits"].numpy(), axis=1)

    def adamw(self, *, step: int, lr: float) -> None:
        for offset, size, decay in self._decay_runs:
            K.adamw(self.parameters.view(offset, size), self.gradients.view(offset, size), self.m.view(offset, size),
                    self.v.view(offset, size), step=step, lr=lr, betas=BETAS, eps=EPS,
                    weight_decay=WEIGHT_DECAY if decay else 0.0)
