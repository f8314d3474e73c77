"""A stack of pre-norm transformer blocks on a device, forward and backward, from engine kernels.

Block i, on the residual stream h of N tokens × width:

    a = rmsnorm(h)·attention_norm;  q, k, v = a·wq, a·wk, a·wv;  rotary(q, k) at each token's position
    h = h + attention(q, k, v)·wo                 (causal, or blind across segments, or both)
    m = rmsnorm(h)·mlp_norm;        h = h + silu(m·w_up)·w_down

Both trainers use it: the byte language model (causal, grouped-query) and the text encoder
(bidirectional inside packed segments). The stack reads its weights and writes its gradients as
``LayerTensors``: views into the model's flat parameters and gradient (``layer_tensors``). Its
activations and scratch are ``StackBuffers``, made once per token count.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .. import kernels as K
from ..engine import Buffer, Device
from .cache import RecentCache


@dataclass
class LayerTensors:
    """One block's tensors, by their names in the registry (``layers.{i}.<field>``): the weights as views
    into a model's flat parameters, or their gradients as views into its flat gradient."""

    attention_norm: Buffer
    wq: Buffer
    wk: Buffer
    wv: Buffer
    wo: Buffer
    mlp_norm: Buffer
    w_up: Buffer
    w_down: Buffer


LAYER_TENSORS = tuple(field.name for field in fields(LayerTensors))


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

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every block's tensors as (registry name, shape), in flat order: layers.{i}.<LAYER_TENSORS>."""
        w = self.width
        layer = {"attention_norm": (w,), "wq": (w, self.q_width), "wk": (w, self.kv_width),
                 "wv": (w, self.kv_width), "wo": (self.q_width, w), "mlp_norm": (w,),
                 "w_up": (w, self.mlp), "w_down": (self.mlp, w)}
        return [(f"layers.{i}.{name}", layer[name]) for i in range(self.layers) for name in LAYER_TENSORS]


@dataclass
class LayerActivations:
    """What one block's forward keeps for its backward, over n tokens (h_in: the block's input)."""

    h_in: Buffer
    a: Buffer
    rstd1: Buffer
    q: Buffer
    k: Buffer
    v: Buffer
    o: Buffer
    lse: Buffer
    h_mid: Buffer
    m: Buffer
    rstd2: Buffer
    u: Buffer
    s: Buffer

    @classmethod
    def allocate(cls, device: Device, g: StackGeometry, n: int) -> LayerActivations:
        return cls(h_in=device.empty((n, g.width)), a=device.empty((n, g.width)), rstd1=device.empty(n),
                   q=device.empty((n, g.q_width)), k=device.empty((n, g.kv_width)), v=device.empty((n, g.kv_width)),
                   o=device.empty((n, g.q_width)), lse=device.empty((n, g.heads)), h_mid=device.empty((n, g.width)),
                   m=device.empty((n, g.width)), rstd2=device.empty(n), u=device.empty((n, g.mlp)),
                   s=device.empty((n, g.mlp)))


@dataclass
class StackWork:
    """The stack's output and the scratch its passes share across blocks, over n tokens.

    dh carries the gradient at the stack's output into the backward and the gradient at its input out of
    it; dgain_rows and partial also serve the caller's final norm."""

    h_out: Buffer
    dh: Buffer
    dx: Buffer
    scratch: Buffer
    dgain_rows: Buffer
    partial: Buffer
    dq: Buffer
    dk: Buffer
    dv: Buffer
    do: Buffer
    delta: Buffer
    du: Buffer
    ds: Buffer

    @classmethod
    def allocate(cls, device: Device, g: StackGeometry, n: int, row_length: int = 0) -> StackWork:
        return cls(h_out=device.empty((n, g.width)), dh=device.empty((n, g.width)), dx=device.empty((n, g.width)),
                   scratch=device.empty((n, g.width)), dgain_rows=device.empty((n, g.width)),
                   partial=K.column_sum_workspace(device, n, g.width, row_length), dq=device.empty((n, g.q_width)),
                   dk=device.empty((n, g.kv_width)), dv=device.empty((n, g.kv_width)), do=device.empty((n, g.q_width)),
                   delta=device.empty((n, g.heads)), du=device.empty((n, g.mlp)), ds=device.empty((n, g.mlp)))


@dataclass
class Bf16Copies:
    """Fast mode's bf16 copies (``kernels.cast_bf16``) of some buffers of a set, under the same names: each
    rounded once and read by several products. In identical mode every field is None."""

    @classmethod
    def of(cls, buffers, fast: bool):
        """A uint16 copy of each of `buffers`' fields this class names (none unless `fast`)."""
        if not fast:
            return cls()
        return cls(**{f.name: getattr(buffers, f.name).device.empty(getattr(buffers, f.name).shape, np.uint16)
                      for f in fields(cls)})


@dataclass
class LayerCopies(Bf16Copies):
    """One block's GEMM inputs (LayerActivations), made in the forward, read again by the weight gradients."""

    a: Buffer | None = None
    o: Buffer | None = None
    m: Buffer | None = None
    s: Buffer | None = None


@dataclass
class WorkCopies(Bf16Copies):
    """The backward's gradients (StackWork) that two products each read."""

    dh: Buffer | None = None
    du: Buffer | None = None
    dq: Buffer | None = None
    dk: Buffer | None = None
    dv: Buffer | None = None


@dataclass
class StackBuffers:
    """Every block's activations and the shared work buffers, for one token count (with fast mode's copies)."""

    layers: list[LayerActivations]
    work: StackWork
    copies: list[LayerCopies]
    work_copies: WorkCopies

    @property
    def input(self) -> Buffer:
        """Where the caller writes the embedded input."""
        return self.layers[0].h_in if self.layers else self.work.h_out


def position_axes(positions: Buffer) -> int:
    """How many position columns a (n,) or (n, axes) positions buffer holds."""
    return positions.shape[1] if len(positions.shape) == 2 else 1


class TransformerStack:
    """The blocks' passes over N tokens; activations and scratch are kept per token count."""

    def __init__(self, device: Device, geometry: StackGeometry, max_positions: int, *, fast: bool = False,
                 row_length: int = 0):
        """fast=True: the blocks' GEMMs and attention run in fast mode (bf16 tensor cores) on a GPU
        (docs/numerics.md). row_length > 0: the sums over tokens (weight gradients, norm gains) take each packed
        row of row_length tokens alone and combine the rows by the row tree (``kernels.tree_sum``), so devices
        sharing a batch by rows give one device's bits (docs/mesh.md); 0 keeps the canonical rule (the language
        model)."""
        self.device = device
        self.geometry = geometry
        self.fast = fast
        self.row_length = row_length
        cos, sin = K.rotary_tables(max_positions, geometry.head_dim, geometry.rope_base)
        self.cos, self.sin = device.put(cos), device.put(sin)
        self._buffers = RecentCache(self._allocate)

    def _allocate(self, n: int) -> StackBuffers:
        g, d = self.geometry, self.device
        layers = [LayerActivations.allocate(d, g, n) for _ in range(g.layers)]
        work = StackWork.allocate(d, g, n, self.row_length)
        return StackBuffers(layers=layers, work=work, copies=[LayerCopies.of(layer, self.fast) for layer in layers],
                            work_copies=WorkCopies.of(work, self.fast))

    def buffers(self, n: int) -> StackBuffers:
        """The activations and work buffers for n tokens, made on first use (the few most recent token
        counts' are kept: ``uform.nn.cache``)."""
        return self._buffers(n)

    def token_counts(self) -> list[int]:
        """The token counts whose buffers are held."""
        return self._buffers.keys()

    def _gemm(self, c: Buffer, a: Buffer, b: Buffer, m: int, n: int, k: int, **options) -> None:
        """A product of the passes; a weight gradient (Aᵀ·B over the tokens) sums by rows (row_length)."""
        K.gemm(c, a, b, m, n, k, fast=self.fast, k_range=self.row_length if options.get("transpose_a") else 0,
               **options)

    @staticmethod
    def _round(copy: Buffer | None, x: Buffer) -> None:
        """Fast mode: write x's bf16 copy, which the next products read (identical mode has none)."""
        if copy is not None:
            K.cast_bf16(copy, x)

    def _attention(self, spans: Buffer, delta: Buffer | None = None) -> dict:
        g = self.geometry
        geometry = dict(heads=g.heads, kv_heads=g.kv_heads, head_dim=g.head_dim, causal=g.causal, spans=spans,
                        fast=self.fast)
        if delta is not None:
            geometry["delta"] = delta
        return geometry

    def forward(self, weights: list[LayerTensors], n: int, positions: Buffer, spans: Buffer) -> Buffer:
        """Run every block over the input buffer (``buffers(n).input``), each token attending within its
        span (kernels.attention_spans); answers the output of the last block. positions is int32 (n,), or
        (n, 3) for rotary positions on three axes (kernels.rotary)."""
        g = self.geometry
        axes = position_axes(positions)
        buffers = self.buffers(n)
        layers, work = buffers.layers, buffers.work
        scratch = work.scratch
        for i, (w, b, c) in enumerate(zip(weights, layers, buffers.copies)):
            K.rmsnorm_forward(b.a, b.rstd1, b.h_in, w.attention_norm, g.norm_eps)
            self._round(c.a, b.a)
            self._gemm(b.q, b.a, w.wq, n, g.q_width, g.width, a16=c.a)
            self._gemm(b.k, b.a, w.wk, n, g.kv_width, g.width, a16=c.a)
            self._gemm(b.v, b.a, w.wv, n, g.kv_width, g.width, a16=c.a)
            K.rotary(b.q, positions, self.cos, self.sin, heads=g.heads, head_dim=g.head_dim, axes=axes)
            K.rotary(b.k, positions, self.cos, self.sin, heads=g.kv_heads, head_dim=g.head_dim, axes=axes)
            K.attention_forward(b.o, b.lse, b.q, b.k, b.v, **self._attention(spans))
            self._round(c.o, b.o)
            self._gemm(scratch, b.o, w.wo, n, g.width, g.q_width, a16=c.o)
            K.add(b.h_mid, b.h_in, scratch)
            K.rmsnorm_forward(b.m, b.rstd2, b.h_mid, w.mlp_norm, g.norm_eps)
            self._round(c.m, b.m)
            self._gemm(b.u, b.m, w.w_up, n, g.mlp, g.width, a16=c.m)
            K.silu(b.s, b.u)
            self._round(c.s, b.s)
            self._gemm(scratch, b.s, w.w_down, n, g.width, g.mlp, a16=c.s)
            h_out = layers[i + 1].h_in if i + 1 < g.layers else work.h_out
            K.add(h_out, b.h_mid, scratch)
        return work.h_out

    def backward(self, weights: list[LayerTensors], grads: list[LayerTensors], n: int, positions: Buffer,
                 spans: Buffer) -> Buffer:
        """From work.dh (the gradient at the stack's output) to the gradient at its input, also in work.dh;
        every weight's gradient is overwritten in `grads`."""
        g = self.geometry
        axes = position_axes(positions)
        buffers = self.buffers(n)
        work = buffers.work
        dh, dx, dgain_rows, partial = work.dh, work.dx, work.dgain_rows, work.partial
        dq, dk, dv, do, du, ds = work.dq, work.dk, work.dv, work.do, work.du, work.ds
        attention = self._attention(spans, work.delta)
        d16 = buffers.work_copies
        for i in reversed(range(g.layers)):
            w, gw, b, c = weights[i], grads[i], buffers.layers[i], buffers.copies[i]
            # h_out = h_mid + silu(m·w_up)·w_down
            self._round(d16.dh, dh)
            self._gemm(gw.w_down, b.s, dh, g.mlp, g.width, n, transpose_a=True, a16=c.s, b16=d16.dh)
            self._gemm(ds, dh, w.w_down, n, g.mlp, g.width, transpose_b=True, a16=d16.dh)
            K.silu_backward(du, b.u, ds)
            self._round(d16.du, du)
            self._gemm(gw.w_up, b.m, du, g.width, g.mlp, n, transpose_a=True, a16=c.m, b16=d16.du)
            self._gemm(dx, du, w.w_up, n, g.width, g.mlp, transpose_b=True, a16=d16.du)
            K.rmsnorm_backward(dx, dgain_rows, dx, b.h_mid, w.mlp_norm, b.rstd2)
            K.column_sum(gw.mlp_norm, dgain_rows, n, g.width, partial=partial, row_length=self.row_length)
            K.add(dh, dh, dx)
            # h_mid = h_in + attention(rmsnorm(h_in))·wo
            self._round(d16.dh, dh)
            self._gemm(gw.wo, b.o, dh, g.q_width, g.width, n, transpose_a=True, a16=c.o, b16=d16.dh)
            self._gemm(do, dh, w.wo, n, g.q_width, g.width, transpose_b=True, a16=d16.dh)
            K.attention_backward(dq, dk, dv, do, b.o, b.lse, b.q, b.k, b.v, **attention)
            K.rotary(dq, positions, self.cos, self.sin, heads=g.heads, head_dim=g.head_dim, inverse=True, axes=axes)
            K.rotary(dk, positions, self.cos, self.sin, heads=g.kv_heads, head_dim=g.head_dim, inverse=True,
                     axes=axes)
            for gradient, copy in ((dq, d16.dq), (dk, d16.dk), (dv, d16.dv)):
                self._round(copy, gradient)
            self._gemm(gw.wq, b.a, dq, g.width, g.q_width, n, transpose_a=True, a16=c.a, b16=d16.dq)
            self._gemm(gw.wk, b.a, dk, g.width, g.kv_width, n, transpose_a=True, a16=c.a, b16=d16.dk)
            self._gemm(gw.wv, b.a, dv, g.width, g.kv_width, n, transpose_a=True, a16=c.a, b16=d16.dv)
            self._gemm(dx, dq, w.wq, n, g.width, g.q_width, transpose_b=True, a16=d16.dq)
            self._gemm(dx, dk, w.wk, n, g.width, g.kv_width, transpose_b=True, accumulate=True, a16=d16.dk)
            self._gemm(dx, dv, w.wv, n, g.width, g.kv_width, transpose_b=True, accumulate=True, a16=d16.dv)
            K.rmsnorm_backward(dx, dgain_rows, dx, b.h_in, w.attention_norm, b.rstd1)
            K.column_sum(gw.attention_norm, dgain_rows, n, g.width, partial=partial, row_length=self.row_length)
            K.add(dh, dh, dx)
        return dh


def layer_tensors(views: dict[str, Buffer], layers: int) -> list[LayerTensors]:
    """Each block's tensors from a model's views by name (``layers.{i}.<name>``)."""
    return [LayerTensors(**{name: views[f"layers.{i}.{name}"] for name in LAYER_TENSORS}) for i in range(layers)]
