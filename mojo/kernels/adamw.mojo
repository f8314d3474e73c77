"""AdamW, PyTorch's form (decoupled weight decay), one body per parameter.

    p ← p·(1 − lr·λ)
    m ← β1·m + (1 − β1)·g
    v ← β2·v + (1 − β2)·g²
    p ← p − (lr / c1) · m / (√v / √c2 + ε)          c1 = 1 − β1^t, c2 = 1 − β2^t

The scalars (1 − β1, 1 − β2, 1 − lr·λ, lr/c1, √c2) are computed once on the host
in float64 and rounded to float32, so every device reads the same bits.
a0 = p, a1 = g, a2 = m, a3 = v; x0 = β1, x1 = β2, x2 = 1 − lr·λ, x3 = lr/c1;
n0…n3 = the float32 bits of √c2, ε, 1 − β1 and 1 − β2.
"""

from engine.device import f32_at
from engine.launch import Args
from engine.numerics import from_bits, sqrt_rn


def adamw(i: Int, args: Args):
    var p = f32_at(args.a0)
    var g = f32_at(args.a1).unsafe_load(i)
    var m = f32_at(args.a2)
    var v = f32_at(args.a3)
    var beta1 = args.x0
    var beta2 = args.x1
    var sqrt_c2 = from_bits(UInt32(args.n0))
    var eps = from_bits(UInt32(args.n1))
    var m_new = beta1 * m.unsafe_load(i) + from_bits(UInt32(args.n2)) * g
    var v_new = beta2 * v.unsafe_load(i) + from_bits(UInt32(args.n3)) * (g * g)
    m.unsafe_store(i, m_new)
    v.unsafe_store(i, v_new)
    var decayed = p.unsafe_load(i) * args.x2
    p.unsafe_store(i, decayed - args.x3 * (m_new / (sqrt_rn(v_new) / sqrt_c2 + eps)))
