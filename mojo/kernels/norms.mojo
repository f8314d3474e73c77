"""Row kernels: RMSNorm, softmax and column sums (one body per row or column; cross-entropy is in cross_entropy.mojo).

RMSNorm over a row x of width W with gain w (x = the residual sum x + residual, when one is given):
    r = 1/√(Σx²/W + ε)            y = x·r·w
    backward, with ĝ = dy·w:      dx = r·(ĝ − x·r²·Σ(ĝ·x)/W)      dw = Σ_rows dy·x·r
Softmax over a row:
    y = e^(x−max)/Σe^(x−max)      dx = y·(dy − Σ dy·y)
Every Σ here is `canonical_reduce`: 32 strided lanes folded by halves. RMSNorm is a row
kernel (`launch_rows`): on a GPU a warp takes a row, thread l playing lane l of the canonical sum and writing the
columns l, l+32, …; on the CPU one call takes the row, in `row_reduce`'s one order. On a GPU the forward's
warp holds a row of up to 32·LANE_VALUES values in registers (load_lane_row: lane l the columns l, l+32, …), so
all its loads are issued before the sum and the row is read once; its sum is the same (normed_lane_row).
Column sums (gradients of gains and biases) run in two stages with a fixed
chunk of rows, so their order is fixed too: Σ over chunks of Σ inside a chunk.
"""

from std.memory import stack_allocation
from max.gpu import barrier, thread_idx
from max.gpu.memory import AddressSpace
from max.gpu.primitives.warp import shuffle_down, shuffle_idx
from engine.device import F32Ptr
from engine.launch import Args, DevicePtr, Interface, launch_elements, launch_gpu_teams
from engine.target import HAS_ACCELERATOR
from engine.reduction import (
    LANES, canonical_reduce, canonical_reduce_lanes, fold_halves, row_max, row_reduce, row_stride,
)
from engine import numerics

comptime COLUMN_CHUNK = 256  # rows per partial sum of the column sums (exported to Python)
comptime LANE_VALUES = 32  # values of a row a lane holds in registers: rows up to 1024 wide
comptime LaneRow = SIMD[DType.float32, LANE_VALUES]


@always_inline
def warp_total(partial: Float32) -> Float32:
    """The lanes' partial sums folded as row_reduce folds them (l + l+16, +8, +4, +2, +1), given to every lane."""
    var total = partial
    comptime for level in range(5):
        total = total + shuffle_down(total, UInt32(16 >> level))
    return shuffle_idx(total, 0)


@always_inline
def load_lane_row(p: F32Ptr, lane: Int, W: Int) -> LaneRow:
    """Columns lane, lane + 32, … (< W) of a row, in ascending slots (the others 0)."""
    var v = LaneRow(0)
    comptime for j in range(LANE_VALUES):
        if lane + LANES * j < W:
            v[j] = p.unsafe_load(lane + LANES * j)
    return v


@always_inline
def normed_lane_row(
    x: F32Ptr, residual: F32Ptr, with_residual: Bool, lane: Int, W: Int, eps: Float32
) -> Tuple[LaneRow, Float32]:
    """A warp's row h = x (+ residual) in registers (load_lane_row: all its loads issued before the sum) and its
    r = 1/√(Σh²/W + ε), summed as row_reduce sums it: lane l its squares in ascending order from +0, then the
    lanes folded (warp_total)."""
    var v = load_lane_row(x, lane, W)
    if with_residual:
        v = v + load_lane_row(residual, lane, W)
    var partial = Float32(0)
    comptime for j in range(LANE_VALUES):
        if lane + LANES * j < W:
            partial += v[j] * v[j]
    return (v, numerics.rsqrt(warp_total(partial) / Float32(W) + eps))


comptime RMSNORM_FORWARD = Interface("y rstd x weight residual h", "width", "eps")


def rmsnorm_forward[warp: Bool](r: Int, lane: Int, args: Args):
    """With a residual (optional), the norm of h = x + residual, which h keeps: the residual add and the norm in
    one pass, each sum computed as `add` computes it. Each caller writes the columns of h it reads back (lane l:
    l, l+32, …), so no thread reads another's store."""
    var W = args.size(0)
    var y = args.f32(0).unsafe_offset(r * W)
    var rstd_out = args.f32(1)
    var x = args.f32(2).unsafe_offset(r * W)
    var w = args.f32(3)
    var eps = args.scalar(0)
    var with_residual = args.given(4)
    var residual = args.f32(4).unsafe_offset(r * W)
    var h = args.f32(5).unsafe_offset(r * W)
    comptime if warp:
        if W <= LANES * LANE_VALUES:  # the row in registers: its loads issued at once, x read once
            var row = normed_lane_row(x, residual, with_residual, lane, W, eps)
            var v = row[0]
            var rstd = row[1]
            if lane == 0:
                rstd_out.unsafe_store(r, rstd)
            comptime for j in range(LANE_VALUES):
                var i = lane + LANES * j
                if i < W:
                    if with_residual:
                        h.unsafe_store(i, v[j])
                    y.unsafe_store(i, (v[j] * rstd) * w.unsafe_load(i))
            return
    if with_residual:
        for i in range(lane, W, row_stride[warp]()):
            h.unsafe_store(i, x.unsafe_load(i) + residual.unsafe_load(i))
        x = h

    def square(i: Int) {imm x} -> Float32:
        var v = x.unsafe_load(i)
        return v * v

    var rstd = numerics.rsqrt(row_reduce[warp](square, W, lane) / Float32(W) + eps)
    if lane == 0:
        rstd_out.unsafe_store(r, rstd)
    for i in range(lane, W, row_stride[warp]()):
        y.unsafe_store(i, (x.unsafe_load(i) * rstd) * w.unsafe_load(i))


comptime RMSNORM_BACKWARD = Interface("dx dweight_rows dy x weight rstd", "width accumulate", "")


def rmsnorm_backward[warp: Bool](r: Int, lane: Int, args: Args):
    """dweight_rows = dy·x·r per row, summed over rows by the column sums. dx may be dy (in place): each
    column is read before it is written, by the thread that writes it. With accumulate, dx = dx + the norm's dx
    (the residual stream's gradient taking the norm's: `add`'s sum, in the same pass)."""
    var W = args.size(0)
    var accumulate = args.flag(1)
    var dx = args.f32(0).unsafe_offset(r * W)
    var dw_rows = args.f32(1).unsafe_offset(r * W)
    var dy = args.f32(2).unsafe_offset(r * W)
    var x = args.f32(3).unsafe_offset(r * W)
    var w = args.f32(4)
    var rstd = args.f32(5).unsafe_load(r)
    comptime if warp:
        if W <= LANES * LANE_VALUES:  # dy, x (and dx) in registers: read once, their loads issued at once (the weight
            # is every row's, read from the caches)
            var gv = load_lane_row(dy, lane, W)
            var xv = load_lane_row(x, lane, W)
            var earlier = load_lane_row(dx, lane, W) if accumulate else LaneRow(0)
            var partial = Float32(0)  # row_reduce's lane sum of the projections, in its order
            comptime for j in range(LANE_VALUES):
                if lane + LANES * j < W:
                    partial += (gv[j] * w.unsafe_load(lane + LANES * j)) * xv[j]
            var coefficient = (rstd * rstd) * (warp_total(partial) / Float32(W))
            var values = earlier  # every value found before the first store, so that no load waits for one
            comptime for j in range(LANE_VALUES):
                if lane + LANES * j < W:
                    var value = rstd * (gv[j] * w.unsafe_load(lane + LANES * j) - xv[j] * coefficient)
                    values[j] = earlier[j] + value if accumulate else value
            comptime for j in range(LANE_VALUES):
                var i = lane + LANES * j
                if i < W:
                    dx.unsafe_store(i, values[j])
                    dw_rows.unsafe_store(i, gv[j] * (xv[j] * rstd))
            return

    def projection(i: Int) {imm dy, imm w, imm x} -> Float32:
        return (dy.unsafe_load(i) * w.unsafe_load(i)) * x.unsafe_load(i)

    var mean_projection = row_reduce[warp](projection, W, lane) / Float32(W)
    var coefficient = (rstd * rstd) * mean_projection
    for i in range(lane, W, row_stride[warp]()):
        var xi = x.unsafe_load(i)
        var gi = dy.unsafe_load(i)
        var value = rstd * (gi * w.unsafe_load(i) - xi * coefficient)
        if accumulate:
            value = dx.unsafe_load(i) + value
        dx.unsafe_store(i, value)
        dw_rows.unsafe_store(i, gi * (xi * rstd))


comptime SOFTMAX_FORWARD = Interface("y x", "width", "")


def softmax_forward(r: Int, args: Args):
    var N = args.size(0)
    var y = args.f32(0).unsafe_offset(r * N)
    var x = args.f32(1).unsafe_offset(r * N)
    var m = row_max(x, N)
    for i in range(N):
        y.unsafe_store(i, numerics.exp(x.unsafe_load(i) - m))

    def value(i: Int) {imm y} -> Float32:
        return y.unsafe_load(i)

    var total = canonical_reduce(value, N)
    for i in range(N):
        y.unsafe_store(i, y.unsafe_load(i) / total)


comptime SOFTMAX_BACKWARD = Interface("dx y dy", "width", "")


def softmax_backward(r: Int, args: Args):
    var N = args.size(0)
    var dx = args.f32(0).unsafe_offset(r * N)
    var y = args.f32(1).unsafe_offset(r * N)
    var dy = args.f32(2).unsafe_offset(r * N)

    def product(i: Int) {imm y, imm dy} -> Float32:
        return dy.unsafe_load(i) * y.unsafe_load(i)

    var dot = canonical_reduce(product, N)
    for i in range(N):
        dx.unsafe_store(i, y.unsafe_load(i) * (dy.unsafe_load(i) - dot))


comptime COLUMN_PARTIAL_SUMS = Interface("partial x", "rows columns chunk squares", "")


def column_partial_sums[w: SIMDLength](task: Int, args: Args):
    """Stage 1, one task per (chunk, column): partial [chunks, C] of x [R, C], each chunk `chunk` rows of x
    (COLUMN_CHUNK, or one packed row's tokens when the stage 2 is the row tree: kernels/tree_sum.mojo).
    An element-wise kernel: tasks [task, task + w), w columns of one chunk as w lanes, each lane its column's
    canonical sum; w tasks that cross into the next chunk are taken one by one. With `squares`, the sums are of
    x[r, c]² (each square rounded, then summed in the same order): the gradient's norm for clipping."""
    var partial = args.f32(0)
    var x = args.f32(1)
    var R = args.size(0)
    var C = args.size(1)
    var length = args.size(2)
    var squares = args.flag(3)
    var chunk = task // C
    var column = task % C
    var begin = chunk * length
    comptime if w > 1:
        if column + w > C:
            for lane in range(w):
                column_partial_sums[1](task + lane, args)
            return

    comptime if w == 1:
        def value(i: Int) {imm x, imm begin, imm C, imm column, imm squares} -> Float32:
            var v = x.unsafe_load((begin + i) * C + column)
            return v * v if squares else v

        partial.unsafe_store(task, canonical_reduce(value, min(length, R - begin)))
    else:
        def values(i: Int) {imm x, imm begin, imm C, imm column, imm squares} -> SIMD[DType.float32, w]:
            var v = x.unsafe_load[width=w]((begin + i) * C + column)
            return v * v if squares else v

        partial.unsafe_store(task, canonical_reduce_lanes[w](values, min(length, R - begin)))


comptime COLUMN_WARPS = 8  # warps of a GPU block of column_partial_sums_block: warp w the canonical lanes w + 8s
comptime COLUMN_BLOCKS_PER_SM = 8  # such blocks a multiprocessor: 2048 threads


def column_partial_sums_block[D: Int](block: Int, args: Args):
    """column_partial_sums[1]'s tasks for 32 neighbouring columns of one chunk on a GPU block of COLUMN_WARPS warps:
    lane c takes column c0 + c, warp w the canonical sum's lanes w, w + 8, w + 16 and w + 24 (the chunk's rows
    32j + w + 8s, j ascending: canonical_reduce's four chains), so that a warp reads 128 contiguous bytes of a row
    at a time. fold_lanes' first two levels (l + l+16, then + l+8) stay inside a warp; the eight results go through
    shared memory and warp 0 folds them as its last three levels do: the same sums in the same order. (A warp a
    column fetched a 32-byte sector a lane for 4 bytes of it; a thread a column, 32 chains, had too few warps.) D is
    launch_gpu_teams' size parameter, unused."""
    var partial = args.f32(0)
    var x = args.f32(1)
    var R = args.size(0)
    var C = args.size(1)
    var length = args.size(2)
    var squares = args.flag(3)
    var column_groups = (C + LANES - 1) // LANES
    var chunk = block // column_groups
    var column = (block - chunk * column_groups) * LANES + Int(thread_idx.x) % LANES
    var warp = Int(thread_idx.x) // LANES
    var begin = chunk * length
    var n = min(length, R - begin)
    var acc = SIMD[DType.float32, 4](0)  # canonical lanes warp, warp + 8, warp + 16, warp + 24
    if column < C:
        var rows = x.unsafe_offset(begin * C + column)
        var start = 0
        while start + 2 * LANES <= n:  # two groups of 32 rows: eight loads in flight
            var values = SIMD[DType.float32, 8](0)
            comptime for u in range(8):
                values[u] = rows.unsafe_load((start + LANES * (u // 4) + warp + COLUMN_WARPS * (u % 4)) * C)
            if squares:
                values = values * values
            acc += values.slice[4, offset=0]()
            acc += values.slice[4, offset=4]()
            start += 2 * LANES
        while start < n:
            comptime for s in range(4):
                var row = start + warp + COLUMN_WARPS * s
                if row < n:
                    var v = rows.unsafe_load(row * C)
                    acc[s] += v * v if squares else v
            start += LANES
    var folded = stack_allocation[COLUMN_WARPS * LANES, Float32, address_space=AddressSpace.SHARED]()
    folded.unsafe_store(Int(thread_idx.x), fold_halves(acc))  # v16[w] + v16[w + 8]: v8[w]
    barrier()
    if warp == 0 and column < C:
        var v8 = SIMD[DType.float32, 8](0)
        comptime for w in range(COLUMN_WARPS):
            v8[w] = folded.unsafe_load(w * LANES + Int(thread_idx.x))
        partial.unsafe_store(chunk * C + column, fold_halves(v8))


def launch_column_partial_sums(dev: DevicePtr, n: Int, args: Args) raises:
    """Stage 1 over its n (chunk, column) tasks: on a GPU a block of COLUMN_WARPS warps for 32 columns of a chunk
    (column_partial_sums_block), on the CPU w columns a call (column_partial_sums[w], through launch_elements).
    The same sums in the same order either way."""
    if dev[].is_gpu():
        comptime if HAS_ACCELERATOR:
            var C = args.size(1)
            launch_gpu_teams[1, COLUMN_WARPS * LANES, COLUMN_BLOCKS_PER_SM, column_partial_sums_block](
                dev, n // C * ((C + LANES - 1) // LANES), args
            )
    else:
        launch_elements[column_partial_sums](dev, n, args)


comptime COLUMN_SUMS_FINISH = Interface("out partial", "chunks columns accumulate", "")


def column_sums_finish(column: Int, args: Args):
    """Stage 2, one task per column: out [C] (+)= Σ over the chunks of partial [chunks, C]."""
    var out = args.f32(0)
    var partial = args.f32(1)
    var chunks = args.size(0)
    var C = args.size(1)
    var accumulate = args.flag(2)

    def value(chunk: Int) {imm partial, imm C, imm column} -> Float32:
        return partial.unsafe_load(chunk * C + column)

    var total = canonical_reduce(value, chunks)
    if accumulate:
        total = out.unsafe_load(column) + total
    out.unsafe_store(column, total)
