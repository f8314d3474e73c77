"""Rotary positions (the half-split form), forward and backward, one body per (token, head).

For pair i in [0, D/2) of a head vector x at position t, with the tables
cos[t, i] = cos(t·θ_i) and sin[t, i] = sin(t·θ_i), θ_i = base^(−2i/D) (built on
the host in float64 and rounded once, so both devices read the same bits):
    x1' = x1·cos − x2·sin        x2' = x2·cos + x1·sin        (x1 = x[i], x2 = x[i + D/2])
The backward rotation is the same with sin negated (x0 = −1 instead of +1).
a0 = x [N, H·D] (in place), a1 = positions int32 [N], a2 = cos, a3 = sin [P, D/2]; n0 = H, n1 = D; x0 = ±1.
"""

from engine.device import f32_at, i32_at
from engine.launch import Args


def rotary(task: Int, args: Args):
    var H = args.n0
    var D = args.n1
    var half = D // 2
    var token = task // H
    var x = f32_at(args.a0 + task * D * 4)
    var position = Int(i32_at(args.a1).unsafe_load(token))
    var cos = f32_at(args.a2 + position * half * 4)
    var sin = f32_at(args.a3 + position * half * 4)
    for i in range(half):
        var c = cos.unsafe_load(i)
        var s = sin.unsafe_load(i) * args.x0
        var x1 = x.unsafe_load(i)
        var x2 = x.unsafe_load(i + half)
        x.unsafe_store(i, x1 * c - x2 * s)
        x.unsafe_store(i + half, x2 * c + x1 * s)
