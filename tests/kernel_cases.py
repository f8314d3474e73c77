"""Kernel test cases shared by the reference tests and the CPU-vs-GPU bit test.

Each case draws fresh random inputs from a seed, runs one kernel on a device and
answers {name: (output, float64 reference, tolerance[, magnitude])}. The tolerance
bounds max |out − ref| / magnitude per output, stated per kernel here; magnitude is
max |ref| unless the case names the scale of an output that cancels to near zero.
"""

from __future__ import annotations

import numpy as np

import uform
from uform import kernels as K
from uform import layouts
from uform.reference import exact_gemm

GEMM_SHAPES = [(1, 1, 1), (7, 5, 3), (33, 65, 17), (129, 130, 131), (64, 256, 96), (37, 45, 9000), (20, 9, 4096)]
ROW_SHAPES = [(1, 1), (3, 7), (17, 33), (64, 768), (5, 1000)]
ATTENTION_SHAPES = [  # batch, seq_len, heads, kv_heads, head_dim
    (1, 1, 1, 1, 8), (2, 7, 4, 2, 8), (1, 19, 6, 3, 16), (2, 33, 2, 1, 64), (1, 70, 2, 2, 32), (2, 45, 1, 1, 128),
]
# Spans over several 64-token blocks, starting and ending inside blocks, with runs of padding between and
# after segments: batch, seq_len, heads, kv_heads, head_dim, mean segment length (0: the whole sequence)
ATTENTION_LONG_SHAPES = [
    (1, 300, 4, 2, 64, 110), (2, 200, 2, 2, 128, 90), (1, 260, 6, 2, 32, 0), (3, 150, 2, 1, 16, 70),
    (1, 200, 2, 1, 8, 50),
]


def rng_for(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f64(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def case_gemm(device: uform.Device, seed: int, m: int, n: int, k: int, transpose_a: bool, transpose_b: bool,
              accumulate: bool):
    rng = rng_for(seed)
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    c = device.put(c0)
    K.gemm(c, device.put(a), device.put(b), m, n, k, transpose_a=transpose_a, transpose_b=transpose_b,
           accumulate=accumulate)
    ref = (f64(a).T if transpose_a else f64(a)) @ (f64(b).T if transpose_b else f64(b))
    if accumulate:
        ref = ref + c0
    return {"c": (c.numpy(), ref, 4e-6 * np.sqrt(k))}


def case_unary(device: uform.Device, seed: int, op: str):
    rng = rng_for(seed)
    x = (rng.standard_normal(5000) * 8).astype(np.float32)
    if op in ("log", "sqrt", "rsqrt"):
        x = np.abs(x) + np.float32(1e-3)
    if op == "log1p":
        x = np.maximum(x, np.float32(-0.999))
    y = device.empty(x.shape)
    K.unary(op, y, device.put(x))
    outputs = {op: (y.numpy(), unary_reference(op, f64(x)), 4e-7)}
    if op == "silu":  # its own kernel too (kernels.silu)
        K.silu(y, device.put(x))
        outputs["silu_kernel"] = (y.numpy(), unary_reference(op, f64(x)), 4e-7)
    return outputs


def unary_reference(op: str, x: np.ndarray) -> np.ndarray:
    sigmoid = lambda: 1 / (1 + np.exp(-x))  # noqa: E731
    return {
        "exp": lambda: np.exp(x), "log": lambda: np.log(x), "log1p": lambda: np.log1p(x),
        "sqrt": lambda: np.sqrt(x), "rsqrt": lambda: 1 / np.sqrt(x), "sigmoid": sigmoid,
        "softplus": lambda: np.logaddexp(0, x), "silu": lambda: x * sigmoid(),
        "silu_derivative": lambda: sigmoid() * (1 + x * (1 - sigmoid())),
    }[op]()


def unary_relative_errors(op: str, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    ref = unary_reference(op, f64(x))
    return np.abs(y - ref) / np.maximum(np.abs(ref), 1e-30)


def case_column_sum(device: uform.Device, seed: int, rows: int, columns: int, row_length: int):
    """column_sum over more rows than a GPU team stages at once (256) and columns that fill no whole tile of 32,
    in chunks of COLUMN_CHUNK rows (row_length 0) or of packed rows of row_length tokens (the row tree), with the
    zeros and signs that tell a skipped row from an added +0, against its float64 sum."""
    rng = rng_for(seed)
    x = (rng.standard_normal((rows, columns)) * np.exp(rng.standard_normal((rows, columns)))).astype(np.float32)
    x[::7, 0] = -0.0
    x[:, -1] = -0.0
    sums, squares = device.empty(columns), device.empty(columns)
    K.column_sum(sums, device.put(x), rows, columns, row_length=row_length)
    K.column_sum(squares, device.put(x), rows, columns, row_length=row_length, squares=True)
    return {"column_sum": (sums.numpy(), f64(x).sum(0), rows * 2.0**-24, np.abs(f64(x)).sum(0).max()),
            "column_sum of squares": (squares.numpy(), (f64(x) ** 2).sum(0), rows * 2.0**-23,
                                      (f64(x) ** 2).sum(0).max())}


def case_rmsnorm(device: uform.Device, seed: int, rows: int, width: int):
    rng = rng_for(seed)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(width)).astype(np.float32)
    dy = rng.standard_normal((rows, width)).astype(np.float32)
    eps = 1e-5
    y, rstd = device.empty(x.shape), device.empty(rows)
    xb, wb = device.put(x), device.put(w)
    K.rmsnorm_forward(y, rstd, xb, wb, eps)
    dx, dw_rows, dw = device.empty(x.shape), device.empty(x.shape), device.empty(width)
    K.rmsnorm_backward(dx, dw_rows, device.put(dy), xb, wb, rstd)
    K.column_sum(dw, dw_rows, rows, width)
    xd, wd, gd = f64(x), f64(w), f64(dy)
    r = 1 / np.sqrt((xd**2).mean(1, keepdims=True) + eps)
    ref_dx = r * (gd * wd - xd * r**2 * (gd * wd * xd).mean(1, keepdims=True))
    ref_dw = (gd * xd * r).sum(0)
    return {"y": (y.numpy(), xd * r * wd, 1e-6), "rstd": (rstd.numpy(), r[:, 0], 1e-6),
            "dx": (dx.numpy(), ref_dx, 2e-6), "dw": (dw.numpy(), ref_dw, 1e-6 * np.sqrt(rows))}


def case_rmsnorm_fused(device: uform.Device, seed: int, rows: int, width: int):
    """RMSNorm with the residual add in its pass (rmsnorm_forward's residual and h) and its backward added into
    the residual stream's gradient (rmsnorm_backward's accumulate) give the bits of the unfused chains: add then
    the norm; the norm's dx then add (tolerance 0 against the chains' values)."""
    rng = rng_for(seed)
    shape = (rows, width)
    x, residual, dy, dh = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    w = (1 + 0.1 * rng.standard_normal(width)).astype(np.float32)
    xb, rb, wb, dyb = device.put(x), device.put(residual), device.put(w), device.put(dy)
    h, y, rstd = device.empty(shape), device.empty(shape), device.empty(rows)
    K.add(h, xb, rb)
    K.rmsnorm_forward(y, rstd, h, wb, 1e-5)
    fused_h, fused_y, fused_rstd = device.empty(shape), device.empty(shape), device.empty(rows)
    K.rmsnorm_forward(fused_y, fused_rstd, xb, wb, 1e-5, residual=rb, h=fused_h)
    dx, dw_rows, total = device.empty(shape), device.empty(shape), device.put(dh)
    K.rmsnorm_backward(dx, dw_rows, dyb, h, wb, rstd)
    K.add(total, total, dx)
    fused_dh, fused_dw_rows = device.put(dh), device.empty(shape)
    K.rmsnorm_backward(fused_dh, fused_dw_rows, dyb, h, wb, rstd, accumulate=True)
    return {"h": (fused_h.numpy(), f64(h.numpy()), 0.0), "y": (fused_y.numpy(), f64(y.numpy()), 0.0),
            "rstd": (fused_rstd.numpy(), f64(rstd.numpy()), 0.0), "dh": (fused_dh.numpy(), f64(total.numpy()), 0.0),
            "dw_rows": (fused_dw_rows.numpy(), f64(dw_rows.numpy()), 0.0)}


def case_softmax(device: uform.Device, seed: int, rows: int, width: int):
    rng = rng_for(seed)
    x = (3 * rng.standard_normal((rows, width))).astype(np.float32)
    dy = rng.standard_normal((rows, width)).astype(np.float32)
    y, dx = device.empty(x.shape), device.empty(x.shape)
    K.softmax_forward(y, device.put(x), width)
    K.softmax_backward(dx, y, device.put(dy), width)
    e = np.exp(f64(x) - f64(x).max(1, keepdims=True))
    ref = e / e.sum(1, keepdims=True)
    ref_dx = ref * (f64(dy) - (f64(dy) * ref).sum(1, keepdims=True))
    return {"y": (y.numpy(), ref, 2e-6), "dx": (dx.numpy(), ref_dx, 4e-6)}


def case_cross_entropy(device: uform.Device, seed: int, rows: int, vocab: int):
    rng = rng_for(seed)
    z = (2 * rng.standard_normal((rows, vocab))).astype(np.float32)
    t = rng.integers(0, vocab, rows).astype(np.int32)
    t[::3] = -1  # ignored rows
    losses, dz = device.empty(rows), device.empty(z.shape)
    K.cross_entropy(losses, dz, device.put(z), device.put(t), grad_scale=0.5)
    zd = f64(z)
    lse = np.log(np.exp(zd - zd.max(1, keepdims=True)).sum(1)) + zd.max(1)
    keep = t >= 0
    ref_loss = np.where(keep, lse - zd[np.arange(rows), np.maximum(t, 0)], 0.0)
    p = np.exp(zd - lse[:, None])
    p[np.arange(rows)[keep], t[keep]] -= 1
    ref_dz = np.where(keep[:, None], 0.5 * p, 0.0)
    return {"loss": (losses.numpy(), ref_loss, 2e-6), "dz": (dz.numpy(), ref_dz, 2e-6)}


def gemm_group_operands(rng, m: int, sizes: tuple, shared: int, transpose_a: bool, transpose_b: bool, summed: bool):
    """Random operands of a gemm_group: (n_t, k_t) per term, the a_t, the b_t and C0."""
    shapes = [(shared, s) if summed else (s, shared) for s in sizes]
    a = [rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32) for _, k in shapes]
    b = [rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32) for n, k in shapes]
    c0 = [rng.standard_normal((m, n)).astype(np.float32) for n, _ in shapes]
    return shapes, a, b, c0


def attention_reference(q, k, v, d_out, seq_len, heads, kv_heads, head_dim, causal, segments):
    """float64 attention, its gradients and its log-sum-exp (0 for a query that sees no key), written with
    dense masks: (o, dq, dk, dv, lse)."""
    tokens = q.shape[0]
    q4 = f64(q).reshape(tokens, heads, head_dim)
    group = heads // kv_heads
    k4 = np.repeat(f64(k).reshape(tokens, kv_heads, head_dim), group, axis=1)
    v4 = np.repeat(f64(v).reshape(tokens, kv_heads, head_dim), group, axis=1)
    seq = np.arange(tokens) // seq_len
    allowed = seq[:, None] == seq[None, :]
    if causal:
        allowed &= np.arange(tokens)[:, None] >= np.arange(tokens)[None, :]
    if segments is not None:
        allowed &= (segments[:, None] == segments[None, :]) & (segments[:, None] >= 0)
    scale = head_dim ** -0.5
    s = np.einsum("ihd,jhd->hij", q4, k4) * scale
    s = np.where(allowed[None], s, -np.inf)
    m = np.max(s, axis=2, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.where(allowed[None], np.exp(s - m), 0)
    total = e.sum(2, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    lse = np.where(total > 0, m + np.log(np.where(total > 0, total, 1)), 0)[..., 0].T
    o = np.einsum("hij,jhd->ihd", p, v4)
    do = f64(d_out).reshape(tokens, heads, head_dim)
    dp = np.einsum("ihd,jhd->hij", do, v4)
    ds = p * (dp - (dp * p).sum(2, keepdims=True))
    dq = np.einsum("hij,jhd->ihd", ds, k4) * scale
    dk = np.einsum("hij,ihd->jhd", ds, q4) * scale
    dv = np.einsum("hij,ihd->jhd", p, do)
    dk = dk.reshape(tokens, kv_heads, group, head_dim).sum(2)
    dv = dv.reshape(tokens, kv_heads, group, head_dim).sum(2)
    return o.reshape(tokens, -1), dq.reshape(tokens, -1), dk.reshape(tokens, -1), dv.reshape(tokens, -1), lse


def run_attention(device: uform.Device, q, k, v, d_out, spans, heads: int, kv_heads: int, head_dim: int,
                  causal: bool, fast: bool = False, span_limit: int = 0, tiles: bool = False):
    """o, dq, dk, dv and lse (numpy) of the engine's attention on device (fast: the fast-mode kernels; span_limit:
    the backward keeps the score gradients of spans up to that long in a d_scores workspace, filled with NaN
    first so that a slot read but never written shows; tiles: the team kernels' tasks from attention_tiles)."""
    qb, kb, vb = device.put(q), device.put(k), device.put(v)
    table = layouts.attention_tiles(spans) if tiles else np.empty((0, 2), np.int32)
    layout = device.put(np.concatenate([spans, table]))  # the tile table right after the spans, as the kernels read it
    geometry = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=causal,
                    spans=layout.view(0, spans.shape), tiles=layout.view(spans.size, table.shape) if tiles else None,
                    fast=fast)
    o, lse = device.empty(q.shape), device.empty((q.shape[0], heads))
    K.attention_forward(o, lse, qb, kb, vb, **geometry)
    dq, dk, dv = device.empty(q.shape), device.empty(k.shape), device.empty(v.shape)
    kept = {}
    if span_limit:
        kept = dict(d_scores=device.put(np.full((q.shape[0], heads, span_limit), np.nan, np.float32)),
                    span_limit=span_limit)
    K.attention_backward(dq, dk, dv, device.put(d_out), o, lse, qb, kb, vb, **geometry, **kept)
    return o.numpy(), dq.numpy(), dk.numpy(), dv.numpy(), lse.numpy()


def attention_inputs(rng: np.random.Generator, tokens: int, heads: int, kv_heads: int, head_dim: int):
    q = rng.standard_normal((tokens, heads * head_dim)).astype(np.float32)
    k = rng.standard_normal((tokens, kv_heads * head_dim)).astype(np.float32)
    v = rng.standard_normal((tokens, kv_heads * head_dim)).astype(np.float32)
    return q, k, v, rng.standard_normal(q.shape).astype(np.float32)


def case_attention(device: uform.Device, seed: int, batch: int, seq_len: int, heads: int, kv_heads: int,
                   head_dim: int, causal: bool, segmented: bool, mean_segment: int = 5, fast: bool = False,
                   span_limit: int = 0, tiles: bool = False):
    rng = rng_for(seed)
    tokens = batch * seq_len
    q, k, v, d_out = attention_inputs(rng, tokens, heads, kv_heads, head_dim)
    segments = None
    if segmented:  # random segment boundaries inside each sequence, padding runs between some and a padded tail
        segments = np.cumsum(rng.random(tokens) < 1 / mean_segment).astype(np.int32)
        segments[seq_len - 1::seq_len] = -1
        if mean_segment > 5:
            for start in rng.integers(0, tokens - 9, 2):
                segments[start:start + rng.integers(1, 9)] = -1
            for end in range(seq_len, tokens + 1, seq_len):
                segments[end - rng.integers(1, 20):end] = -1
            runs = np.cumsum(np.r_[True, segments[1:] != segments[:-1]])  # a segment cut by padding: two segments
            segments = np.where(segments < 0, -1, runs).astype(np.int32)
    spans = layouts.attention_spans(tokens, seq_len, segments)
    outputs = run_attention(device, q, k, v, d_out, spans, heads, kv_heads, head_dim, causal, fast, span_limit,
                            tiles)
    ref = attention_reference(q, k, v, d_out, seq_len, heads, kv_heads, head_dim, causal, segments)
    tolerance = 4e-6 * np.sqrt(seq_len * head_dim)
    return {name: (out, r, tolerance) for name, out, r in zip(("o", "dq", "dk", "dv", "lse"), outputs, ref)}


def case_rotary(device: uform.Device, seed: int, tokens: int, heads: int, head_dim: int, axes: int = 1,
                offset: int = 0):
    """offset > 0: x a view that many floats into its buffer (off 16 bytes: a GPU then runs `rotary`, not
    `rotary_fast`)."""
    rng = rng_for(seed)
    x = rng.standard_normal((tokens, heads * head_dim)).astype(np.float32)
    positions = rng.integers(0, 64, (tokens, axes)).astype(np.int32)
    cos, sin = layouts.rotary_tables(64, head_dim)
    xb = device.put(np.r_[np.zeros(offset, np.float32), x.reshape(-1)]).view(offset, x.shape)
    pb, cb, sb = device.put(positions), device.put(cos), device.put(sin)
    K.rotary(xb, pb, cb, sb, heads=heads, head_dim=head_dim, axes=axes)
    rotated = xb.numpy()
    K.rotary(xb, pb, cb, sb, heads=heads, head_dim=head_dim, inverse=True, axes=axes)
    half = head_dim // 2
    time_pairs = half // 4
    row_pairs = (half - time_pairs) // 2
    axis = np.zeros(half, int) if axes == 1 else np.repeat([0, 1, 2], [time_pairs, row_pairs, half - time_pairs - row_pairs])
    pair_positions = positions[:, axis]                  # [tokens, half]: the position each pair reads
    x3 = f64(x).reshape(tokens, heads, head_dim)
    c = np.take_along_axis(f64(cos)[pair_positions], np.arange(half)[None, :, None], 2)[..., 0][:, None, :]
    s = np.take_along_axis(f64(sin)[pair_positions], np.arange(half)[None, :, None], 2)[..., 0][:, None, :]
    ref = np.concatenate([x3[..., :half] * c - x3[..., half:] * s, x3[..., half:] * c + x3[..., :half] * s], -1)
    return {"rotated": (rotated, ref.reshape(tokens, -1), 1e-6), "round_trip": (xb.numpy(), f64(x), 1e-6)}


def case_gemm_exact(device: uform.Device, seed: int, m: int, n: int, k: int, transpose_a: bool = False,
                    transpose_b: bool = False, accumulate: bool = False, spread: float = 1.0,
                    residues: bool | str = False):
    """The exact GEMM (its limb form, or with `residues` its residue form, or its fused form) against its definition
    (uform.reference.exact_gemm): equal values, a relative error of 0 (tests/test_kernels.py compares their
    bits). Values of a wide range (GEMMul8's draws), a zero row, a zero column, and subnormal inputs."""
    rng = rng_for(seed)
    a = ((rng.random((m, k)) - 0.5) * np.exp(spread * rng.standard_normal((m, k)))).astype(np.float32)
    b = ((rng.random((k, n)) - 0.5) * np.exp(spread * rng.standard_normal((k, n)))).astype(np.float32)
    a[m // 2] = 0.0
    b[:, n // 2] = 0.0
    a[0, : k // 2] = np.float32(3e-39)  # subnormal inputs beside normal ones in one row
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    stored_a = np.ascontiguousarray(a.T) if transpose_a else a
    stored_b = np.ascontiguousarray(b.T) if transpose_b else b
    cb = device.put(c0)
    K.gemm_exact(cb, device.put(stored_a), device.put(stored_b), m, n, k, transpose_a=transpose_a,
                 transpose_b=transpose_b, accumulate=accumulate, residues=residues)
    expected = exact_gemm.exact_gemm(a, b)
    if accumulate:
        expected = c0 + expected  # one float32 addition
    return {"c": (cb.numpy(), expected.astype(np.float64), 0.0, 1.0)}


def bf16_rounded(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16, to nearest with ties to even, as float64."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def case_cast_bf16(device: uform.Device, seed: int, count: int, offset: int):
    """fast mode's rounding to bf16 (kernels.cast_bf16), exact: normal values, ties of both parities, subnormals
    and zeros of both signs; `offset` values into the buffers, so an odd one takes the unaligned path."""
    rng = rng_for(seed)
    x = (rng.standard_normal(count) * np.exp2(rng.integers(-20, 20, count))).astype(np.float32)
    special = np.array([0.0, -0.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1e-40, -3e-39, 2**-149, 65504.0],
                       np.float32)
    x[:min(count, special.size)] = special[:count]
    source = device.put(np.r_[np.zeros(offset, np.float32), x]).view(offset, (count,))
    target = device.empty(offset + count, np.uint16).view(offset, (count,))
    K.cast_bf16(target, source)
    bits = device_bits(target, offset, count)
    return {"y": ((bits.astype(np.uint32) << 16).view(np.float32), bf16_rounded(x), 0.0, 1.0)}


def device_bits(view, offset: int, count: int) -> np.ndarray:
    """The uint16 values of a view that starts `offset` values into its allocation (host copies read whole
    allocations)."""
    return view.owner.numpy()[offset:offset + count]


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns as float32 values."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def case_fast_producers(device: uform.Device, seed: int, rows: int, width: int, offset: int):
    """Fast mode's producers of bf16 copies (kernels/fast_producers.mojo, rotary_fast) give the bits of the
    unfused chains they replace (add, rmsnorm_forward/backward, silu, silu_backward, rotary, then cast_bf16),
    exactly (tolerance 0 against the chain's values); the fast rotary in place gives rotary's bits. The element
    kernels start `offset` values into their buffers, so an offset that is not a multiple of 8 takes their
    unaligned path."""
    rng = rng_for(seed)
    shape, count = (rows, width), rows * width
    x, residual, dy, dh = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    w = (1 + 0.1 * rng.standard_normal(width)).astype(np.float32)
    eps = 1e-5
    xb, rb, wb, dyb = device.put(x), device.put(residual), device.put(w), device.put(dy)

    def bits16():
        return device.empty(shape, np.uint16)

    def chain_bits(fp32: uform.Buffer) -> np.ndarray:
        copy = device.empty(fp32.shape, np.uint16)
        K.cast_bf16(copy, fp32)
        return copy.numpy()

    # forward norm, with and without the residual add
    h, y, rstd = device.empty(shape), device.empty(shape), device.empty(rows)
    K.add(h, xb, rb)
    K.rmsnorm_forward(y, rstd, h, wb, eps)
    fused_h, fused_y16, fused_rstd = device.empty(shape), bits16(), device.empty(rows)
    K.rmsnorm_bf16(fused_y16, fused_rstd, xb, wb, eps, residual=rb, h=fused_h)
    plain_y16, plain_rstd = bits16(), device.empty(rows)
    K.rmsnorm_bf16(plain_y16, plain_rstd, h, wb, eps)
    outputs = {"norm_h": (fused_h.numpy(), f64(h.numpy()), 0.0, 1.0),
               "norm_rstd": (fused_rstd.numpy(), f64(rstd.numpy()), 0.0, 1.0),
               "norm_y16": (bf16_values(fused_y16.numpy()), f64(bf16_values(chain_bits(y))), 0.0, 1.0),
               "norm_y16_no_residual": (bf16_values(plain_y16.numpy()), f64(bf16_values(chain_bits(y))), 0.0, 1.0)}
    # backward norm added into dh
    dx, dw_rows = device.empty(shape), device.empty(shape)
    K.rmsnorm_backward(dx, dw_rows, dyb, h, wb, rstd)
    total = device.put(dh)
    K.add(total, total, dx)
    fused_dh, fused_dh16, fused_dw_rows = device.put(dh), bits16(), device.empty(shape)
    K.rmsnorm_backward_bf16(fused_dh, fused_dh16, fused_dw_rows, dyb, h, wb, rstd)
    outputs.update({"norm_backward_dh": (fused_dh.numpy(), f64(total.numpy()), 0.0, 1.0),
                    "norm_backward_dh16": (bf16_values(fused_dh16.numpy()), f64(bf16_values(chain_bits(total))), 0.0,
                                           1.0),
                    "norm_backward_dw_rows": (fused_dw_rows.numpy(), f64(dw_rows.numpy()), 0.0, 1.0)})
    # SiLU and its backward, from an offset into the buffers
    u = (4 * rng.standard_normal(count)).astype(np.float32)
    ub = device.put(np.r_[np.zeros(offset, np.float32), u]).view(offset, (count,))
    gb = device.put(np.r_[np.zeros(offset, np.float32), dy.ravel()]).view(offset, (count,))
    s, du = device.empty(count), device.empty(count)
    K.silu(s, ub)
    K.silu_backward(du, ub, gb)
    fused_s16 = device.empty(offset + count, np.uint16).view(offset, (count,))
    fused_du16 = device.empty(offset + count, np.uint16).view(offset, (count,))
    K.silu_bf16(fused_s16, ub)
    K.silu_backward_bf16(fused_du16, ub, gb)
    for name, copy, fp32 in (("silu16", fused_s16, s), ("silu_backward16", fused_du16, du)):
        chain = device.empty(count, np.uint16)
        K.cast_bf16(chain, fp32)
        outputs[name] = (bf16_values(device_bits(copy, offset, count)), f64(bf16_values(chain.numpy())), 0.0, 1.0)
    # the fast rotary (heads of 16 in each row), in place and, inverse, into bf16, on one and three position axes
    cos, sin = (device.put(table) for table in layouts.rotary_tables(64, 16))
    heads = width // 16
    for axes in (1, 3) if heads else ():
        positions = device.put(rng.integers(0, 64, (rows, axes)).astype(np.int32))
        q = rng.standard_normal((rows, heads * 16)).astype(np.float32)
        geometry = dict(heads=heads, head_dim=16, axes=axes)
        identical, fast = device.put(q), device.put(q)
        K.rotary(identical, positions, cos, sin, **geometry)
        K.rotary(fast, positions, cos, sin, fast=True, **geometry)
        rotated = identical.numpy()
        outputs[f"rotary_fast_axes{axes}"] = (fast.numpy(), f64(rotated), 0.0, 1.0)
        K.rotary(identical, positions, cos, sin, inverse=True, **geometry)
        rotated16 = device.empty(q.shape, np.uint16)
        K.rotary(fast, positions, cos, sin, inverse=True, fast=True, y16=rotated16, **geometry)
        outputs[f"rotary16_axes{axes}"] = (bf16_values(rotated16.numpy()), f64(bf16_values(chain_bits(identical))),
                                           0.0, 1.0)
        outputs[f"rotary16_source_kept_axes{axes}"] = (fast.numpy(), f64(rotated), 0.0, 1.0)
    return outputs


def case_embedding(device: uform.Device, seed: int, tokens: int, vocab: int, width: int, with_rows: bool = False):
    rng = rng_for(seed)
    table = rng.standard_normal((vocab, width)).astype(np.float32)
    ids = rng.integers(0, vocab, tokens).astype(np.int32)
    d_out = rng.standard_normal((tokens, width)).astype(np.float32)
    extra = rng.standard_normal((tokens, width)).astype(np.float32)
    row_of = np.where(rng.random(tokens) < 0.5, rng.permutation(tokens), -1).astype(np.int32)
    out = device.empty((tokens, width))
    if with_rows:
        K.embedding_forward(out, device.put(table), device.put(ids), width, rows=device.put(extra),
                            row_of=device.put(row_of))
    else:
        K.embedding_forward(out, device.put(table), device.put(ids), width)
    ref_out = f64(table)[ids] + (np.where(row_of[:, None] >= 0, f64(extra)[row_of], 0) if with_rows else 0)
    order, offsets = layouts.embedding_groups(ids, vocab)
    on_device = device.empty(tokens, np.int32), device.empty(vocab + 1, np.int32)  # the same groups, found there
    K.token_groups(*on_device, device.put(ids), vocab)
    dtable = device.empty(table.shape)
    K.embedding_backward(dtable, device.put(d_out), device.put(order), device.put(offsets), width)
    ref = np.zeros((vocab, width))
    np.add.at(ref, ids, f64(d_out))
    # fast mode's chunked order, accumulating onto a table of ones
    chunk_starts, id_chunks = layouts.embedding_chunks(offsets)
    chunked = device.put(np.ones(table.shape, np.float32))
    K.embedding_backward_chunked(chunked, device.put(d_out), device.put(order), device.put(chunk_starts),
                                 device.put(id_chunks), width, accumulate=True)
    return {"out": (out.numpy(), ref_out, 1e-7), "dtable": (dtable.numpy(), ref, 1e-6 * np.sqrt(tokens)),
            "dtable_chunked": (chunked.numpy(), ref + 1, 1e-6 * np.sqrt(tokens)),
            "token_order": (on_device[0].numpy(), order, 0.0), "token_offsets": (on_device[1].numpy(), offsets, 0.0)}


def case_rows(device: uform.Device, seed: int, tokens: int, rows: int, width: int):
    """gather_rows, scatter_rows and mse_rows: the moves and the loss of the media heads."""
    rng = rng_for(seed)
    x = rng.standard_normal((tokens, width)).astype(np.float32)
    index = np.where(rng.random(rows) < 0.8, rng.permutation(tokens)[:rows], -1).astype(np.int32)
    gathered = device.empty((rows, width))
    K.gather_rows(gathered, device.put(x), device.put(index), width)
    ref_gathered = np.where(index[:, None] >= 0, f64(x)[index], 0)
    distinct = rng.permutation(tokens)[:rows].astype(np.int32)
    base = rng.standard_normal((tokens, width)).astype(np.float32)
    scattered = device.put(base)
    K.scatter_rows(scattered, device.put(x[:rows]), device.put(distinct), width, accumulate=True)
    ref_scattered = f64(base).copy()
    ref_scattered[distinct] += f64(x[:rows])
    target = rng.standard_normal((rows, width)).astype(np.float32)
    losses, dpred = device.empty(rows), device.empty((rows, width))
    K.mse_rows(losses, dpred, device.put(x[:rows]), device.put(target), grad_scale=0.5)
    error = f64(x[:rows]) - f64(target)
    return {"gathered": (gathered.numpy(), ref_gathered, 0.0), "scattered": (scattered.numpy(), ref_scattered, 1e-7),
            "mse": (losses.numpy(), (error ** 2).mean(1), 1e-6), "dpred": (dpred.numpy(), error / width, 1e-6)}


def case_adamw(device: uform.Device, seed: int, size: int, steps: int):
    rng = rng_for(seed)
    p = rng.standard_normal(size).astype(np.float32)
    pb, mb, vb = device.put(p), device.zeros(size), device.zeros(size)
    ref_p, ref_m, ref_v = f64(p), np.zeros(size), np.zeros(size)
    lr, (b1, b2), eps, wd = 1e-2, (0.9, 0.999), 1e-8, 0.1
    for step in range(1, steps + 1):
        g = rng.standard_normal(size).astype(np.float32)
        K.adamw(pb, device.put(g), mb, vb, step=step, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
        ref_p *= 1 - lr * wd
        ref_m = b1 * ref_m + (1 - b1) * f64(g)
        ref_v = b2 * ref_v + (1 - b2) * f64(g) ** 2
        ref_p -= lr / (1 - b1**step) * ref_m / (np.sqrt(ref_v) / np.sqrt(1 - b2**step) + eps)
    return {"p": (pb.numpy(), ref_p, 1e-6), "m": (mb.numpy(), ref_m, 1e-6), "v": (vb.numpy(), ref_v, 1e-6)}


def case_pooling(device: uform.Device, seed: int, segments: int, width: int):
    rng = rng_for(seed)
    lengths = rng.integers(1, 9, segments).astype(np.int32)
    starts = (np.cumsum(lengths) - lengths + np.arange(segments)).astype(np.int32)  # a padding token between
    tokens = int(starts[-1] + lengths[-1] + 1)
    token_segments = np.full(tokens, -1, np.int32)
    for s in range(segments):
        token_segments[starts[s]:starts[s] + lengths[s]] = s
    y = rng.standard_normal((tokens, width)).astype(np.float32)
    de = rng.standard_normal((segments, width)).astype(np.float32)
    e, dy = device.empty((segments, width)), device.put(np.ones((tokens, width), np.float32))
    lb = device.put(lengths)
    K.pool_forward(e, device.put(y), device.put(starts), lb, width)
    K.pool_backward(dy, device.put(de), device.put(token_segments), lb, width, accumulate=True)
    ref_e = np.stack([f64(y)[starts[s]:starts[s] + lengths[s]].mean(0) for s in range(segments)])
    ref_dy = 1.0 + np.where(token_segments[:, None] >= 0, f64(de)[token_segments] / lengths[token_segments][:, None], 0)
    return {"e": (e.numpy(), ref_e, 1e-6), "dy": (dy.numpy(), ref_dy, 1e-6)}


def case_l2_normalize(device: uform.Device, seed: int, rows: int, width: int, stride: int):
    rng = rng_for(seed)
    e = rng.standard_normal((rows, stride)).astype(np.float32)
    du = rng.standard_normal((rows, width)).astype(np.float32)
    u, inverse = device.empty((rows, width)), device.empty(rows)
    de = device.put(np.ones((rows, stride), np.float32))
    eb = device.put(e)
    K.l2_normalize_forward(u, inverse, eb, width, stride)
    K.l2_normalize_backward(de, device.put(du), u, inverse, width, stride, accumulate=True)
    x = f64(e)[:, :width]
    norm = np.sqrt((x**2).sum(1, keepdims=True) + K.NORM_EPSILON)
    ref_u = x / norm
    ref_de = np.ones((rows, stride))
    ref_de[:, :width] += (f64(du) - ref_u * (ref_u * f64(du)).sum(1, keepdims=True)) / norm
    return {"u": (u.numpy(), ref_u, 1e-6), "de": (de.numpy(), ref_de, 2e-6)}


def case_pair_loss(device: uform.Device, seed: int, segments: int, groups: int, ranked: bool):
    rng = rng_for(seed)
    cos = np.clip(rng.standard_normal((segments, segments)) * 0.4, -1, 1).astype(np.float32)
    sign = rng.choice([-1.0, 0.0, 1.0], (segments, segments), p=[0.5, 0.2, 0.3]).astype(np.float32)
    np.fill_diagonal(sign, 0)
    weight = np.where(sign != 0, rng.uniform(0.5, 2, (segments, segments)), 0).astype(np.float32)
    group = rng.integers(0, groups, segments).astype(np.int32)
    log_scale = rng.uniform(0, 2.5, groups).astype(np.float32)
    bias = rng.uniform(-5, 1, groups).astype(np.float32)
    norm, scale = 0.37, 0.5
    temperature, losses = device.empty((segments, 2)), device.empty(segments)
    dcos, dls, db = device.empty((segments, segments)), device.empty(segments), device.empty(segments)
    gb = device.put(group)
    K.row_temperature(temperature, device.put(log_scale), device.put(bias), gb)
    K.pair_loss(losses, dcos, dls, db, device.put(cos), device.put(sign), device.put(weight), temperature,
                form=K.FORM_RANKED if ranked else K.FORM_WEIGHTED_SIGMOID, ranked_norm=norm, grad_scale=scale)
    g_ls, g_b = device.empty(groups), device.empty(groups)
    K.group_sums(g_ls, dls, gb)
    K.group_sums(g_b, db, gb)
    t = np.exp(f64(log_scale))[group][:, None]
    z = t * f64(cos) + f64(bias)[group][:, None]
    softplus = lambda x: np.logaddexp(0, x)  # noqa: E731
    sigmoid = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    w, sg = f64(weight), f64(sign)
    if ranked:
        gap = z[:, None, :] - z[:, :, None]              # [i, p, n] = z_in − z_ip
        pn = (sg[:, :, None] > 0) & (sg[:, None, :] < 0)
        ww = norm * w[:, :, None] * w[:, None, :] * pn
        ref_loss = (ww * softplus(gap)).sum((1, 2))
        force = ww * sigmoid(gap)
        dz = force.sum(1) - force.sum(2)
    else:
        ref_loss = (w * softplus(-sg * z) * (sg != 0)).sum(1)
        dz = -sg * w * sigmoid(-sg * z) * (sg != 0)
    dz = dz * scale
    ref_dls = np.array([(dz * f64(cos) * t)[group == g].sum() for g in range(groups)])
    ref_db = np.array([dz[group == g].sum() for g in range(groups)])
    # Under the ranked form Σ_j dz_ij = 0 (the bias cancels): dbias is measured against the size of dz.
    return {"loss": (losses.numpy(), ref_loss, 2e-6), "dcos": (dcos.numpy(), dz * t, 2e-6),
            "dlog_scale": (g_ls.numpy(), ref_dls, 2e-6),
            "dbias": (g_b.numpy(), ref_db, 2e-6, np.abs(dz).sum() if ranked else np.abs(ref_db).max())}


def unit_rows(rng, rows: int, width: int) -> np.ndarray:
    x = rng.standard_normal((rows, width))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def case_maxsim(device: uform.Device, seed: int, segments: int, width: int):
    """MaxSim forward and backward over segments that are queries, documents, both or neither; every
    document repeats one of its rows, so its maxima tie and the gradient must go to the lowest row."""
    rng = rng_for(seed)
    side = rng.integers(0, 4, segments)
    side[0], side[-1] = 3, 2
    query_counts = np.where(side & 1, rng.integers(1, 6, segments), 0).astype(np.int32)
    document_counts = np.where(side & 2, rng.integers(2, 7, segments), 0).astype(np.int32)
    query_starts = (np.cumsum(query_counts) - query_counts).astype(np.int32)
    document_starts = (np.cumsum(document_counts) - document_counts).astype(np.int32)
    queries = unit_rows(rng, int(query_counts.sum()), width)
    documents = unit_rows(rng, int(document_counts.sum()), width)
    for j in np.flatnonzero(document_counts):  # the last row of each document repeats its first
        documents[document_starts[j] + document_counts[j] - 1] = documents[document_starts[j]]
    query_segment = np.repeat(np.arange(segments), query_counts).astype(np.int32)
    document_segment = np.repeat(np.arange(segments), document_counts).astype(np.int32)
    d_scores = rng.standard_normal((segments, segments)).astype(np.float32)
    Nq, Nd = queries.shape[0], documents.shape[0]

    best, arg = device.empty((Nq, segments)), device.empty((Nq, segments), np.int32)
    scores = device.empty((segments, segments))
    dq, dd = device.empty((Nq, width)), device.empty((Nd, width))
    q_buffer, d_buffer = device.put(queries), device.put(documents)
    K.maxsim_forward(best, arg, q_buffer, d_buffer, device.put(document_starts), device.put(document_counts), width)
    K.maxsim_scores(scores, best, device.put(query_starts), device.put(query_counts), device.put(document_counts))
    K.maxsim_backward(dq, dd, device.put(d_scores), arg, q_buffer, d_buffer, device.put(query_segment),
                      device.put(document_segment), segments, width)

    sim = f64(queries) @ f64(documents).T
    ref_arg = np.full((Nq, segments), -1)
    for j in np.flatnonzero(document_counts):
        rows = slice(document_starts[j], document_starts[j] + document_counts[j])
        ref_arg[:, j] = document_starts[j] + np.argmax(sim[:, rows], axis=1)  # argmax: the first of equals
    ref_best = np.where(ref_arg >= 0, np.take_along_axis(sim, np.maximum(ref_arg, 0), 1), 0.0)
    ref_scores = np.zeros((segments, segments))
    for i in np.flatnonzero(query_counts):
        ref_scores[i] = ref_best[query_starts[i]:query_starts[i] + query_counts[i]].sum(0)
    ref_scores[:, document_counts == 0] = 0
    ref_dq, ref_dd = np.zeros((Nq, width)), np.zeros((Nd, width))
    for a in range(Nq):
        for j in np.flatnonzero(ref_arg[a] >= 0):
            g = f64(d_scores)[query_segment[a], j]
            ref_dq[a] += g * f64(documents[ref_arg[a, j]])
            ref_dd[ref_arg[a, j]] += g * f64(queries[a])
    return {"arg": (arg.numpy(), ref_arg, 0.0), "best": (best.numpy(), ref_best, 1e-6),
            "scores": (scores.numpy(), ref_scores, 2e-6), "d_queries": (dq.numpy(), ref_dq, 1e-6),
            "d_documents": (dd.numpy(), ref_dd, 2e-6)}


def case_choice_loss(device: uform.Device, seed: int, items: int, vocab: int, with_targets: bool):
    """The softmax over each item's legal bytes and, with targets, the soft-target cross-entropy and its
    gradient (zero off the legal bytes)."""
    rng = rng_for(seed)
    counts = rng.integers(1, min(vocab, 9) + 1, items)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    legal = np.concatenate([rng.permutation(vocab)[:n] for n in counts]).astype(np.int32)
    targets = np.concatenate([rng.dirichlet(np.ones(n)) for n in counts]).astype(np.float32)
    z = (3 * rng.standard_normal((items, vocab))).astype(np.float32)
    probabilities, losses, dz = device.empty(legal.size), device.empty(items), device.empty((items, vocab))
    K.choice_loss(probabilities, losses if with_targets else None, dz if with_targets else None, device.put(z),
                  device.put(offsets), device.put(legal), device.put(targets) if with_targets else None,
                  grad_scale=0.25)
    ref_p, ref_loss, ref_dz = np.zeros(legal.size), np.zeros(items), np.zeros((items, vocab))
    for c in range(items):
        k = slice(offsets[c], offsets[c + 1])
        logits = f64(z[c, legal[k]])
        p = np.exp(logits - logits.max())
        p /= p.sum()
        ref_p[k] = p
        ref_loss[c] = -(f64(targets[k]) * np.log(p)).sum()
        ref_dz[c, legal[k]] = 0.25 * (p - f64(targets[k]))
    result = {"probabilities": (probabilities.numpy(), ref_p, 1e-6)}
    if with_targets:
        result |= {"loss": (losses.numpy(), ref_loss, 2e-6), "dz": (dz.numpy(), ref_dz, 1e-6)}
    return result


def case_row_sums(device: uform.Device, seed: int, rows: int, row_length: int, m: int, n: int, vocab: int):
    """The sums over tokens taken a packed row at a time and combined by the row tree (kernels.tree_sum): a
    weight gradient (gemm's k_range), norm gains (column_sum's row_length), the embedding table's gradient and
    tree_sum itself, each against its float64 sum."""
    rng = rng_for(seed)
    tokens = rows * row_length
    a = rng.standard_normal((tokens, m)).astype(np.float32)
    b = rng.standard_normal((tokens, n)).astype(np.float32)
    c = device.empty((m, n))
    K.gemm(c, device.put(a), device.put(b), m, n, tokens, transpose_a=True, k_range=row_length)
    gains = device.empty(n)
    K.column_sum(gains, device.put(b), tokens, n, row_length=row_length)
    ids = rng.integers(0, vocab, tokens).astype(np.int32)
    order, offsets = layouts.embedding_groups(ids, vocab, row_length)
    dtable = device.empty((vocab, n))
    K.embedding_backward(dtable, device.put(b), device.put(order), device.put(offsets), n,
                         partials=device.empty((rows, vocab, n)))
    table = np.zeros((vocab, n))
    np.add.at(table, ids, f64(b))
    partials = (rng.standard_normal((rows, m)) * np.exp(rng.standard_normal((rows, m)))).astype(np.float32)
    total = device.put(np.ones(m, np.float32))
    K.tree_sum(total, device.put(partials), rows, accumulate=True)
    scale = 4e-6 * np.sqrt(tokens)
    return {"gemm": (c.numpy(), f64(a).T @ f64(b), scale), "column_sum": (gains.numpy(), f64(b).sum(0), scale),
            "embedding": (dtable.numpy(), table, scale), "tree": (total.numpy(), 1 + f64(partials).sum(0), 1e-6)}


def all_cases():
    """(id, function, kwargs) for every case; both test modules iterate this list."""
    cases = []
    for m, n, k in GEMM_SHAPES:
        for ta, tb in ((False, False), (True, False), (False, True)):
            cases.append((f"gemm-{m}x{n}x{k}-ta{int(ta)}-tb{int(tb)}", case_gemm,
                          dict(m=m, n=n, k=k, transpose_a=ta, transpose_b=tb, accumulate=(m + n) % 2 == 0)))
    for op in K.UNARY_OPS:
        cases.append((f"unary-{op}", case_unary, dict(op=op)))
    for rows, width in ROW_SHAPES:
        # width 1 makes the RMSNorm gradient pure cancellation (x²r² = 1 − ε): its row starts at 3
        cases.append((f"rmsnorm-{rows}x{max(width, 3)}", case_rmsnorm, dict(rows=rows, width=max(width, 3))))
        cases.append((f"rmsnorm_fused-{rows}x{width}", case_rmsnorm_fused, dict(rows=rows, width=width)))
        cases.append((f"softmax-{rows}x{width}", case_softmax, dict(rows=rows, width=width)))
        cases.append((f"cross_entropy-{rows}x{width}", case_cross_entropy, dict(rows=rows, vocab=width)))
    for b, t, h, kv, d in ATTENTION_SHAPES:
        for causal in (False, True):
            for segmented in (False, True):
                cases.append((f"attention-{b}x{t}-h{h}kv{kv}d{d}-c{int(causal)}s{int(segmented)}", case_attention,
                              dict(batch=b, seq_len=t, heads=h, kv_heads=kv, head_dim=d, causal=causal,
                                   segmented=segmented)))
    for b, t, h, kv, d, segment in ATTENTION_LONG_SHAPES:
        for causal in (False, True):
            cases.append((f"attention-{b}x{t}-h{h}kv{kv}d{d}-c{int(causal)}-segments{segment}", case_attention,
                          dict(batch=b, seq_len=t, heads=h, kv_heads=kv, head_dim=d, causal=causal,
                               segmented=segment > 0, mean_segment=max(segment, 1))))
    for tokens, heads, d in ((1, 1, 8), (13, 3, 16), (40, 4, 64)):
        for axes in (1, 3):
            cases.append((f"rotary-{tokens}x{heads}x{d}-axes{axes}", case_rotary,
                          dict(tokens=tokens, heads=heads, head_dim=d, axes=axes)))
            cases.append((f"rotary-{tokens}x{heads}x{d}-axes{axes}+1", case_rotary,
                          dict(tokens=tokens, heads=heads, head_dim=d, axes=axes, offset=1)))
    for m, n, k, ta, tb, acc, spread in ((1, 1, 1, False, False, False, 1.0), (7, 5, 33, False, False, True, 2.0),
                                         (9, 6, 300, True, False, False, 1.0), (5, 8, 700, False, True, True, 0.5),
                                         (4, 3, 5000, False, False, False, 1.0), (40, 36, 50, True, False, True, 1.0),
                                         (13, 35, 1100, True, False, True, 1.0), (50, 20, 600, False, True, False, 2.0)):
        for residues in (False, True, "fused"):
            form = "fused" if residues == "fused" else f"residues{int(residues)}"
            cases.append((f"gemm_exact-{m}x{n}x{k}-t{int(ta)}{int(tb)}-acc{int(acc)}-{form}",
                          case_gemm_exact, dict(m=m, n=n, k=k, transpose_a=ta, transpose_b=tb, accumulate=acc,
                                                spread=spread, residues=residues)))
    for m, n, k, ta, tb, acc in ((130, 257, 100, False, False, True), (257, 129, 40, True, False, False),
                                 (129, 200, 77, False, True, True)):  # past the fused kernel's 128 × 128 tile
        cases.append((f"gemm_exact-{m}x{n}x{k}-t{int(ta)}{int(tb)}-acc{int(acc)}-fused", case_gemm_exact,
                      dict(m=m, n=n, k=k, transpose_a=ta, transpose_b=tb, accumulate=acc, residues="fused")))
    for count, offset in ((1, 0), (7, 0), (8, 0), (1000, 0), (1000, 3), (4099, 8)):
        cases.append((f"cast_bf16-{count}+{offset}", case_cast_bf16, dict(count=count, offset=offset)))
    for rows, width, offset in ((1, 3, 0), (5, 40, 3), (17, 768, 0), (9, 200, 5), (3, 1100, 1)):
        cases.append((f"fast_producers-{rows}x{width}+{offset}", case_fast_producers,
                      dict(rows=rows, width=width, offset=offset)))
    for tokens, vocab, width in ((1, 1, 1), (50, 7, 5), (300, 258, 33), (700, 3, 16)):
        for with_rows in (False, True):
            cases.append((f"embedding-{tokens}-{vocab}x{width}-rows{int(with_rows)}", case_embedding,
                          dict(tokens=tokens, vocab=vocab, width=width, with_rows=with_rows)))
    for rows, row_length, m, n, vocab in ((1, 1, 1, 1, 1), (3, 17, 5, 9, 7), (8, 64, 33, 20, 260), (13, 40, 8, 130, 3)):
        cases.append((f"row_sums-{rows}x{row_length}-{m}x{n}-v{vocab}", case_row_sums,
                      dict(rows=rows, row_length=row_length, m=m, n=n, vocab=vocab)))
    for rows, columns, row_length in ((1100, 70, 0), (1100, 45, 550), (300, 33, 100), (257, 1, 0)):
        cases.append((f"column_sum-{rows}x{columns}-rows{row_length}", case_column_sum,
                      dict(rows=rows, columns=columns, row_length=row_length)))
    for tokens, rows, width in ((1, 1, 1), (40, 17, 48), (300, 129, 768)):
        cases.append((f"rows-{tokens}-{rows}x{width}", case_rows, dict(tokens=tokens, rows=rows, width=width)))
    for segments, width in ((1, 8), (5, 64), (40, 200)):
        cases.append((f"pooling-{segments}x{width}", case_pooling, dict(segments=segments, width=width)))
    for rows, width, stride in ((1, 8, 8), (7, 64, 128), (33, 200, 200)):
        cases.append((f"l2_normalize-{rows}x{width}of{stride}", case_l2_normalize,
                      dict(rows=rows, width=width, stride=stride)))
    for segments, groups in ((2, 1), (9, 2), (40, 3)):
        for ranked in (False, True):
            cases.append((f"pair_loss-{segments}-g{groups}-{'ranked' if ranked else 'sigmoid'}", case_pair_loss,
                          dict(segments=segments, groups=groups, ranked=ranked)))
    for size, steps in ((1, 1), (1000, 5)):
        cases.append((f"adamw-{size}-{steps}", case_adamw, dict(size=size, steps=steps)))
    for segments, width in ((2, 8), (6, 16), (23, 128)):
        cases.append((f"maxsim-{segments}x{width}", case_maxsim, dict(segments=segments, width=width)))
    for items, vocab in ((1, 1), (7, 264), (40, 30)):
        for with_targets in (False, True):
            cases.append((f"choice_loss-{items}x{vocab}-targets{int(with_targets)}", case_choice_loss,
                          dict(items=items, vocab=vocab, with_targets=with_targets)))
    return cases
