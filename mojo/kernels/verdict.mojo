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
from engine.device import F32Ptr
from engine.launch import Args, Interface
from engine.reduction import row_stride

comptime LARGEST_SQUARABLE = 1.8446742974197924e19  # √(largest float32), as float64: the largest |g| whose g² fits
comptime LARGEST_FLOAT32 = Float32(3.4028234663852886e38)

comptime AHEAD = 32  # values a lane loads at once

comptime STEP_VERDICT = Interface("verdict losses sums", "loss_count sum_count", "")


@always_inline
def bad_values[warp: Bool, squarable: Bool](values: F32Ptr, n: Int, lane: Int) -> Int:
    """How many of values[0:n] the verdict refuses: not finite, or (`squarable`) |x| > LARGEST_SQUARABLE. Written
    as "not (within)", so that a NaN, which fails every comparison, is bad. A lane takes values lane, lane + 32, …
    (all of them on the CPU), AHEAD at a time: their loads issued together, before any is tested."""
    var stride = row_stride[warp]()
    var count = 0
    for base in range(0, n, stride * AHEAD):
        var run = Array[Float32, AHEAD](fill=0)
        comptime for j in range(AHEAD):
            var i = base + j * stride + lane
            if i < n:
                run[j] = values.unsafe_load(i)
        comptime for j in range(AHEAD):
            var x = abs(run[j])
            var within = x <= LARGEST_FLOAT32
            comptime if squarable:
                within = within and Float64(x) <= LARGEST_SQUARABLE
            count += 0 if within else 1
    return count


def step_verdict[warp: Bool](row: Int, lane: Int, args: Args):
    # The losses, then the sums, each in loads issued AHEAD at a time: a lane that took one value at a time waited
    # for each load before the next (25 µs over the byte LM's 4,161 values, 116 µs over the large shape's 12,289),
    # and so did one loop over both, whose loads sat behind a branch on which array a value was in (28 µs).
    var verdict = args.f32(0)
    var count = bad_values[warp, False](args.f32(1), args.size(0), lane)
    count += bad_values[warp, True](args.f32(2), args.size(1), lane)
    comptime if warp:
        comptime for level in range(5):
            count += Int(shuffle_down(Int32(count), UInt32(16 >> level)))
    if lane == 0:
        verdict.unsafe_store(0, Float32(1) if count == 0 else Float32(0))
