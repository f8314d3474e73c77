"""Attention in fast mode: bf16 tensor cores with fp32 accumulation, forward and backward, on NVIDIA GPUs only.

The same operands, masks and results as attention.mojo (one interface, ATTENTION, read through `Attention`):
rows of q [N, Hq·D], k and v [N, Hkv·D]; query head h reads key/value head h·Hkv/Hq; token t lies in the span
[begin_t, end_t) of `spans`; query i sees the keys [begin_i, hi_i), hi_i = end_i or min(end_i, i + 1) when causal.

    s_ij = (q_i·k_j)·scale      p_ij = e^(s_ij − L_i)      L_i = log Σ_j e^(s_ij)      o_i = Σ_j p_ij v_j
    backward, with δ_i = dO_i·o_i:   dp_ij = dO_i·v_j      ds_ij = p_ij (dp_ij − δ_i)
    dq_i = scale Σ_j ds_ij k_j      dk_j = scale Σ_(h,i) ds_ij q_i      dv_j = Σ_(h,i) p_ij dO_i

Numerics. q, k, v and dO are read as fp32 and rounded to bf16 (nearest even) as they are staged into shared
memory; every product above is a bf16 `mma.sync` m16n8k16 accumulating in fp32 (the tensor core's own order of
summation inside one instruction). p and ds are rounded to bf16 as the left operand of their products. The
softmax runs in fp32 in base 2 with the hardware exp2: s·scale·log2(e), a running maximum m and sum l per query
(FA2's online softmax over blocks of 64 keys), o = o/l, and L = (m + log2 l)·ln 2 in natural log, as the
identical kernels write it (o = 0 and L = 0 for a query that sees no key); the backward recomputes
p = exp2(s·scale·log2(e) − L·log2(e)). δ is the identical kernel's fp32 chain (attention_backward_delta's one fma
chain over d ascending), taken on 16-byte loads (attention_backward_delta_fast; on a GPU a warp's rows staged
together, attention_backward_delta_warp): the same bits. So
results differ from the identical mode's by bf16 rounding (relative error at most 2⁻⁹ per operand).

Determinism. No atomics: dk and dv are summed by the task that owns a tile of keys, over the heads of its group
ascending, then the blocks of queries ascending; dq by the task that owns a tile of queries, over the blocks of
keys ascending. Each fp32 accumulator takes its mma results in that fixed order, so two runs on the same GPU
model give the same bits. The CPU has no fast kernels: there the wrappers run the identical ones.

Work. A task is a tile of 128 tokens (queries: forward and dq; keys: dk and dv) × one head (one kv head for dk
and dv), computed by a block of 8 warps, each warp owning a strip of 16 rows of the tile (held as mma operands in
registers). The block walks the tokens of the other side that any row of its tile pairs with, in blocks of 64
from the lowest, stages each block into shared memory, and each warp computes only the blocks its own rows reach:
in a row of packed segments a tile touches only its segments' blocks. Inside a block, pairs outside the mask get
p = 0 (forward: s = −∞). (Measured on the H200 at the encoder's shape: 8 warps a block beat 4, 1.4× forward.)

Fragments follow PTX's m16n8k16 layout: lane = 4g + c holds rows g and g + 8 of a 16 × 8 accumulator at columns
2c and 2c + 1; an accumulator of 16 × 64 scores is eight such tiles, and two neighbouring tiles are exactly the
A operand of the next product (so p never goes through shared memory). Operands are staged as lines of one
token's D dims (padded by 8 bf16 so that ldmatrix's eight rows fall in distinct banks) and loaded by ldmatrix,
transposed where the token is the contraction index (p·v, ds·q, ds·k, p·dO).
"""

from std.bit import count_trailing_zeros
from std.collections import Array
from std.math import exp2, log2
from std.memory import stack_allocation
from max.gpu import barrier, thread_idx
from max.gpu.compute.mma import ld_matrix, mma
from max.gpu.memory import AddressSpace
from max.gpu.primitives.warp import shuffle_xor
from engine.device import F32Ptr
from engine.launch import Args, DevicePtr, launch_gpu_teams, launch_index
from engine.reduction import fma_dot
from engine.target import HAS_ACCELERATOR
from engine import numerics
from kernels.attention import Attention

comptime HEAD_DIMS = (16, 32, 64, 128)  # head dimensions with fast kernels (exported to Python)
comptime WARPS = 8  # warps of a block, each a strip of 16 rows of the tile
comptime STRIP = 16  # rows of a warp's strip
comptime TILE = STRIP * WARPS  # tokens of a task's tile (exported to Python)
comptime BLOCK = 64  # tokens of a block of the other side, staged at once
comptime TEAM = 32 * WARPS  # threads of a block
comptime COLUMN_TILES = BLOCK // 8  # 8-column accumulator tiles across a block
# Registers a thread may take, for D ≤ 64 (D = 128 takes all 255): they set how many blocks share a multiprocessor
# (blocks_per_sm). Forward and dq: 128, two blocks. dk/dv holds two more strips of outputs: 168 leaves room for one
# block only, so the compiler may take 255 (it did: measured on the H200, 2026-11-29).
comptime FORWARD_REGISTERS = 128
comptime DKDV_REGISTERS = 168
comptime DQ_REGISTERS = 128
comptime LOG2E = Float32(1.4426950408889634)
comptime LN2 = Float32(0.6931471805599453)
comptime NEG_INF = -numerics.INF

comptime Accumulator = SIMD[DType.float32, 4]  # a lane's share of a 16 × 8 fp32 tile: (g, 2c), (g, 2c+1),
# (g+8, 2c), (g+8, 2c+1)
comptime Operand = SIMD[DType.bfloat16, 8]  # a lane's share of a 16 × 16 A operand, or of two 16 × 8 B operands
comptime Scores = Array[Accumulator, COLUMN_TILES]  # a strip's 16 rows × a block's 64 tokens
comptime Outputs[D: Int] = Array[Accumulator, D // 8]  # a strip's 16 rows × D dims
comptime Strip[D: Int] = Array[Operand, D // 16]  # a strip's 16 rows × D dims as A operands, one per 16 dims
comptime Panel = Pointer[BFloat16, MutUntrackedOrigin, address_space=AddressSpace.SHARED]
comptime Row2 = SIMD[DType.int32, 2]  # a value for each of a lane's two rows, g and g + 8


@always_inline
def line_of[D: Int]() -> Int:
    """bf16 of one staged token's line: D dims and 8 of padding (16 bytes), so that ldmatrix's 8 lines fall in
    distinct banks."""
    return D + 8


@always_inline
def new_panel[D: Int]() -> Panel:
    """A block's 64 lines in shared memory."""
    return stack_allocation[BLOCK * line_of[D](), BFloat16, alignment=16, address_space=AddressSpace.SHARED]()


def blocks_per_sm[D: Int](registers: Int) -> Int:
    """Blocks meant to share a multiprocessor (the launch's hint to the compiler), so that a thread keeps within
    `registers` (for D ≤ 64; 255 for D = 128)."""
    return max(1, 65536 // (TEAM * (registers if D <= 64 else 255)))


struct Lane(ImplicitlyCopyable, Movable):
    """Where a thread sits: its warp (strip), and in the warp its fragment row g and column pair c."""

    var tid: Int
    var lane: Int
    var warp: Int
    var g: Int
    var c: Int

    @always_inline
    def __init__(out self):
        self.tid = Int(thread_idx.x)
        self.lane = self.tid % 32
        self.warp = self.tid // 32
        self.g = self.lane // 4
        self.c = self.lane % 4


# ---- staging and fragments ---------------------------------------------------------------------------------

@always_inline
def stage[D: Int](panel: Panel, source: F32Ptr, stride: Int, offset: Int, first: Int, tokens: Int, tid: Int):
    """panel line t = bf16 of source[(first + t)·stride + offset …] (D dims) for the 64 tokens from first; tokens at
    or past `tokens` stage as 0. The block's threads convert 4 consecutive dims each, a line after another."""
    comptime QUADS = D // 4
    comptime for step in range(BLOCK * QUADS // TEAM):
        var item = tid + TEAM * step
        var t = item // QUADS
        var quad = item % QUADS
        var value = SIMD[DType.float32, 4](0)
        if first + t < tokens:
            value = source.unsafe_load[width=4, alignment=16]((first + t) * stride + offset + 4 * quad)
        panel.unsafe_store[width=4, alignment=8](t * line_of[D]() + 4 * quad, value.cast[DType.bfloat16]())


@always_inline
def tile_strip[D: Int](
    first: Panel, second: Panel, source: F32Ptr, stride: Int, offset: Int, start: Int, tokens: Int, me: Lane
) -> Strip[D]:
    """The lane's A operands of its warp's strip of the tile's rows from source (rows: tokens, columns: dims),
    staged through the two block panels (lines 0–63 of the tile in `first`, 64–127 in `second`), which are free
    again on return."""
    comptime for half in range(TILE // BLOCK):
        stage[D](first if half == 0 else second, source, stride, offset, start + BLOCK * half, tokens, me.tid)
    barrier()
    var panel = first if STRIP * me.warp < BLOCK else second
    var strip = Strip[D](fill=Operand(0))
    var line = (STRIP * me.warp) % BLOCK + me.lane % 8 + 8 * ((me.lane // 8) % 2)
    comptime for k in range(D // 16):
        strip[k] = ld_matrix[8](panel.unsafe_offset(line * line_of[D]() + 16 * k + 8 * (me.lane // 16)))
    barrier()
    return strip^


@always_inline
def token_operands[D: Int](panel: Panel, n: Int, k: Int, me: Lane) -> Operand:
    """B operands of the panel's tokens 8n … 8n + 15 (columns of two 8-column tiles) over dims 16k … 16k + 15:
    the first four values for tokens 8n …, the last four for tokens 8n + 8 …."""
    var line = 8 * n + me.lane % 8 + 8 * (me.lane // 16)
    return ld_matrix[8](panel.unsafe_offset(line * line_of[D]() + 16 * k + 8 * ((me.lane // 8) % 2)))


@always_inline
def dim_operands[D: Int](panel: Panel, k: Int, n: Int, me: Lane) -> Operand:
    """B operands of the panel's tokens 16k … 16k + 15 as the contraction index and dims 8n … 8n + 15 as columns
    (transposed): the first four values for dims 8n …, the last four for dims 8n + 8 …."""
    var line = 16 * k + me.lane % 16
    return ld_matrix[8, transpose=True](panel.unsafe_offset(line * line_of[D]() + 8 * n + 8 * (me.lane // 16)))


@always_inline
def scores[D: Int](strip: Strip[D], panel: Panel, me: Lane) -> Scores:
    """The strip's rows · the panel's 64 tokens over D dims: 16 × 64 fp32 (zero-started mma over dims ascending)."""
    var s = Scores(fill=Accumulator(0))
    comptime for n in range(0, COLUMN_TILES, 2):
        comptime for k in range(D // 16):
            var b = token_operands[D](panel, n, k, me)
            mma(s[n], strip[k], b.slice[4, offset=0](), s[n])
            mma(s[n + 1], strip[k], b.slice[4, offset=4](), s[n + 1])
    return s^


@always_inline
def accumulate[D: Int](mut acc: Outputs[D], weights: Scores, panel: Panel, me: Lane):
    """acc += weights (16 × 64, rounded to bf16) · the panel's 64 tokens (D dims), tokens ascending by 16."""
    comptime for k in range(BLOCK // 16):
        var a = weights[2 * k].join(weights[2 * k + 1]).cast[DType.bfloat16]()
        comptime for n in range(0, D // 8, 2):
            var b = dim_operands[D](panel, k, n, me)
            mma(acc[n], a, b.slice[4, offset=0](), acc[n])
            mma(acc[n + 1], a, b.slice[4, offset=4](), acc[n + 1])


@always_inline
def store_strip[D: Int](
    acc: Outputs[D], factor: SIMD[DType.float32, 2], destination: F32Ptr, stride: Int, offset: Int, row: Int,
    tokens: Int, me: Lane,
):
    """Rows `row` (the lane's g) and row + 8 of a strip's outputs, times factor[0] and factor[1], to
    destination[token·stride + offset + d] (rows at or past `tokens` are not written)."""
    comptime for r in range(2):
        var token = row + 8 * r
        if token < tokens:
            comptime for n in range(D // 8):
                var pair = SIMD[DType.float32, 2](acc[n][2 * r], acc[n][2 * r + 1]) * factor[r]
                destination.unsafe_store[width=2, alignment=8](token * stride + offset + 8 * n + 2 * me.c, pair)


# ---- masks ----------------------------------------------------------------------------------------------------

@always_inline
def reach[keys: Bool](at: Attention, first: Int, count: Int) -> Tuple[Int, Int]:
    """[low, high): the union of the tokens rows first … first + count − 1 pair with, their keys (rows are queries,
    `keys`) or their queries (rows are keys); empty (low ≥ high) when none does."""
    var low = at.tokens
    var high = 0
    for row in range(first, min(first + count, at.tokens)):
        var pairs = at.keys_of(row) if keys else at.queries_of(row)
        if pairs[0] < pairs[1]:
            low = min(low, pairs[0])
            high = max(high, pairs[1])
    return (low, high)


@always_inline
def lane_reach[keys: Bool](at: Attention, row: Int) -> Tuple[Row2, Row2]:
    """(low, high) of the tokens the lane's rows `row` and row + 8 pair with (empty past the last token)."""
    var low = Row2(0)
    var high = Row2(0)
    comptime for r in range(2):
        if row + 8 * r < at.tokens:
            var pairs = at.keys_of(row + 8 * r) if keys else at.queries_of(row + 8 * r)
            low[r] = Int32(pairs[0])
            high[r] = Int32(pairs[1])
    return (low, high)


@always_inline
def column_of(base: Int, n: Int, e: Int, me: Lane) -> Int:
    """The token of column 2c + e of accumulator tile n in the block from base."""
    return base + 8 * n + 2 * me.c + e


@always_inline
def inside(low: Row2, high: Row2, r: Int, token: Int) -> Bool:
    return Int(low[r]) <= token and token < Int(high[r])


@always_inline
def overlaps(span: Tuple[Int, Int], base: Int) -> Bool:
    """Whether [span) meets the block [base, base + BLOCK)."""
    return max(span[0], base) < min(span[1], base + BLOCK)


@always_inline
def quad_max(x: Float32) -> Float32:
    """The maximum over the 4 lanes that share a fragment row."""
    var y = max(x, shuffle_xor(x, 1))
    return max(y, shuffle_xor(y, 2))


@always_inline
def quad_sum(x: Float32) -> Float32:
    """The sum over the 4 lanes that share a fragment row (lane pairs first, then the two pairs)."""
    var y = x + shuffle_xor(x, 1)
    return y + shuffle_xor(y, 2)


# ---- forward: o and lse per (query tile, head) -------------------------------------------------------------

def attention_forward_fast[D: Int](task: Int, args: Args):
    """Task (query tile, head): o and lse of its 128 queries, an online softmax over blocks of 64 keys."""
    var at = Attention(args)
    var me = Lane()
    var start = (task // at.heads) * TILE
    var head = task % at.heads
    var kv = head * at.kv_heads // at.heads
    var q_stride = at.heads * D
    var kv_stride = at.kv_heads * D
    var keys = new_panel[D]()
    var values = new_panel[D]()
    var q = tile_strip[D](keys, values, at.q, q_stride, head * D, start, at.tokens, me)
    var row = start + STRIP * me.warp + me.g
    var lane_keys = lane_reach[True](at, row)
    var warp_keys = reach[True](at, start + STRIP * me.warp, STRIP)
    var tile_keys = reach[True](at, start, TILE)
    var scale2 = at.scale * LOG2E
    var m = SIMD[DType.float32, 2](NEG_INF)  # running maxima of scale·s·log2(e), per lane row
    var l = SIMD[DType.float32, 2](0)  # running sums of the lane's own columns
    var o = Outputs[D](fill=Accumulator(0))
    var base = tile_keys[0]
    while base < tile_keys[1]:
        stage[D](keys, at.k, kv_stride, kv * D, base, at.tokens, me.tid)
        stage[D](values, at.v, kv_stride, kv * D, base, at.tokens, me.tid)
        barrier()
        if overlaps(warp_keys, base):
            var s = scores[D](q, keys, me)
            comptime for r in range(2):
                var block_max = NEG_INF
                comptime for n in range(COLUMN_TILES):
                    comptime for e in range(2):
                        var x = s[n][2 * r + e] * scale2
                        if not inside(lane_keys[0], lane_keys[1], r, column_of(base, n, e, me)):
                            x = NEG_INF
                        s[n][2 * r + e] = x
                        block_max = max(block_max, x)
                var m_new = max(m[r], quad_max(block_max))
                var pivot = m_new if m_new != NEG_INF else Float32(0)  # a row with no key yet: every p is 0
                var rescale = exp2(m[r] - pivot)
                var total = Float32(0)
                comptime for n in range(COLUMN_TILES):
                    comptime for e in range(2):
                        var p = exp2(s[n][2 * r + e] - pivot)
                        s[n][2 * r + e] = p
                        total += p
                l[r] = l[r] * rescale + total
                m[r] = m_new
                comptime for n in range(D // 8):
                    o[n][2 * r] *= rescale
                    o[n][2 * r + 1] *= rescale
            accumulate[D](o, s, values, me)
        barrier()
        base += BLOCK
    var factor = SIMD[DType.float32, 2](0)
    comptime for r in range(2):
        l[r] = quad_sum(l[r])
        factor[r] = 1 / l[r] if l[r] != 0 else Float32(0)
    var o_stride = at.heads * D
    store_strip[D](o, factor, at.o, o_stride, head * D, row, at.tokens, me)
    if me.c == 0:
        comptime for r in range(2):
            if row + 8 * r < at.tokens:
                var lse = (m[r] + log2(l[r])) * LN2 if l[r] != 0 else Float32(0)
                at.lse.unsafe_store((row + 8 * r) * at.heads + head, lse)


# ---- backward (after attention_backward_delta_fast) ------------------------------------------------------------

comptime DELTA_CHUNK = 16  # values of a row loaded at once (4 loads of 16 bytes per operand); divides every HEAD_DIMS


def attention_backward_delta_fast(task: Int, args: Args):
    """δ = dO·o per (token, head), an index kernel: attention.attention_backward_delta's chain, fma over d ascending
    from +0, on rows loaded DELTA_CHUNK values at a time (rows start on 16 bytes: the wrappers check the operands'
    alignment, and D is a multiple of 16), so the loads of a chunk are in flight together."""
    var at = Attention(args)
    var D = at.head_dim
    at.delta.unsafe_store(task, fma_dot[DELTA_CHUNK](at.d_out.unsafe_offset(task * D), at.o.unsafe_offset(task * D), D))


comptime DELTA_TASKS = 32  # tasks (rows of dO and o) a GPU block of one warp takes: a contiguous stretch of each
comptime DELTA_LINE = 128 + 4  # floats of a staged row, up to D = 128: 16 bytes of padding keep a quarter-warp's
# 16-byte reads of 8 rows in distinct banks
comptime DELTA_LOADS = 8  # 16-byte loads of each operand a thread keeps in flight while staging
comptime DELTA_BLOCKS_PER_SM = 6  # one-warp blocks a multiprocessor: their staged rows (33.8 KB each) fit its shared
# memory


def attention_backward_delta_warp[D: Int](block: Int, args: Args):
    """attention_backward_delta_fast for the DELTA_TASKS consecutive tasks of a one-warp block on a GPU. Their rows
    of dO and o lie side by side, so the warp stages them in shared memory with 16-byte loads that cover each
    operand's stretch contiguously (thread by thread, a row's own loads hit 32 rows 4·D bytes apart), then thread
    t runs task t's chain over its row: the same fma chain over d ascending from +0, so the same bits."""
    var at = Attention(args)
    var dims = at.head_dim
    var first = block * DELTA_TASKS
    var count = min(DELTA_TASKS, at.tokens * at.heads - first)
    var lane = Int(thread_idx.x)
    var line = dims + 4
    var dims_log2 = Int(count_trailing_zeros(dims))  # every head dimension is a power of two (HEAD_DIMS)
    var a = stack_allocation[DELTA_TASKS * DELTA_LINE, Float32, alignment=16, address_space=AddressSpace.SHARED]()
    var b = stack_allocation[DELTA_TASKS * DELTA_LINE, Float32, alignment=16, address_space=AddressSpace.SHARED]()
    var quads = count * dims // 4  # 16-byte pieces of each operand's stretch
    var d_out = at.d_out.unsafe_offset(first * dims)
    var o = at.o.unsafe_offset(first * dims)
    for batch in range(0, quads, DELTA_TASKS * DELTA_LOADS):
        comptime for u in range(DELTA_LOADS):
            var q = batch + DELTA_TASKS * u + lane
            if q < quads:
                var row = (4 * q) >> dims_log2
                var at_line = row * line + 4 * q - row * dims
                a.unsafe_store[width=4, alignment=16](at_line, d_out.unsafe_load[width=4, alignment=16](4 * q))
                b.unsafe_store[width=4, alignment=16](at_line, o.unsafe_load[width=4, alignment=16](4 * q))
    barrier()
    if lane < count:
        var row = lane * line
        at.delta.unsafe_store(first + lane, fma_dot[4](a.unsafe_offset(row), b.unsafe_offset(row), dims))


def launch_backward_delta(dev: DevicePtr, n: Int, args: Args) raises:
    """δ over its n = tokens·heads tasks: on a GPU a warp DELTA_TASKS of them (attention_backward_delta_warp), on
    the CPU a call each (attention_backward_delta_fast). The same chain either way."""
    if dev[].is_gpu():
        comptime if HAS_ACCELERATOR:
            launch_gpu_teams[1, DELTA_TASKS, DELTA_BLOCKS_PER_SM, attention_backward_delta_warp](
                dev, (n + DELTA_TASKS - 1) // DELTA_TASKS, args
            )
    else:
        launch_index[attention_backward_delta_fast](dev, n, args)


@always_inline
def pair_gradients(s: Float32, dp: Float32, lse2: Float32, delta: Float32, scale2: Float32) -> Tuple[Float32, Float32]:
    """(p, ds) of one pair from its score s, dp = dO·v, the query's L·log2(e) and δ."""
    var p = exp2(s * scale2 - lse2)
    return (p, p * (dp - delta))


def attention_backward_dkdv_fast[D: Int](task: Int, args: Args):
    """Task (key tile, kv head): dk and dv of its 128 keys, over the heads of the group, then the blocks of
    queries; rows are keys, columns queries."""
    var at = Attention(args)
    var me = Lane()
    var start = (task // at.kv_heads) * TILE
    var kv = task % at.kv_heads
    var group = at.heads // at.kv_heads
    var q_stride = at.heads * D
    var kv_stride = at.kv_heads * D
    var queries = new_panel[D]()
    var gradients = new_panel[D]()  # dO of the block's queries
    var block_lse2 = stack_allocation[BLOCK, Float32, address_space=AddressSpace.SHARED]()
    var block_delta = stack_allocation[BLOCK, Float32, address_space=AddressSpace.SHARED]()
    var k = tile_strip[D](queries, gradients, at.k, kv_stride, kv * D, start, at.tokens, me)
    var v = tile_strip[D](queries, gradients, at.v, kv_stride, kv * D, start, at.tokens, me)
    var row = start + STRIP * me.warp + me.g
    var lane_queries = lane_reach[False](at, row)
    var warp_queries = reach[False](at, start + STRIP * me.warp, STRIP)
    var tile_queries = reach[False](at, start, TILE)
    var scale2 = at.scale * LOG2E
    var dk = Outputs[D](fill=Accumulator(0))
    var dv = Outputs[D](fill=Accumulator(0))
    for member in range(group):
        var head = kv * group + member
        var base = tile_queries[0]
        while base < tile_queries[1]:
            stage[D](queries, at.q, q_stride, head * D, base, at.tokens, me.tid)
            stage[D](gradients, at.d_out, q_stride, head * D, base, at.tokens, me.tid)
            if me.tid < BLOCK:
                var i = base + me.tid
                var lse2 = Float32(0)
                var delta = Float32(0)
                if i < at.tokens:
                    lse2 = at.lse.unsafe_load(i * at.heads + head) * LOG2E
                    delta = at.delta.unsafe_load(i * at.heads + head)
                block_lse2.unsafe_store(me.tid, lse2)
                block_delta.unsafe_store(me.tid, delta)
            barrier()
            if overlaps(warp_queries, base):
                var s = scores[D](k, queries, me)
                var dp = scores[D](v, gradients, me)
                comptime for n in range(COLUMN_TILES):
                    comptime for e in range(2):
                        var i = column_of(base, n, e, me)
                        var lse2 = block_lse2.unsafe_load(i - base)
                        var delta = block_delta.unsafe_load(i - base)
                        comptime for r in range(2):
                            var pair = (Float32(0), Float32(0))
                            if inside(lane_queries[0], lane_queries[1], r, i):
                                pair = pair_gradients(s[n][2 * r + e], dp[n][2 * r + e], lse2, delta, scale2)
                            s[n][2 * r + e] = pair[0]
                            dp[n][2 * r + e] = pair[1]
                accumulate[D](dv, s, gradients, me)
                accumulate[D](dk, dp, queries, me)
            barrier()
            base += BLOCK
    store_strip[D](dv, SIMD[DType.float32, 2](1), at.dv, kv_stride, kv * D, row, at.tokens, me)
    store_strip[D](dk, SIMD[DType.float32, 2](at.scale), at.dk, kv_stride, kv * D, row, at.tokens, me)


def attention_backward_dq_fast[D: Int](task: Int, args: Args):
    """Task (query tile, head): dq of its 128 queries, over the blocks of keys; rows are queries, columns keys."""
    var at = Attention(args)
    var me = Lane()
    var start = (task // at.heads) * TILE
    var head = task % at.heads
    var kv = head * at.kv_heads // at.heads
    var q_stride = at.heads * D
    var kv_stride = at.kv_heads * D
    var keys = new_panel[D]()
    var values = new_panel[D]()
    var q = tile_strip[D](keys, values, at.q, q_stride, head * D, start, at.tokens, me)
    var d_out = tile_strip[D](keys, values, at.d_out, q_stride, head * D, start, at.tokens, me)
    var row = start + STRIP * me.warp + me.g
    var lane_keys = lane_reach[True](at, row)
    var warp_keys = reach[True](at, start + STRIP * me.warp, STRIP)
    var tile_keys = reach[True](at, start, TILE)
    var scale2 = at.scale * LOG2E
    var lse2 = SIMD[DType.float32, 2](0)
    var delta = SIMD[DType.float32, 2](0)
    comptime for r in range(2):
        if row + 8 * r < at.tokens:
            lse2[r] = at.lse.unsafe_load((row + 8 * r) * at.heads + head) * LOG2E
            delta[r] = at.delta.unsafe_load((row + 8 * r) * at.heads + head)
    var dq = Outputs[D](fill=Accumulator(0))
    var base = tile_keys[0]
    while base < tile_keys[1]:
        stage[D](keys, at.k, kv_stride, kv * D, base, at.tokens, me.tid)
        stage[D](values, at.v, kv_stride, kv * D, base, at.tokens, me.tid)
        barrier()
        if overlaps(warp_keys, base):
            var s = scores[D](q, keys, me)
            var dp = scores[D](d_out, values, me)
            comptime for n in range(COLUMN_TILES):
                comptime for e in range(2):
                    var j = column_of(base, n, e, me)
                    comptime for r in range(2):
                        var ds = Float32(0)
                        if inside(lane_keys[0], lane_keys[1], r, j):
                            ds = pair_gradients(s[n][2 * r + e], dp[n][2 * r + e], lse2[r], delta[r], scale2)[1]
                        dp[n][2 * r + e] = ds
            accumulate[D](dq, dp, keys, me)
        barrier()
        base += BLOCK
    store_strip[D](dq, SIMD[DType.float32, 2](at.scale), at.dq, q_stride, head * D, row, at.tokens, me)
