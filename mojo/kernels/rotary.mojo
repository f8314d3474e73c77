"""Rotary positions (the half-split form), forward and backward, one body per (token, head).

For pair i in [0, D/2) of a head vector x at position t, with the tables
cos[t, i] = cos(t·θ_i) and sin[t, i] = sin(t·θ_i), θ_i = base^(−2i/D) (built on
the host in float64 and rounded once, so both devices read the same bits):
    x1' = x1·cos − x2·sin        x2' = x2·cos + x1·sin        (x1 = x[i], x2 = x[i + D/2])
The backward rotation is the same with sin negated.
x [N, H·D] rotates in place; cos and sin are [P, D/2]; direction is +1 forward, −1 backward.
"""

from engine.launch import Args, Interface

comptime ROTARY = Interface("x positions cos sin", "heads head_dim", "direction")


def rotary(task: Int, args: Args):
    var H = args.size(0)
    var D = args.size(1)
    var direction = args.scalar(0)
    var half = D // 2
    var token = task // H
    var x = args.f32(0).unsafe_offset(task * D)
    var position = Int(args.i32(1).unsafe_load(token))
    var cos = args.f32(2).unsafe_offset(position * half)
    var sin = args.f32(3).unsafe_offset(position * half)
    for i in range(half):
        var c = cos.unsafe_load(i)
        var s = sin.unsafe_load(i) * direction
        var x1 = x.unsafe_load(i)
        var x2 = x.unsafe_load(i + half)
        x.unsafe_store(i, x1 * c - x2 * s)
        x.unsafe_store(i + half, x2 * c + x1 * s)
