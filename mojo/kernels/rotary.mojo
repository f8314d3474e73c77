"""Rotary positions (the half-split form), forward and backward, one body per PAIRS_PER_TASK pairs of a head.

For pair i in [0, D/2) of a head vector x at position t, with the tables
cos[t, i] = cos(t·θ_i) and sin[t, i] = sin(t·θ_i), θ_i = base^(−2i/D) (built on
the host in float64 and rounded once, so both devices read the same bits):
    x1' = x1·cos − x2·sin        x2' = x2·cos + x1·sin        (x1 = x[i], x2 = x[i + D/2])
The backward rotation is the same with sin negated.
x [N, H·D] rotates in place; cos and sin are [P, D/2]; direction is +1 forward, −1 backward.

Positions have `axes` columns: 1 (a sequence), or 3 (time, row, column: images and video). With
three, the D/2 pairs are cut into sections, pair i reading the position on its section's axis:
time the first ⌊D/8⌋ pairs, row the next ⌊(D/2 − ⌊D/8⌋)/2⌋, column the rest (M-RoPE's split). A
token whose three positions are equal (text) rotates exactly as with one axis.

A GPU takes `rotary_fast` (in identical mode where x starts on 16 bytes, as the wrapper checks; always in fast
mode): the same pairs and the same arithmetic (so the same bits), each task's values moved as 16-byte vectors;
given y16, it writes the rotated x as its bf16 copy there (to nearest, ties to even) and leaves x as it was (the
backward's dq and dk, which only the GEMMs read next).

A task rotates PAIRS_PER_TASK consecutive pairs of one (token, head), so that neighbouring GPU threads
read neighbouring floats; each pair's arithmetic is the same whatever the task, hence so are the bits.
`rotary`'s body takes a SIMD width (`launch_lanes`): a GPU thread rotates its pairs one by one (an x off 16 bytes),
a CPU call all of them as the lanes of one vector, each lane computed as it would be alone.
"""

from engine.launch import Args, Interface
from kernels.gemm.fast import BF16Ptr

comptime ROTARY = Interface("x positions cos sin", "heads head_dim axes", "direction")
comptime ROTARY_FAST = Interface("x positions cos sin y16", "heads head_dim axes", "direction")


comptime PAIRS_PER_TASK = 4  # divides D/2 for every even head dimension the engine compiles (8 … 128)


def rotary[w: SIMDLength](task: Int, args: Args):
    var H = args.size(0)
    var D = args.size(1)
    var axes = args.size(2)
    var direction = args.scalar(0)
    var half = D // 2
    var vector = task // (half // PAIRS_PER_TASK)  # the (token, head) whose pairs this task rotates
    var first = task % (half // PAIRS_PER_TASK) * PAIRS_PER_TASK
    var token = vector // H
    var x = args.f32(0).unsafe_offset(vector * D)
    var positions = args.i32(1).unsafe_offset(token * axes)
    var cos = args.f32(2)
    var sin = args.f32(3)
    # The pairs [0, time_end) read the first axis, [time_end, row_end) the second, the rest the third.
    var time_end = half if axes == 1 else half // 4
    var row_end = half if axes == 1 else time_end + (half - time_end) // 2
    var time = Int(positions.unsafe_load(0))
    var row = Int(positions.unsafe_load(0 if axes == 1 else 1))
    var column = Int(positions.unsafe_load(0 if axes == 1 else 2))
    comptime for p in range(0, PAIRS_PER_TASK, w):
        var i = first + p
        var c = SIMD[DType.float32, w](0)
        var s = SIMD[DType.float32, w](0)
        comptime for lane in range(w):
            var position = time if i + lane < time_end else (row if i + lane < row_end else column)
            c[lane] = cos.unsafe_load(position * half + i + lane)
            s[lane] = sin.unsafe_load(position * half + i + lane)
        s = s * direction
        var x1 = x.unsafe_load[width=w](i)
        var x2 = x.unsafe_load[width=w](i + half)
        x.unsafe_store(i, x1 * c - x2 * s)
        x.unsafe_store(i + half, x2 * c + x1 * s)


def rotary_fast(task: Int, args: Args):
    """`rotary`'s task on vectors: x[first, first + 4) and x[first + half, first + half + 4) are loaded and stored
    16 bytes at a time (x must start on 16 bytes, as the wrapper checks; D is a multiple of 8), each lane computed
    as `rotary` computes its pair. With y16 given the results go there in bf16 and x is unchanged."""
    var H = args.size(0)
    var D = args.size(1)
    var axes = args.size(2)
    var direction = args.scalar(0)
    var half = D // 2
    var vector = task // (half // PAIRS_PER_TASK)
    var first = task % (half // PAIRS_PER_TASK) * PAIRS_PER_TASK
    var token = vector // H
    var x = args.f32(0).unsafe_offset(vector * D)
    var positions = args.i32(1).unsafe_offset(token * axes)
    var cos = args.f32(2)
    var sin = args.f32(3)
    var time_end = half if axes == 1 else half // 4
    var row_end = half if axes == 1 else time_end + (half - time_end) // 2
    var time = Int(positions.unsafe_load(0))
    var row = Int(positions.unsafe_load(0 if axes == 1 else 1))
    var column = Int(positions.unsafe_load(0 if axes == 1 else 2))
    var c = SIMD[DType.float32, PAIRS_PER_TASK](0)
    var s = SIMD[DType.float32, PAIRS_PER_TASK](0)
    comptime for p in range(PAIRS_PER_TASK):
        var i = first + p
        var position = time if i < time_end else (row if i < row_end else column)
        c[p] = cos.unsafe_load(position * half + i)
        s[p] = sin.unsafe_load(position * half + i) * direction
    var x1 = x.unsafe_load[width=PAIRS_PER_TASK, alignment=16](first)
    var x2 = x.unsafe_load[width=PAIRS_PER_TASK, alignment=16](first + half)
    var y1 = x1 * c - x2 * s
    var y2 = x2 * c + x1 * s
    if args.given(4):
        var y16 = BF16Ptr(unsafe_from_address=Int(args.addresses[4]) + 2 * vector * D)
        y16.unsafe_store[width=PAIRS_PER_TASK, alignment=8](first, y1.cast[DType.bfloat16]())
        y16.unsafe_store[width=PAIRS_PER_TASK, alignment=8](first + half, y2.cast[DType.bfloat16]())
    else:
        x.unsafe_store[width=PAIRS_PER_TASK, alignment=16](first, y1)
        x.unsafe_store[width=PAIRS_PER_TASK, alignment=16](first + half, y2)
