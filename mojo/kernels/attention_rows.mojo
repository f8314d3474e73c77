"""Attention by rows: the identical attention of kernels/attention.mojo (same operands, same math, same canonical
order, so the same bits) for launches too small to fill a GPU with 256-thread teams (the byte LM's 64 tokens of
4 heads are 4 teams on 132 multiprocessors, a team's phases a chain of barriers and staged loads).

    forward, row (query i, head h):  o_i and L_i      backward, row (key j, kv head g): dk_j and dv_j,
                                                      or row (query i, head h): dq_i

A row kernel (`launch_rows`): on a GPU a warp takes a row, thread `lane` playing the lane; on the CPU one call
takes the row. The order is attention.mojo's:

- A score is fma_dot over d (one fma chain from +0) times the scale; dp = dO·v and δ = dO·o likewise (δ is
  computed where it is used, so the backward is one launch: its rows are the keys' (dk, dv) rows, then the
  queries' dq rows).
- The forward walks query i's keys [b, e) in blocks of TILE = 64 from b. A block's 64 slots (keys outside
  [b, e) are −∞ scores, so +0 weights) are spread over the warp as lane t holding slots t and t + 32; the block's
  maximum (exact, order-free but for the sign of a zero, which no result tells apart) and Σp come from the
  warp's shuffles, Σp folded by halves as attention.mojo folds it: lane t's slot t + slot t+32, then +16, +8, +4,
  +2, +1 (the CPU: `fold_lanes` over the same 32 pairs). Then c = exp(m − m'), l = l·c + Σp, o = o·c, and one
  fma per key of the block, ascending, each lane its own output columns (d = lane + 32·c), every lane reading
  the key's weight from the lane that holds its slot.
- The backward's chains: dv_j = Σ p·dO_i and dk_j = Σ ds·q_i over (head of the group ascending, query
  ascending), dq_i = Σ ds·k_j over keys ascending; each pair's p and ds computed by the lane that holds its
  slot (a chunk of 64 queries or keys at a time), the chains walked by every lane over its own columns, a row a
  step (on the H200 the backward's launch took 11.7 µs so, and 16–17.6 µs with its rows loaded ahead as the
  forward's `chain` loads them).

A block or chunk a row does not pair with is not visited: attention.mojo's team visits it when another row of
the team needs it, and for this row it changes nothing (m' = m, c = 1, no weight, no fma; with an infinite
score, whose row is NaN already, only a NaN's payload could differ, which is outside the contract).

kernels.attention_forward and attention_backward pick the form: by rows on a GPU for launches of fewer than
ROWS_MAX_TEAMS teams; the CPU runs the teams (whose products it vectorises across threads) unless
UFORM_ATTENTION = rows forces these.
"""

from std.collections import Array
from max.gpu.primitives.warp import shuffle_down, shuffle_idx
from engine.device import F32Ptr
from engine.launch import Args
from engine.reduction import LANES, fold_lanes, fma_dot
from engine import numerics
from kernels.attention import HEAD_DIMS, TILE, Attention

comptime ROWS_MAX_TEAMS = 132  # a GPU launch of fewer attention teams runs by rows (exported; speed only)


@always_inline
def slot_count[warp: Bool]() -> Int:
    """Slots of a 64-slot block one caller holds: 2 a lane in a warp (t and t + 32), all 64 on the CPU."""
    return TILE // LANES if warp else TILE


@always_inline
def slot_of[warp: Bool](u: Int, lane: Int) -> Int:
    """The block's slot of a caller's u-th value."""
    return lane + LANES * u if warp else u


@always_inline
def column_count[D: Int, warp: Bool]() -> Int:
    """Output columns one caller holds: d = lane + 32·c in a warp (lanes ≥ D idle when D < 32), all D on the CPU."""
    return max(D // LANES, 1) if warp else D


@always_inline
def load_columns[D: Int, warp: Bool](row: F32Ptr, lane: Int) -> SIMD[DType.float32, column_count[D, warp]()]:
    """The caller's columns of a row of D floats (0 for a lane past D)."""
    comptime C = column_count[D, warp]()
    comptime if warp:
        var x = SIMD[DType.float32, C](0)
        comptime for c in range(C):
            if lane + LANES * c < D:
                x[c] = row.unsafe_load(lane + LANES * c)
        return x
    else:
        return rebind[SIMD[DType.float32, C]](row.unsafe_load[width=D](0))


@always_inline
def store_columns[D: Int, warp: Bool](row: F32Ptr, x: SIMD[DType.float32, column_count[D, warp]()], lane: Int):
    comptime C = column_count[D, warp]()
    comptime if warp:
        comptime for c in range(C):
            if lane + LANES * c < D:
                row.unsafe_store(lane + LANES * c, x[c])
    else:
        row.unsafe_store(0, rebind[SIMD[DType.float32, D]](x))


@always_inline
def slot_value[warp: Bool, S: Int](x: SIMD[DType.float32, S], slot: Int) -> Float32:
    """A slot's value, read by every lane: a shuffle from the lane that holds it (every lane must call it)."""
    comptime if warp:
        return shuffle_idx(x[slot // LANES], UInt32(slot % LANES))
    else:
        return x[slot]


@always_inline
def block_max[warp: Bool, S: Int](s: SIMD[DType.float32, S]) -> Float32:
    """The largest of the block's 64 slots (a NaN never compares greater), every lane getting lane 0's answer."""
    var m = -numerics.INF
    for u in range(S):
        m = s[u] if s[u] > m else m
    comptime if warp:
        comptime for level in range(5):
            var other = shuffle_down(m, UInt32(16 >> level))
            m = other if other > m else m
        return shuffle_idx(m, 0)
    else:
        return m


@always_inline
def block_sum[warp: Bool, S: Int](p: SIMD[DType.float32, S]) -> Float32:
    """Σ of the block's 64 slots folded by halves (slot t + slot t+32, then +16, +8, +4, +2, +1)."""
    comptime if warp:
        var v = p[0] + p[1]
        comptime for level in range(5):
            v = v + shuffle_down(v, UInt32(16 >> level))
        return shuffle_idx(v, 0)
    else:
        return fold_lanes(
            rebind[SIMD[DType.float32, LANES]](p.slice[LANES, offset=0]() + p.slice[LANES, offset=LANES]())
        )


@always_inline
def ahead[D: Int, warp: Bool]() -> Int:
    """Rows a chain loads at once: 32 values a lane (32 rows of one column each for D ≤ 32), or 8 rows on the CPU."""
    return LANES // column_count[D, warp]() if warp else 8


@always_inline
def chain[D: Int, warp: Bool, S: Int](
    mut acc: SIMD[DType.float32, column_count[D, warp]()], weights: SIMD[DType.float32, S], first: F32Ptr,
    stride: Int, count: Int, lane: Int,
):
    """acc = fma(w_t, x_t, acc) for t in [0, count) ascending: w_t the weights' slot t, x_t the caller's columns of
    the row at first + t·stride. The rows are loaded `ahead` at a time, their loads issued together before the
    fmas: the forward's launch at the byte LM's 32-token spans took 10 µs with a row a step, 4.8 µs so."""
    comptime Columns = SIMD[DType.float32, column_count[D, warp]()]
    comptime AHEAD = ahead[D, warp]()
    var t0 = 0
    while t0 < count:
        var rows = Array[Columns, AHEAD](fill=Columns(0))
        comptime for r in range(AHEAD):
            if t0 + r < count:
                rows[r] = load_columns[D, warp](first.unsafe_offset((t0 + r) * stride), lane)
        comptime for r in range(AHEAD):
            if t0 + r < count:
                acc = Columns(slot_value[warp](weights, t0 + r)).fma(rows[r], acc)
        t0 += AHEAD


@always_inline
def forward_row[D: Int, warp: Bool](row: Int, lane: Int, at: Attention):
    """Query i = row / heads of head h = row % heads: o_i and L_i."""
    comptime S = slot_count[warp]()
    comptime Slots = SIMD[DType.float32, S]
    var i = row // at.heads
    var h = row % at.heads
    var kv = h * at.kv_heads // at.heads
    var q = at.q.unsafe_offset(row * D)
    var keys = at.keys_of(i)
    var m = -numerics.INF
    var l = Float32(0)
    var acc = SIMD[DType.float32, column_count[D, warp]()](0)
    var base = keys[0]
    while base < keys[1]:
        var end = min(base + TILE, keys[1])
        var s = Slots(-numerics.INF)
        for u in range(S):
            var j = base + slot_of[warp](u, lane)
            if j < end:
                s[u] = fma_dot(q, at.k.unsafe_offset((j * at.kv_heads + kv) * D), D) * at.scale
        var m_block = block_max[warp](s)
        var m_new = m_block if m_block > m else m
        var c = numerics.exp(m - m_new) if m_new != -numerics.INF else Float32(1)
        m = m_new
        var p = s.eq(-numerics.INF).select(Slots(0), numerics.exp(s - m_new))
        l = l * c + block_sum[warp](p)
        acc = acc * c
        chain[D, warp](acc, p, at.v.unsafe_offset((base * at.kv_heads + kv) * D), at.kv_heads * D, end - base, lane)
        base += TILE
    var o = acc / l if l != 0 else SIMD[DType.float32, column_count[D, warp]()](0)
    store_columns[D, warp](at.o.unsafe_offset(row * D), o, lane)
    if lane == 0:
        # l = 0: the query sees no key; a NaN l (a non-finite score) propagates
        at.lse.unsafe_store(row, m + numerics.log(l) if l != 0 else Float32(0))


@always_inline
def keys_row[D: Int, warp: Bool](row: Int, lane: Int, at: Attention):
    """Key j = row / kv_heads of kv head g = row % kv_heads: dk_j and dv_j, over the group's heads, then the
    queries that see j, 64 at a time."""
    comptime S = slot_count[warp]()
    comptime Slots = SIMD[DType.float32, S]
    comptime Columns = SIMD[DType.float32, column_count[D, warp]()]
    var j = row // at.kv_heads
    var g = row % at.kv_heads
    var group = at.heads // at.kv_heads
    var k = at.k.unsafe_offset(row * D)
    var v = at.v.unsafe_offset(row * D)
    var queries = at.queries_of(j)
    var dk = Columns(0)
    var dv = Columns(0)
    for member in range(group):
        var h = g * group + member
        var base = queries[0]
        while base < queries[1]:
            var end = min(base + TILE, queries[1])
            var s = Slots(0)
            var dp = Slots(0)
            var lse = Slots(0)
            var delta = Slots(0)
            for u in range(S):
                var i = base + slot_of[warp](u, lane)
                if i < end:
                    var task_row = i * at.heads + h
                    var d_out = at.d_out.unsafe_offset(task_row * D)
                    s[u] = fma_dot(k, at.q.unsafe_offset(task_row * D), D)
                    dp[u] = fma_dot(v, d_out, D)
                    delta[u] = fma_dot(d_out, at.o.unsafe_offset(task_row * D), D)
                    lse[u] = at.lse.unsafe_load(task_row)
            var p = numerics.exp(s * at.scale - lse)
            var ds = p * (dp - delta)
            for i in range(base, end):  # a row a step: faster here than `chain` (module doc)
                var task_row = i * at.heads + h
                var d_out = load_columns[D, warp](at.d_out.unsafe_offset(task_row * D), lane)
                var q = load_columns[D, warp](at.q.unsafe_offset(task_row * D), lane)
                dv = Columns(slot_value[warp](p, i - base)).fma(d_out, dv)
                dk = Columns(slot_value[warp](ds, i - base)).fma(q, dk)
            base += TILE
    store_columns[D, warp](at.dv.unsafe_offset(row * D), dv, lane)
    store_columns[D, warp](at.dk.unsafe_offset(row * D), dk * at.scale, lane)


@always_inline
def queries_row[D: Int, warp: Bool](row: Int, lane: Int, at: Attention):
    """Query i = row / heads of head h = row % heads: dq_i, over its keys, 64 at a time."""
    comptime S = slot_count[warp]()
    comptime Slots = SIMD[DType.float32, S]
    comptime Columns = SIMD[DType.float32, column_count[D, warp]()]
    var i = row // at.heads
    var h = row % at.heads
    var kv = h * at.kv_heads // at.heads
    var q = at.q.unsafe_offset(row * D)
    var d_out = at.d_out.unsafe_offset(row * D)
    var lse = at.lse.unsafe_load(row)
    var delta = fma_dot(d_out, at.o.unsafe_offset(row * D), D)
    var keys = at.keys_of(i)
    var dq = Columns(0)
    var base = keys[0]
    while base < keys[1]:
        var end = min(base + TILE, keys[1])
        var s = Slots(0)
        var dp = Slots(0)
        for u in range(S):
            var j = base + slot_of[warp](u, lane)
            if j < end:
                var kv_row = j * at.kv_heads + kv
                s[u] = fma_dot(q, at.k.unsafe_offset(kv_row * D), D)
                dp[u] = fma_dot(d_out, at.v.unsafe_offset(kv_row * D), D)
        var ds = numerics.exp(s * at.scale - lse) * (dp - delta)
        for j in range(base, end):  # a row a step: faster here than `chain` (module doc)
            var k = load_columns[D, warp](at.k.unsafe_offset((j * at.kv_heads + kv) * D), lane)
            dq = Columns(slot_value[warp](ds, j - base)).fma(k, dq)
        base += TILE
    store_columns[D, warp](at.dq.unsafe_offset(row * D), dq * at.scale, lane)


def attention_forward_rows[warp: Bool](row: Int, lane: Int, args: Args):
    """A row per (query, head): rows [0, tokens·heads)."""
    var at = Attention(args)
    comptime for i in range(len(HEAD_DIMS)):
        comptime D = HEAD_DIMS[i]
        if at.head_dim == D:
            forward_row[D, warp](row, lane, at)


def attention_backward_rows[warp: Bool](row: Int, lane: Int, args: Args):
    """The whole backward in one launch: rows [0, tokens·kv_heads) are the keys' (dk, dv), then tokens·heads rows
    the queries' dq."""
    var at = Attention(args)
    var key_rows = at.tokens * at.kv_heads
    comptime for i in range(len(HEAD_DIMS)):
        comptime D = HEAD_DIMS[i]
        if at.head_dim == D:
            if row < key_rows:
                keys_row[D, warp](row, lane, at)
            else:
                queries_row[D, warp](row - key_rows, lane, at)
