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
halves (lane l takes lane l+16, then l+8, +4, +2, +1). Each kernel is one body over the lanes a
call plays, a compile-time parameter: on a GPU a thread plays its own lane of a warp (`played` = 1)
and the folds are shuffles; on the CPU one call plays all 32 (`played` = 32), computing 8 lanes' dot
products at once in SIMD. Both round the same operations in the same order.
Every attention kernel reads the one interface ATTENTION, by the names of `Attention`.
"""

from std.collections import Array
from std.math import fma
from max.gpu.primitives.warp import shuffle_down
from engine.device import F32Ptr, I32Ptr
from engine.launch import Args, Interface, WARP
from engine import numerics

comptime HEAD_DIMS = (8, 16, 32, 64, 128)  # compiled head dimensions (exported to Python)
comptime CPU_KEYS = 8  # keys whose dot products one CPU SIMD pass computes

comptime ATTENTION = Interface("o lse q k v spans d_out delta dq dk dv", "heads kv_heads head_dim causal", "scale")


struct Attention(ImplicitlyCopyable, Movable):
    """The operands of the attention kernels, by name. Rows: q, o, d_out, dq [N, Hq·D]; k, v, dk, dv
    [N, Hkv·D]; lse and delta [N, Hq]; spans int32 [N, 2]. The forward reads o, lse, q, k, v, spans;
    the backward also d_out, delta and the gradient it writes."""

    var o: F32Ptr
    var lse: F32Ptr
    var q: F32Ptr
    var k: F32Ptr
    var v: F32Ptr
    var spans: I32Ptr
    var d_out: F32Ptr
    var delta: F32Ptr
    var dq: F32Ptr
    var dk: F32Ptr
    var dv: F32Ptr
    var heads: Int
    var kv_heads: Int
    var head_dim: Int
    var causal: Bool
    var scale: Float32

    @always_inline
    def __init__(out self, args: Args):
        self.o = args.f32(0)
        self.lse = args.f32(1)
        self.q = args.f32(2)
        self.k = args.f32(3)
        self.v = args.f32(4)
        self.spans = args.i32(5)
        self.d_out = args.f32(6)
        self.delta = args.f32(7)
        self.dq = args.f32(8)
        self.dk = args.f32(9)
        self.dv = args.f32(10)
        self.heads = args.size(0)
        self.kv_heads = args.size(1)
        self.head_dim = args.size(2)
        self.causal = args.flag(3)
        self.scale = args.scalar(0)

    @always_inline
    def kv_head(self, task: Int) -> Int:
        """The key/value head that (token, query head) task reads."""
        return (task % self.heads) * self.kv_heads // self.heads

    @always_inline
    def kv_row(self, token: Int, kv: Int) -> Int:
        """The row of k (or v) holding a token's vector of head kv."""
        return token * self.kv_heads + kv

    @always_inline
    def query_keys(self, token: Int) -> Tuple[Int, Int]:
        """The keys [begin, end) query token sees."""
        var begin = Int(self.spans.unsafe_load(2 * token))
        var end = Int(self.spans.unsafe_load(2 * token + 1))
        return (begin, min(end, token + 1) if self.causal else end)

    @always_inline
    def key_pairs(self, task: Int) -> KeyPairs:
        """The (head, query) pairs that see (key token, kv head) task."""
        var token = task // self.kv_heads
        var begin = Int(self.spans.unsafe_load(2 * token))
        var end = Int(self.spans.unsafe_load(2 * token + 1))
        var first = max(begin, token) if self.causal and begin < end else begin
        var group = self.heads // self.kv_heads
        return KeyPairs(first, end - first, (end - first) * group, (task % self.kv_heads) * group)

    @always_inline
    def pair_row(self, pairs: KeyPairs, e: Int) -> Int:
        """The (query token, head) row of pair e = head_in_group·queries + query (32-bit division: a
        64-bit one is a long software routine on a GPU)."""
        var query = UInt32(e) % UInt32(pairs.queries)
        var head = UInt32(e) // UInt32(pairs.queries)
        return (pairs.first + Int(query)) * self.heads + pairs.first_head + Int(head)


@fieldwise_init
struct KeyPairs(ImplicitlyCopyable, Movable):
    """The pairs of one key: its first query, how many queries, pairs (queries × heads of the group),
    and the first query head of its group."""

    var first: Int
    var queries: Int
    var count: Int
    var first_head: Int


# ---- shared arithmetic -------------------------------------------------------------------------------

@always_inline
def load_row[D: Int](row: F32Ptr) -> SIMD[DType.float32, D]:
    return row.unsafe_load[width=D, alignment=16](0)


@always_inline
def dot(a: F32Ptr, b: F32Ptr, D: Int) -> Float32:
    var acc = Float32(0)
    for d in range(D):
        acc = fma(a.unsafe_load(d), b.unsafe_load(d), acc)
    return acc


@always_inline
def dots[D: Int, G: Int](a: SIMD[DType.float32, D], base: F32Ptr, rows: SIMD[DType.int64, G], count: Int) -> SIMD[DType.float32, G]:
    """a·row for the `count` (≤ G) rows `rows` of base (rows of D), each one fma chain over d.
    One row (a GPU lane): the row read 16 bytes at a time; several (the CPU): G chains side by side in SIMD."""
    comptime if G == 1:
        var row = base.unsafe_offset(Int(rows[0]) * D)
        var acc = Float32(0)
        comptime for c in range(D // 4):
            var chunk = row.unsafe_load[width=4, alignment=16](4 * c)
            comptime for i in range(4):
                acc = fma(a[4 * c + i], chunk[i], acc)
        return SIMD[DType.float32, G](acc)
    else:
        var acc = SIMD[DType.float32, G](0)
        for d in range(D):
            var column = SIMD[DType.float32, G](0)
            comptime for i in range(G):
                if i < count:
                    column[i] = base.unsafe_load(Int(rows[i]) * D + d)
            acc = column.fma(SIMD[DType.float32, G](a[d]), acc)
        return acc


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
def shuffle_down_lanes[D: Int](v: SIMD[DType.float32, D], offset: Int) -> SIMD[DType.float32, D]:
    """The vector of lane + offset (a warp shuffles one 32-bit value at a time)."""
    var out = SIMD[DType.float32, D](0)
    comptime for i in range(D):
        out[i] = shuffle_down(v[i], UInt32(offset))
    return out


# ---- the lanes: terms dealt in turn, then folded by halves ------------------------------------------

@always_inline
def group_width[played: Int]() -> Int:
    """How many lanes' dot products one pass computes: 1 on a GPU thread, CPU_KEYS on the CPU."""
    return 1 if played == 1 else CPU_KEYS


@always_inline
def fold_softmax[D: Int, played: Int](
    mut m: Array[Float32, played], mut l: Array[Float32, played], mut acc: Array[SIMD[DType.float32, D], played]
):
    """Merge the lanes' (max, Σ, output) states by halves into lane 0."""
    comptime for step in range(5):
        comptime offset = 16 >> step
        comptime if played == 1:
            var scales = merge_scales(m[0], shuffle_down(m[0], UInt32(offset)))
            var l_other = shuffle_down(l[0], UInt32(offset))
            var acc_other = shuffle_down_lanes[D](acc[0], offset)
            l[0] = l[0] * scales[1] + l_other * scales[2]
            acc[0] = acc_other.fma(SIMD[DType.float32, D](scales[2]), acc[0] * scales[1])
            m[0] = scales[0]
        else:
            for lane in range(offset):
                var scales = merge_scales(m[lane], m[lane + offset])
                l[lane] = l[lane] * scales[1] + l[lane + offset] * scales[2]
                acc[lane] = acc[lane + offset].fma(SIMD[DType.float32, D](scales[2]), acc[lane] * scales[1])
                m[lane] = scales[0]


@always_inline
def fold_sums[D: Int, played: Int](mut acc: Array[SIMD[DType.float32, D], played]) -> SIMD[DType.float32, D]:
    """Σ of the lanes' partial sums, folded by halves (lane 0 holds it)."""
    comptime for step in range(5):
        comptime offset = 16 >> step
        comptime if played == 1:
            acc[0] = acc[0] + shuffle_down_lanes[D](acc[0], offset)
        else:
            for lane in range(offset):
                acc[lane] = acc[lane] + acc[lane + offset]
    return acc[0]


# ---- forward: o and lse per (query token, head) ------------------------------------------------------

def attention_forward[D: Int, played: Int](task: Int, lane: Int, args: Args):
    var at = Attention(args)
    comptime G = group_width[played]()
    var kv = at.kv_head(task)
    var q = load_row[D](at.q.unsafe_offset(task * D))
    var keys = at.query_keys(task // at.heads)
    var m = Array[Float32, played](fill=-numerics.INF)
    var l = Array[Float32, played](fill=0)
    var acc = Array[SIMD[DType.float32, D], played](fill=SIMD[DType.float32, D](0))
    var round = keys[0]
    while round < keys[1]:
        comptime for g in range(played // G):
            var first = round + lane + g * G
            var count = min(G, keys[1] - first)
            if count > 0:
                var rows = SIMD[DType.int64, G](0)
                comptime for i in range(G):
                    if i < count:
                        rows[i] = Int64(at.kv_row(first + i, kv))
                var scores = dots[D, G](q, at.k, rows, count)
                comptime for i in range(G):
                    if i < count:
                        var slot = g * G + i
                        var m_lane = m[slot]
                        var l_lane = l[slot]
                        var cp = online_step(m_lane, l_lane, scores[i] * at.scale)
                        m[slot] = m_lane
                        l[slot] = l_lane
                        acc[slot] = SIMD[DType.float32, D](cp[1]).fma(
                            load_row[D](at.v.unsafe_offset(Int(rows[i]) * D)), acc[slot] * cp[0])
        round += WARP
    fold_softmax[D, played](m, l, acc)
    if lane == 0:
        var o = at.o.unsafe_offset(task * D)
        if l[0] > 0:
            o.unsafe_store[width=D, alignment=16](0, acc[0] / l[0])
        else:
            o.unsafe_store[width=D, alignment=16](0, SIMD[DType.float32, D](0))
        at.lse.unsafe_store(task, m[0] + numerics.log(l[0]) if l[0] > 0 else Float32(0))


# ---- backward -----------------------------------------------------------------------------------------

def attention_backward_delta(task: Int, args: Args):
    """δ = dO·o per (token, head)."""
    var at = Attention(args)
    var D = at.head_dim
    at.delta.unsafe_store(task, dot(at.d_out.unsafe_offset(task * D), at.o.unsafe_offset(task * D), D))


def attention_backward_dq[D: Int, played: Int](task: Int, lane: Int, args: Args):
    """dq per (query token, head): scale·Σ_j ds_j k_j over the keys it sees."""
    var at = Attention(args)
    comptime G = group_width[played]()
    var kv = at.kv_head(task)
    var q = load_row[D](at.q.unsafe_offset(task * D))
    var d_out = load_row[D](at.d_out.unsafe_offset(task * D))
    var lse = at.lse.unsafe_load(task)
    var delta = at.delta.unsafe_load(task)
    var keys = at.query_keys(task // at.heads)
    var acc = Array[SIMD[DType.float32, D], played](fill=SIMD[DType.float32, D](0))
    var round = keys[0]
    while round < keys[1]:
        comptime for g in range(played // G):
            var first = round + lane + g * G
            var count = min(G, keys[1] - first)
            if count > 0:
                var rows = SIMD[DType.int64, G](0)
                comptime for i in range(G):
                    if i < count:
                        rows[i] = Int64(at.kv_row(first + i, kv))
                var scores = dots[D, G](q, at.k, rows, count)
                var dps = dots[D, G](d_out, at.v, rows, count)
                comptime for i in range(G):
                    if i < count:
                        var ds = numerics.exp(scores[i] * at.scale - lse) * (dps[i] - delta)
                        acc[g * G + i] = SIMD[DType.float32, D](ds).fma(
                            load_row[D](at.k.unsafe_offset(Int(rows[i]) * D)), acc[g * G + i])
        round += WARP
    var total = fold_sums[D, played](acc)
    if lane == 0:
        at.dq.unsafe_offset(task * D).unsafe_store[width=D, alignment=16](0, total * at.scale)


def attention_backward_dv[D: Int, played: Int](task: Int, lane: Int, args: Args):
    """dv per (key token, kv head): Σ over the (head, query) pairs that see it of p·dO."""
    var at = Attention(args)
    comptime G = group_width[played]()
    var k = load_row[D](at.k.unsafe_offset(task * D))
    var pairs = at.key_pairs(task)
    var acc = Array[SIMD[DType.float32, D], played](fill=SIMD[DType.float32, D](0))
    var round = 0
    while round < pairs.count:
        comptime for g in range(played // G):
            var first = round + lane + g * G
            var count = min(G, pairs.count - first)
            if count > 0:
                var rows = SIMD[DType.int64, G](0)
                comptime for i in range(G):
                    if i < count:
                        rows[i] = Int64(at.pair_row(pairs, first + i))
                var scores = dots[D, G](k, at.q, rows, count)
                comptime for i in range(G):
                    if i < count:
                        var row = Int(rows[i])
                        var p = numerics.exp(scores[i] * at.scale - at.lse.unsafe_load(row))
                        acc[g * G + i] = SIMD[DType.float32, D](p).fma(
                            load_row[D](at.d_out.unsafe_offset(row * D)), acc[g * G + i])
        round += WARP
    var total = fold_sums[D, played](acc)
    if lane == 0:
        at.dv.unsafe_offset(task * D).unsafe_store[width=D, alignment=16](0, total)


def attention_backward_dk[D: Int, played: Int](task: Int, lane: Int, args: Args):
    """dk per (key token, kv head): scale·Σ over the (head, query) pairs that see it of ds·q."""
    var at = Attention(args)
    comptime G = group_width[played]()
    var k = load_row[D](at.k.unsafe_offset(task * D))
    var v = load_row[D](at.v.unsafe_offset(task * D))
    var pairs = at.key_pairs(task)
    var acc = Array[SIMD[DType.float32, D], played](fill=SIMD[DType.float32, D](0))
    var round = 0
    while round < pairs.count:
        comptime for g in range(played // G):
            var first = round + lane + g * G
            var count = min(G, pairs.count - first)
            if count > 0:
                var rows = SIMD[DType.int64, G](0)
                comptime for i in range(G):
                    if i < count:
                        rows[i] = Int64(at.pair_row(pairs, first + i))
                var scores = dots[D, G](k, at.q, rows, count)
                var dps = dots[D, G](v, at.d_out, rows, count)
                comptime for i in range(G):
                    if i < count:
                        var row = Int(rows[i])
                        var ds = numerics.exp(scores[i] * at.scale - at.lse.unsafe_load(row)) * (
                            dps[i] - at.delta.unsafe_load(row))
                        acc[g * G + i] = SIMD[DType.float32, D](ds).fma(
                            load_row[D](at.q.unsafe_offset(row * D)), acc[g * G + i])
        round += WARP
    var total = fold_sums[D, played](acc)
    if lane == 0:
        at.dk.unsafe_offset(task * D).unsafe_store[width=D, alignment=16](0, total * at.scale)
