"""The exact GEMM (issue 12): C = op(A)·op(B), or C += op(A)·op(B), as one rounding of an exact sum.

    C[m, n] = C0[m, n] + RN( 2^(e_m + f_n − 2b) · Σ_k A'[m, k]·B'[k, n] )      (C0 = 0 unless accumulating)
    A'[m, k] = trunc(a(m, k)·2^(b − e_m)),   B'[k, n] = trunc(b(k, n)·2^(b − f_n))

e_m is the exponent of max_k |a(m, k)| (the maximum in [2^(e−1), 2^e)), f_n that of max_k |b(k, n)|, and
b = bits_per_side(K) a function of K alone; RN rounds once to float32, to nearest with ties to even,
keeping subnormals and overflowing to ±inf. An output whose row of A or column of B holds an infinity or
a NaN is the canonical NaN, so a non-finite operand never yields a finite result. The definition and its
accuracy are in docs/numerics.md and python/uform/reference/exact_gemm.py, which these kernels equal bit
for bit. Every step is integer
arithmetic on the operands' float32 bits, so no device, order or split of k can change a bit.

Two kernels, each one body for both launchers:
- `exact_prep`, one task per row of A (or column of B): the line's exponent and its fixed-point values,
  stored as 16-bit limbs, v = high·2^16 + low (0 ≤ low < 2^16), k contiguous.
- `exact_products`, one task per output: the limb products summed over k in int64 (each sum stays below
  2^62 by the choice of b), combined into a 128-bit integer, rounded once.
This SIMT form is the definition's first, plain implementation: the tensor-core form (int8 residues modulo
fixed primes, the Chinese remainder theorem) computes the same integers faster. Layouts as in gemm.mojo.
"""

from std.bit import count_leading_zeros
from std.memory import bitcast
from engine.device import F32Ptr
from engine.launch import Args, DevicePtr, Interface, launch_index
from engine.numerics import CANONICAL_NAN

comptime LIMB = 16  # bits of a fixed-point value's low limb
comptime NON_FINITE = Int32(1 << 30)  # the exponent a line holding an infinity or a NaN records
comptime MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217)  # pairwise coprime, each ≤ 256
comptime MAX_K = 1 << 20  # the longest contraction the definition covers


def moduli_count(K: Int) -> Int:
    """N(K): 11 moduli up to K = 65536, 12 beyond (python/uform/reference/exact_gemm.py says why)."""
    return 11 if K <= 65536 else 12


def bits_per_side(K: Int) -> Int:
    """b = ⌊(⌊log2 P⌋ − 1 − ⌈log2 K⌉) / 2⌋, P the product of the first N(K) moduli: then |X| < K·2^(2b) ≤ P/2."""
    var product = UInt128(1)
    comptime for i in range(len(MODULI)):
        if i < moduli_count(K):
            product *= UInt128(MODULI[i])
    var floor_log2_p = 127 - Int(count_leading_zeros(product))
    var ceil_log2_k = 0 if K == 1 else 64 - Int(count_leading_zeros(UInt64(K - 1)))
    return (floor_log2_p - 1 - ceil_log2_k) // 2

comptime EXACT_PREP = Interface("high low exponents x", "length line_stride element_stride bits", "")


def exact_prep(line: Int, args: Args):
    """Line `line` of x (its elements at x[line·line_stride + i·element_stride], i < length): its exponent
    e (0 for an all-zero line, NON_FINITE for one that holds an infinity or a NaN) and high[line·length + i],
    low[...] = the limbs of trunc(x_i·2^(bits − e))."""
    var high = args.i32(0).unsafe_offset(line * args.size(0))
    var low = args.i32(1).unsafe_offset(line * args.size(0))
    var x = args.f32(3).unsafe_offset(line * args.size(1))
    var length = args.size(0)
    var step = args.size(2)
    var bits = args.size(3)
    var largest = UInt32(0)
    for i in range(length):
        var magnitude = bitcast[DType.uint32](x.unsafe_load(i * step)) & 0x7FFFFFFF
        largest = max(largest, magnitude)  # float32 magnitudes order as their bit patterns do
    if largest >= 0x7F800000:  # an infinity or a NaN: every output of the line is NaN
        args.i32(2).unsafe_store(line, NON_FINITE)
        return
    var e = 0 if largest == 0 else significand_bits(largest) + binade(largest)
    args.i32(2).unsafe_store(line, Int32(e))
    for i in range(length):
        var pattern = bitcast[DType.uint32](x.unsafe_load(i * step))
        var magnitude = pattern & 0x7FFFFFFF
        var shift = binade(magnitude) + bits - e  # x = m·2^binade, so x·2^(bits − e) = m·2^shift
        var m = Int64(significand(magnitude))
        var fixed = m << Int64(shift) if shift >= 0 else (m >> Int64(min(-shift, 63)))
        if pattern >> 31 == 1:
            fixed = -fixed
        high.unsafe_store(i, Int32(fixed >> Int64(LIMB)))
        low.unsafe_store(i, Int32(fixed & Int64((1 << LIMB) - 1)))


@always_inline
def significand(magnitude: UInt32) -> UInt32:
    """m of a float32 magnitude's bits, its value m·2^binade: the hidden bit set unless subnormal."""
    var field = magnitude & 0x7FFFFF
    return field if magnitude >> 23 == 0 else field | 0x800000


@always_inline
def binade(magnitude: UInt32) -> Int:
    """The power of two of the value's last significand bit: −149 for a subnormal, E − 150 for E ≥ 1."""
    var field = Int(magnitude >> 23)
    return -149 if field == 0 else field - 150


@always_inline
def significand_bits(magnitude: UInt32) -> Int:
    """How many bits the significand takes (24 for a normal value)."""
    return 32 - Int(count_leading_zeros(significand(magnitude)))


comptime EXACT_PRODUCTS = Interface("c a_high a_low b_high b_low a_exponents b_exponents", "n k bits accumulate", "")


def exact_products(task: Int, args: Args):
    """Output (m, n) = (task // n, task % n): Σ_k A'[m, k]·B'[k, n] exactly from the limbs (A' rows and B'
    columns each k contiguous), then one rounding, plus C0 when accumulating; NaN for a non-finite line."""
    var N = args.size(0)
    var K = args.size(1)
    var bits = args.size(2)
    var row = task // N
    var column = task % N
    var c = args.f32(0)
    var e = args.i32(5).unsafe_load(row)
    var f = args.i32(6).unsafe_load(column)
    if e == NON_FINITE or f == NON_FINITE:
        c.unsafe_store(task, bitcast[DType.float32](CANONICAL_NAN))
        return
    var a1 = args.i32(1).unsafe_offset(row * K)
    var a0 = args.i32(2).unsafe_offset(row * K)
    var b1 = args.i32(3).unsafe_offset(column * K)
    var b0 = args.i32(4).unsafe_offset(column * K)
    var highs = Int64(0)
    var middles = Int64(0)
    var lows = Int64(0)
    for i in range(K):
        var ah = Int64(a1.unsafe_load(i))
        var al = Int64(a0.unsafe_load(i))
        var bh = Int64(b1.unsafe_load(i))
        var bl = Int64(b0.unsafe_load(i))
        highs += ah * bh
        middles += ah * bl + al * bh
        lows += al * bl
    var total = (Int128(highs) << Int128(2 * LIMB)) + (Int128(middles) << Int128(LIMB)) + Int128(lows)
    var value = rounded(total, 2 * bits - Int(e) - Int(f))
    if args.flag(3):
        value = c.unsafe_load(task) + value
    c.unsafe_store(task, value)


def rounded(x: Int128, shift: Int) -> Float32:
    """x·2^(−shift) rounded once to float32, to nearest with ties to even (subnormals kept, ±inf past the
    largest finite value); +0 for x = 0, and a zero of x's sign for magnitudes below half the smallest
    subnormal."""
    if x == 0:
        return Float32(0)
    var sign = UInt32(0x80000000) if x < 0 else UInt32(0)
    var magnitude = UInt128(-x if x < 0 else x)
    var length = 128 - Int(count_leading_zeros(magnitude))
    var top = length - shift  # the value lies in [2^(top − 1), 2^top)
    if top < -149:
        return bitcast[DType.float32](sign)
    var kept = 24 if top - 1 >= -126 else 24 + (top - 1) + 126  # a subnormal keeps fewer bits
    var dropped = length - kept
    var q: UInt128
    if dropped > 0:
        q = magnitude >> UInt128(dropped)
        var remainder = magnitude - (q << UInt128(dropped))
        var half = UInt128(1) << UInt128(dropped - 1)
        if remainder > half or (remainder == half and (q & 1) == 1):
            q += 1
    else:
        q = magnitude << UInt128(-dropped)
    var exponent = top - 1  # of the value before rounding
    if q == UInt128(1) << UInt128(kept):  # the rounding carried into the next power of two
        exponent += 1
        if kept == 24:
            q >>= 1
    if exponent >= -126 and q >= UInt128(1) << UInt128(23):  # a normal result: 24 significant bits in q
        if exponent > 127:
            return bitcast[DType.float32](sign | 0x7F800000)
        return bitcast[DType.float32](sign | (UInt32(exponent + 127) << 23) | (UInt32(q) & 0x7FFFFF))
    return bitcast[DType.float32](sign | UInt32(q))  # a subnormal: q units of 2^−149


def prep_line(dev: DevicePtr, high: Int, low: Int, exponents: Int, x: F32Ptr, lines: Int, length: Int,
              line_stride: Int, element_stride: Int, bits: Int) raises:
    var args = Args.empty()  # EXACT_PREP
    args.addresses[0] = Int64(high)
    args.addresses[1] = Int64(low)
    args.addresses[2] = Int64(exponents)
    args.addresses[3] = Int64(Int(x))
    args.sizes[0] = Int64(length)
    args.sizes[1] = Int64(line_stride)
    args.sizes[2] = Int64(element_stride)
    args.sizes[3] = Int64(bits)
    launch_index[exact_prep](dev, lines, args)


def workspace_bytes(M: Int, N: Int, K: Int) -> Int:
    """Bytes of the workspace an M×N×K product needs: A's and B's limbs (int32) and exponents (int32)."""
    return 4 * (2 * M * K + 2 * N * K + M + N)


def gemm_exact_on[transpose_a: Bool, transpose_b: Bool](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, accumulate: Bool, workspace: Int,
) raises:
    """The exact product (the module doc); `workspace` holds workspace_bytes(M, N, K)."""
    if K > MAX_K:
        raise Error("gemm_exact: k = ", K, " passes the definition's ", MAX_K)
    var bits = bits_per_side(K)
    var a_high = workspace
    var a_low = a_high + 4 * M * K
    var b_high = a_low + 4 * M * K
    var b_low = b_high + 4 * N * K
    var a_exponents = b_low + 4 * N * K
    var b_exponents = a_exponents + 4 * M
    # A's rows: a(m, k) at m·K + k, or k·M + m stored transposed; B's columns: b(k, n) at k·N + n, or n·K + k.
    prep_line(dev, a_high, a_low, a_exponents, a, M, K, 1 if transpose_a else K, M if transpose_a else 1, bits)
    prep_line(dev, b_high, b_low, b_exponents, b, N, K, K if transpose_b else 1, 1 if transpose_b else N, bits)
    var args = Args.empty()  # EXACT_PRODUCTS
    args.addresses[0] = Int64(Int(c))
    args.addresses[1] = Int64(a_high)
    args.addresses[2] = Int64(a_low)
    args.addresses[3] = Int64(b_high)
    args.addresses[4] = Int64(b_low)
    args.addresses[5] = Int64(a_exponents)
    args.addresses[6] = Int64(b_exponents)
    args.sizes[0] = Int64(N)
    args.sizes[1] = Int64(K)
    args.sizes[2] = Int64(bits)
    args.sizes[3] = Int64(1 if accumulate else 0)
    launch_index[exact_products](dev, M * N, args)
