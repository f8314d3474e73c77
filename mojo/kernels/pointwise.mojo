"""Element-wise kernels: the portable math over arrays, SiLU and its derivative, adds.

    unary_math:     y = f(x)           (a0 = y, a1 = x, n0 = op code below)
    silu_backward:  dx = dy·silu'(x)   (a0 = dx, a1 = x, a2 = dy)
    add:            y = a + b          (a0 = y, a1 = a, a2 = b)
    scale:          y = α·x            (a0 = y, a1 = x, x0 = α)
    fill:           y = α              (a0 = y, x0 = α)
"""

from engine.device import f32_at
from engine.launch import Args
from engine import numerics

# Operation codes of `unary_math`, mirrored in python/uform/kernels.py.
comptime OP_EXP = 0
comptime OP_LOG = 1
comptime OP_LOG1P = 2
comptime OP_SQRT = 3
comptime OP_RSQRT = 4
comptime OP_SIGMOID = 5
comptime OP_SOFTPLUS = 6
comptime OP_SILU = 7
comptime OP_SILU_DERIVATIVE = 8


@always_inline
def unary(op: Int, x: Float32) -> Float32:
    if op == OP_EXP:
        return numerics.exp(x)
    if op == OP_LOG:
        return numerics.log(x)
    if op == OP_LOG1P:
        return numerics.log1p(x)
    if op == OP_SQRT:
        return numerics.sqrt_rn(x)
    if op == OP_RSQRT:
        return numerics.rsqrt(x)
    if op == OP_SIGMOID:
        return numerics.sigmoid(x)
    if op == OP_SOFTPLUS:
        return numerics.softplus(x)
    if op == OP_SILU:
        return numerics.silu(x)
    return numerics.silu_derivative(x)


def unary_math(i: Int, args: Args):
    f32_at(args.a0).unsafe_store(i, unary(args.n0, f32_at(args.a1).unsafe_load(i)))


def silu_backward(i: Int, args: Args):
    var x = f32_at(args.a1).unsafe_load(i)
    f32_at(args.a0).unsafe_store(i, f32_at(args.a2).unsafe_load(i) * numerics.silu_derivative(x))


def add(i: Int, args: Args):
    f32_at(args.a0).unsafe_store(i, f32_at(args.a1).unsafe_load(i) + f32_at(args.a2).unsafe_load(i))


def scale(i: Int, args: Args):
    f32_at(args.a0).unsafe_store(i, args.x0 * f32_at(args.a1).unsafe_load(i))


def fill(i: Int, args: Args):
    f32_at(args.a0).unsafe_store(i, args.x0)
