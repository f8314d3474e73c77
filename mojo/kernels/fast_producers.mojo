"""Fast mode's producers of bf16 copies: the stack's fp32 element-wise and row kernels, fused with the
residual adds around them, writing the bf16 copy (bf16(x): to nearest, ties to even) that the next GEMMs
read instead of an fp32 result that only those GEMMs would read.

    rmsnorm_bf16:           h = x (+ residual);   r = 1/√(Σh²/W + ε);   y16 = bf16((h·r)·w)
    rmsnorm_backward_bf16:  dh = dh + r·(dy·w − x·(r²·Σ(dy·w·x)/W));   dh16 = bf16(dh)
                            dweight_rows = dy·(x·r)
    silu_bf16:              y16 = bf16(silu(x))
    silu_backward_bf16:     dx16 = bf16(dy·silu'(x))
    rotary_fast (rotary.mojo):  y16 = bf16(rotary(x)), or rotary in place on 16-byte vectors

Every fp32 value here is computed by the same operations, in the same order, as the identical kernels that
this fusion replaces (norms.rmsnorm_forward/backward, pointwise.add/silu/silu_backward, gemm/fast.mojo cast_bf16),
so each bf16 copy has the bits of that chain's: the fusion saves passes over memory, not arithmetic. They
run under both launchers (the CPU runs them only in tests: the trainers use them in fast mode on a GPU).

On a GPU the forward norm's warp holds a row of up to 32·LANE_VALUES values in registers, as
norms.rmsnorm_forward's does (normed_lane_row: lane l the columns l, l+32, …, as row_reduce assigns them): all its
loads are issued before the sum, and the row is read from memory once. Wider rows, and the backward (whose register
form measured slower on the H200: 12.7 ms a step against 10.2), take the loop of the identical kernels. Either way
lane l adds its values in ascending order from +0 and the warp folds the lanes as row_reduce does.
"""

from engine.device import F32Ptr
from engine.launch import Args, Interface
from engine.reduction import LANES, row_reduce, row_stride
from kernels.norms import LANE_VALUES, normed_lane_row
from engine import numerics
from kernels.gemm.fast import BF16Ptr, CAST_LANES

@always_inline
def bf16_at(args: Args, slot: Int) -> BF16Ptr:
    """Buffer `slot` as bf16 values."""
    return BF16Ptr(unsafe_from_address=Int(args.addresses[slot]))


comptime RMSNORM_BF16 = Interface("y16 rstd h x residual weight", "width", "eps")


def rmsnorm_bf16[warp: Bool](r: Int, lane: Int, args: Args):
    """Row r of RMSNorm into bf16, on h = x + residual (residual optional; h, optional, keeps the sum in fp32)."""
    var W = args.size(0)
    var y16 = bf16_at(args, 0) + r * W
    var rstd_out = args.f32(1)
    var keep_sum = args.given(2)
    var h = args.f32(2).unsafe_offset(r * W)
    var x = args.f32(3).unsafe_offset(r * W)
    var with_residual = args.given(4)
    var residual = args.f32(4).unsafe_offset(r * W)
    var w = args.f32(5)
    var eps = args.scalar(0)
    comptime if warp:
        if W <= LANES * LANE_VALUES:
            var row = normed_lane_row(x, residual, with_residual, lane, W, eps)
            var v = row[0]
            var rstd = row[1]
            if lane == 0:
                rstd_out.unsafe_store(r, rstd)
            comptime for j in range(LANE_VALUES):
                var i = lane + LANES * j
                if i < W:
                    if keep_sum:
                        h.unsafe_store(i, v[j])
                    y16.unsafe_store(i, ((v[j] * rstd) * w.unsafe_load(i)).cast[DType.bfloat16]())
            return

    def square(i: Int) {imm x, imm residual, imm with_residual} -> Float32:
        var v = x.unsafe_load(i)
        if with_residual:
            v = v + residual.unsafe_load(i)
        return v * v

    var rstd = numerics.rsqrt(row_reduce[warp](square, W, lane) / Float32(W) + eps)
    if lane == 0:
        rstd_out.unsafe_store(r, rstd)
    for i in range(lane, W, row_stride[warp]()):
        var v = x.unsafe_load(i)
        if with_residual:
            v = v + residual.unsafe_load(i)
        if keep_sum:
            h.unsafe_store(i, v)
        y16.unsafe_store(i, ((v * rstd) * w.unsafe_load(i)).cast[DType.bfloat16]())


comptime RMSNORM_BACKWARD_BF16 = Interface("dh dh16 dweight_rows dy x weight rstd", "width", "")


def rmsnorm_backward_bf16[warp: Bool](r: Int, lane: Int, args: Args):
    """Row r of RMSNorm's backward added into the residual stream's gradient dh, with dh's bf16 copy."""
    var W = args.size(0)
    var dh = args.f32(0).unsafe_offset(r * W)
    var dh16 = bf16_at(args, 1) + r * W
    var dw_rows = args.f32(2).unsafe_offset(r * W)
    var dy = args.f32(3).unsafe_offset(r * W)
    var x = args.f32(4).unsafe_offset(r * W)
    var w = args.f32(5)
    var rstd = args.f32(6).unsafe_load(r)

    def projection(i: Int) {imm dy, imm w, imm x} -> Float32:
        return (dy.unsafe_load(i) * w.unsafe_load(i)) * x.unsafe_load(i)

    var mean_projection = row_reduce[warp](projection, W, lane) / Float32(W)
    var coefficient = (rstd * rstd) * mean_projection
    for i in range(lane, W, row_stride[warp]()):
        var xi = x.unsafe_load(i)
        var gi = dy.unsafe_load(i)
        var total = dh.unsafe_load(i) + rstd * (gi * w.unsafe_load(i) - xi * coefficient)
        dh.unsafe_store(i, total)
        dh16.unsafe_store(i, total.cast[DType.bfloat16]())
        dw_rows.unsafe_store(i, gi * (xi * rstd))


comptime SILU_BF16 = Interface("y16 x", "count", "")


def silu_bf16(i: Int, args: Args):
    """y16[j] = bf16(silu(x[j])) for the CAST_LANES values j of group i (moved 16 or 32 bytes at a time when
    aligned, else one by one; the portable silu computes each lane alone)."""
    var y16 = bf16_at(args, 0)
    var x = args.f32(1)
    var count = args.size(0)
    var first = i * CAST_LANES
    if first + CAST_LANES <= count and Int(x) % 32 == 0 and Int(y16) % 16 == 0:
        var s = numerics.silu(x.unsafe_load[width=CAST_LANES, alignment=32](first))
        y16.unsafe_store[width=CAST_LANES, alignment=16](first, s.cast[DType.bfloat16]())
    else:
        for j in range(first, min(first + CAST_LANES, count)):
            y16.unsafe_store(j, numerics.silu(x.unsafe_load(j)).cast[DType.bfloat16]())


comptime SILU_BACKWARD_BF16 = Interface("dx16 x dy", "count", "")


def silu_backward_bf16(i: Int, args: Args):
    """dx16[j] = bf16(dy[j]·silu'(x[j])) for the CAST_LANES values j of group i (as silu_bf16)."""
    var dx16 = bf16_at(args, 0)
    var x = args.f32(1)
    var dy = args.f32(2)
    var count = args.size(0)
    var first = i * CAST_LANES
    if first + CAST_LANES <= count and Int(x) % 32 == 0 and Int(dy) % 32 == 0 and Int(dx16) % 16 == 0:
        var g = dy.unsafe_load[width=CAST_LANES, alignment=32](first) * numerics.silu_derivative(
            x.unsafe_load[width=CAST_LANES, alignment=32](first)
        )
        dx16.unsafe_store[width=CAST_LANES, alignment=16](first, g.cast[DType.bfloat16]())
    else:
        for j in range(first, min(first + CAST_LANES, count)):
            var g = dy.unsafe_load(j) * numerics.silu_derivative(x.unsafe_load(j))
            dx16.unsafe_store(j, g.cast[DType.bfloat16]())
