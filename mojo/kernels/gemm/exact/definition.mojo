"""The exact GEMM's definition and its plain SIMT form: C = op(A)·op(B), or C += op(A)·op(B), as one rounding of an
exact sum.

    C[m, n] = C0[m, n] + RN( 2^(e_m + f_n − 2b) · Σ_k A'[m, k]·B'[k, n] )      (C0 = 0 unless accumulating)
    A'[m, k] = trunc(a(m, k)·2^(b − e_m)),   B'[k, n] = trunc(b(k, n)·2^(b − f_n))

e_m is the exponent of max_k |a(m, k)| (the maximum in [2^(e−1), 2^e)), f_n that of max_k |b(k, n)|, and
b = bits_per_side(K) a function of K alone; RN rounds once to float32, to nearest with ties to even,
keeping subnormals and overflowing to ±inf. An output whose row of A or column of B holds an infinity or
a NaN is the canonical NaN, so a non-finite operand never yields a finite result. The definition and its
accuracy are in docs/numerics.md and python/uform/reference/exact_gemm.py, which these kernels equal bit
for bit. Every step is integer arithmetic on the operands' float32 bits, so no device, order or split of k can
change a bit.

Two kernels, each one body for both launchers:
- `exact_prep`, one task per row of A (or column of B): the line's exponent and its fixed-point values,
  stored as 16-bit limbs, v = high·2^16 + low (0 ≤ low < 2^16), k contiguous.
- `exact_products`, one task per output: the limb products summed over k in int64 (each sum stays below
  2^62 by the choice of b), combined into a 128-bit integer, rounded once.
This SIMT form is the definition's first, plain implementation; the residue form (forms.mojo) computes the same
integers faster. Layouts as in kernels/gemm/fma.mojo.
"""

from std.bit import count_leading_zeros
from std.memory import bitcast
from engine.device import F32Ptr, I32Ptr, i32_at
from engine.launch import Args, DevicePtr, launch_index
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


@fieldwise_init
struct LimbPrep(ImplicitlyCopyable, Movable):
    """exact_prep's operands: lines of x (line l's element i at x[l·line_stride + i·element_stride], i < length) cut
    into the limbs high and low (length int32 a line each) of `bits`-bit fixed-point values, their exponents
    (int32 a line)."""

    var high: I32Ptr
    var low: I32Ptr
    var exponents: I32Ptr
    var x: F32Ptr
    var length: Int
    var line_stride: Int
    var element_stride: Int
    var bits: Int

    @always_inline
    def __init__(out self, args: Args):
        self.high = args.i32(0)
        self.low = args.i32(1)
        self.exponents = args.i32(2)
        self.x = args.f32(3)
        self.length = args.size(0)
        self.line_stride = args.size(1)
        self.element_stride = args.size(2)
        self.bits = args.size(3)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.high))
        args.addresses[1] = Int64(Int(self.low))
        args.addresses[2] = Int64(Int(self.exponents))
        args.addresses[3] = Int64(Int(self.x))
        args.sizes[0] = Int64(self.length)
        args.sizes[1] = Int64(self.line_stride)
        args.sizes[2] = Int64(self.element_stride)
        args.sizes[3] = Int64(self.bits)
        return args


def exact_prep(line: Int, args: Args):
    """Line `line` of x (LimbPrep): its exponent e (0 for an all-zero line, NON_FINITE for one that holds an
    infinity or a NaN) and high[line·length + i], low[...] = the limbs of trunc(x_i·2^(bits − e))."""
    var prep = LimbPrep(args)
    var high = prep.high.unsafe_offset(line * prep.length)
    var low = prep.low.unsafe_offset(line * prep.length)
    var x = prep.x.unsafe_offset(line * prep.line_stride)
    var e = line_exponent(x, prep.length, prep.element_stride)
    prep.exponents.unsafe_store(line, e)
    if e == NON_FINITE:
        return
    for i in range(prep.length):
        var fixed = fixed_point(x.unsafe_load(i * prep.element_stride), prep.bits, Int(e))
        high.unsafe_store(i, Int32(fixed >> Int64(LIMB)))
        low.unsafe_store(i, Int32(fixed & Int64((1 << LIMB) - 1)))


@always_inline
def line_exponent(x: F32Ptr, length: Int, step: Int) -> Int32:
    """e of a line: its largest magnitude lies in [2^(e−1), 2^e); 0 when all zero, NON_FINITE with an
    infinity or a NaN."""
    var largest = UInt32(0)
    for i in range(length):
        var magnitude = bitcast[DType.uint32](x.unsafe_load(i * step)) & 0x7FFFFFFF
        largest = max(largest, magnitude)  # float32 magnitudes order as their bit patterns do
    return exponent_of_largest(largest)


@always_inline
def exponent_of_largest(largest: UInt32) -> Int32:
    """e of a line from the bits of its largest magnitude: 0 when zero, NON_FINITE for an infinity or a NaN."""
    if largest >= 0x7F800000:
        return NON_FINITE
    return Int32(0 if largest == 0 else significand_bits(largest) + Int(binade(largest)))


@always_inline
def fixed_point[w: SIMDLength, //](value: SIMD[DType.float32, w], bits: Int, e: Int) -> SIMD[DType.int64, w]:
    """trunc(value·2^(bits − e)) lane by lane, from the float32 bits: value = ±m·2^binade, so the result is
    ±m·2^shift (shift < 64: for a value of the line, m·2^shift < 2^bits)."""
    var pattern = bitcast[DType.uint32, w](value)
    var magnitude = pattern & 0x7FFFFFFF
    var shift = binade(magnitude) + Int64(bits - e)
    var m = significand(magnitude).cast[DType.int64]()
    var fixed = shift.ge(0).select(m << max(shift, 0), m >> min(max(-shift, 0), 63))
    return (pattern >> 31).eq(1).select(-fixed, fixed)


@always_inline
def significand[w: SIMDLength, //](magnitude: SIMD[DType.uint32, w]) -> SIMD[DType.uint32, w]:
    """m of a float32 magnitude's bits, its value m·2^binade: the hidden bit set unless subnormal."""
    var field = magnitude & 0x7FFFFF
    return (magnitude >> 23).eq(0).select(field, field | 0x800000)


@always_inline
def binade[w: SIMDLength, //](magnitude: SIMD[DType.uint32, w]) -> SIMD[DType.int64, w]:
    """The power of two of the value's last significand bit: −149 for a subnormal, E − 150 for E ≥ 1."""
    var field = (magnitude >> 23).cast[DType.int64]()
    return field.eq(0).select(SIMD[DType.int64, w](-149), field - 150)


@always_inline
def significand_bits(magnitude: UInt32) -> Int:
    """How many bits the significand takes (24 for a normal value)."""
    return 32 - Int(count_leading_zeros(significand(magnitude)))


@fieldwise_init
struct LimbProducts(ImplicitlyCopyable, Movable):
    """exact_products' operands: C (m × n float32) from the limbs of A's rows and B's columns (exact_prep's, k each)
    and their exponents, with `bits` bits a side; `accumulate` adds C's values."""

    var c: F32Ptr
    var a_high: I32Ptr
    var a_low: I32Ptr
    var b_high: I32Ptr
    var b_low: I32Ptr
    var a_exponents: I32Ptr
    var b_exponents: I32Ptr
    var n: Int
    var k: Int
    var bits: Int
    var accumulate: Bool

    @always_inline
    def __init__(out self, args: Args):
        self.c = args.f32(0)
        self.a_high = args.i32(1)
        self.a_low = args.i32(2)
        self.b_high = args.i32(3)
        self.b_low = args.i32(4)
        self.a_exponents = args.i32(5)
        self.b_exponents = args.i32(6)
        self.n = args.size(0)
        self.k = args.size(1)
        self.bits = args.size(2)
        self.accumulate = args.flag(3)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.c))
        args.addresses[1] = Int64(Int(self.a_high))
        args.addresses[2] = Int64(Int(self.a_low))
        args.addresses[3] = Int64(Int(self.b_high))
        args.addresses[4] = Int64(Int(self.b_low))
        args.addresses[5] = Int64(Int(self.a_exponents))
        args.addresses[6] = Int64(Int(self.b_exponents))
        args.sizes[0] = Int64(self.n)
        args.sizes[1] = Int64(self.k)
        args.sizes[2] = Int64(self.bits)
        args.sizes[3] = Int64(1 if self.accumulate else 0)
        return args


def exact_products(task: Int, args: Args):
    """Output (m, n) = (task // n, task % n): Σ_k A'[m, k]·B'[k, n] exactly from the limbs (A' rows and B'
    columns each k contiguous), then one rounding, plus C0 when accumulating; NaN for a non-finite line."""
    var products = LimbProducts(args)
    var N = products.n
    var K = products.k
    var row = task // N
    var column = task % N
    var c = products.c
    var e = products.a_exponents.unsafe_load(row)
    var f = products.b_exponents.unsafe_load(column)
    if e == NON_FINITE or f == NON_FINITE:
        c.unsafe_store(task, bitcast[DType.float32](CANONICAL_NAN))
        return
    var a1 = products.a_high.unsafe_offset(row * K)
    var a0 = products.a_low.unsafe_offset(row * K)
    var b1 = products.b_high.unsafe_offset(column * K)
    var b0 = products.b_low.unsafe_offset(column * K)
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
    var value = rounded(total, 2 * products.bits - Int(e) - Int(f))
    if products.accumulate:
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
    var high = UInt64(magnitude >> 64)
    var low = UInt64(magnitude & 0xFFFFFFFFFFFFFFFF)
    var length = 128 - Int(count_leading_zeros(high)) if high != 0 else 64 - Int(count_leading_zeros(low))
    var top = length - shift  # the value lies in [2^(top − 1), 2^top)
    if top < -149:
        return bitcast[DType.float32](sign)
    var kept = 24 if top - 1 >= -126 else 24 + (top - 1) + 126  # a subnormal keeps fewer bits (0 ≤ kept ≤ 24)
    # The magnitude's leading 64 bits, its leading 1 at bit 63 (in 64-bit words: no 128-bit shifts), and whether
    # a bit below them is set; a magnitude of at most 64 bits is all in `lead`.
    var lead: UInt64
    var below = False
    if high != 0:
        var up = UInt64(128 - length)  # 0 … 63
        lead = high << up | (low >> (64 - up) if up > 0 else 0)
        below = low << up != 0
    else:
        lead = low << UInt64(64 - length)
    var q = lead >> 1 >> UInt64(63 - kept)  # the kept leading bits
    var rest = lead << UInt64(kept)  # the dropped bits of `lead`, left-aligned: half is 2^63
    var half = UInt64(1) << 63
    if rest > half or (rest == half and (below or (q & 1) == 1)):
        q += 1
    var exponent = top - 1  # of the value before rounding
    if q == UInt64(1) << UInt64(kept):  # the rounding carried into the next power of two
        exponent += 1
        if kept == 24:
            q >>= 1
    if exponent >= -126 and q >= UInt64(1) << 23:  # a normal result: 24 significant bits in q
        if exponent > 127:
            return bitcast[DType.float32](sign | 0x7F800000)
        return bitcast[DType.float32](sign | (UInt32(exponent + 127) << 23) | (UInt32(q) & 0x7FFFFF))
    return bitcast[DType.float32](sign | UInt32(q))  # a subnormal: q units of 2^−149


def prep_line(dev: DevicePtr, high: Int, low: Int, exponents: Int, x: F32Ptr, lines: Int, length: Int,
              line_stride: Int, element_stride: Int, bits: Int) raises:
    var prep = LimbPrep(i32_at(high), i32_at(low), i32_at(exponents), x, length, line_stride, element_stride, bits)
    launch_index[exact_prep](dev, lines, prep.args())


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
    var products = LimbProducts(c, i32_at(a_high), i32_at(a_low), i32_at(b_high), i32_at(b_low), i32_at(a_exponents),
                                i32_at(b_exponents), N, K, bits, accumulate)
    launch_index[exact_products](dev, M * N, products.args())
