"""Scaled dot-product attention with masks, forward and backward, one body per (token, head).

Tokens are rows of q [N, Hq·D], k and v [N, Hkv·D], N = B·T, the sequences of T
tokens laid one after another. Query head h reads key/value head h·Hkv/Hq
(grouped-query attention). Query i may see key j when both lie in one sequence,
j ≤ i if causal, and both carry the same segment id if segments are given
(block-diagonal attention of packed segments); a token of segment < 0 is
padding: it sees nothing and its output is 0.

    s_j = (q·k_j)·scale      p_j = e^(s_j − L)      L = m + log Σ e^(s_j − m)
    o = Σ_j p_j v_j
    backward, with δ = dO·o:  dp_j = dO·v_j   ds_j = p_j (dp_j − δ)
    dq = scale Σ_j ds_j k_j   dk_j = scale Σ_(h,i) ds_ij q_i   dv_j = Σ_(h,i) p_ij dO_i

Order: every dot product is an fma chain over d; every Σ over keys (or, for
dk/dv, over heads of the group then queries) runs in ascending index order.
Operands: n0 = T, n1 = Hq, n2 = Hkv, n3 = D (≤ 128), x0 = scale, x1 = 1 if causal.
"""

from std.collections import Array
from std.math import fma
from engine.device import F32Ptr, f32_at, i32_at
from engine.launch import Args
from engine import numerics

comptime MAX_HEAD_DIM = 128


@always_inline
def dot(a: F32Ptr, b: F32Ptr, D: Int) -> Float32:
    var acc = Float32(0)
    for d in range(D):
        acc = fma(a.unsafe_load(d), b.unsafe_load(d), acc)
    return acc


@always_inline
def segment_of(segments: Int, token: Int) -> Int:
    return 0 if segments == 0 else Int(i32_at(segments).unsafe_load(token))


@always_inline
def key_range(token: Int, T: Int, causal: Bool) -> Tuple[Int, Int]:
    """The keys [first, end) of the query's sequence that the causal mask leaves."""
    var first = (token // T) * T
    return (first, token + 1 if causal else first + T)


def attention_forward(task: Int, args: Args):
    """a0 = o [N,Hq·D], a1 = lse [N,Hq], a2 = q, a3 = k, a4 = v, a5 = segments int32 [N] or 0."""
    var T = args.n0
    var Hq = args.n1
    var Hkv = args.n2
    var D = args.n3
    var token = task // Hq
    var h = task % Hq
    var kv = h * Hkv // Hq
    var q = f32_at(args.a2 + (token * Hq + h) * D * 4)
    var o = f32_at(args.a0 + (token * Hq + h) * D * 4)
    var segment = segment_of(args.a5, token)
    var keys = key_range(token, T, args.x1 != 0)
    var acc = Array[Float32, MAX_HEAD_DIM](fill=0)
    var m = -numerics.INF
    if segment >= 0:
        for j in range(keys[0], keys[1]):
            if segment_of(args.a5, j) == segment:
                var s = dot(q, f32_at(args.a3 + (j * Hkv + kv) * D * 4), D) * args.x0
                m = s if s > m else m
    var total = Float32(0)
    if m > -numerics.INF:
        for j in range(keys[0], keys[1]):
            if segment_of(args.a5, j) == segment:
                var p = numerics.exp(dot(q, f32_at(args.a3 + (j * Hkv + kv) * D * 4), D) * args.x0 - m)
                total += p
                var v = f32_at(args.a4 + (j * Hkv + kv) * D * 4)
                for d in range(D):
                    acc[d] = fma(p, v.unsafe_load(d), acc[d])
    for d in range(D):
        o.unsafe_store(d, acc[d] / total if total > 0 else Float32(0))
    f32_at(args.a1).unsafe_store(task, m + numerics.log(total) if total > 0 else Float32(0))


def attention_backward_delta(task: Int, args: Args):
    """δ = dO·o per (token, head): a0 = delta [N,Hq], a1 = dO, a2 = o; n1 = Hq, n3 = D."""
    var D = args.n3
    f32_at(args.a0).unsafe_store(task, dot(f32_at(args.a1 + task * D * 4), f32_at(args.a2 + task * D * 4), D))


def attention_backward_dq(task: Int, args: Args):
    """a0 = dq, a1 = dO, a2 = q, a3 = k, a4 = v, a5 = segments, a6 = lse, a7 = delta."""
    var T = args.n0
    var Hq = args.n1
    var Hkv = args.n2
    var D = args.n3
    var token = task // Hq
    var h = task % Hq
    var kv = h * Hkv // Hq
    var q = f32_at(args.a2 + task * D * 4)
    var d_out = f32_at(args.a1 + task * D * 4)
    var lse = f32_at(args.a6).unsafe_load(task)
    var delta = f32_at(args.a7).unsafe_load(task)
    var segment = segment_of(args.a5, token)
    var keys = key_range(token, T, args.x1 != 0)
    var acc = Array[Float32, MAX_HEAD_DIM](fill=0)
    if segment >= 0:
        for j in range(keys[0], keys[1]):
            if segment_of(args.a5, j) == segment:
                var k = f32_at(args.a3 + (j * Hkv + kv) * D * 4)
                var p = numerics.exp(dot(q, k, D) * args.x0 - lse)
                var ds = p * (dot(d_out, f32_at(args.a4 + (j * Hkv + kv) * D * 4), D) - delta)
                for d in range(D):
                    acc[d] = fma(ds, k.unsafe_load(d), acc[d])
    var dq = f32_at(args.a0 + task * D * 4)
    for d in range(D):
        dq.unsafe_store(d, acc[d] * args.x0)


@always_inline
def for_each_query_of_key[Visit: def(Int, Int) -> None](visit: Visit, key_token: Int, kv: Int, args: Args, segments: Int):
    """visit(query_token, head) for every query of the kv group that sees this key, in canonical order."""
    var T = args.n0
    var Hq = args.n1
    var Hkv = args.n2
    var segment = segment_of(segments, key_token)
    if segment < 0:
        return
    var group = Hq // Hkv
    var end = (key_token // T) * T + T
    for h in range(kv * group, kv * group + group):
        for i in range(key_token if args.x1 != 0 else (key_token // T) * T, end):
            if segment_of(segments, i) == segment:
                visit(i, h)


def attention_backward_dv(task: Int, args: Args):
    """Per (key token, kv head): a0 = dv [N,Hkv·D], a1 = dO, a2 = q, a3 = k, a4 = lse, a5 = segments."""
    var Hq = args.n1
    var Hkv = args.n2
    var D = args.n3
    var key_token = task // Hkv
    var kv = task % Hkv
    var k = f32_at(args.a3 + task * D * 4)
    var acc = Array[Float32, MAX_HEAD_DIM](fill=0)

    def visit(i: Int, h: Int) {mut acc, imm args, imm k, imm Hq, imm D}:
        var row = i * Hq + h
        var p = numerics.exp(dot(f32_at(args.a2 + row * D * 4), k, D) * args.x0 - f32_at(args.a4).unsafe_load(row))
        var d_out = f32_at(args.a1 + row * D * 4)
        for d in range(D):
            acc[d] = fma(p, d_out.unsafe_load(d), acc[d])

    for_each_query_of_key(visit, key_token, kv, args, args.a5)
    var dv = f32_at(args.a0 + task * D * 4)
    for d in range(D):
        dv.unsafe_store(d, acc[d])


def attention_backward_dk(task: Int, args: Args):
    """Per (key token, kv head): a0 = dk, a1 = dO, a2 = q, a3 = k, a4 = v, a5 = lse, a6 = delta, a7 = segments."""
    var Hq = args.n1
    var Hkv = args.n2
    var D = args.n3
    var key_token = task // Hkv
    var kv = task % Hkv
    var k = f32_at(args.a3 + task * D * 4)
    var v = f32_at(args.a4 + task * D * 4)
    var acc = Array[Float32, MAX_HEAD_DIM](fill=0)

    def visit(i: Int, h: Int) {mut acc, imm args, imm k, imm v, imm Hq, imm D}:
        var row = i * Hq + h
        var q = f32_at(args.a2 + row * D * 4)
        var p = numerics.exp(dot(q, k, D) * args.x0 - f32_at(args.a5).unsafe_load(row))
        var ds = p * (dot(f32_at(args.a1 + row * D * 4), v, D) - f32_at(args.a6).unsafe_load(row))
        for d in range(D):
            acc[d] = fma(ds, q.unsafe_load(d), acc[d])

    for_each_query_of_key(visit, key_token, kv, args, args.a7)
    var dk = f32_at(args.a0 + task * D * 4)
    for d in range(D):
        dk.unsafe_store(d, acc[d] * args.x0)
