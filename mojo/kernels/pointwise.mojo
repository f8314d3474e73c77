"""Element-wise kernels: the portable math over arrays, SiLU and its derivative, adds. Each body
computes `w` consecutive elements (`launch_elements`), each lane on its own.

    unary_math:     y = f(x)           f chosen by an op code: its index in UNARY_OPS
    silu:           y = silu(x)        (unary_math's "silu" in a kernel of its own)
    silu_backward:  dx = dy·silu'(x)
    add:            y = a + b
    scale:          y = α·x
    fill:           y = α
"""

from engine.launch import Args, Interface
from engine import numerics

# The portable math `unary_math` applies; an op's code is its index here (exported to Python).
comptime UNARY_OPS = ("exp", "log", "log1p", "sqrt", "rsqrt", "sigmoid", "softplus", "silu", "silu_derivative")


@always_inline
def unary[w: SIMDLength, //](op: Int, x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    if op == 0:
        return numerics.exp(x)
    if op == 1:
        return numerics.log(x)
    if op == 2:
        return numerics.log1p(x)
    if op == 3:
        return numerics.sqrt_rn(x)
    if op == 4:
        return numerics.rsqrt(x)
    if op == 5:
        return numerics.sigmoid(x)
    if op == 6:
        return numerics.softplus(x)
    if op == 7:
        return numerics.silu(x)
    return numerics.silu_derivative(x)


comptime UNARY_MATH = Interface("y x", "op", "")


def unary_math[w: SIMDLength](i: Int, args: Args):
    var y = args.f32(0)
    var x = args.f32(1)
    var op = args.size(0)
    y.unsafe_store(i, unary(op, x.unsafe_load[width=w](i)))


comptime SILU = Interface("y x", "", "")


def silu[w: SIMDLength](i: Int, args: Args):
    """unary_math's "silu" alone: compiled without the other ops, the GPU kernel keeps fewer registers and so more
    loads in flight (unary_math's 52 registers held the encoder's SiLU at 2.2 TB/s)."""
    var y = args.f32(0)
    var x = args.f32(1)
    y.unsafe_store(i, numerics.silu(x.unsafe_load[width=w](i)))


comptime SILU_BACKWARD = Interface("dx x dy", "", "")


def silu_backward[w: SIMDLength](i: Int, args: Args):
    var dx = args.f32(0)
    var x = args.f32(1)
    var dy = args.f32(2)
    dx.unsafe_store(i, dy.unsafe_load[width=w](i) * numerics.silu_derivative(x.unsafe_load[width=w](i)))


comptime ADD = Interface("y a b", "", "")


def add[w: SIMDLength](i: Int, args: Args):
    var y = args.f32(0)
    var a = args.f32(1)
    var b = args.f32(2)
    y.unsafe_store(i, a.unsafe_load[width=w](i) + b.unsafe_load[width=w](i))


comptime SCALE = Interface("y x", "", "alpha")


def scale[w: SIMDLength](i: Int, args: Args):
    var y = args.f32(0)
    var x = args.f32(1)
    var alpha = args.scalar(0)
    y.unsafe_store(i, alpha * x.unsafe_load[width=w](i))


comptime FILL = Interface("y", "", "value")


def fill[w: SIMDLength](i: Int, args: Args):
    var y = args.f32(0)
    var value = args.scalar(0)
    y.unsafe_store(i, SIMD[DType.float32, w](value))
