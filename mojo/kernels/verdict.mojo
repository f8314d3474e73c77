"""A step's verdict on the device: may its update run?

    verdict = 1 if every loss is finite and every sum of the gradient check is finite with
                |sum| ≤ LARGEST_SQUARABLE, else 0

The host takes the same decision on the same values after downloading them (a float64 sum
of finite float32 losses is finite; `ResidentState.summed_gradient_problem`), and names
what was wrong. A replayed step computes it before AdamW, which reads it and leaves every
parameter and moment as it was on a 0: a refused step changes nothing though its update
was launched before the host could look. One warp (one CPU call) counts the bad values; a count is
exact in any order, so each lane counts its values AHEAD at a time and the warp adds its lanes' counts.
"""

from std.collections import Array
from max.gpu.primitives.warp import shuffle_down
from engine.launch import Args, Interface
from engine.reduction import row_stride

comptime LARGEST_SQUARABLE = 1.8446742974197924e19  # √(largest float32), as float64: the largest |g| whose g² fits
comptime LARGEST_FLOAT32 = Float32(3.4028234663852886e38)

comptime AHEAD = 16  # values a lane loads at once

comptime STEP_VERDICT = Interface("verdict losses sums", "loss_count sum_count", "")


def step_verdict[warp: Bool](row: Int, lane: Int, args: Args):
    var verdict = args.f32(0)
    var losses = args.f32(1)
    var sums = args.f32(2)
    var loss_count = args.size(0)
    var sum_count = args.size(1)

    @always_inline
    def bad(i: Int) {imm losses, imm sums, imm loss_count} -> Int:
        # Written as "not (within)", so that a NaN, which fails every comparison, is bad.
        if i < loss_count:
            return 0 if abs(losses.unsafe_load(i)) <= LARGEST_FLOAT32 else 1
        var s = abs(sums.unsafe_load(i - loss_count))
        return 0 if s <= LARGEST_FLOAT32 and Float64(s) <= LARGEST_SQUARABLE else 1

    # AHEAD values a lane at once, their loads issued together: a lane that took one value at a time waited for
    # each load before the next (25 µs over the byte LM's 4,161 values, 116 µs over the large shape's 12,289).
    var n = loss_count + sum_count
    var stride = row_stride[warp]()
    var count = 0
    for base in range(0, n, stride * AHEAD):
        var run = Array[Int, AHEAD](fill=0)
        comptime for j in range(AHEAD):
            var i = base + j * stride + lane
            if i < n:
                run[j] = bad(i)
        comptime for j in range(AHEAD):
            count += run[j]
    comptime if warp:
        comptime for level in range(5):
            count += Int(shuffle_down(Int32(count), UInt32(16 >> level)))
    if lane == 0:
        verdict.unsafe_store(0, Float32(1) if count == 0 else Float32(0))
