"""Portable float32 math: the same bits on every CPU and GPU this engine targets.

Vendor `exp`, `log` and `sqrt` differ between a CPU and a GPU in the last bits,
so the "identical" numerics build every transcendental from +, ×, explicit
`fma`, and the two operations IEEE 754 rounds correctly everywhere: `/` and
`sqrt_rn`. The build runs with `--fp-mode contract=off`, so no `a*b + c` is fused
behind our back. Measured error against float64 (tests/test_numerics.py):

    exp    ≤ 1 ulp        log    ≤ 1 ulp        log1p  ≤ 2 ulp
    sqrt   correctly rounded (0.5 ulp)          rsqrt  ≤ 1 ulp (two roundings)
    sigmoid ≤ 2 ulp       silu   ≤ 3 ulp        softplus ≤ 2 ulp
"""

from std.math import fma, floor, sqrt
from std.memory import bitcast
from std.sys import is_nvidia_gpu, llvm_intrinsic

comptime LN2_HI = Float32(0.693145751953125)  # ln 2 with its low 12 bits cleared, so n·LN2_HI is exact
comptime LN2_LO = Float32(1.428606765330187e-06)
comptime LOG2_E = Float32(1.4426950408889634)
comptime INF = Float32.MAX * Float32(2)  # +inf, built without a library call


@always_inline
def as_bits(x: Float32) -> UInt32:
    return bitcast[DType.uint32](x)


@always_inline
def from_bits(b: UInt32) -> Float32:
    return bitcast[DType.float32](b)


@always_inline
def is_nan(x: Float32) -> Bool:
    return x != x


comptime CANONICAL_NAN = UInt32(0x7FC00000)


@always_inline
def canonical(x: Float32) -> Float32:
    """x, or the one quiet NaN 0x7FC00000 if x is any NaN.

    An x86 CPU propagates a NaN operand's payload and sign, an NVIDIA GPU answers
    0x7FFFFFFF: so every function here canonicalises its NaN results.
    """
    return from_bits(CANONICAL_NAN) if x != x else x


@always_inline
def scale_by_power_of_two(x: Float32, n: Int32) -> Float32:
    """x · 2^n for n in [-252, 254], through two exact multiplications (no ldexp call)."""
    var half = n >> 1
    var first = from_bits(UInt32(half + 127) << 23)
    var second = from_bits(UInt32(n - half + 127) << 23)
    return (x * first) * second


@always_inline
def sqrt_rn(x: Float32) -> Float32:
    """The correctly rounded square root (IEEE 754 `sqrt`)."""
    comptime if is_nvidia_gpu():
        # The default GPU lowering is an approximation; sqrt.rn is the IEEE operation.
        return canonical(llvm_intrinsic["llvm.nvvm.sqrt.rn.f", Float32](x))
    else:
        return canonical(sqrt(x))


@always_inline
def rsqrt(x: Float32) -> Float32:
    """1/√x as two correctly rounded operations."""
    return canonical(Float32(1) / sqrt_rn(x))


@always_inline
def exp(x: Float32) -> Float32:
    """e^x: x = n·ln2 + r with |r| ≤ ln2/2, e^r by a degree-7 Taylor polynomial, then ·2^n."""
    if is_nan(x):
        return from_bits(CANONICAL_NAN)
    if x > Float32(88.72284):
        return INF
    if x < Float32(-103.97208):
        return Float32(0)
    var n = floor(fma(x, LOG2_E, Float32(0.5)))
    var r = fma(-n, LN2_HI, x)
    r = fma(-n, LN2_LO, r)
    # Horner: 1 + r(1 + r/2(1 + r/3(1 + r/4(1 + r/5(1 + r/6(1 + r/7))))))
    var p = fma(r, Float32(1.0 / 5040.0), Float32(1.0 / 720.0))
    p = fma(p, r, Float32(1.0 / 120.0))
    p = fma(p, r, Float32(1.0 / 24.0))
    p = fma(p, r, Float32(1.0 / 6.0))
    p = fma(p, r, Float32(0.5))
    p = fma(p, r, Float32(1.0))
    p = fma(p, r, Float32(1.0))
    return scale_by_power_of_two(p, Int32(n))


@always_inline
def log(x: Float32) -> Float32:
    """ln x: x = 2^e · m with m in [√½, √2), ln m = 2·atanh(s) with s = (m−1)/(m+1)."""
    if is_nan(x) or x < Float32(0):
        return from_bits(CANONICAL_NAN)
    if x == Float32(0):
        return -INF
    if x == INF:
        return x
    var bits = as_bits(x)
    var e = Int32(0)
    if bits < 0x00800000:  # subnormal: lift into the normal range first
        bits = as_bits(x * Float32(8388608.0))
        e = -23
    e += Int32(bits >> 23) - 127
    var m = from_bits((bits & 0x007FFFFF) | 0x3F800000)  # m in [1, 2)
    if m > Float32(1.4142135):
        m = m * Float32(0.5)
        e += 1
    var s = (m - Float32(1)) / (m + Float32(1))
    var s2 = s * s
    # atanh(s)/s = 1 + s²/3 + s⁴/5 + s⁶/7 + s⁸/9 + s¹⁰/11
    var q = fma(s2, Float32(1.0 / 11.0), Float32(1.0 / 9.0))
    q = fma(q, s2, Float32(1.0 / 7.0))
    q = fma(q, s2, Float32(1.0 / 5.0))
    q = fma(q, s2, Float32(1.0 / 3.0))
    var tail = s * s2 * q  # the series past its first term, so the sum rounds once at the end
    var ef = Float32(e)
    var low = fma(ef, LN2_LO, Float32(2) * tail)
    var mid = Float32(2) * s + low
    return fma(ef, LN2_HI, mid)


@always_inline
def log1p(x: Float32) -> Float32:
    """ln(1 + x), accurate for small x: log(u)·x/(u−1) with u = 1 + x (Goldberg's trick)."""
    var u = Float32(1) + x
    if u == Float32(1):
        return x
    if u == INF or is_nan(u) or u < Float32(0):
        return log(u)
    return canonical(log(u) * (x / (u - Float32(1))))


@always_inline
def sigmoid(x: Float32) -> Float32:
    """1/(1 + e^−x), symmetric so that large |x| never overflows."""
    if x >= Float32(0):
        return Float32(1) / (Float32(1) + exp(-x))
    var e = exp(x)
    return canonical(e / (Float32(1) + e))


@always_inline
def softplus(x: Float32) -> Float32:
    """ln(1 + e^x) = max(x, 0) + log1p(e^−|x|)."""
    var a = x if x >= Float32(0) else -x
    var m = x if x > Float32(0) else Float32(0)
    return canonical(m + log1p(exp(-a)))


@always_inline
def silu(x: Float32) -> Float32:
    """x·σ(x), the MLP activation of both models."""
    return canonical(x * sigmoid(x))


@always_inline
def silu_derivative(x: Float32) -> Float32:
    """d/dx x·σ(x) = σ(x)·(1 + x·σ(−x)); σ(−x) rather than 1 − σ(x) keeps its low bits."""
    return canonical(sigmoid(x) * fma(x, sigmoid(-x), Float32(1)))
