"""Scaled dot-product attention with masks, forward and backward.

Tokens are rows of q [N, Hq·D], k and v [N, Hkv·D]. Query head h reads key/value head
h·Hkv/Hq (grouped-query attention). Each token t lies in a block [begin_t, end_t) given by
`spans` (int32 [N, 2]): its packed segment, or its whole sequence; a padding token's block is
empty. Query t sees the keys of its block (those ≤ t when causal); key j is seen by the queries of
its block (those ≥ j when causal).

    s_j = (q·k_j)·scale      p_j = e^(s_j − L)      L = log Σ_j e^(s_j)
    o = Σ_j p_j v_j
    backward, with δ = dO·o:  dp_j = dO·v_j   ds_j = p_j (dp_j − δ)
    dq = scale Σ_j ds_j k_j   dk_j = scale Σ_(h,i) ds_ij q_i   dv_j = Σ_(h,i) p_ij dO_i

The canonical order. Every dot product is an fma chain over d. The terms of every Σ over keys
(or over the (head, query) pairs of a key) are dealt to 32 lanes in turn — term e to lane e mod
32 — each lane keeps its own sum in ascending order (for the softmax, an online softmax: a running
maximum m, a running Σe^(s−m) and output, rescaled when m grows), and the lanes are folded by
halves (lane l takes lane l+16, then l+8, +4, +2, +1). On a GPU the 32 lanes are a warp's threads
and the folds are shuffles; on the CPU one task plays the 32 lanes, computing 8 lanes' dot
products at once in SIMD. Both round the same operations in the same order.
Operands: n0 = T (unused), n1 = Hq, n2 = Hkv, n3 = D; x0 = scale, x1 = 1 if causal.
"""

from std.collections import Array
from std.math import fma
from std.python import PythonObject
from max.gpu.primitives.warp import shuffle_down
from engine.device import F32Ptr, f32_at, i32_at
from engine.launch import Args, WARP, launch_warps, launch_from_python
from engine import numerics

comptime HEAD_DIMS = (8, 16, 32, 64, 128)
comptime CPU_KEYS = 8  # keys whose dot products one CPU SIMD pass computes


# ---- shared arithmetic -------------------------------------------------------------------------------

@always_inline
def dot(a: F32Ptr, b: F32Ptr, D: Int) -> Float32:
    var acc = Float32(0)
    for d in range(D):
        acc = fma(a.unsafe_load(d), b.unsafe_load(d), acc)
    return acc


@always_inline
def dot_with_row[D: Int](a: SIMD[DType.float32, D], b: F32Ptr) -> Float32:
    """a·b as one fma chain over d, with `a` in registers and b read 16 bytes at a time."""
    var acc = Float32(0)
    comptime for c in range(D // 4):
        var chunk = b.unsafe_load[width=4, alignment=16](4 * c)
        comptime for i in range(4):
            acc = fma(a[4 * c + i], chunk[i], acc)
    return acc


@always_inline
def dot_of_rows[D: Int](a: SIMD[DType.int64, CPU_KEYS], b: F32Ptr, count: Int) -> SIMD[DType.float32, CPU_KEYS]:
    """`count` (≤ 8) dot products of the rows at addresses a[i] with b, each an fma chain over d, in SIMD."""
    var acc = SIMD[DType.float32, CPU_KEYS](0)
    for d in range(D):
        var column = SIMD[DType.float32, CPU_KEYS](0)
        for i in range(count):
            column[i] = f32_at(Int(a[i])).unsafe_load(d)
        acc = column.fma(SIMD[DType.float32, CPU_KEYS](b.unsafe_load(d)), acc)
    return acc


@always_inline
def shuffle_down_lanes[D: Int](v: SIMD[DType.float32, D], offset: Int) -> SIMD[DType.float32, D]:
    """The vector of lane + offset (a warp shuffles one 32-bit value at a time)."""
    var out = SIMD[DType.float32, D](0)
    comptime for i in range(D):
        out[i] = shuffle_down(v[i], UInt32(offset))
    return out


@always_inline
def online_step(mut m: Float32, mut l: Float32, s: Float32) -> Tuple[Float32, Float32]:
    """Take score s into a lane's running (max, Σe^(s−max)); answers (rescale of the old terms, weight of s)."""
    var m_new = s if s > m else m
    var c = numerics.exp(m - m_new)
    var p = numerics.exp(s - m_new)
    l = l * c + p
    m = m_new
    return (c, p)


@always_inline
def merge_scales(ma: Float32, mb: Float32) -> Tuple[Float32, Float32, Float32]:
    """(max, scale of a, scale of b) to merge two lanes' softmax states; a lane that saw no key has −inf."""
    if mb == -numerics.INF:
        return (ma, Float32(1), Float32(0))
    if ma == -numerics.INF:
        return (mb, Float32(0), Float32(1))
    var m = ma if ma > mb else mb
    return (m, numerics.exp(ma - m), numerics.exp(mb - m))


@always_inline
def query_keys(spans: Int, token: Int, causal: Bool) -> Tuple[Int, Int]:
    var begin = Int(i32_at(spans).unsafe_load(2 * token))
    var end = Int(i32_at(spans).unsafe_load(2 * token + 1))
    return (begin, min(end, token + 1) if causal else end)


@always_inline
def key_queries(spans: Int, token: Int, causal: Bool) -> Tuple[Int, Int]:
    var begin = Int(i32_at(spans).unsafe_load(2 * token))
    var end = Int(i32_at(spans).unsafe_load(2 * token + 1))
    return (max(begin, token) if causal and begin < end else begin, end)


# ---- forward: a0 = o [N,Hq·D], a1 = lse [N,Hq], a2 = q, a3 = k, a4 = v, a5 = spans ---------------------

def forward_gpu[D: Int](task: Int, lane: Int, args: Args):
    var Hq = args.n1
    var Hkv = args.n2
    var token = task // Hq
    var kv = (task % Hq) * Hkv // Hq
    var q = f32_at(args.a2 + task * D * 4).unsafe_load[width=D, alignment=16](0)
    var keys = query_keys(args.a5, token, args.x1 != 0)
    var m = -numerics.INF
    var l = Float32(0)
    var acc = SIMD[DType.float32, D](0)
    var j = keys[0] + lane
    while j < keys[1]:
        var cp = online_step(m, l, dot_with_row[D](q, f32_at(args.a3 + (j * Hkv + kv) * D * 4)) * args.x0)
        acc = SIMD[DType.float32, D](cp[1]).fma(f32_at(args.a4 + (j * Hkv + kv) * D * 4).unsafe_load[width=D, alignment=16](0),
                                                acc * cp[0])
        j += WARP
    comptime for step in range(5):
        comptime offset = 16 >> step
        var m_other = shuffle_down(m, UInt32(offset))
        var l_other = shuffle_down(l, UInt32(offset))
        var acc_other = shuffle_down_lanes[D](acc, offset)
        var scales = merge_scales(m, m_other)
        l = l * scales[1] + l_other * scales[2]
        acc = acc_other.fma(SIMD[DType.float32, D](scales[2]), acc * scales[1])
        m = scales[0]
    if lane == 0:
        var o = f32_at(args.a0 + task * D * 4)
        if l > 0:
            o.unsafe_store[width=D, alignment=16](0, acc / l)
        else:
            o.unsafe_store[width=D, alignment=16](0, SIMD[DType.float32, D](0))
        f32_at(args.a1).unsafe_store(task, m + numerics.log(l) if l > 0 else Float32(0))


def forward_cpu[D: Int](task: Int, args: Args):
    var Hq = args.n1
    var Hkv = args.n2
    var token = task // Hq
    var kv = (task % Hq) * Hkv // Hq
    var q = f32_at(args.a2 + task * D * 4)
    var keys = query_keys(args.a5, token, args.x1 != 0)
    var m = Array[Float32, WARP](fill=-numerics.INF)
    var l = Array[Float32, WARP](fill=0)
    var acc = Array[SIMD[DType.float32, D], WARP](fill=SIMD[DType.float32, D](0))
    var base = keys[0]
    while base < keys[1]:
        var count = min(CPU_KEYS, keys[1] - base)
        var rows = SIMD[DType.int64, CPU_KEYS](0)
        for i in range(count):
            rows[i] = Int64(args.a3 + ((base + i) * Hkv + kv) * D * 4)
        var scores = dot_of_rows[D](rows, q, count)
        for i in range(count):
            var lane = (base + i - keys[0]) % WARP
            var ml = m[lane]
            var ll = l[lane]
            var cp = online_step(ml, ll, scores[i] * args.x0)
            m[lane] = ml
            l[lane] = ll
            acc[lane] = SIMD[DType.float32, D](cp[1]).fma(
                f32_at(args.a4 + ((base + i) * Hkv + kv) * D * 4).unsafe_load[width=D, alignment=16](0), acc[lane] * cp[0])
        base += CPU_KEYS
    comptime for step in range(5):
        comptime offset = 16 >> step
        for lane in range(offset):
            var scales = merge_scales(m[lane], m[lane + offset])
            l[lane] = l[lane] * scales[1] + l[lane + offset] * scales[2]
            acc[lane] = acc[lane + offset].fma(SIMD[DType.float32, D](scales[2]), acc[lane] * scales[1])
            m[lane] = scales[0]
    var o = f32_at(args.a0 + task * D * 4)
    if l[0] > 0:
        o.unsafe_store[width=D, alignment=16](0, acc[0] / l[0])
    else:
        o.unsafe_store[width=D, alignment=16](0, SIMD[DType.float32, D](0))
    f32_at(args.a1).unsafe_store(task, m[0] + numerics.log(l[0]) if l[0] > 0 else Float32(0))


# ---- backward ----------------------------------------------------------------------------------------

def attention_backward_delta(task: Int, args: Args):
    """δ = dO·o per (token, head): a0 = delta [N,Hq], a1 = dO, a2 = o; n3 = D."""
    var D = args.n3
    f32_at(args.a0).unsafe_store(task, dot(f32_at(args.a1 + task * D * 4), f32_at(args.a2 + task * D * 4), D))


@always_inline
def fold_sums_gpu[D: Int](acc: SIMD[DType.float32, D]) -> SIMD[DType.float32, D]:
    var total = acc
    comptime for step in range(5):
        total = total + shuffle_down_lanes[D](total, 16 >> step)
    return total


@always_inline
def fold_sums_cpu[D: Int](mut acc: Array[SIMD[DType.float32, D], WARP]) -> SIMD[DType.float32, D]:
    comptime for step in range(5):
        comptime offset = 16 >> step
        for lane in range(offset):
            acc[lane] = acc[lane] + acc[lane + offset]
    return acc[0]


# dq, per (query token, head): a0 = dq, a1 = dO, a2 = q, a3 = k, a4 = v, a5 = spans, a6 = lse, a7 = delta

@always_inline
def dq_term(args: Args, task: Int, score: Float32, dp: Float32) -> Float32:
    """ds = p·(dp − δ) with p = e^(s − L)."""
    var p = numerics.exp(score * args.x0 - f32_at(args.a6).unsafe_load(task))
    return p * (dp - f32_at(args.a7).unsafe_load(task))


def dq_gpu[D: Int](task: Int, lane: Int, args: Args):
    var Hq = args.n1
    var Hkv = args.n2
    var kv = (task % Hq) * Hkv // Hq
    var q = f32_at(args.a2 + task * D * 4).unsafe_load[width=D, alignment=16](0)
    var d_out = f32_at(args.a1 + task * D * 4).unsafe_load[width=D, alignment=16](0)
    var keys = query_keys(args.a5, task // Hq, args.x1 != 0)
    var acc = SIMD[DType.float32, D](0)
    var j = keys[0] + lane
    while j < keys[1]:
        var k = f32_at(args.a3 + (j * Hkv + kv) * D * 4)
        var ds = dq_term(args, task, dot_with_row[D](q, k), dot_with_row[D](d_out, f32_at(args.a4 + (j * Hkv + kv) * D * 4)))
        acc = SIMD[DType.float32, D](ds).fma(k.unsafe_load[width=D, alignment=16](0), acc)
        j += WARP
    acc = fold_sums_gpu[D](acc)
    if lane == 0:
        f32_at(args.a0 + task * D * 4).unsafe_store[width=D, alignment=16](0, acc * args.x0)


def dq_cpu[D: Int](task: Int, args: Args):
    var Hq = args.n1
    var Hkv = args.n2
    var kv = (task % Hq) * Hkv // Hq
    var q = f32_at(args.a2 + task * D * 4)
    var d_out = f32_at(args.a1 + task * D * 4)
    var keys = query_keys(args.a5, task // Hq, args.x1 != 0)
    var acc = Array[SIMD[DType.float32, D], WARP](fill=SIMD[DType.float32, D](0))
    var base = keys[0]
    while base < keys[1]:
        var count = min(CPU_KEYS, keys[1] - base)
        var k_rows = SIMD[DType.int64, CPU_KEYS](0)
        var v_rows = SIMD[DType.int64, CPU_KEYS](0)
        for i in range(count):
            k_rows[i] = Int64(args.a3 + ((base + i) * Hkv + kv) * D * 4)
            v_rows[i] = Int64(args.a4 + ((base + i) * Hkv + kv) * D * 4)
        var scores = dot_of_rows[D](k_rows, q, count)
        var dps = dot_of_rows[D](v_rows, d_out, count)
        for i in range(count):
            var lane = (base + i - keys[0]) % WARP
            var ds = dq_term(args, task, scores[i], dps[i])
            acc[lane] = SIMD[DType.float32, D](ds).fma(f32_at(Int(k_rows[i])).unsafe_load[width=D, alignment=16](0), acc[lane])
        base += CPU_KEYS
    f32_at(args.a0 + task * D * 4).unsafe_store[width=D, alignment=16](0, fold_sums_cpu[D](acc) * args.x0)


# dk and dv, per (key token, kv head), over the (head of the group, query) pairs e = head·nq + query:
# dv: a0 = dv, a1 = dO, a2 = q, a3 = k, a4 = lse, a5 = spans
# dk: a0 = dk, a1 = dO, a2 = q, a3 = k, a4 = v, a5 = lse, a6 = delta, a7 = spans

@always_inline
def pair_row(args: Args, task: Int, e: Int, first: Int, count: Int) -> Int:
    """The (query token, head) row of pair e of key task's (head, query) pairs."""
    var group = args.n1 // args.n2
    var kv = task % args.n2
    return (first + e % count) * args.n1 + kv * group + e // count


@always_inline
def kv_pairs(args: Args, task: Int, spans: Int) -> Tuple[Int, Int, Int]:
    """(first query, queries, pairs) of key task."""
    var queries = key_queries(spans, task // args.n2, args.x1 != 0)
    var count = queries[1] - queries[0]
    return (queries[0], count, count * (args.n1 // args.n2))


@always_inline
def dk_term(args: Args, row: Int, score: Float32, dp: Float32) -> Float32:
    var p = numerics.exp(score * args.x0 - f32_at(args.a5).unsafe_load(row))
    return p * (dp - f32_at(args.a6).unsafe_load(row))


def dv_gpu[D: Int](task: Int, lane: Int, args: Args):
    var k = f32_at(args.a3 + task * D * 4).unsafe_load[width=D, alignment=16](0)
    var pairs = kv_pairs(args, task, args.a5)
    var acc = SIMD[DType.float32, D](0)
    var e = lane
    while e < pairs[2]:
        var row = pair_row(args, task, e, pairs[0], pairs[1])
        var p = numerics.exp(dot_with_row[D](k, f32_at(args.a2 + row * D * 4)) * args.x0 - f32_at(args.a4).unsafe_load(row))
        acc = SIMD[DType.float32, D](p).fma(f32_at(args.a1 + row * D * 4).unsafe_load[width=D, alignment=16](0), acc)
        e += WARP
    acc = fold_sums_gpu[D](acc)
    if lane == 0:
        f32_at(args.a0 + task * D * 4).unsafe_store[width=D, alignment=16](0, acc)


def dv_cpu[D: Int](task: Int, args: Args):
    var k = f32_at(args.a3 + task * D * 4)
    var pairs = kv_pairs(args, task, args.a5)
    var acc = Array[SIMD[DType.float32, D], WARP](fill=SIMD[DType.float32, D](0))
    var base = 0
    while base < pairs[2]:
        var count = min(CPU_KEYS, pairs[2] - base)
        var q_rows = SIMD[DType.int64, CPU_KEYS](0)
        for i in range(count):
            q_rows[i] = Int64(args.a2 + pair_row(args, task, base + i, pairs[0], pairs[1]) * D * 4)
        var scores = dot_of_rows[D](q_rows, k, count)
        for i in range(count):
            var row = pair_row(args, task, base + i, pairs[0], pairs[1])
            var p = numerics.exp(scores[i] * args.x0 - f32_at(args.a4).unsafe_load(row))
            var lane = (base + i) % WARP
            acc[lane] = SIMD[DType.float32, D](p).fma(f32_at(args.a1 + row * D * 4).unsafe_load[width=D, alignment=16](0), acc[lane])
        base += CPU_KEYS
    f32_at(args.a0 + task * D * 4).unsafe_store[width=D, alignment=16](0, fold_sums_cpu[D](acc))


def dk_gpu[D: Int](task: Int, lane: Int, args: Args):
    var k = f32_at(args.a3 + task * D * 4).unsafe_load[width=D, alignment=16](0)
    var v = f32_at(args.a4 + task * D * 4).unsafe_load[width=D, alignment=16](0)
    var pairs = kv_pairs(args, task, args.a7)
    var acc = SIMD[DType.float32, D](0)
    var e = lane
    while e < pairs[2]:
        var row = pair_row(args, task, e, pairs[0], pairs[1])
        var q = f32_at(args.a2 + row * D * 4)
        var ds = dk_term(args, row, dot_with_row[D](k, q), dot_with_row[D](v, f32_at(args.a1 + row * D * 4)))
        acc = SIMD[DType.float32, D](ds).fma(q.unsafe_load[width=D, alignment=16](0), acc)
        e += WARP
    acc = fold_sums_gpu[D](acc)
    if lane == 0:
        f32_at(args.a0 + task * D * 4).unsafe_store[width=D, alignment=16](0, acc * args.x0)


def dk_cpu[D: Int](task: Int, args: Args):
    var k = f32_at(args.a3 + task * D * 4)
    var v = f32_at(args.a4 + task * D * 4)
    var pairs = kv_pairs(args, task, args.a7)
    var acc = Array[SIMD[DType.float32, D], WARP](fill=SIMD[DType.float32, D](0))
    var base = 0
    while base < pairs[2]:
        var count = min(CPU_KEYS, pairs[2] - base)
        var q_rows = SIMD[DType.int64, CPU_KEYS](0)
        var o_rows = SIMD[DType.int64, CPU_KEYS](0)
        for i in range(count):
            var row = pair_row(args, task, base + i, pairs[0], pairs[1])
            q_rows[i] = Int64(args.a2 + row * D * 4)
            o_rows[i] = Int64(args.a1 + row * D * 4)
        var scores = dot_of_rows[D](q_rows, k, count)
        var dps = dot_of_rows[D](o_rows, v, count)
        for i in range(count):
            var row = pair_row(args, task, base + i, pairs[0], pairs[1])
            var ds = dk_term(args, row, scores[i], dps[i])
            var lane = (base + i) % WARP
            acc[lane] = SIMD[DType.float32, D](ds).fma(f32_at(Int(q_rows[i])).unsafe_load[width=D, alignment=16](0), acc[lane])
        base += CPU_KEYS
    f32_at(args.a0 + task * D * 4).unsafe_store[width=D, alignment=16](0, fold_sums_cpu[D](acc) * args.x0)


# ---- Python entry points: pick the kernels compiled for the head dimension --------------------------

def by_head_dim[
    gpu_body: def[D: Int](Int, Int, Args) thin -> None, cpu_body: def[D: Int](Int, Args) thin -> None
](device: PythonObject, n: PythonObject, addresses: PythonObject, sizes: PythonObject, scalars: PythonObject) raises -> PythonObject:
    var D = Int(py=sizes[3])
    comptime for i in range(len(HEAD_DIMS)):
        comptime head_dim = HEAD_DIMS[i]
        if D == head_dim:
            return launch_warps[gpu_body[head_dim], cpu_body[head_dim]](device, n, addresses, sizes, scalars)
    raise Error("attention: head_dim ", D, " is not compiled; use one of 8, 16, 32, 64, 128")


def attention_forward(device: PythonObject, n: PythonObject, addresses: PythonObject, sizes: PythonObject, scalars: PythonObject) raises -> PythonObject:
    return by_head_dim[forward_gpu, forward_cpu](device, n, addresses, sizes, scalars)


def attention_backward_dq(device: PythonObject, n: PythonObject, addresses: PythonObject, sizes: PythonObject, scalars: PythonObject) raises -> PythonObject:
    return by_head_dim[dq_gpu, dq_cpu](device, n, addresses, sizes, scalars)


def attention_backward_dv(device: PythonObject, n: PythonObject, addresses: PythonObject, sizes: PythonObject, scalars: PythonObject) raises -> PythonObject:
    return by_head_dim[dv_gpu, dv_cpu](device, n, addresses, sizes, scalars)


def attention_backward_dk(device: PythonObject, n: PythonObject, addresses: PythonObject, sizes: PythonObject, scalars: PythonObject) raises -> PythonObject:
    return by_head_dim[dk_gpu, dk_cpu](device, n, addresses, sizes, scalars)
