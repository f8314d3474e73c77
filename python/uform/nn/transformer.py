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

import functools
from dataclasses import dataclass, fields

import numpy as np

from .. import kernels as K
from .. import layouts
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


EXACT_BLOCK_TOKENS = 4096
"""Tokens of a block of packed rows whose weight gradient is one exact product (weight_gradient_range)."""


def exact_block_rows(row_length: int) -> int:
    """Packed rows of row_length tokens in a block of an exact weight gradient: the largest power of two of them
    within EXACT_BLOCK_TOKENS (at least one), so that an aligned block of 2^j rows holds whole blocks once it holds
    that many (docs/mesh.md)."""
    rows = max(1, EXACT_BLOCK_TOKENS // row_length)
    return 1 << (rows.bit_length() - 1)


@functools.lru_cache(maxsize=1024)
def weight_gradient_range(m: int, n: int, k: int, row_length: int) -> int:
    """The k range of a weight gradient Aᵀ·B (m × n over k tokens in packed rows of row_length; kernels.gemm's
    k_range), identical mode: a block of exact_block_rows rows where the exact GEMM's rule takes the product
    over a block (one exact product a block, rounded once; each output reconstructed once a block rather than once
    a row: docs/numerics.md has the H200's figures), else a row (the fma chain's canonical partials); 0 without
    rows (the language model, fast mode). A block at least k long (a device of fewer rows) is one product over the
    k tokens."""
    if row_length == 0:
        return 0
    block = row_length * exact_block_rows(row_length)
    return block if K.gemm_is_exact(m, n, k, block) else row_length


def world_block_rows(geometry: StackGeometry, row_length: int) -> int:
    """The packed rows each device of a world of several must hold at least (docs/mesh.md): exact_block_rows where
    weight_gradient_range gives some weight gradient of the stack a block's range over a block's tokens, so that a
    device holds whole blocks; else one."""
    rows = exact_block_rows(row_length)
    block = row_length * rows
    weights = {shape for _, shape in geometry.tensor_shapes() if len(shape) == 2}
    return rows if any(weight_gradient_range(m, n, block, row_length) == block for m, n in weights) else 1


@dataclass
class LayerActivations:
    """What one block's forward keeps for its backward, over n tokens (h_in: the block's input). In fast mode the
    GEMM inputs a, m and s exist only as bf16 copies (LayerCopies): their fp32 fields are None."""

    h_in: Buffer
    a: Buffer | None
    rstd1: Buffer
    q: Buffer
    k: Buffer
    v: Buffer
    o: Buffer
    lse: Buffer
    h_mid: Buffer
    m: Buffer | None
    rstd2: Buffer
    u: Buffer
    s: Buffer | None

    @classmethod
    def allocate(cls, device: Device, g: StackGeometry, n: int, fast: bool) -> LayerActivations:
        def fp32(shape):  # a GEMM input that fast mode keeps only in bf16
            return None if fast else device.empty(shape)

        return cls(h_in=device.empty((n, g.width)), a=fp32((n, g.width)), rstd1=device.empty(n),
                   q=device.empty((n, g.q_width)), k=device.empty((n, g.kv_width)), v=device.empty((n, g.kv_width)),
                   o=device.empty((n, g.q_width)), lse=device.empty((n, g.heads)), h_mid=device.empty((n, g.width)),
                   m=fp32((n, g.width)), rstd2=device.empty(n), u=device.empty((n, g.mlp)), s=fp32((n, g.mlp)))


# The largest workspace a training stack keeps attention's score gradients in for one token count, on a GPU and
# on the CPU: with it the dq kernel reads the dk/dv kernel's ds instead of computing them again, with the same bits
# (kernels.attention_backward); without it, for n · heads · span_limit floats past this, it computes them.
D_SCORES_BYTES = {True: 4 << 30, False: 1 << 30}


@dataclass
class StackWork:
    """The stack's output and the scratch its passes share across blocks, over n tokens.

    dh carries the gradient at the stack's output into the backward and the gradient at its input out of
    it; dgain_rows and partial also serve the caller's final norm. In fast mode du exists only in bf16."""

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
    du: Buffer | None
    ds: Buffer
    d_scores: Buffer | None

    @classmethod
    def allocate(cls, device: Device, g: StackGeometry, n: int, fast: bool, row_length: int = 0,
                 span_limit: int = 0) -> StackWork:
        """span_limit > 0: keep attention's score gradients (d_scores) for spans up to that long, where they fit
        D_SCORES_BYTES (identical mode: fast mode's kernels do not read them)."""
        kept = n * g.heads * span_limit
        fits = not fast and 0 < 4 * kept <= D_SCORES_BYTES[device.is_gpu]
        return cls(h_out=device.empty((n, g.width)), dh=device.empty((n, g.width)), dx=device.empty((n, g.width)),
                   scratch=device.empty((n, g.width)), dgain_rows=device.empty((n, g.width)),
                   partial=K.column_sum_workspace(device, n, g.width, row_length), dq=device.empty((n, g.q_width)),
                   dk=device.empty((n, g.kv_width)), dv=device.empty((n, g.kv_width)), do=device.empty((n, g.q_width)),
                   delta=device.empty((n, g.heads)), du=None if fast else device.empty((n, g.mlp)),
                   ds=device.empty((n, g.mlp)), d_scores=device.empty(kept) if fits else None)


def bf16_buffer(device: Device, shape: tuple[int, ...], fast: bool) -> Buffer | None:
    """A uint16 buffer for a bf16 copy in fast mode; None in identical mode, which keeps none."""
    return device.empty(shape, np.uint16) if fast else None


@dataclass
class LayerCopies:
    """Fast mode's bf16 copies of one block's GEMM inputs, made in the forward (by their producers: the norms and
    SiLU write a, m and s only so; o is rounded from attention's fp32 output), read again by the weight
    gradients. In identical mode every field is None."""

    a: Buffer | None
    o: Buffer | None
    m: Buffer | None
    s: Buffer | None

    @classmethod
    def allocate(cls, device: Device, g: StackGeometry, n: int, fast: bool) -> LayerCopies:
        return cls(a=bf16_buffer(device, (n, g.width), fast), o=bf16_buffer(device, (n, g.q_width), fast),
                   m=bf16_buffer(device, (n, g.width), fast), s=bf16_buffer(device, (n, g.mlp), fast))


@dataclass
class WorkCopies:
    """Fast mode's bf16 copies of the backward's gradients that two products each read (dh from the norms'
    backward, du from SiLU's, dq and dk from the inverse rotary, dv rounded from attention's output)."""

    dh: Buffer | None
    du: Buffer | None
    dq: Buffer | None
    dk: Buffer | None
    dv: Buffer | None

    @classmethod
    def allocate(cls, device: Device, g: StackGeometry, n: int, fast: bool) -> WorkCopies:
        return cls(dh=bf16_buffer(device, (n, g.width), fast), du=bf16_buffer(device, (n, g.mlp), fast),
                   dq=bf16_buffer(device, (n, g.q_width), fast), dk=bf16_buffer(device, (n, g.kv_width), fast),
                   dv=bf16_buffer(device, (n, g.kv_width), fast))


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
                 row_length: int = 0, training: bool = True):
        """fast=True: the blocks' GEMMs and attention run in fast mode (bf16 tensor cores) on a GPU
        (docs/numerics.md). row_length > 0: the sums over tokens (weight gradients, norm gains) take each packed
        row of row_length tokens alone (exact weight gradients a block of rows: weight_gradient_range) and combine
        them by the row tree (``kernels.tree_sum``), so devices sharing a batch by rows give one device's bits
        (docs/mesh.md); 0 keeps the canonical rule (the language model). training=False: a stack that only runs
        forward keeps no workspace for the backward's attention score gradients (StackWork.d_scores)."""
        self.device = device
        self.geometry = geometry
        self.fast = fast
        self.row_length = row_length
        # the backward keeps attention's score gradients for spans up to a sequence, or a packed row (training only)
        self.span_limit = max_positions if training else 0
        cos, sin = layouts.rotary_tables(max_positions, geometry.head_dim, geometry.rope_base)
        self.cos, self.sin = device.put(cos), device.put(sin)
        self._buffers = RecentCache(self._allocate)
        self._weights16: Buffer | None = None

    def _allocate(self, n: int) -> StackBuffers:
        g, d = self.geometry, self.device
        return StackBuffers(layers=[LayerActivations.allocate(d, g, n, self.fast) for _ in range(g.layers)],
                            work=StackWork.allocate(d, g, n, self.fast, self.row_length, self.span_limit),
                            copies=[LayerCopies.allocate(d, g, n, self.fast) for _ in range(g.layers)],
                            work_copies=WorkCopies.allocate(d, g, n, self.fast))

    def buffers(self, n: int) -> StackBuffers:
        """The activations and work buffers for n tokens, made on first use (the few most recent token
        counts' are kept: ``uform.nn.cache``)."""
        return self._buffers(n)

    def token_counts(self) -> list[int]:
        """The token counts whose buffers are held."""
        return self._buffers.keys()

    def _gemm(self, c: Buffer, a: Buffer, b: Buffer, m: int, n: int, k: int, **options) -> None:
        """A product of the passes; a weight gradient (Aᵀ·B over the tokens) sums by rows or blocks of rows
        (weight_gradient_range)."""
        K.gemm(c, a, b, m, n, k, fast=self.fast, k_range=self._k_range(m, n, k, options), **options)

    def _k_range(self, m: int, n: int, k: int, options: dict) -> int:
        """kernels.gemm's k_range for a product of the passes: a weight gradient's (Aᵀ·B over the tokens:
        weight_gradient_range), else 0."""
        return weight_gradient_range(m, n, k, self.row_length) if options.get("transpose_a") else 0

    def _gemm_apart(self, cs: list[Buffer], a: Buffer, bs: list[Buffer], m: int, ns: list[int], k: int, *,
                    a16: Buffer | None, b16s: list[Buffer | None], **options) -> None:
        """Products that read one A: q, k and v of one input, and their weight gradients. Identical mode: a
        ``gemm_group`` for the products of each k range (weight_gradient_range: one group but for grouped-query
        heads narrower than the rule); fast mode: one by one, each with its copies."""
        if self.fast:
            for c, b, n, b16 in zip(cs, bs, ns, b16s):
                self._gemm(c, a, b, m, n, k, a16=a16, b16=b16, **options)
            return
        ranges = [self._k_range(m, n, k, options) for n in ns]
        for k_range in dict.fromkeys(ranges):
            group = [i for i, r in enumerate(ranges) if r == k_range]
            K.gemm_group([cs[i] for i in group], [a] * len(group), [bs[i] for i in group], m, [ns[i] for i in group],
                         [k] * len(group), k_range=k_range, **options)

    def _gemm_summed(self, c: Buffer, as_: list[Buffer], bs: list[Buffer], m: int, n: int, ks: list[int], *,
                     a16s: list[Buffer | None], b16s: list[Buffer | None], **options) -> None:
        """c = Σ_t op(A_t)·op(B_t), each product added to the sum of those before (the input's gradient through q,
        k and v). Identical mode: one summed ``gemm_group``; fast mode: one product after another."""
        if self.fast:
            for t, (a, b, k, a16, b16) in enumerate(zip(as_, bs, ks, a16s, b16s)):
                self._gemm(c, a, b, m, n, k, accumulate=t > 0, a16=a16, b16=b16, **options)
            return
        K.gemm_group([c] * len(as_), as_, bs, m, [n] * len(as_), ks, summed=True, **options)

    def _round_weights(self, weights: list[LayerTensors]) -> list[LayerTensors]:
        """Fast mode: bf16 copies of every block's tensors, for the products that read the weights, made by one
        cast_bf16 over the span of the model's flat parameters that holds them all (they view one allocation);
        identical mode: tensors of None."""
        if not self.fast:
            return [LayerTensors(**dict.fromkeys(LAYER_TENSORS)) for _ in weights]
        views = [getattr(w, name) for w in weights for name in LAYER_TENSORS]
        flat = views[0]
        while flat.owner is not None:
            flat = flat.owner
        for view in views:
            root = view
            while root.owner is not None:
                root = root.owner
            if root is not flat:
                raise ValueError("fast mode's weight copies need every block's tensors in one allocation")
        first = (min(v.address for v in views) - flat.address) // 4
        first -= first % 8  # the cast's 32-byte groups line up with the allocation's
        count = (max(v.address + v.nbytes for v in views) - flat.address) // 4 - first
        if self._weights16 is None or self._weights16.size != count:
            self._weights16 = flat.device.empty(count, np.uint16)
        K.cast_bf16(self._weights16, flat.view(first, count))

        def copy(view: Buffer) -> Buffer:
            return self._weights16.view((view.address - flat.address) // 4 - first, view.shape)

        return [LayerTensors(**{name: copy(getattr(w, name)) for name in LAYER_TENSORS}) for w in weights]

    @staticmethod
    def _round(copy: Buffer | None, x: Buffer) -> None:
        """Fast mode: write x's bf16 copy, which the next products read (identical mode has none)."""
        if copy is not None:
            K.cast_bf16(copy, x)

    def _norm(self, y: Buffer | None, y16: Buffer | None, rstd: Buffer, x: Buffer, gain: Buffer, *,
              residual: Buffer | None = None, h: Buffer | None = None) -> None:
        """y = rmsnorm(h)·gain, h = x + residual kept in h (or h = x without a residual), in one pass with the add
        (the bits of the add, then the norm); fast mode writes only y's bf16 copy y16 (kernels.rmsnorm_bf16)."""
        eps = self.geometry.norm_eps
        if self.fast:
            K.rmsnorm_bf16(y16, rstd, x, gain, eps, residual=residual, h=h)
            return
        K.rmsnorm_forward(y, rstd, x, gain, eps, residual=residual, h=h)

    def _norm_backward(self, dh: Buffer, dh16: Buffer | None, dy: Buffer, x: Buffer, gain: Buffer, rstd: Buffer,
                       dgain: Buffer, work: StackWork) -> None:
        """dh += the norm's dx for dy at its output, in one pass with the add, dgain = its gain's gradient; fast mode
        also writes dh's bf16 copy dh16 (kernels.rmsnorm_backward_bf16)."""
        n, width = x.shape[0], self.geometry.width
        if self.fast:
            K.rmsnorm_backward_bf16(dh, dh16, work.dgain_rows, dy, x, gain, rstd)
        else:
            K.rmsnorm_backward(dh, work.dgain_rows, dy, x, gain, rstd, accumulate=True)
        K.column_sum(dgain, work.dgain_rows, n, width, partial=work.partial, row_length=self.row_length)

    def _attention(self, spans: Buffer, tiles: Buffer | None, work: StackWork | None = None) -> dict:
        """attention_forward's arguments, or with the work buffers attention_backward's."""
        g = self.geometry
        geometry = dict(heads=g.heads, kv_heads=g.kv_heads, head_dim=g.head_dim, causal=g.causal, spans=spans,
                        tiles=tiles, fast=self.fast)
        if work is not None:
            geometry["delta"] = work.delta
            if work.d_scores is not None:
                geometry.update(d_scores=work.d_scores, span_limit=self.span_limit)
        return geometry

    def forward(self, weights: list[LayerTensors], n: int, positions: Buffer, spans: Buffer,
                tiles: Buffer | None = None) -> Buffer:
        """Run every block over the input buffer (``buffers(n).input``), each token attending within its
        span (layouts.attention_spans; tiles: attention's tile table, TokenInputs.write_spans); answers the output
        of the last block. positions is int32 (n,), or (n, 3) for rotary positions on three axes (kernels.rotary)."""
        g = self.geometry
        axes = position_axes(positions)
        buffers = self.buffers(n)
        layers, work = buffers.layers, buffers.work
        scratch = work.scratch
        copies = buffers.copies
        for i, (w, w16, b, c) in enumerate(zip(weights, self._round_weights(weights), layers, copies)):
            if i == 0:
                self._norm(b.a, c.a, b.rstd1, b.h_in, w.attention_norm)
            self._gemm_apart([b.q, b.k, b.v], b.a, [w.wq, w.wk, w.wv], n, [g.q_width, g.kv_width, g.kv_width],
                             g.width, a16=c.a, b16s=[w16.wq, w16.wk, w16.wv])
            K.rotary(b.q, positions, self.cos, self.sin, heads=g.heads, head_dim=g.head_dim, axes=axes, fast=self.fast)
            K.rotary(b.k, positions, self.cos, self.sin, heads=g.kv_heads, head_dim=g.head_dim, axes=axes,
                     fast=self.fast)
            K.attention_forward(b.o, b.lse, b.q, b.k, b.v, **self._attention(spans, tiles))
            self._round(c.o, b.o)
            self._gemm(scratch, b.o, w.wo, n, g.width, g.q_width, a16=c.o, b16=w16.wo)
            self._norm(b.m, c.m, b.rstd2, b.h_in, w.mlp_norm, residual=scratch, h=b.h_mid)
            self._gemm(b.u, b.m, w.w_up, n, g.mlp, g.width, a16=c.m, b16=w16.w_up)
            if self.fast:
                K.silu_bf16(c.s, b.u)
            else:
                K.silu(b.s, b.u)
            self._gemm(scratch, b.s, w.w_down, n, g.width, g.mlp, a16=c.s, b16=w16.w_down)
            if i + 1 < g.layers:  # the next block's input, and its first norm in the same pass
                after, after_copies = layers[i + 1], copies[i + 1]
                self._norm(after.a, after_copies.a, after.rstd1, b.h_mid, weights[i + 1].attention_norm,
                           residual=scratch, h=after.h_in)
            else:
                K.add(work.h_out, b.h_mid, scratch)
        return work.h_out

    def backward(self, weights: list[LayerTensors], grads: list[LayerTensors], n: int, positions: Buffer,
                 spans: Buffer, tiles: Buffer | None = None) -> Buffer:
        """From work.dh (the gradient at the stack's output) to the gradient at its input, also in work.dh;
        every weight's gradient is overwritten in `grads`."""
        g = self.geometry
        axes = position_axes(positions)
        buffers = self.buffers(n)
        work = buffers.work
        dh, dx = work.dh, work.dx
        dq, dk, dv, do, du, ds = work.dq, work.dk, work.dv, work.do, work.du, work.ds
        attention = self._attention(spans, tiles, work)
        d16 = buffers.work_copies
        self._round(d16.dh, dh)  # below the top block, the norms' backward writes dh's copy
        weights16 = self._round_weights(weights)
        for i in reversed(range(g.layers)):
            w, w16, gw, b, c = weights[i], weights16[i], grads[i], buffers.layers[i], buffers.copies[i]
            # h_out = h_mid + silu(m·w_up)·w_down
            self._gemm(gw.w_down, b.s, dh, g.mlp, g.width, n, transpose_a=True, a16=c.s, b16=d16.dh)
            self._gemm(ds, dh, w.w_down, n, g.mlp, g.width, transpose_b=True, a16=d16.dh, b16=w16.w_down)
            if self.fast:
                K.silu_backward_bf16(d16.du, b.u, ds)
            else:
                K.silu_backward(du, b.u, ds)
            self._gemm(gw.w_up, b.m, du, g.width, g.mlp, n, transpose_a=True, a16=c.m, b16=d16.du)
            self._gemm(dx, du, w.w_up, n, g.width, g.mlp, transpose_b=True, a16=d16.du, b16=w16.w_up)
            self._norm_backward(dh, d16.dh, dx, b.h_mid, w.mlp_norm, b.rstd2, gw.mlp_norm, work)
            # h_mid = h_in + attention(rmsnorm(h_in))·wo
            self._gemm(gw.wo, b.o, dh, g.q_width, g.width, n, transpose_a=True, a16=c.o, b16=d16.dh)
            self._gemm(do, dh, w.wo, n, g.q_width, g.width, transpose_b=True, a16=d16.dh, b16=w16.wo)
            K.attention_backward(dq, dk, dv, do, b.o, b.lse, b.q, b.k, b.v, **attention)
            K.rotary(dq, positions, self.cos, self.sin, heads=g.heads, head_dim=g.head_dim, inverse=True, axes=axes,
                     fast=self.fast, y16=d16.dq)
            K.rotary(dk, positions, self.cos, self.sin, heads=g.kv_heads, head_dim=g.head_dim, inverse=True,
                     axes=axes, fast=self.fast, y16=d16.dk)
            self._round(d16.dv, dv)
            self._gemm_apart([gw.wq, gw.wk, gw.wv], b.a, [dq, dk, dv], g.width, [g.q_width, g.kv_width, g.kv_width],
                             n, transpose_a=True, a16=c.a, b16s=[d16.dq, d16.dk, d16.dv])
            self._gemm_summed(dx, [dq, dk, dv], [w.wq, w.wk, w.wv], n, g.width, [g.q_width, g.kv_width, g.kv_width],
                              transpose_b=True, a16s=[d16.dq, d16.dk, d16.dv], b16s=[w16.wq, w16.wk, w16.wv])
            self._norm_backward(dh, d16.dh, dx, b.h_in, w.attention_norm, b.rstd1, gw.attention_norm, work)
        return dh


def layer_tensors(views: dict[str, Buffer], layers: int) -> list[LayerTensors]:
    """Each block's tensors from a model's views by name (``layers.{i}.<name>``)."""
    return [LayerTensors(**{name: views[f"layers.{i}.{name}"] for name in LAYER_TENSORS}) for i in range(layers)]
