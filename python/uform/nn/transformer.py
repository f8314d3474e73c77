"""A stack of pre-norm transformer blocks on a device, forward and backward, from engine kernels.

Block i, on the residual stream h of N tokens × width:

    a = rmsnorm(h)·attention_norm;  q, k, v = a·wq, a·wk, a·wv;  rotary(q, k) at each token's position
    h = h + attention(q, k, v)·wo                 (causal, or blind across segments, or both)
    m = rmsnorm(h)·mlp_norm;        h = h + silu(m·w_up)·w_down

Both trainers use it: the byte language model (causal, grouped-query) and the text encoder
(bidirectional inside packed segments). The stack reads its weights and writes its gradients as
views into the caller's flat buffers, keyed by the names of LAYER_TENSORS.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels as K
from ..engine import Buffer, Device

LAYER_TENSORS = ("attention_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_up", "w_down")


@dataclass(frozen=True)
class StackGeometry:
    width: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    layers: int
    norm_eps: float
    rope_base: float
    causal: bool

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        w = self.width
        return {"attention_norm": (w,), "wq": (w, self.q_width), "wk": (w, self.kv_width),
                "wv": (w, self.kv_width), "wo": (self.q_width, w), "mlp_norm": (w,),
                "w_up": (w, self.mlp), "w_down": (self.mlp, w)}


class TransformerStack:
    """The blocks' passes over N tokens; activations and scratch are kept per token count."""

    def __init__(self, device: Device, geometry: StackGeometry, max_positions: int):
        self.device = device
        self.geometry = geometry
        cos, sin = K.rotary_tables(max_positions, geometry.head_dim, geometry.rope_base)
        self.cos, self.sin = device.put(cos), device.put(sin)
        self._buffers: dict[int, tuple[list, dict]] = {}

    def buffers(self, n: int) -> tuple[list[dict], dict]:
        """Per-layer activations (h_in is each block's input) and shared backward scratch for n tokens."""
        if n not in self._buffers:
            g, d = self.geometry, self.device
            layers = [dict(h_in=d.empty((n, g.width)), a=d.empty((n, g.width)), rstd1=d.empty(n),
                           q=d.empty((n, g.q_width)), k=d.empty((n, g.kv_width)), v=d.empty((n, g.kv_width)),
                           o=d.empty((n, g.q_width)), lse=d.empty((n, g.heads)), h_mid=d.empty((n, g.width)),
                           m=d.empty((n, g.width)), rstd2=d.empty(n), u=d.empty((n, g.mlp)),
                           s=d.empty((n, g.mlp)))
                      for _ in range(g.layers)]
            work = dict(h_out=d.empty((n, g.width)), dh=d.empty((n, g.width)), dx=d.empty((n, g.width)),
                        scratch=d.empty((n, g.width)), dgain_rows=d.empty((n, g.width)),
                        partial=K.column_sum_workspace(d, n, g.width), dq=d.empty((n, g.q_width)),
                        dk=d.empty((n, g.kv_width)), dv=d.empty((n, g.kv_width)), do=d.empty((n, g.q_width)),
                        delta=d.empty((n, g.heads)), du=d.empty((n, g.mlp)), ds=d.empty((n, g.mlp)))
            self._buffers[n] = (layers, work)
        return self._buffers[n]

    def token_counts(self) -> list[int]:
        """The token counts whose buffers are held."""
        return list(self._buffers)

    def input_buffer(self, n: int) -> Buffer:
        """Where the caller writes the embedded input of n tokens."""
        layers, work = self.buffers(n)
        return layers[0]["h_in"] if layers else work["h_out"]

    def _attention(self, spans: Buffer, work: dict | None = None) -> dict:
        g = self.geometry
        geometry = dict(heads=g.heads, kv_heads=g.kv_heads, head_dim=g.head_dim, causal=g.causal, spans=spans)
        if work is not None:
            geometry["delta"] = work["delta"]
        return geometry

    def forward(self, weights: list[dict[str, Buffer]], n: int, positions: Buffer, spans: Buffer) -> Buffer:
        """Run every block over the input buffer, each token attending within its span
        (kernels.attention_spans); answers the output of the last block."""
        g = self.geometry
        layers, work = self.buffers(n)
        scratch = work["scratch"]
        for i, (w, b) in enumerate(zip(weights, layers)):
            K.rmsnorm_forward(b["a"], b["rstd1"], b["h_in"], w["attention_norm"], g.norm_eps)
            K.gemm(b["q"], b["a"], w["wq"], n, g.q_width, g.width)
            K.gemm(b["k"], b["a"], w["wk"], n, g.kv_width, g.width)
            K.gemm(b["v"], b["a"], w["wv"], n, g.kv_width, g.width)
            K.rotary(b["q"], positions, self.cos, self.sin, heads=g.heads, head_dim=g.head_dim)
            K.rotary(b["k"], positions, self.cos, self.sin, heads=g.kv_heads, head_dim=g.head_dim)
            K.attention_forward(b["o"], b["lse"], b["q"], b["k"], b["v"], **self._attention(spans))
            K.gemm(scratch, b["o"], w["wo"], n, g.width, g.q_width)
            K.add(b["h_mid"], b["h_in"], scratch)
            K.rmsnorm_forward(b["m"], b["rstd2"], b["h_mid"], w["mlp_norm"], g.norm_eps)
            K.gemm(b["u"], b["m"], w["w_up"], n, g.mlp, g.width)
            K.silu(b["s"], b["u"])
            K.gemm(scratch, b["s"], w["w_down"], n, g.width, g.mlp)
            h_out = layers[i + 1]["h_in"] if i + 1 < g.layers else work["h_out"]
            K.add(h_out, b["h_mid"], scratch)
        return work["h_out"]

    def backward(self, weights: list[dict[str, Buffer]], grads: list[dict[str, Buffer]], n: int,
                 positions: Buffer, spans: Buffer) -> Buffer:
        """From work["dh"] (the gradient at the stack's output) to the gradient at its input, also in
        work["dh"]; every weight's gradient is overwritten in `grads`."""
        g = self.geometry
        layers, work = self.buffers(n)
        dh, dx, dgain_rows, partial = work["dh"], work["dx"], work["dgain_rows"], work["partial"]
        dq, dk, dv, do, du, ds = (work[name] for name in ("dq", "dk", "dv", "do", "du", "ds"))
        attention = self._attention(spans, work)
        for i in reversed(range(g.layers)):
            w, gw, b = weights[i], grads[i], layers[i]
            # h_out = h_mid + silu(m·w_up)·w_down
            K.gemm(gw["w_down"], b["s"], dh, g.mlp, g.width, n, transpose_a=True)
            K.gemm(ds, dh, w["w_down"], n, g.mlp, g.width, transpose_b=True)
            K.silu_backward(du, b["u"], ds)
            K.gemm(gw["w_up"], b["m"], du, g.width, g.mlp, n, transpose_a=True)
            K.gemm(dx, du, w["w_up"], n, g.width, g.mlp, transpose_b=True)
            K.rmsnorm_backward(dx, dgain_rows, dx, b["h_mid"], w["mlp_norm"], b["rstd2"])
            K.column_sum(gw["mlp_norm"], dgain_rows, n, g.width, partial=partial)
            K.add(dh, dh, dx)
            # h_mid = h_in + attention(rmsnorm(h_in))·wo
            K.gemm(gw["wo"], b["o"], dh, g.q_width, g.width, n, transpose_a=True)
            K.gemm(do, dh, w["wo"], n, g.q_width, g.width, transpose_b=True)
            K.attention_backward(dq, dk, dv, do, b["o"], b["lse"], b["q"], b["k"], b["v"], **attention)
            K.rotary(dq, positions, self.cos, self.sin, heads=g.heads, head_dim=g.head_dim, inverse=True)
            K.rotary(dk, positions, self.cos, self.sin, heads=g.kv_heads, head_dim=g.head_dim, inverse=True)
            K.gemm(gw["wq"], b["a"], dq, g.width, g.q_width, n, transpose_a=True)
            K.gemm(gw["wk"], b["a"], dk, g.width, g.kv_width, n, transpose_a=True)
            K.gemm(gw["wv"], b["a"], dv, g.width, g.kv_width, n, transpose_a=True)
            K.gemm(dx, dq, w["wq"], n, g.width, g.q_width, transpose_b=True)
            K.gemm(dx, dk, w["wk"], n, g.width, g.kv_width, transpose_b=True, accumulate=True)
            K.gemm(dx, dv, w["wv"], n, g.width, g.kv_width, transpose_b=True, accumulate=True)
            K.rmsnorm_backward(dx, dgain_rows, dx, b["h_in"], w["attention_norm"], b["rstd1"])
            K.column_sum(gw["attention_norm"], dgain_rows, n, g.width, partial=partial)
            K.add(dh, dh, dx)
        return dh


def layer_views(views: dict[str, Buffer], layers: int) -> list[dict[str, Buffer]]:
    """Per-layer dicts of the `layers.{i}.<name>` views of a flat buffer."""
    return [{name: views[f"layers.{i}.{name}"] for name in LAYER_TENSORS} for i in range(layers)]


def flat_views(flat: Buffer, registry: list[dict]) -> dict[str, Buffer]:
    """Every tensor of a registry as a view into the flat buffer."""
    return {entry["name"]: flat.view(entry["offset"], entry["shape"]) for entry in registry}


def embedding_backward(dtable: Buffer, d_out: Buffer, ids: np.ndarray, order: Buffer, offsets: Buffer,
                       width: int) -> None:
    """The embedding gradient from the gradient at its output, grouping tokens by id on the host."""
    order_host, offsets_host = K.embedding_groups(ids, offsets.size - 1)
    order.write(order_host)
    offsets.write(offsets_host)
    K.embedding_backward(dtable, d_out, order, offsets, width)
