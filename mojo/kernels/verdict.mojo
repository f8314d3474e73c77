"""A step's verdict on the device: may its update run?

    verdict = 1 if every loss is finite and every sum of the gradient check is finite with
                |sum| ≤ LARGEST_SQUARABLE, else 0

The host takes the same decision on the same values after downloading them (a float64 sum
of finite float32 losses is finite; `ResidentState.summed_gradient_problem`), and names
what was wrong. A replayed step computes it before AdamW, which reads it and leaves every
parameter and moment as it was on a 0: a refused step changes nothing though its update
was launched before the host could look. One warp (one CPU call) counts the bad values
with the canonical row sum; a count of 0/1 values is exact in any order.
"""

from engine.launch import Args, Interface
from engine.reduction import row_reduce

comptime LARGEST_SQUARABLE = 1.8446742974197924e19  # √(largest float32), as float64: the largest |g| whose g² fits
comptime LARGEST_FLOAT32 = Float32(3.4028234663852886e38)

comptime STEP_VERDICT = Interface("verdict losses sums", "loss_count sum_count", "")


def step_verdict[warp: Bool](row: Int, lane: Int, args: Args):
    var verdict = args.f32(0)
    var losses = args.f32(1)
    var sums = args.f32(2)
    var loss_count = args.size(0)
    var sum_count = args.size(1)

    def bad(i: Int) {imm losses, imm sums, imm loss_count} -> Float32:
        # Written as "not (within)", so that a NaN, which fails every comparison, is bad.
        if i < loss_count:
            return Float32(0) if abs(losses.unsafe_load(i)) <= LARGEST_FLOAT32 else Float32(1)
        var s = abs(sums.unsafe_load(i - loss_count))
        return Float32(0) if s <= LARGEST_FLOAT32 and Float64(s) <= LARGEST_SQUARABLE else Float32(1)

    var bad_values = row_reduce[warp](bad, loss_count + sum_count, lane)
    if lane == 0:
        verdict.unsafe_store(0, Float32(1) if bad_values == 0 else Float32(0))
