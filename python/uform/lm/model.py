"""The byte language model on a device: forward and backward composed of engine kernels.

``DeviceModel`` holds the resident training state on one device (flat
parameters, their gradient, the AdamW moments) and, per batch geometry, the
activations the backward reads. Every tensor of the model is a view into the
flat buffers, in ``parameter_registry`` order, so the state leaves the device
as three downloads. The architecture and its float64 twin are described in
``uform.lm.config`` and ``uform.lm.reference``; the kernels' math is beside
their bodies in ``mojo/kernels/``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels as K
from ..engine import Buffer, Device
from .config import LanguageModelConfig, parameter_registry

LAYER_TENSORS = ("attention_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_up", "w_down")


@dataclass
class Activations:
    """What one forward pass of a (batch, length) geometry keeps for its backward."""

    batch: int
    length: int
    ids: Buffer          # inputs [N] int32
    targets: Buffer      # [N] int32
    positions: Buffer    # [N] int32
    layers: list         # per layer: dict of buffers
    hidden: Buffer       # final hidden state [N, W]
    logits: Buffer       # [N, V]
    losses: Buffer       # [N]
    dlogits: Buffer      # [N, V]
    work: dict           # backward scratch, reused every step


class DeviceModel:
    """Parameters, gradient and AdamW moments resident on `device`, and the passes over them."""

    def __init__(self, device: Device, shape: LanguageModelConfig, parameters: np.ndarray, m: np.ndarray,
                 v: np.ndarray):
        self.device = device
        self.shape = shape
        self.parameters = device.put(parameters)
        self.gradients = device.zeros(shape.n_total)
        self.m = device.put(m)
        self.v = device.put(v)
        self.registry = parameter_registry(shape)
        self.p = self._views(self.parameters)
        self.g = self._views(self.gradients)
        cos, sin = K.rotary_tables(shape.length, shape.head_dim, shape.rope_base)
        self.cos, self.sin = device.put(cos), device.put(sin)
        self._activations: dict[tuple[int, int], Activations] = {}

    def _views(self, flat: Buffer) -> dict[str, Buffer]:
        return {entry["name"]: flat.view(entry["offset"], entry["shape"]) for entry in self.registry}

    def layer(self, views: dict[str, Buffer], i: int) -> dict[str, Buffer]:
        return {name: views[f"layers.{i}.{name}"] for name in LAYER_TENSORS}

    def download_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.parameters.numpy(), self.m.numpy(), self.v.numpy()

    # ---- workspace ---------------------------------------------------------------------------------

    def activations(self, batch: int, length: int) -> Activations:
        """The activation buffers of this geometry, made on first use and kept."""
        key = (batch, length)
        if key not in self._activations:
            c, d = self.shape, self.device
            n = batch * length
            qw, kw = c.heads * c.head_dim, c.kv_heads * c.head_dim
            layers = [dict(h_in=d.empty((n, c.width)), a=d.empty((n, c.width)), rstd1=d.empty(n),
                           q=d.empty((n, qw)), k=d.empty((n, kw)), v=d.empty((n, kw)), o=d.empty((n, qw)),
                           lse=d.empty((n, c.heads)), h_mid=d.empty((n, c.width)), m=d.empty((n, c.width)),
                           rstd2=d.empty(n), u=d.empty((n, c.mlp)), s=d.empty((n, c.mlp)))
                      for _ in range(c.layers)]
            positions = np.tile(np.arange(length, dtype=np.int32), batch)
            work = dict(dh=d.empty((n, c.width)), dx=d.empty((n, c.width)), scratch=d.empty((n, c.width)),
                        dgain_rows=d.empty((n, c.width)), partial=K.column_sum_workspace(d, n, c.width),
                        dq=d.empty((n, qw)), dk=d.empty((n, kw)), dv=d.empty((n, kw)), do=d.empty((n, qw)),
                        delta=d.empty((n, c.heads)), du=d.empty((n, c.mlp)), ds=d.empty((n, c.mlp)),
                        order=d.empty(n, np.int32), offsets=d.empty(c.vocab_size + 1, np.int32))
            self._activations[key] = Activations(
                batch, length, d.empty(n, np.int32), d.empty(n, np.int32), d.put(positions), layers,
                d.empty((n, c.width)), d.empty((n, c.vocab_size)), d.empty(n), d.empty((n, c.vocab_size)), work)
        return self._activations[key]

    # ---- forward -----------------------------------------------------------------------------------

    def forward(self, inputs: np.ndarray) -> Activations:
        """Logits of inputs (B, T) int32, keeping what the backward needs."""
        c = self.shape
        batch, length = inputs.shape
        act = self.activations(batch, length)
        n = batch * length
        act.ids.write(inputs.reshape(-1))
        h = act.layers[0]["h_in"] if c.layers else act.hidden
        K.embedding_forward(h, self.p["embedding"], act.ids, c.width)
        scratch = act.work["scratch"]
        for i, buffers in enumerate(act.layers):
            w = self.layer(self.p, i)
            b = buffers
            K.rmsnorm_forward(b["a"], b["rstd1"], b["h_in"], w["attention_norm"], c.norm_eps)
            K.gemm(b["q"], b["a"], w["wq"], n, c.heads * c.head_dim, c.width)
            K.gemm(b["k"], b["a"], w["wk"], n, c.kv_heads * c.head_dim, c.width)
            K.gemm(b["v"], b["a"], w["wv"], n, c.kv_heads * c.head_dim, c.width)
            K.rotary(b["q"], act.positions, self.cos, self.sin, heads=c.heads, head_dim=c.head_dim)
            K.rotary(b["k"], act.positions, self.cos, self.sin, heads=c.kv_heads, head_dim=c.head_dim)
            K.attention_forward(b["o"], b["lse"], b["q"], b["k"], b["v"], seq_len=length, heads=c.heads,
                                kv_heads=c.kv_heads, head_dim=c.head_dim, causal=True)
            K.gemm(scratch, b["o"], w["wo"], n, c.width, c.heads * c.head_dim)
            K.add(b["h_mid"], b["h_in"], scratch)
            K.rmsnorm_forward(b["m"], b["rstd2"], b["h_mid"], w["mlp_norm"], c.norm_eps)
            K.gemm(b["u"], b["m"], w["w_up"], n, c.mlp, c.width)
            K.silu(b["s"], b["u"])
            K.gemm(scratch, b["s"], w["w_down"], n, c.width, c.mlp)
            h_out = act.layers[i + 1]["h_in"] if i + 1 < c.layers else act.hidden
            K.add(h_out, b["h_mid"], scratch)
        K.gemm(act.logits, act.hidden, self.p["head"], n, c.vocab_size, c.width)
        return act

    def losses(self, act: Activations, targets: np.ndarray, *, with_gradient: bool) -> np.ndarray:
        """Per-position cross-entropy (downloaded), and with_gradient the mean loss's dlogits."""
        n = act.batch * act.length
        act.targets.write(targets.reshape(-1))
        K.cross_entropy(act.losses, act.dlogits if with_gradient else None, act.logits, act.targets,
                        grad_scale=1.0 / n)
        return act.losses.numpy()

    # ---- backward ----------------------------------------------------------------------------------

    def backward(self, act: Activations, inputs: np.ndarray) -> None:
        """The gradient of the mean loss into self.gradients (overwritten), from act.dlogits."""
        c, work = self.shape, act.work
        n = act.batch * act.length
        qw, kw = c.heads * c.head_dim, c.kv_heads * c.head_dim
        dh, dx, dgain_rows, partial = work["dh"], work["dx"], work["dgain_rows"], work["partial"]
        dq, dk, dv, do, du, ds = (work[name] for name in ("dq", "dk", "dv", "do", "du", "ds"))
        K.gemm(self.g["head"], act.hidden, act.dlogits, c.width, c.vocab_size, n, transpose_a=True)
        K.gemm(dh, act.dlogits, self.p["head"], n, c.width, c.vocab_size, transpose_b=True)
        geometry = dict(seq_len=act.length, heads=c.heads, kv_heads=c.kv_heads, head_dim=c.head_dim, causal=True,
                        delta=work["delta"])
        for i in reversed(range(c.layers)):
            w, g, b = self.layer(self.p, i), self.layer(self.g, i), act.layers[i]
            # h_out = h_mid + silu(m·w_up)·w_down
            K.gemm(g["w_down"], b["s"], dh, c.mlp, c.width, n, transpose_a=True)
            K.gemm(ds, dh, w["w_down"], n, c.mlp, c.width, transpose_b=True)
            K.silu_backward(du, b["u"], ds)
            K.gemm(g["w_up"], b["m"], du, c.width, c.mlp, n, transpose_a=True)
            K.gemm(dx, du, w["w_up"], n, c.width, c.mlp, transpose_b=True)
            K.rmsnorm_backward(dx, dgain_rows, dx, b["h_mid"], w["mlp_norm"], b["rstd2"])
            K.column_sum(g["mlp_norm"], dgain_rows, n, c.width, partial=partial)
            K.add(dh, dh, dx)
            # h_mid = h_in + attention(rmsnorm(h_in))·wo
            K.gemm(g["wo"], b["o"], dh, qw, c.width, n, transpose_a=True)
            K.gemm(do, dh, w["wo"], n, qw, c.width, transpose_b=True)
            K.attention_backward(dq, dk, dv, do, b["o"], b["lse"], b["q"], b["k"], b["v"], **geometry)
            K.rotary(dq, act.positions, self.cos, self.sin, heads=c.heads, head_dim=c.head_dim, inverse=True)
            K.rotary(dk, act.positions, self.cos, self.sin, heads=c.kv_heads, head_dim=c.head_dim, inverse=True)
            K.gemm(g["wq"], b["a"], dq, c.width, qw, n, transpose_a=True)
            K.gemm(g["wk"], b["a"], dk, c.width, kw, n, transpose_a=True)
            K.gemm(g["wv"], b["a"], dv, c.width, kw, n, transpose_a=True)
            K.gemm(dx, dq, w["wq"], n, c.width, qw, transpose_b=True)
            K.gemm(dx, dk, w["wk"], n, c.width, kw, transpose_b=True, accumulate=True)
            K.gemm(dx, dv, w["wv"], n, c.width, kw, transpose_b=True, accumulate=True)
            K.rmsnorm_backward(dx, dgain_rows, dx, b["h_in"], w["attention_norm"], b["rstd1"])
            K.column_sum(g["attention_norm"], dgain_rows, n, c.width, partial=partial)
            K.add(dh, dh, dx)
        order, offsets = K.embedding_groups(inputs, c.vocab_size)
        work["order"].write(order)
        work["offsets"].write(offsets)
        K.embedding_backward(self.g["embedding"], dh, work["order"], work["offsets"], c.width)

    def adamw(self, *, step: int, lr: float, betas, eps: float, weight_decay: float) -> None:
        K.adamw(self.parameters, self.gradients, self.m, self.v, step=step, lr=lr, betas=betas, eps=eps,
                weight_decay=weight_decay)
