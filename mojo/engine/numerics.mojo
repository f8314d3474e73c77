"""Portable float32 math: the same bits on every CPU and GPU this engine targets.

Vendor `exp`, `log` and `sqrt` differ between a CPU and a GPU in the last bits,
so the "identical" numerics build every transcendental from +, ×, explicit
`fma`, and the two operations IEEE 754 rounds correctly everywhere: `/` and
`sqrt_rn`. The build runs with `--fp-mode contract=off`, so no `a*b + c` is fused
behind our back. Measured error against float64 (tests/test_numerics.py):

    exp    ≤ 1 ulp        log    ≤ 1 ulp        log1p  ≤ 2 ulp
    sqrt   correctly rounded (0.5 ulp)          rsqrt  ≤ 1 ulp (two roundings)
    sigmoid ≤ 2 ulp       silu   ≤ 3 ulp        softplus ≤ 2 ulp

Every function takes `w` lanes at once (a GPU thread calls it with four, the CPU
launcher with eight) and computes each lane exactly as it would alone: special
arguments are answered by selects, not early returns, so lanes never interact.
"""

from std.math import fma, floor, isnan, sqrt
from std.memory import bitcast
from std.sys import is_nvidia_gpu, llvm_intrinsic

comptime LN2_HI = Float32(0.693145751953125)  # ln 2 with its low 12 bits cleared, so n·LN2_HI is exact
comptime LN2_LO = Float32(1.428606765330187e-06)
comptime LOG2_E = Float32(1.4426950408889634)
comptime INF = Float32.MAX * Float32(2)  # +inf, built without a library call
comptime CANONICAL_NAN = UInt32(0x7FC00000)

comptime Floats[w: SIMDLength] = SIMD[DType.float32, w]  # signatures spell it out: w is inferred from there


@always_inline
def as_bits[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.uint32, w]:
    return bitcast[DType.uint32, w](x)


@always_inline
def from_bits[w: SIMDLength, //](b: SIMD[DType.uint32, w]) -> SIMD[DType.float32, w]:
    return bitcast[DType.float32, w](b)


@always_inline
def is_nan[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.bool, w]:
    return isnan(x)  # (not x.ne(x): SIMD's ne is the ordered comparison, false for a NaN)


@always_inline
def nan_where[w: SIMDLength, //](mask: SIMD[DType.bool, w], x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """x, with the one quiet NaN 0x7FC00000 in the lanes of `mask`.

    Chosen between bit patterns, not floats: the compiler may take any NaN for any other, so it may drop
    a float select that only puts one NaN in place of another, leaving the hardware's (0xFFC00000 on x86).
    """
    return from_bits(mask.select(SIMD[DType.uint32, w](CANONICAL_NAN), as_bits(x)))


@always_inline
def canonical[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """x, or the one quiet NaN 0x7FC00000 where x is any NaN.

    An x86 CPU propagates a NaN operand's payload and sign, an NVIDIA GPU answers
    0x7FFFFFFF: so every function here canonicalises its NaN results.
    """
    return nan_where(is_nan(x), x)


@always_inline
def scale_by_power_of_two[w: SIMDLength, //](
    x: SIMD[DType.float32, w], n: SIMD[DType.int32, w]
) -> SIMD[DType.float32, w]:
    """x · 2^n for n in [-252, 254], through two exact multiplications (no ldexp call)."""
    var half = n >> 1
    var first = from_bits((half + 127).cast[DType.uint32]() << 23)
    var second = from_bits((n - half + 127).cast[DType.uint32]() << 23)
    return (x * first) * second


@always_inline
def sqrt_rn[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """The correctly rounded square root (IEEE 754 `sqrt`)."""
    comptime if is_nvidia_gpu():
        # The default GPU lowering is an approximation; sqrt.rn is the IEEE operation.
        var root = Floats[w]()
        comptime for lane in range(w):
            root[lane] = llvm_intrinsic["llvm.nvvm.sqrt.rn.f", Float32](x[lane])
        return canonical(root)
    else:
        # A negative x's root is taken of −x, then replaced by the NaN: were the square root to make the
        # NaN itself, the compiler could drop the replacement (see nan_where).
        var negative = x.lt(Float32(0))
        return nan_where(is_nan(x) | negative, sqrt(negative.select(-x, x)))


@always_inline
def rsqrt[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """1/√x as two correctly rounded operations."""
    return canonical(Floats[w](1) / sqrt_rn(x))


@always_inline
def exp[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """e^x: x = n·ln2 + r with |r| ≤ ln2/2, e^r by a degree-7 Taylor polynomial, then ·2^n."""
    var nan_lanes = is_nan(x)
    var high = x.gt(Float32(88.72284))
    var low = x.lt(Float32(-103.97208))
    var t = (nan_lanes | high | low).select(Floats[w](0), x)  # lanes answered below compute on 0
    var n = floor(fma(t, Floats[w](LOG2_E), Floats[w](0.5)))
    var r = fma(-n, Floats[w](LN2_HI), t)
    r = fma(-n, Floats[w](LN2_LO), r)
    # Horner: 1 + r(1 + r/2(1 + r/3(1 + r/4(1 + r/5(1 + r/6(1 + r/7))))))
    var p = fma(r, Floats[w](1.0 / 5040.0), Floats[w](1.0 / 720.0))
    p = fma(p, r, Floats[w](1.0 / 120.0))
    p = fma(p, r, Floats[w](1.0 / 24.0))
    p = fma(p, r, Floats[w](1.0 / 6.0))
    p = fma(p, r, Floats[w](0.5))
    p = fma(p, r, Floats[w](1.0))
    p = fma(p, r, Floats[w](1.0))
    var y = scale_by_power_of_two(p, n.cast[DType.int32]())
    return nan_where(nan_lanes, high.select(Floats[w](INF), low.select(Floats[w](0), y)))


@always_inline
def log[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """ln x: x = 2^e · m with m in [√½, √2), ln m = 2·atanh(s) with s = (m−1)/(m+1)."""
    var subnormal = as_bits(x).lt(0x00800000)  # lifted into the normal range first
    var bits = subnormal.select(as_bits(x * Float32(8388608.0)), as_bits(x))
    var e = subnormal.select(SIMD[DType.int32, w](-23), SIMD[DType.int32, w](0))
    e += (bits >> 23).cast[DType.int32]() - 127
    var m = from_bits((bits & 0x007FFFFF) | 0x3F800000)  # m in [1, 2)
    var upper = m.gt(Float32(1.4142135))
    m = upper.select(m * Float32(0.5), m)
    e += upper.select(SIMD[DType.int32, w](1), SIMD[DType.int32, w](0))
    var s = (m - Float32(1)) / (m + Float32(1))
    var s2 = s * s
    # atanh(s)/s = 1 + s²/3 + s⁴/5 + s⁶/7 + s⁸/9 + s¹⁰/11
    var q = fma(s2, Floats[w](1.0 / 11.0), Floats[w](1.0 / 9.0))
    q = fma(q, s2, Floats[w](1.0 / 7.0))
    q = fma(q, s2, Floats[w](1.0 / 5.0))
    q = fma(q, s2, Floats[w](1.0 / 3.0))
    var tail = s * s2 * q  # the series past its first term, so the sum rounds once at the end
    var ef = e.cast[DType.float32]()
    var low = fma(ef, Floats[w](LN2_LO), Float32(2) * tail)
    var mid = Float32(2) * s + low
    var y = fma(ef, Floats[w](LN2_HI), mid)
    var undefined = is_nan(x) | x.lt(Float32(0))
    return nan_where(undefined, x.eq(Float32(0)).select(Floats[w](-INF), x.eq(INF).select(x, y)))


@always_inline
def log1p[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """ln(1 + x), accurate for small x: log(u)·x/(u−1) with u = 1 + x (Goldberg's trick)."""
    var u = Float32(1) + x
    var log_u = log(u)
    var special = u.eq(INF) | is_nan(u) | u.lt(Float32(0))  # log(u) answers these itself
    var y = special.select(log_u, canonical(log_u * (x / (u - Float32(1)))))
    return u.eq(Float32(1)).select(x, y)


@always_inline
def exp_minus_magnitude[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """e^−|x|, the one exponential of both sigmoid forms: never above 1, so 1 + e^−|x| never overflows."""
    return exp(x.ge(Float32(0)).select(-x, x))


@always_inline
def sigmoids[w: SIMDLength, //](
    x: SIMD[DType.float32, w]
) -> Tuple[SIMD[DType.float32, w], SIMD[DType.float32, w]]:
    """σ(x) and σ(−x) from one exponential, e = e^−|x|: 1/(1 + e) for the argument ≥ 0 (both, at ±0), and
    e/(1 + e) for the one < 0, exactly as `sigmoid` computes each."""
    var e = exp_minus_magnitude(x)
    var upper = Float32(1) / (Float32(1) + e)
    var lower = canonical(e / (Float32(1) + e))
    return (x.ge(Float32(0)).select(upper, lower), (-x).ge(Float32(0)).select(upper, lower))


@always_inline
def sigmoid[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """1/(1 + e^−x), or e^x/(1 + e^x) for x < 0, so that large |x| never overflows: sigmoids' first value, by the
    one division it selects (the numerator chosen before dividing), not both."""
    var e = exp_minus_magnitude(x)
    return canonical(x.ge(Float32(0)).select(Floats[w](1), e) / (Float32(1) + e))


@always_inline
def softplus[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """ln(1 + e^x) = max(x, 0) + log1p(e^−|x|)."""
    var a = x.ge(Float32(0)).select(x, -x)
    var m = x.gt(Float32(0)).select(x, Floats[w](0))
    return canonical(m + log1p(exp(-a)))


@always_inline
def silu[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """x·σ(x), the MLP activation of both models."""
    return canonical(x * sigmoid(x))


@always_inline
def silu_derivative[w: SIMDLength, //](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """d/dx x·σ(x) = σ(x)·(1 + x·σ(−x)); σ(−x) rather than 1 − σ(x) keeps its low bits."""
    var pair = sigmoids(x)
    return canonical(pair[0] * fma(x, pair[1], Floats[w](1)))
