"""The exact GEMM's definition, executable: the value every device must give, bit for bit.

The identical GEMM wherever the canonical shape rule takes a product (docs/numerics.md; the fma chain below
it): the specification its CPU and tensor-core kernels are checked against, and the measure of its accuracy.
For C = A·B with A M×K and B K×N in float32:

1. Scales from exponents alone. e_i is the exponent of max_k |a_ik| (frexp: max in [2^(e−1), 2^e)), f_j
   that of max_k |b_kj|; an all-zero row or column takes 0.
2. A bit budget from k alone: N(k) moduli of MODULI (11 up to k = 65536, 12 up to 2^20), whose product P
   bounds the exact sum, and b = ⌊(⌊log2 P⌋ − 1 − ⌈log2 k⌉) / 2⌋ bits a side (38 at k = 768, 37 at 4096,
   35 at 65536, 36 at 2^20). N(k) is set by accuracy: with 11 moduli, 99–100 % of the outputs were the
   correctly rounded exact product on every tested distribution (10 gave 75–94 % on the widest), and the
   error is never above the fma chain's (tests/test_exact_gemm_reference.py).
3. Fixed-point operands, truncated toward zero: A'_ik = trunc(a_ik · 2^(b − e_i)), B'_kj = trunc(b_kj ·
   2^(b − f_j)), integers below 2^b in magnitude (exact from the float32 bits).
4. X_ij = Σ_k A'_ik B'_kj exactly, an integer below P/2 in magnitude: no order, so no tiling, split or
   device changes it. (The GPU takes it as residues mod each modulus from int8 tensor-core products, then
   the Chinese remainder theorem; the CPU by any exact integer method.)
5. c_ij = X_ij · 2^(e_i + f_j − 2b) rounded once to float32, to nearest with ties to even (subnormals
   kept, overflow to ±inf); X = 0 gives +0.

6. Non-finite inputs: an output whose row of A or column of B holds an infinity or a NaN is NaN, so a
   non-finite operand (a diverging gradient) never yields a finite result.

A sum of products, Σ_t A_t·B_t (``kernels.gemm_group(summed=True)``: the input's gradient through q, k and v),
is one product of the terms joined along k: ``exact_gemm(np.hstack(as_), np.vstack(bs))``.
"""

from __future__ import annotations

import math

import numpy as np

MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217)
"""Pairwise coprime, each at most 256 so that its symmetric residues are int8."""


MAX_K = 1 << 20
"""The longest contraction the definition covers (a longer one is cut into k ranges by the caller)."""


def moduli_count(k: int) -> int:
    """N(k): how many moduli the product of a k-long contraction takes."""
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k = {k} is outside [1, {MAX_K}]")
    return 11 if k <= 65536 else 12


def bits_per_side(k: int) -> int:
    """b: the bits of each fixed-point operand, so that |X| < k·2^(2b) ≤ P/2."""
    modulus_product = math.prod(MODULI[:moduli_count(k)])
    return (math.floor(math.log2(modulus_product)) - 1 - math.ceil(math.log2(k))) // 2


def fixed_point(x: np.ndarray, axis: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(x', e): x' = trunc(x · 2^(bits − e)) as int64, e the exponent of each max |x| along `axis` (0 for an
    all-zero line), kept as an array that broadcasts against x."""
    x = np.asarray(x, np.float32).astype(np.float64)  # exact
    largest = np.max(np.abs(x), axis=axis, keepdims=True)
    exponent = np.frexp(np.where(largest > 0, largest, 1.0))[1].astype(np.int64)
    return np.trunc(np.ldexp(x, bits - exponent)).astype(np.int64), exponent  # power-of-two scaling: exact


def exact_products(a_fixed: np.ndarray, b_fixed: np.ndarray) -> np.ndarray:
    """Σ_k a'_ik b'_kj exactly, as Python ints: each operand cut into 16-bit limbs, whose products summed
    over k stay below 2^62 in int64 (the high limbs below 2^(b−16), and 2^(2b−32)·k < 2^62 for every k), then
    the limb sums combined in Python's integers."""
    def limbs(v):
        low = v & 0xFFFF  # two's complement: v = high·2^16 + low, 0 ≤ low < 2^16
        return v >> 16, low

    (a1, a0), (b1, b0) = limbs(a_fixed), limbs(b_fixed)
    parts = [(a1 @ b1, 32), (a1 @ b0, 16), (a0 @ b1, 16), (a0 @ b0, 0)]
    total = np.zeros(parts[0][0].shape, dtype=object)
    for part, shift in parts:
        total = total + part.astype(object) * (1 << shift)
    return total


def round_to_float32(x: int, shift: int) -> np.float32:
    """x · 2^(−shift) rounded once to float32, to nearest with ties to even."""
    if x == 0:
        return np.float32(0.0)
    sign, magnitude = (-1, -x) if x < 0 else (1, x)
    top = magnitude.bit_length() - shift  # the value lies in [2^(top−1), 2^top)
    if top < -149:
        return np.float32(sign * 0.0)  # below half the smallest subnormal
    keep = 24 if top - 1 >= -126 else max(0, 24 + (top - 1) + 126)  # a subnormal keeps fewer bits
    drop = magnitude.bit_length() - keep
    if drop > 0:
        quotient, remainder = divmod(magnitude, 1 << drop)
        half = 1 << (drop - 1)
        if remainder > half or (remainder == half and quotient & 1):
            quotient += 1
        magnitude, shift = quotient, shift - drop
    value = math.ldexp(float(magnitude), -shift)  # exact: at most 25 significant bits
    return np.float32(sign * value) if value < 2.0**128 else np.float32(sign * np.inf)


def exact_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A·B as the exact GEMM defines it (the module doc), float32 M×N."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    k = a.shape[1]
    bits = bits_per_side(k)
    finite_rows, finite_columns = np.isfinite(a).all(1), np.isfinite(b).all(0)
    a_fixed, e = fixed_point(np.where(finite_rows[:, None], a, 0), 1, bits)
    b_fixed, f = fixed_point(np.where(finite_columns[None, :], b, 0), 0, bits)
    sums = exact_products(a_fixed, b_fixed)
    shifts = 2 * bits - e - f  # (M, 1) + (1, N)
    out = np.empty(sums.shape, np.float32)
    for index in np.ndindex(out.shape):
        out[index] = round_to_float32(int(sums[index]), int(shifts[index]))
    out[~(finite_rows[:, None] & finite_columns[None, :])] = np.nan
    return out
