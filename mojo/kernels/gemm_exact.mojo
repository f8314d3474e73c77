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
This SIMT form is the definition's first, plain implementation. The residue form computes the same integers
faster (`gemm_exact_residues_on`, what `kernels.gemm_exact(..., residues=True or "fused")` runs): on a GPU int8
residues modulo 11 or 12 pairwise coprime moduli of at most 256, multiplied on the tensor cores (the sections
below, unfused and fused), on the CPU int16 residues modulo 8 primes below 2^12, multiplied by AVX2's vpmaddwd in
a blocked GEMM (the last section); either way the Chinese remainder theorem turns the residues into the integer,
rounded once as here. Layouts as in gemm.mojo.
"""

from std.bit import count_leading_zeros
from std.math import fma
from std.memory import bitcast
from std.collections import Array
from std.sys import inlined_assembly, is_nvidia_gpu, llvm_intrinsic
from std.utils import IndexList
from engine.device import F32Ptr, I32Ptr, f32_at, i32_at
from engine.launch import (Args, DevicePtr, cpu_parallel_for, launch_elements, launch_gpu_mapped_teams,
                           launch_gpu_teams, launch_grouped, launch_index, launch_rows, launch_teams, sync)
from max.gpu import barrier, thread_idx
from max.gpu.compute.mma import (
    WGMMADescriptor, wgmma_async, wgmma_commit_group_sync, wgmma_fence_aligned, wgmma_wait_group_sync,
)
from max.gpu.host import DeviceBuffer
from max.gpu.host.nvidia.tma import TMADescriptor, TensorMapSwizzle, create_tma_descriptor
from max.gpu.memory import (
    AddressSpace, cp_async_bulk_tensor_shared_cluster_global, external_memory, fence_async_view_proxy,
)
from max.gpu.sync import mbarrier_arrive_expect_tx_shared, mbarrier_init
from engine.reduction import row_stride
from max.gpu.primitives.warp import shuffle_down, shuffle_idx, shuffle_xor
from engine.numerics import CANONICAL_NAN, scale_by_power_of_two
from engine.target import HAS_ACCELERATOR, HAS_HOPPER, HAS_NVIDIA
from kernels.gemm import transposed
from kernels.tree_sum import TreeSum, tree_sum
from _cublas.cublas import Algorithm, ComputeType, check_cublas_error, cublasGemmStridedBatchedEx, cublasOperation_t
from _cublas.dtype import DataType
from linalg.matmul.vendor.blas import _get_global_handle

comptime LIMB = 16  # bits of a fixed-point value's low limb
comptime NON_FINITE = Int32(1 << 30)  # the exponent a line holding an infinity or a NaN records
comptime MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217)  # pairwise coprime, each ≤ 256
comptime MAX_K = 1 << 20  # the longest contraction the definition covers


comptime EXACT_MIN_K = 512  # the shortest k (or k range) the identical GEMM takes exactly
comptime EXACT_MIN_SIDE = 512  # the fewest rows, and columns, of a product it takes exactly


def exact_applies(M: Int, N: Int, K: Int, range_length: Int = 0) -> Bool:
    """The identical GEMM's canonical shape rule (docs/numerics.md): an M × N product over K, or over k ranges of
    range_length (L = min(range_length, K), each range a product of its own), is this exact product when
    512 ≤ L ≤ MAX_K and M, N ≥ 512, and the fma chain of kernels/gemm.mojo otherwise, on every device alike. Below
    it the exact form's fixed costs lead: per output a reconstruction of about 150 integer operations (as many as
    768·11 int8 products), per operand value the residues of 11 moduli, and few tiles to spread them (on the
    H200 the byte LM's large shape, 8192 × 256 over 512, ran its products exact at half the fma chain's speed)."""
    var L = min(range_length, K) if range_length > 0 else K
    return EXACT_MIN_K <= L <= MAX_K and M >= EXACT_MIN_SIDE and N >= EXACT_MIN_SIDE


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


# ---- the residue form: residues modulo coprime moduli, then the Chinese remainder theorem --------------------
#
# X = Σ_k A'·B' is found from its residues modulo the first N(K) MODULI, whose product P exceeds 2|X|:
# each operand is kept as N int8 residue planes (its symmetric residues, |r| ≤ 128), a plane product sums
# int8 × int8 in int32 (exact; chunks of RESIDUE_CHUNK k keep |Σ| ≤ 2^30), and the Chinese remainder theorem's
# weighted sum, X = Σ r_i·W_i − q·P (crt_round proves it), turns the N residues of X into X. One product runs,
# in order: each operand's line exponents (line_exponents, a GPU warp a line, for a transposed operand over
# its partial_maxima), its residue planes (exact_residues, a task a line and group of 16 k, or for a transposed
# operand exact_residues_across, a team a tile of lines; many contiguous lines take both in one pass,
# exact_line_planes, a GPU half-warp a line), the plane products (one strided batched cuBLAS int8
# GEMM a chunk of k) and crt_round, a thread an output; or, in the fused form (the section after them), the plane
# products and the reconstruction as one kernel. Every body is integer arithmetic in 32 bits where the values
# allow. The CPU runs the same exponent passes and reconstruction over its own moduli (the section at the end).

comptime RESIDUE_CHUNK = 1 << 16  # k of one int32 residue sum: 2^16 products of at most 2^14 each
comptime RESIDUE_ALIGNMENT = 16  # a residue line's length is padded (with zeros) to a multiple of 16 bytes


def padded(K: Int) -> Int:
    """The stored length of a residue line of K values."""
    return (K + RESIDUE_ALIGNMENT - 1) // RESIDUE_ALIGNMENT * RESIDUE_ALIGNMENT


def inverse_mod(a: Int, p: Int) -> Int:
    """a⁻¹ mod p for coprime a and p (extended Euclid); evaluated at compile time for the MODULI."""
    var t = 0
    var next_t = 1
    var r = p
    var next_r = a % p
    while next_r != 0:
        var q = r // next_r
        var saved_t = t - q * next_t
        t = next_t
        next_t = saved_t
        var saved_r = r - q * next_r
        r = next_r
        next_r = saved_r
    return t % p


comptime I8Ptr = Pointer[Int8, MutUntrackedOrigin]
comptime EXPONENT_READS = 8  # loads largest_magnitude keeps in flight a thread


@always_inline
def largest_magnitude(x: F32Ptr, begin: Int, end: Int, stride: Int, step: Int) -> UInt32:
    """The bits of the largest magnitude among elements begin, begin + stride, … below `end` of a line (element i
    at x[i·step]). The reads go EXPONENT_READS at a time into as many maxima, so that a GPU thread has that many
    loads in flight; a maximum of bit patterns, so any order gives the same bits."""
    var maxima = SIMD[DType.uint32, EXPONENT_READS](0)
    var i = begin
    while i + (EXPONENT_READS - 1) * stride < end:
        comptime for j in range(EXPONENT_READS):
            maxima[j] = max(maxima[j], bitcast[DType.uint32](x.unsafe_load((i + j * stride) * step)) & 0x7FFFFFFF)
        i += EXPONENT_READS * stride
    for rest in range(i, end, stride):
        maxima[0] = max(maxima[0], bitcast[DType.uint32](x.unsafe_load(rest * step)) & 0x7FFFFFFF)
    return maxima.reduce_max()


@fieldwise_init
struct LineExponents(ImplicitlyCopyable, Movable):
    """line_exponents' operands: the exponents (int32 a line) of lines of x, laid out as LimbPrep's; with
    `magnitudes`, the bits of each line's largest magnitude instead."""

    var exponents: I32Ptr
    var x: F32Ptr
    var length: Int
    var line_stride: Int
    var element_stride: Int
    var magnitudes: Bool

    @always_inline
    def __init__(out self, args: Args):
        self.exponents = args.i32(0)
        self.x = args.f32(1)
        self.length = args.size(0)
        self.line_stride = args.size(1)
        self.element_stride = args.size(2)
        self.magnitudes = args.flag(3)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.exponents))
        args.addresses[1] = Int64(Int(self.x))
        args.sizes[0] = Int64(self.length)
        args.sizes[1] = Int64(self.line_stride)
        args.sizes[2] = Int64(self.element_stride)
        args.sizes[3] = Int64(1 if self.magnitudes else 0)
        return args


def line_exponents[warp: Bool](line: Int, lane: Int, args: Args):
    """exponents[line] = e of line `line` of x (LineExponents), as line_exponent finds it: taken by one caller, or
    by a GPU warp whose thread `lane` reads elements lane, lane + 32, … and whose lanes then meet by shuffles (a
    maximum of bit patterns, so any order gives the same e). With `magnitudes`, the bits of the line's largest
    magnitude instead (joined_line_exponents)."""
    var lines = LineExponents(args)
    var x = lines.x.unsafe_offset(line * lines.line_stride)
    var largest = largest_magnitude(x, lane, lines.length, row_stride[warp](), lines.element_stride)
    comptime if warp:
        comptime for level in range(5):
            largest = max(largest, shuffle_down(largest, UInt32(16 >> level)))
    if lane == 0:
        lines.exponents.unsafe_store(line, Int32(largest) if lines.magnitudes else exponent_of_largest(largest))


comptime EXPONENT_BLOCK = 64  # k one partial_maxima task reads
@fieldwise_init
struct PartialMaxima(ImplicitlyCopyable, Movable):
    """partial_maxima's operands: the bits of the largest magnitudes (int32) of blocks of EXPONENT_BLOCK k of `lines`
    lines of x, laid out as LimbPrep's; with k cut into `ranges` equal ranges of per_range blocks, in ranges. A
    block's maxima of the lines lie `apart` apart: `lines`, or more where these lines are some of an operand's
    joined along its lines (ranges_fused), whose place the caller's `partial` gives."""

    var partial: I32Ptr
    var x: F32Ptr
    var length: Int
    var line_stride: Int
    var element_stride: Int
    var lines: Int
    var ranges: Int
    var per_range: Int
    var apart: Int

    @always_inline
    def __init__(out self, args: Args):
        self.partial = args.i32(0)
        self.x = args.f32(1)
        self.length = args.size(0)
        self.line_stride = args.size(1)
        self.element_stride = args.size(2)
        self.lines = args.size(3)
        self.ranges = args.size(4)
        self.per_range = args.size(5)
        self.apart = args.size(6)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.partial))
        args.addresses[1] = Int64(Int(self.x))
        args.sizes[0] = Int64(self.length)
        args.sizes[1] = Int64(self.line_stride)
        args.sizes[2] = Int64(self.element_stride)
        args.sizes[3] = Int64(self.lines)
        args.sizes[4] = Int64(self.ranges)
        args.sizes[5] = Int64(self.per_range)
        args.sizes[6] = Int64(self.apart)
        return args


def partial_maxima(task: Int, args: Args):
    """For lines whose elements lie `lines` apart (a transposed operand, neighbouring lines side by side): task
    b·lines + line finds the largest magnitude's bits among elements [64b, 64(b + 1)) of line `line`
    (EXPONENT_BLOCK), so neighbouring tasks read neighbouring floats and a long line spreads over many tasks. It
    stores them at partial[b·apart + line]; or, with k cut into equal ranges of per_range blocks, block j of range
    r at partial[(j·ranges + r)·apart + line], so that range r's maxima of a line lie ranges·apart apart from
    r·apart + line on (exponents_of_maxima's layout: a range of a line is a line of maxima)."""
    var maxima = PartialMaxima(args)
    var lines = maxima.lines
    var per_range = maxima.per_range
    var line = task % lines
    var b = task // lines
    var first = b * EXPONENT_BLOCK
    var x = maxima.x.unsafe_offset(line * maxima.line_stride)
    var index = b * maxima.apart + line
    if per_range > 0:
        index = (b % per_range * maxima.ranges + b // per_range) * maxima.apart + line
    var end = min(maxima.length, first + EXPONENT_BLOCK)
    maxima.partial.unsafe_store(index, Int32(largest_magnitude(x, first, end, 1, maxima.element_stride)))


comptime RESIDUE_GROUP = 16  # k values a residue task converts: one 16-byte store per modulus
@fieldwise_init
struct ResiduePlanes(ImplicitlyCopyable, Movable):
    """The residue passes' operands (exact_residues, exact_line_planes, exact_residues_across): `lines` lines of x,
    laid out as LimbPrep's, cut with their exponents (int32 a line, or with k cut into ranges of range_length a
    range of a line: exponent_at) into `bits`-bit fixed-point values, whose int8 residues go to `residues` (line l's
    residues modulo MODULI[i] at line i·plane_lines + l of plane_line bytes). plane_lines is `lines`, or more where
    these lines are some of an operand's joined along its lines (ranges_fused); the caller's `residues` and
    `exponents` then give their place, as `residues` gives where a term's k begin in a line (joined_planes)."""

    var residues: I8Ptr
    var exponents: I32Ptr
    var x: F32Ptr
    var length: Int
    var line_stride: Int
    var element_stride: Int
    var bits: Int
    var lines: Int
    var range_length: Int
    var plane_line: Int
    var plane_lines: Int

    @always_inline
    def __init__(out self, args: Args):
        self.residues = I8Ptr(unsafe_from_address=Int(args.addresses[0]))
        self.exponents = args.i32(1)
        self.x = args.f32(2)
        self.length = args.size(0)
        self.line_stride = args.size(1)
        self.element_stride = args.size(2)
        self.bits = args.size(3)
        self.lines = args.size(4)
        self.range_length = args.size(5)
        self.plane_line = args.size(6)
        self.plane_lines = args.size(7)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.residues))
        args.addresses[1] = Int64(Int(self.exponents))
        args.addresses[2] = Int64(Int(self.x))
        args.sizes[0] = Int64(self.length)
        args.sizes[1] = Int64(self.line_stride)
        args.sizes[2] = Int64(self.element_stride)
        args.sizes[3] = Int64(self.bits)
        args.sizes[4] = Int64(self.lines)
        args.sizes[5] = Int64(self.range_length)
        args.sizes[6] = Int64(self.plane_line)
        args.sizes[7] = Int64(self.plane_lines)
        return args

    @always_inline
    def line(self, line: Int) -> F32Ptr:
        """Where line `line` of x begins."""
        return self.x.unsafe_offset(line * self.line_stride)

    @always_inline
    def exponent_at(self, line: Int, k: Int) -> Int32:
        """The exponent that element k of line `line` is cut with: the line's, or with k cut into ranges of
        range_length (a product per range) its range's, at exponents[range·plane_lines + line]."""
        var index = line if self.range_length == 0 else k // self.range_length * self.plane_lines + line
        return self.exponents.unsafe_load(index)

    @always_inline
    def residue_line(self, i: Int, line: Int) -> I8Ptr:
        """Where the residues of line `line` modulo MODULI[i] begin."""
        return self.residues.unsafe_offset((i * self.plane_lines + line) * self.plane_line)

    @always_inline
    def store_residues[moduli: Int](self, line: Int, first: Int, group: FixedGroup):
        """The symmetric residues of a group of fixed-point values (k [first, first + 16) of line `line`) modulo
        each of the first `moduli` MODULI into their planes."""
        comptime for i in range(moduli):
            self.residue_line(i, line).unsafe_store[width=RESIDUE_GROUP, alignment=RESIDUE_GROUP](
                first, group.residues[MODULI[i]]()
            )


@always_inline
def quotient_below_2_31[w: SIMDLength, //, p: Int](x: SIMD[DType.uint32, w]) -> SIMD[DType.uint32, w]:
    """⌊x/p⌋ for 0 ≤ x < 2^31 and 2 ≤ p ≤ 2^12, by one 64-bit multiply (no 64-bit division, which a GPU
    emulates): with s = 31 + ⌈log2 p⌉ (39 for 128 < p ≤ 256), m = ⌈2^s/p⌉ ≤ 2^32 and m·p = 2^s + d (0 ≤ d < p),
    x·m/2^s = x/p + x·d/(p·2^s) lies in [x/p, x/p + 1/p) (x·d < 2^31·p ≤ 2^s), so its floor is ⌊x/p⌋ (x/p's
    fraction is at most (p − 1)/p)."""
    comptime s = 95 - Int(count_leading_zeros(UInt64(p - 1)))  # 31 + ⌈log2 p⌉
    comptime m = ((1 << s) + p - 1) // p
    return ((x.cast[DType.uint64]() * UInt64(m)) >> UInt64(s)).cast[DType.uint32]()


@always_inline
def remainder_below_2_31[w: SIMDLength, //, p: Int](x: SIMD[DType.uint32, w]) -> SIMD[DType.uint32, w]:
    """x mod p for 0 ≤ x < 2^31 and 2 ≤ p ≤ 2^12 (quotient_below_2_31)."""
    return x - quotient_below_2_31[p](x) * UInt32(p)


comptime SPLIT = 27  # fixed-point values are split as v = high·2^27 + low


@fieldwise_init
struct FixedGroup(ImplicitlyCopyable, Movable):
    """RESIDUE_GROUP fixed-point values v = high·2^SPLIT + low, high and low carrying v's sign: |high| < 2^16 and
    |low| < 2^27 (|v| < 2^bits ≤ 2^43), so that a residue takes 32-bit arithmetic only."""

    var high: SIMD[DType.int32, RESIDUE_GROUP]
    var low: SIMD[DType.int32, RESIDUE_GROUP]

    @staticmethod
    @always_inline
    def of(values: SIMD[DType.float32, RESIDUE_GROUP], bits: Int, e: Int) -> FixedGroup:
        """The words of trunc(value·2^(bits − e)) (fixed_point's values), from the float32 bits in 32-bit words:
        value = ±m·2^binade, so |v| = m·2^s with s = binade + bits − e ≤ 42 (m·2^s < 2^bits), truncated to m >> −s
        for s < 0. high = m·2^(s − 27) for s ≥ 27, else m >> (27 − s) (0 for s ≤ 3, m < 2^24); low = (m << s) mod
        2^27 for s ≥ 0 (a 32-bit shift keeps the low 27 bits; 0 for s ≥ 27), else m >> −s. Each is one left and one
        right shift, the one not wanted by 0, each right shift clamped to [0, 31] (a right shift by 31 leaves 0 of m,
        as the exact one would) and high's left shift at most 15 (s ≤ 42), so no select and no shift out of
        range. On an NVIDIA GPU the same words by float32 arithmetic instead (scaled_words)."""
        comptime if is_nvidia_gpu():
            return FixedGroup.scaled_words(values, bits, e)
        var pattern = bitcast[DType.uint32, RESIDUE_GROUP](values)
        var magnitude = pattern & 0x7FFFFFFF
        var field = (magnitude >> 23).cast[DType.int32]()
        var m = significand(magnitude).cast[DType.int32]()
        var s = max(field, 1) + Int32(bits - e - 150)  # binade = max(field, 1) − 150
        var high = (m << max(s - SPLIT, 0)) >> min(max(SPLIT - s, 0), 31)
        var low = ((m << min(max(s, 0), 31)) & ((1 << SPLIT) - 1)) >> min(max(-s, 0), 31)
        var sign = bitcast[DType.int32, RESIDUE_GROUP](pattern) >> 31  # 0, or −1 for a negative value
        return FixedGroup((high ^ sign) - sign, (low ^ sign) - sign)

    @staticmethod
    @always_inline
    def scaled_words(values: SIMD[DType.float32, RESIDUE_GROUP], bits: Int, e: Int) -> FixedGroup:
        """`of`'s words by float32 operations, each exact, on the FMA pipes that the residues' integer work leaves
        idle (the integer form's shifts and clamps kept the residue passes bound by the integer pipes):
        - V = value·2^(bits − e) by numerics.scale_by_power_of_two's two multiplies by powers of two, exact
          unless the first product is subnormal, and then |V| < 1 and its words are 0 either way (|value| < 2^e,
          so |V| < 2^bits; the clamp to its range only matters for a non-finite line's zeros).
        - H = RZ(V·2^−27 ± 2^23), the magic number taking V's sign: a sum of magnitude in [2^23, 2^24), whose
          units are whole, rounded toward zero, so H ∓ 2^23 = trunc(V/2^27) = high (|high| < 2^16), exactly.
        - L = V − high·2^27 (one fma): the part of V below 2^27, of V's sign, exact (its significant bits are
          V's); low = trunc(L), the float-to-integer conversion.
        trunc(V) = high·2^27 + trunc(L), as `of` splits it."""
        comptime unit = Float32(1 << SPLIT)
        var v = scale_by_power_of_two(values, SIMD[DType.int32, RESIDUE_GROUP](min(max(bits - e, -252), 252)))
        var signs = bitcast[DType.uint32, RESIDUE_GROUP](v) & 0x80000000
        var magic = bitcast[DType.float32, RESIDUE_GROUP](signs | bitcast[DType.uint32](Float32(1 << 23)))
        var rounded = SIMD[DType.float32, RESIDUE_GROUP](0)
        comptime for j in range(RESIDUE_GROUP):
            rounded[j] = inlined_assembly["fma.rz.f32 $0, $1, $2, $3;", Float32, constraints="=f,f,f,f"](
                v[j], 1 / unit, magic[j]
            )
        var high = rounded - magic
        var low = high.fma(SIMD[DType.float32, RESIDUE_GROUP](-unit), v)
        return FixedGroup(high.cast[DType.int32](), low.cast[DType.int32]())

    @always_inline
    def residues[p: Int, dtype: DType = DType.int8](self) -> SIMD[dtype, RESIDUE_GROUP]:
        """The symmetric residues of the values modulo p, −⌊p/2⌋ … ⌈p/2⌉ − 1 (inside int8 for the MODULI, int16 for
        the WIDE_MODULI). For p = 256, low's low byte (v ≡ low mod 2^27, and the byte read as int8 is the residue in
        [−128, 128)). Else, with h = ⌊p/2⌋: x = high·(2^27 mod p) + low ≡ v (mod p), |x| < 2^16·p + 2^27; a lift
        L, a multiple of p and of 2^16 above |x|, makes y = x + L + h lie in [0, 2^30), and with q = ⌊y/p⌋,
        y − q·p = (v + h) mod p, so x − q·p ≡ r = ((v + h) mod p) − h (mod 2^16), which int8 and int16 keep. q as
        quotient_below_2_31 finds it, with s = 30 + ⌈log2 p⌉ (y < 2^30, so y·d < 2^s) and m = ⌈2^s/p⌉ < 2^31: one
        signed 32 × 32-bit multiply-add into 64 bits, x·m + (L + h)·m, and a shift: four operations a value and modulus.
        (The same residues in exact float32 arithmetic, on the pipes this integer work leaves idle, ran 12 % slower
        on the H200: bench/RESULTS.md, 2026-11-30 09:53.)"""
        comptime if p == 256:
            return self.low.cast[DType.int8]().cast[dtype]()
        comptime half = p // 2
        comptime lift = p * (1 << 16) * (1 + ((1 << 11) + p - 1) // p)  # ≥ 2^16·p + 2^27
        comptime assert 2 * lift + half < (1 << 30), "the lifted value passes 2^30"
        comptime s = 94 - Int(count_leading_zeros(UInt64(p - 1)))  # 30 + ⌈log2 p⌉
        comptime m = ((1 << s) + p - 1) // p
        var x = self.high * Int32((1 << SPLIT) % p) + self.low
        var q = ((x.cast[DType.int64]() * Int64(m) + Int64((lift + half) * m)) >> Int64(s)).cast[DType.int32]()
        return (x - q * Int32(p)).cast[dtype]()


@always_inline
def group_values(x: F32Ptr, step: Int, length: Int, first: Int) -> SIMD[DType.float32, RESIDUE_GROUP]:
    """Elements [first, first + 16) of a line (element k at x[k·step]), zero past `length`. A whole group of
    contiguous elements is one load (four 16-byte loads on a GPU where the group is so aligned, not sixteen of 4
    bytes); else lane by lane, each lane's index a constant (a lane indexed at run time goes through memory)."""
    var values = SIMD[DType.float32, RESIDUE_GROUP](0)
    if step == 1 and first + RESIDUE_GROUP <= length:
        var group = x.unsafe_offset(first)
        if Int(group) % 16 == 0:
            values = group.unsafe_load[width=RESIDUE_GROUP, alignment=16]()
        else:
            values = group.unsafe_load[width=RESIDUE_GROUP]()
    else:
        comptime for j in range(RESIDUE_GROUP):
            if first + j < length:
                values[j] = x.unsafe_load((first + j) * step)
    return values


@always_inline
def fixed_group(x: F32Ptr, step: Int, length: Int, first: Int, bits: Int, e: Int32) -> FixedGroup:
    """The fixed-point values of elements [first, first + 16) of a line (group_values; e its exponent): zero past
    `length` and for a non-finite line."""
    var values = SIMD[DType.float32, RESIDUE_GROUP](0)
    if e != NON_FINITE:
        values = group_values(x, step, length, first)
    return FixedGroup.of(values, bits, Int(e))


def exact_residues[moduli: Int](task: Int, args: Args):
    """For lines whose elements are contiguous (element_stride 1): task line·groups + g takes k values
    [16g, 16g + 16) of line `line` of x (as exact_prep takes it, cut with exponent_at's e) and stores the symmetric
    residues of their fixed-point values modulo each of the first `moduli` MODULI at
    residues[(i·plane_lines + line)·plane_line + k] (int8; the padding, and every residue of a non-finite line,
    zero), so a line's groups lie side by side (plane_line: padded(length), or longer where the line is one part of
    a concatenated k, which starts where the caller's `residues` points: gemm_exact_summed_on)."""
    var planes = ResiduePlanes(args)
    var groups = padded(planes.length) // RESIDUE_GROUP
    # a 32-bit division where the index allows it: a GPU emulates the 64-bit one in ~70 instructions
    var line = Int(UInt32(task) // UInt32(groups)) if task < (1 << 31) else task // groups
    var first = (task - line * groups) * RESIDUE_GROUP
    var e = planes.exponent_at(line, first)
    planes.store_residues[moduli](line, first, fixed_group(planes.line(line), 1, planes.length, first, planes.bits, e))


comptime LINE_LANES = 16  # GPU threads that share a line in exact_line_planes: a half-warp (a line of 768 is 48
# groups of 16 k, 3 a lane)
comptime LINE_PLANES_MIN_LINES = 8192  # the fewest lines that take exact_line_planes: 2^17 threads, about half of
# what an H100's or H200's multiprocessors hold; fewer lines (weights, a long k over few lines) keep the two passes,
# whose tasks are a line's groups, so that a long line still spreads over many threads


def exact_line_planes[moduli: Int, lanes: Int](line: Int, lane: Int, args: Args):
    """line_exponents and exact_residues in one pass over a line whose elements are contiguous (element_stride 1, no
    k ranges, the planes' lines these; ResiduePlanes): `lanes` threads take the line (LINE_LANES on a GPU, a
    half-warp; 1 on the CPU, where launch_grouped needs a body but no product calls it: the CPU's exact GEMM cuts
    its own planes, wide_planes), lane l its groups of 16 k l, l + lanes, …; they find the line's largest magnitude
    (shuffled among the 16 lanes: a maximum of bit patterns, so any order gives line_exponents' bits), store its
    exponent at exponents[line], then read their groups again (from the caches now) and store their residues. One
    read of the line from memory instead of two (the exponents' kernel's and the residues')."""
    comptime assert lanes == 1 or lanes == LINE_LANES, "a line is a half-warp's or one caller's"
    var planes = ResiduePlanes(args)
    var length = planes.length
    var x = planes.line(line)
    var groups = padded(length) // RESIDUE_GROUP
    var largest = UInt32(0)
    for g in range(lane, groups, lanes):
        var magnitudes = bitcast[DType.uint32, RESIDUE_GROUP](group_values(x, 1, length, g * RESIDUE_GROUP))
        largest = max(largest, (magnitudes & 0x7FFFFFFF).reduce_max())
    comptime if lanes > 1:
        # xor 8, 4, 2, 1 stay within the half-warp; where the lines end mid-warp the other half has exited, which the
        # shuffles do not wait for (group_kernel)
        comptime assert LINE_LANES == 16, "four levels of shuffles"
        comptime for level in range(4):
            largest = max(largest, shuffle_xor(largest, UInt32(LINE_LANES >> (level + 1))))
    var e = exponent_of_largest(largest)
    if lane == 0:
        planes.exponents.unsafe_store(line, e)
    for g in range(lane, groups, lanes):
        planes.store_residues[moduli](line, g * RESIDUE_GROUP, fixed_group(x, 1, length, g * RESIDUE_GROUP,
                                                                           planes.bits, e))


def whole_line_planes[moduli: Int](line: Int, args: Args):
    """exact_line_planes as one call a line, the CPU body launch_grouped takes (no CPU product calls it)."""
    exact_line_planes[moduli, 1](line, 0, args)


comptime TILE_LINES = 32  # lines of one exact_residues_across tile: a warp's reads span 32 neighbouring lines
comptime TILE_GROUPS = 4  # groups of 16 k of one tile
comptime TILE_TEAM = TILE_LINES * TILE_GROUPS  # threads a tile
comptime TILE_ROW = TILE_GROUPS * RESIDUE_GROUP + 16  # bytes of a tile line's residues in the scratch, padded
comptime TILE_TEAMS_PER_SM = 7  # a budget of 73 registers a thread (the default 2 left it 255, 12 % occupancy); 8
# would take 64 registers without spills, but 8 tiles' scratch (and the 1 KB a block reserves) pass 228 KB


def tile_scratch_floats(moduli: Int) -> Int:
    """The scratch one tile's residues take: `moduli` planes of TILE_LINES rows of TILE_ROW bytes."""
    return moduli * TILE_LINES * TILE_ROW // 4


def exact_residues_across[moduli: Int, played: Int, space: AddressSpace](
    task: Int, first: Int, args: Args, scratch: Pointer[Float32, MutUntrackedOrigin, address_space=space]
):
    """exact_residues' values for lines whose elements lie `lines` apart (neighbouring lines side by side: a
    transposed operand), a tile of 32 lines × 64 k a team of 128 threads (task = tile of k · line tiles + tile
    of lines). Thread t converts line t mod 32 of the tile at group t ÷ 32, so a warp reads 32 neighbouring
    floats at once, into the scratch (each modulus a plane of 32 rows of TILE_ROW bytes, padded so that 8
    neighbouring rows' 16-byte stores hit different banks); after the barrier thread t stores 16 bytes of row
    t ÷ 4 at group t mod 4 of each plane, so 4 threads write 64 contiguous bytes of a line."""
    var planes = ResiduePlanes(args)
    var lines = planes.lines
    var groups = padded(planes.length) // RESIDUE_GROUP
    var line_tiles = (lines + TILE_LINES - 1) // TILE_LINES
    var first_line = task % line_tiles * TILE_LINES
    var first_group = task // line_tiles * TILE_GROUPS
    var rows = scratch.bitcast[Int8]()
    for p in range(played):
        var thread = first + p
        var line = first_line + thread % TILE_LINES
        var g = first_group + thread // TILE_LINES
        if line < lines and g < groups:
            var e = planes.exponent_at(line, g * RESIDUE_GROUP)
            var group = fixed_group(planes.line(line), planes.element_stride, planes.length, g * RESIDUE_GROUP,
                                    planes.bits, e)
            var at = thread % TILE_LINES * TILE_ROW + thread // TILE_LINES * RESIDUE_GROUP
            comptime for i in range(moduli):
                rows.unsafe_store[width=RESIDUE_GROUP, alignment=RESIDUE_GROUP](
                    i * TILE_LINES * TILE_ROW + at, group.residues[MODULI[i]]()
                )
    sync[played]()
    for p in range(played):
        var thread = first + p
        var row = thread // TILE_GROUPS
        var line = first_line + row
        var g = first_group + thread % TILE_GROUPS
        if line < lines and g < groups:
            comptime for i in range(moduli):
                var values = rows.unsafe_load[width=RESIDUE_GROUP, alignment=RESIDUE_GROUP](
                    i * TILE_LINES * TILE_ROW + row * TILE_ROW + thread % TILE_GROUPS * RESIDUE_GROUP
                )
                planes.residue_line(i, line).unsafe_store[width=RESIDUE_GROUP, alignment=RESIDUE_GROUP](
                    g * RESIDUE_GROUP, values
                )


@fieldwise_init
struct CrtRound(ImplicitlyCopyable, Movable):
    """crt_round's operands: C (m × n float32) from the plane products' int32 sums (a plane of m·n a modulus and
    chunk of k) and the exponents of A's rows and B's columns, with `bits` bits a side; `accumulate` adds C's
    values."""

    var c: F32Ptr
    var sums: I32Ptr
    var a_exponents: I32Ptr
    var b_exponents: I32Ptr
    var m: Int
    var n: Int
    var k: Int
    var bits: Int
    var accumulate: Bool

    @always_inline
    def __init__(out self, args: Args):
        self.c = args.f32(0)
        self.sums = args.i32(1)
        self.a_exponents = args.i32(2)
        self.b_exponents = args.i32(3)
        self.m = args.size(0)
        self.n = args.size(1)
        self.k = args.size(2)
        self.bits = args.size(3)
        self.accumulate = args.flag(4)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.c))
        args.addresses[1] = Int64(Int(self.sums))
        args.addresses[2] = Int64(Int(self.a_exponents))
        args.addresses[3] = Int64(Int(self.b_exponents))
        args.sizes[0] = Int64(self.m)
        args.sizes[1] = Int64(self.n)
        args.sizes[2] = Int64(self.k)
        args.sizes[3] = Int64(self.bits)
        args.sizes[4] = Int64(1 if self.accumulate else 0)
        return args


def modulus[wide: Bool, i: Int]() -> Int:
    """Modulus i of the GPU's set (MODULI) or of the CPU's (WIDE_MODULI)."""
    comptime if wide:
        return WIDE_MODULI[i]
    else:
        return MODULI[i]


def crt_cofactor_inverse[wide: Bool, moduli: Int, i: Int]() -> Int:
    """c_i = (P/p_i)⁻¹ mod p_i, P the product of the first `moduli` moduli of the set."""
    var cofactor = 1  # P/p_i mod p_i
    comptime for j in range(moduli):
        if j != i:
            cofactor = cofactor * modulus[wide, j]() % modulus[wide, i]()
    return inverse_mod(cofactor, modulus[wide, i]())


def crt_weight[wide: Bool, moduli: Int, i: Int]() -> UInt128:
    """W_i = (P/p_i)·c_i: ≡ 1 modulo p_i, ≡ 0 modulo the other moduli, below P (c_i < p_i)."""
    var cofactor = UInt128(1)
    comptime for j in range(moduli):
        if j != i:
            cofactor *= UInt128(modulus[wide, j]())
    return cofactor * UInt128(crt_cofactor_inverse[wide, moduli, i]())


def crt_fraction[wide: Bool, moduli: Int, i: Int]() -> UInt64:
    """⌊2^32·c_i/p_i⌋: W_i/P = c_i/p_i in 32-bit fixed point, rounded down."""
    return (UInt64(crt_cofactor_inverse[wide, moduli, i]()) << 32) // UInt64(modulus[wide, i]())


def modulus_product[wide: Bool, moduli: Int]() -> UInt128:
    """P, the product of the first `moduli` moduli of the set."""
    var product = UInt128(1)
    comptime for i in range(moduli):
        product *= UInt128(modulus[wide, i]())
    return product


def word(x: UInt128, w: Int) -> UInt64:
    """32-bit word w of x (word 0 the lowest)."""
    return UInt64((x >> UInt128(32 * w)) & 0xFFFFFFFF)


comptime CRT_BITS = 96  # X is found modulo 2^96: P < 2^96 for either set, so |X| < P/2 < 2^95 fixes it


def crt_round[moduli: Int, wide: Bool, w: SIMDLength](output: Int, args: Args):
    """Outputs [output, output + w) (each (m, n) = (o // N, o % N), a lane each: a GPU thread takes one
    (launch_elements' gpu_lanes 1), the CPU 8): their residues r_i, then crt_store. On a GPU (the MODULI) r_i is
    the chunk sums of plane product i, each reduced by chunk_residue to a value below 2p_i, summed over the
    chunks (0 ≤ r_i < 16·512 = 2^13); on the CPU (`wide`: the WIDE_MODULI, wide_rows) the plane product's sum, a
    value below 2^25 congruent to X, reduced (0 ≤ r_i < p_i < 2^12). All sums of one chunk are loaded at once
    (they are independent)."""
    var crt = CrtRound(args)
    var M = crt.m
    var N = crt.n
    var chunks = 1 if wide else (crt.k + RESIDUE_CHUNK - 1) // RESIDUE_CHUNK
    var sums = crt.sums.unsafe_offset(output)
    var residues = SIMD[DType.uint32, 16 * w](0)  # residue i of lane j at i·w + j
    for chunk in range(chunks):
        comptime for i in range(moduli):
            var sum = sums.unsafe_load[width=w]((i * chunks + chunk) * M * N)
            var r: SIMD[DType.uint32, w]
            comptime if wide:
                r = remainder_below_2_31[modulus[True, i]()](sum.cast[DType.uint32]())
            else:
                r = chunk_residue[MODULI[i]](sum)
            residues = residues.insert[offset = i * w](residues.slice[w, offset = i * w]() + r)
    var e = SIMD[DType.int32, w](0)  # the lanes' line exponents
    var f = SIMD[DType.int32, w](0)
    var row = output // N
    var column = output - row * N
    comptime for j in range(w):
        if j > 0:  # the next output, without another division
            column += 1
            if column == N:
                column = 0
                row += 1
        e[j] = crt.a_exponents.unsafe_load(row)
        f[j] = crt.b_exponents.unsafe_load(column)
    crt_store[moduli, wide, w](crt.c, output, residues, e, f, crt.bits, crt.accumulate)


@always_inline
def chunk_residue[w: SIMDLength, //, p: Int](sum: SIMD[DType.int32, w]) -> SIMD[DType.uint32, w]:
    """A value ≡ sum (mod p) in [0, 2p), for the int32 sum of one chunk's products of symmetric residues (|sum| ≤
    2^14·2^16 = 2^30, and below 2^30 for p < 256: residues within ±127)."""
    comptime if p == 256:
        return sum.cast[DType.uint32]() & 0xFF  # the two's complement's low byte
    else:  # sum + 2^30 lies in [0, 2^31)
        comptime offset = UInt32(p - (1 << 30) % p)  # ≡ −2^30 (mod p)
        return remainder_below_2_31[p]((sum + (1 << 30)).cast[DType.uint32]()) + offset


@always_inline
def crt_store[moduli: Int, wide: Bool = False, w: SIMDLength = 1](
    c: F32Ptr, output: Int, residues: SIMD[DType.uint32, 16 * w], e: SIMD[DType.int32, w], f: SIMD[DType.int32, w],
    bits: Int, accumulate: Bool,
):
    """c[output + j] (+)= X_j·2^(e_j + f_j − 2b) rounded once for the w lanes j (crt_value), NaN for a non-finite
    line (finished)."""
    var value = crt_value[moduli, wide, w](residues, e, f, bits)
    c.unsafe_store(output, finished(value, c, output, e, f, accumulate))


@always_inline
def finished[w: SIMDLength, //](
    value: SIMD[DType.float32, w], c: F32Ptr, output: Int, e: SIMD[DType.int32, w], f: SIMD[DType.int32, w],
    accumulate: Bool,
) -> SIMD[DType.float32, w]:
    """What c[output + j] becomes for the rounded products `value`: value, or with `accumulate` c's value plus it;
    the canonical NaN where a line is non-finite (e or f NON_FINITE), chosen after the sum so that the NaN's bits
    never depend on c's."""
    var total = value
    if accumulate:
        total = c.unsafe_load[width=w](output) + value
    var non_finite = e.eq(NON_FINITE) | f.eq(NON_FINITE)
    return non_finite.select(SIMD[DType.float32, w](bitcast[DType.float32](CANONICAL_NAN)), total)


@always_inline
def crt_value[moduli: Int, wide: Bool, w: SIMDLength](
    residues: SIMD[DType.uint32, 16 * w], e: SIMD[DType.int32, w], f: SIMD[DType.int32, w], bits: Int
) -> SIMD[DType.float32, w]:
    """X_j·2^(e_j + f_j − 2b) rounded once for the w lanes j, X found from its residues r_i ≡ X (mod p_i),
    0 ≤ r_i < 2^13 (residues[i·w + j] for the first `moduli` MODULI, or with `wide` WIDE_MODULI); meaningless for a
    non-finite line, which `finished` replaces by NaN.

    The reconstruction is an integer identity, X = S − q·P with S = Σ_i r_i·W_i and q = ⌊S/P + 1/2⌋:
    - S ≡ X (mod P): W_i ≡ [i = j] (mod p_j) and r_i ≡ X (mod p_i), so S ≡ X modulo every p_j, hence modulo
      their product P (the moduli are pairwise coprime).
    - q is the nearest integer to S/P: S/P = q' + X/P for the integer q' = (S − X)/P, and |X| < K·2^(2b) ≤
      2^(⌊log2 P⌋ − 1) (bits_per_side), so |X/P| ≤ 1/2 − δ with δ = 1/2 − 2^(⌊log2 P⌋−1)/P (2^−6.1 for 11
      MODULI, 2^−2.2 for 12; the WIDE_MODULI's P exceeds twice the 12 MODULI's, so there δ > 1/4).
      S/P = Σ_i r_i·c_i/p_i (W_i/P = c_i/p_i); its estimate T/2^32 with
      T = Σ_i r_i·⌊2^32·c_i/p_i⌋ lies in (S/P − ε, S/P], ε = 12·2^13·2^−32 < 2^−15 < δ, so
      q = ⌊(T + 2^31)/2^32⌋ = q' (T/2^32 + 1/2 lies in (q' + δ − ε, q' + 1 − δ] ⊂ [q', q' + 1)).
    - |X| < P/2 < 2^95, so X is its value modulo 2^96 read as a signed 96-bit integer: S + q·(2^96 − P) in
      32-bit words. Words 0 and 1 sum the products r_i·w and q·w (w a word of W_i or of 2^96 − P, below 2^32;
      q ≤ Σ r_i < 12·2^13) in 64 bits, below 24·2^45 < 2^50 with the carries; word 2 is kept modulo 2^32 (wrapping).
    So any residues r_i ≡ X below 2^13 give the same X, hence the same bits. Per output: N 32×32-bit multiply-adds
    (word 2) and 3·N float64 fmas, no Garner steps and no 128-bit multiplies: T and the sums Σ r_i·w of words 0 and
    1 are integers below 2^48 (every term non-negative, every product below 2^45), so float64 holds them and every
    partial sum exactly. They are summed by fma on the float64 units (a GPU's FP64 pipe, beside the integer
    multipliers that word 2's sum and the rest keep busy), each r_i converted exactly, and read back as integers
    (exact_integer) before the q·w terms and the carries."""
    var estimate_sum = SIMD[DType.float64, w](1 << 31)  # T + 2^31
    var low_sum = SIMD[DType.float64, w](0)  # Σ r_i·(word 0 of W_i)
    var middle_sum = SIMD[DType.float64, w](0)  # Σ r_i·(word 1 of W_i)
    var high = SIMD[DType.uint32, w](0)  # word 2 of S + q·(2^96 − P)
    comptime for i in range(moduli):
        comptime weight = crt_weight[wide, moduli, i]()
        comptime fraction = Float64(crt_fraction[wide, moduli, i]())
        comptime weight_low = Float64(word(weight, 0))
        comptime weight_middle = Float64(word(weight, 1))
        comptime weight_high = UInt32(word(weight, 2))
        var r32 = residues.slice[w, offset = i * w]()
        var r = exact_float64(r32)
        estimate_sum = fma(r, SIMD[DType.float64, w](fraction), estimate_sum)
        low_sum = fma(r, SIMD[DType.float64, w](weight_low), low_sum)
        middle_sum = fma(r, SIMD[DType.float64, w](weight_middle), middle_sum)
        high += r32 * weight_high
    var low = exact_integer(low_sum)  # words 0 and 1 of S + q·(2^96 − P), before the carries
    var middle = exact_integer(middle_sum)
    var q = exact_integer(estimate_sum) >> 32
    comptime complement = (UInt128(1) << UInt128(CRT_BITS)) - modulus_product[wide, moduli]()  # ≡ −P (mod 2^96)
    low += q * word(complement, 0)
    middle += q * word(complement, 1) + (low >> 32)
    high += q.cast[DType.uint32]() * UInt32(word(complement, 2)) + (middle >> 32).cast[DType.uint32]()
    var value = SIMD[DType.float32, w](0)
    comptime for j in range(w):
        value[j] = rounded_words(high[j], UInt32(middle[j] & 0xFFFFFFFF), UInt32(low[j] & 0xFFFFFFFF),
                                 2 * bits - Int(e[j]) - Int(f[j]))
    return value


comptime TWO_52 = Float64(1 << 52)  # a float64 of magnitude [2^52, 2^53) holds exactly the integers, a unit apart


@always_inline
def exact_float64[w: SIMDLength, //](x: SIMD[DType.uint32, w]) -> SIMD[DType.float64, w]:
    """x as a float64, exactly. On an NVIDIA GPU: the float64 whose high word is 2^52's and low word x (so 2^52 + x),
    less 2^52, the two words joined by a move the compiler cannot read as a conversion (which it would make an
    I2F.F64, a slow instruction), so that only the subtraction runs, on the FP64 pipe; elsewhere a conversion."""
    comptime if is_nvidia_gpu():
        comptime high_word = UInt32(bitcast[DType.uint64](TWO_52) >> 32)
        var joined = SIMD[DType.float64, w](0)
        comptime for j in range(w):
            joined[j] = inlined_assembly["mov.b64 $0, {$1, $2};", Float64, constraints="=d,r,r"](x[j], high_word)
        return joined - TWO_52
    else:
        return x.cast[DType.float64]()


@always_inline
def exact_integer[w: SIMDLength, //](x: SIMD[DType.float64, w]) -> SIMD[DType.uint64, w]:
    """x, an integer in [0, 2^52) held by a float64, as an integer: the significand bits of 2^52 + x."""
    return bitcast[DType.uint64, w](x + TWO_52) & ((1 << 52) - 1)


@always_inline
def rounded_words(high: UInt32, middle: UInt32, low: UInt32, shift: Int) -> Float32:
    """rounded(X, shift) for the signed 96-bit X = high·2^64 + middle·2^32 + low (high read as signed), by the
    conversion of a 64-bit integer to float32 where that gives the same bits, else by rounded:
    - |X| < 2^63: v = X, whose conversion (to nearest, ties to even) is RN(X);
    - else v = ⌊X/2^32⌋ with the lowest bit set when a dropped bit is (round to odd): v and X/2^32 then round
      alike to 24 bits, since v keeps at least 31 (24 + 2 suffice);
    then RN(X)·2^−shift is the answer when its exponent stays normal: scaling by a power of two commutes with a
    rounding to 24 bits there, and a value below 2^−126 whose 24-bit rounding reaches 2^−126 (within 2^−151 of
    it) also rounds up to 2^−126 on the subnormals' coarser grid. Subnormal, overflowing and zero results take
    rounded. One conversion and an exponent adjustment instead of 128-bit shifts: the same bits on every
    device (the conversion is IEEE's)."""
    var fits = Int32(high) == (Int32(middle) >> 31)  # high only extends the sign of bit 63
    var v: Int64
    var scale: Int  # the power of two v stands for
    if fits:
        v = Int64((UInt64(middle) << 32) | UInt64(low))
        scale = 0
    else:
        v = Int64((UInt64(high) << 32) | UInt64(middle)) | Int64(1 if low != 0 else 0)
        scale = 32
    var bits = bitcast[DType.uint32](Float32(v))
    var exponent = Int((bits >> 23) & 0xFF) + scale - shift  # the result's biased exponent
    if v != 0 and exponent >= 1 and exponent <= 254:
        return bitcast[DType.float32](bits + (UInt32(scale - shift) << 23))
    var value = (Int128(Int64(Int32(high))) << 64) | Int128((UInt64(middle) << 32) | UInt64(low))
    return rounded(value, shift)


def exponent_blocks(K: Int) -> Int:
    """How many partial maxima a transposed line of K values takes."""
    return (K + EXPONENT_BLOCK - 1) // EXPONENT_BLOCK


def residue_workspace_bytes(M: Int, N: Int, K: Int, splits: Int, gpu: Bool) -> Int:
    """Bytes of the residue form's workspace: the residue planes (int8 on a GPU, int16 on the CPU) and the exponents
    (exponents_bytes) of both operands, the plane products' sums and the partial maxima of a transposed operand's
    lines (`splits` as gemm_exact_residues_on takes it; on a GPU in residue_product's order, A's part first)."""
    return joined_workspace_bytes(M, N, one_term(K), splits, gpu)


def joined_workspace_bytes[terms: Int](M: Int, N: Int, k: Joined[terms], splits: Int, gpu: Bool) -> Int:
    """residue_workspace_bytes for operands joined along k (Joined): the planes' lines as long as their k extent, the
    partial maxima of every term's lines."""
    var K = k.extent
    var planes: Int
    if gpu:
        planes = moduli_count(k.total) * (M + N) * padded(K) + sums_bytes(M, N, K, splits)
    else:
        planes = 2 * WIDE_COUNT * (M + N) * padded(K) + 4 * WIDE_COUNT * M * N
    return planes + exponents_bytes(M) + exponents_bytes(N) + 4 * max(M, N) * k.exponent_blocks()


def exponents_bytes(count: Int) -> Int:
    """Bytes of `count` int32 exponents in a workspace, rounded up to 16 so that planes after them stay aligned for
    their 16-byte stores and copies."""
    return (4 * count + 15) // 16 * 16


def sums_bytes(M: Int, N: Int, K: Int, splits: Int) -> Int:
    """Bytes of the unfused form's int32 chunk sums, which also hold the fused kernel's byte residues."""
    var moduli = moduli_count(K)
    var chunks = (K + RESIDUE_CHUNK - 1) // RESIDUE_CHUNK
    return max(4 * moduli * chunks * M * N, fused_scratch_bytes(M, N, K, moduli, fused_splits(M, N, K, splits)))


def gemm_exact_residues_on[transpose_a: Bool, transpose_b: Bool, fused: Bool = False](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, accumulate: Bool, workspace: Int,
    splits: Int = 0, range_length: Int = 0, a_ready: Bool = False,
) raises:
    """The exact product through residues (the same bits as gemm_exact_on); `workspace` holds
    residue_workspace_bytes(M, N, K, splits, dev[].is_gpu()). With `fused`, a GPU runs the plane products and the
    reconstruction in the fused kernel (exact_fused_tile; k split into fused_splits(M, N, K, splits) ranges, 0 its
    own choice) where fused_pays, else the unfused form; the CPU runs its own residue form either way
    (wide_residue_product: the same bits). A positive range_length below K (Aᵀ·B only) cuts k into ranges, a
    product each, combined by the row tree (gemm_exact_ranges_on; the workspace then holds
    ranged_workspace_bytes). a_ready: the workspace already holds A's planes and exponents, as the previous product
    of the same A, layout, M, K and range_length left them (A's part of the workspace comes first, whatever N): a
    GPU then skips them where it finds them for the whole product at once (unranged, or ranges run together:
    gemm_exact_shared_a_on); the CPU, and ranges one at a time, find them again."""
    if (range_length if 0 < range_length < K else K) > MAX_K:
        raise Error("gemm_exact: k = ", K, " (in ranges of ", range_length, ") passes the definition's ", MAX_K)
    if 0 < range_length < K:
        gemm_exact_ranges_on[transpose_a, transpose_b, fused](dev, c, a, b, M, N, K, accumulate, workspace,
                                                               range_length, a_ready)
    elif not dev[].is_gpu():
        wide_residue_product[transpose_a, transpose_b](dev, c, Array[F32Ptr, 1](fill=a), Array[F32Ptr, 1](fill=b), M,
                                                       N, one_term(K), accumulate, workspace)
    else:
        moduli_residue_product[transpose_a, transpose_b, fused](dev, c, Array[F32Ptr, 1](fill=a),
                                                                Array[F32Ptr, 1](fill=b), M, N, one_term(K),
                                                                accumulate, workspace, splits, a_ready)


def gemm_exact_shared_a_on[transpose_a: Bool, transpose_b: Bool, terms: Int](
    dev: DevicePtr, c: Array[F32Ptr, terms], a: F32Ptr, b: Array[F32Ptr, terms], M: Int, N: Array[Int, terms],
    products: Int, K: Int, accumulate: Bool, workspace: Int, range_length: Int,
) raises:
    """The first `products` of up to `terms` exact products of one A, C_t (+)= op(A)·op(B_t) (q, k and v of one
    input; their weight gradients by rows), each with the bits the identical GEMM gives it alone (the fused form at
    its own split of k), A's residue planes found once on a GPU; where their k ranges run together, as one product
    of their columns joined (columns_joined). `workspace` holds uform_engine's gemm_shared_a_workspace."""
    if columns_joined(K, range_length, products, dev[].is_gpu()):
        comptime if transpose_a and not transpose_b:
            ranges_fused_on(dev, c, a, b, M, N, products, K, accumulate, workspace, range_length, False)
            return
    for t in range(products):
        gemm_exact_residues_on[transpose_a, transpose_b, fused=True](
            dev, c[t], a, b[t], M, N[t], K, accumulate, workspace, fused_splits(M, N[t], K, 0), range_length, t > 0
        )


def gemm_exact_summed_on[transpose_a: Bool, transpose_b: Bool, terms: Int](
    dev: DevicePtr, c: F32Ptr, a: Array[F32Ptr, terms], b: Array[F32Ptr, terms], M: Int, N: Int,
    k: Array[Int, terms], count: Int, accumulate: Bool, workspace: Int,
) raises:
    """C (+)= op(A_0)·op(B_0) + op(A_1)·op(B_1) + … for the first `count` terms as one exact product, of A_0 | A_1 | …
    joined along k by B_0 over B_1 over …: k = k_0 + k_1 + …, each line's exponent over all its terms, one rounding
    (the input's gradient through q, k and v). On a GPU the fused form at its own split; `workspace` holds
    summed_workspace_bytes(M, N, k, count, dev[].is_gpu())."""
    var joined = Joined[terms](k, count)
    if joined.extent > MAX_K:  # the total, and the padding, which the chunk sums' bounds count too
        raise Error("gemm_exact: joined k = ", joined.total, " (", joined.extent, " padded) passes ", MAX_K)
    if not dev[].is_gpu():
        wide_residue_product[transpose_a, transpose_b](dev, c, a, b, M, N, joined, accumulate, workspace)
        return
    moduli_residue_product[transpose_a, transpose_b, True](dev, c, a, b, M, N, joined, accumulate, workspace,
                                                           fused_splits(M, N, joined.extent, 0), False)


def summed_workspace_bytes[terms: Int](M: Int, N: Int, k: Array[Int, terms], count: Int, gpu: Bool) -> Int:
    """Bytes of gemm_exact_summed_on's workspace."""
    var joined = Joined[terms](k, count)
    return joined_workspace_bytes(M, N, joined, fused_splits(M, N, joined.extent, 0), gpu)


def moduli_residue_product[transpose_a: Bool, transpose_b: Bool, fused: Bool, terms: Int](
    dev: DevicePtr, c: F32Ptr, a: Array[F32Ptr, terms], b: Array[F32Ptr, terms], M: Int, N: Int, k: Joined[terms],
    accumulate: Bool, workspace: Int, splits: Int, a_ready: Bool,
) raises:
    """residue_product with the moduli the definition takes for k (moduli_count of its total: 11 or 12)."""
    if moduli_count(k.total) == 11:
        residue_product[11, transpose_a, transpose_b, fused](dev, c, a, b, M, N, k, accumulate, workspace, splits,
                                                             a_ready)
    else:
        residue_product[12, transpose_a, transpose_b, fused](dev, c, a, b, M, N, k, accumulate, workspace, splits,
                                                             a_ready)


def residue_product[moduli: Int, transpose_a: Bool, transpose_b: Bool, fused: Bool, terms: Int](
    dev: DevicePtr, c: F32Ptr, a: Array[F32Ptr, terms], b: Array[F32Ptr, terms], M: Int, N: Int, k: Joined[terms],
    accumulate: Bool, workspace: Int, splits: Int, a_ready: Bool,
) raises:
    """gemm_exact_residues_on on a GPU, for a k whose definition takes `moduli` moduli: the planes (A's unless
    a_ready), their products on the tensor cores, the reconstruction (with `fused`, the last two in one kernel).
    With several terms (gemm_exact_summed_on), the product of their operands joined along k."""
    var bits = bits_per_side(k.total)
    var K = k.extent
    var a_residues = workspace  # A's part first, so that products of one A and any N find it at the same place
    var a_exponents = a_residues + moduli * M * padded(K)
    var b_residues = a_exponents + exponents_bytes(M)
    var b_exponents = b_residues + moduli * N * padded(K)
    var sums = b_exponents + exponents_bytes(N)
    var partial = sums + sums_bytes(M, N, K, splits)
    if not a_ready:
        joined_planes[moduli, terms](dev, a_residues, a_exponents, partial, a, M, k, not transpose_a, bits)
    joined_planes[moduli, terms](dev, b_residues, b_exponents, partial, b, N, k, transpose_b, bits)
    comptime if HAS_ACCELERATOR:
        comptime if fused and HAS_HOPPER:  # elsewhere the unfused form: the same bits
            if fused_pays(M, N, K, splits):
                fused_products[moduli](dev, c, a_residues, b_residues, a_exponents, b_exponents, sums, M, N, K,
                                       bits, accumulate, fused_splits(M, N, K, splits))
                return
        comptime if HAS_NVIDIA:
            plane_products_on_tensor_cores(dev, sums, a_residues, b_residues, M, N, K, moduli)
        else:
            raise Error("gemm_exact: the residue form's plane products run on cuBLAS: not in this build")
    reconstruct[moduli, False](dev, c, sums, a_exponents, b_exponents, M, N, K, bits, accumulate)


struct Joined[terms: Int](Copyable, Movable):
    """The k of an exact product whose operands are one or more terms joined along k (gemm_exact_summed_on): each
    term's k, the definition's k (their sum: b and the moduli follow from it), and the k the planes' lines take:
    one term's own k, or the sum of the terms' padded k (each term's residues start where the one before ends,
    padded, so that every store and copy stays 16-byte aligned; the zeros between add nothing)."""

    var k: Array[Int, Self.terms]
    var count: Int
    var total: Int
    var extent: Int

    def __init__(out self, k: Array[Int, Self.terms], count: Int):
        self.k = k.copy()
        self.count = count
        self.total = 0
        self.extent = 0
        for t in range(count):
            self.total += k[t]
            self.extent += padded(k[t])
        if count == 1:
            self.extent = k[0]

    def offset(self, t: Int) -> Int:
        """Where term t's k begin in a line of the joined planes."""
        var at = 0
        for s in range(t):
            at += padded(self.k[s])
        return at

    def exponent_blocks(self) -> Int:
        """Partial maxima a joined line takes at most (joined_planes)."""
        var blocks = 0
        for t in range(self.count):
            blocks += exponent_blocks(self.k[t])
        return blocks


def one_term(K: Int) -> Joined[1]:
    """The k of a product of one term."""
    return Joined[1](Array[Int, 1](fill=K), 1)


def joined_planes[moduli: Int, terms: Int, wide: Bool = False](
    dev: DevicePtr, residues: Int, exponents: Int, partial: Int, x: Array[F32Ptr, terms], lines: Int,
    k: Joined[terms], along: Bool, bits: Int,
) raises:
    """The residue planes of an operand's lines (A's rows, B's columns), its terms joined along k: each line's
    exponent over every term (joined_line_exponents), then each term's residues at its offset of the line (int8,
    or with `wide` the CPU's int16 planes: wide_planes). along: a line's elements are contiguous (A's rows of A·B,
    B's columns of A·Bᵀ: x(line, k) at line·k_t + k), else `lines` apart (at k·lines + line)."""
    if k.count == 1:
        comptime if not wide:
            residue_planes[moduli](dev, residues, exponents, partial, x[0], lines, k.total, k.total if along else 1,
                                   1 if along else lines, bits)
            return
        line_exponents_on(dev, exponents, partial, x[0], lines, k.total, k.total if along else 1,
                          1 if along else lines)
    else:
        joined_line_exponents(dev, exponents, partial, x, lines, k, along)
    for t in range(k.count):
        comptime if wide:
            wide_planes(dev, residues, exponents, x[t], lines, k.k[t], k.k[t] if along else 1, 1 if along else lines,
                        bits, padded(k.extent), k.offset(t))
        else:
            line_residues[moduli](dev, residues + k.offset(t), exponents, x[t], lines, k.k[t],
                                  k.k[t] if along else 1, 1 if along else lines, bits, 0, padded(k.extent), lines)


def joined_line_exponents[terms: Int](
    dev: DevicePtr, exponents: Int, partial: Int, x: Array[F32Ptr, terms], lines: Int, k: Joined[terms], along: Bool
) raises:
    """exponents[line] = e of each line over every term, laid out as joined_planes takes them: the bits of each
    term's largest magnitudes of each line side by side in `partial` (a warp a line where its elements are
    contiguous, else partial_maxima over blocks of k), `lines` apart, then line_exponents over them, as over a
    transposed line's partial maxima (a maximum of bit patterns: any order and grouping give the same e)."""
    var blocks = 0  # the partial maxima of each line so far
    for t in range(k.count):
        var at = partial + 4 * blocks * lines
        if along:
            contiguous_line_exponents(dev, at, x[t], lines, k.k[t], k.k[t], True)
            blocks += 1
        else:
            blocks += partial_maxima_on(dev, at, x[t], lines, k.k[t], 1, lines)
    exponents_of_maxima(dev, exponents, partial, lines, blocks, lines)


def reconstruct[moduli: Int, wide: Bool](
    dev: DevicePtr, c: F32Ptr, sums: Int, a_exponents: Int, b_exponents: Int, M: Int, N: Int, K: Int, bits: Int,
    accumulate: Bool,
) raises:
    """C from the plane products' sums: crt_round over every output."""
    var crt = CrtRound(c, i32_at(sums), i32_at(a_exponents), i32_at(b_exponents), M, N, K, bits, accumulate)
    launch_elements[crt_round[moduli, wide, ...], gpu_lanes=1](dev, M * N, crt.args())  # 4 a GPU thread: 19 % slower


def residue_planes[moduli: Int](
    dev: DevicePtr, residues: Int, exponents: Int, partial: Int, x: F32Ptr, lines: Int, length: Int,
    line_stride: Int, element_stride: Int, bits: Int,
) raises:
    """The lines' exponents (line_exponents_on), then their residue planes: where a line's elements are contiguous,
    a task a group of 16 k (exact_residues), else a team a tile of 32 lines × 64 k (exact_residues_across): a
    warp's reads are contiguous either way, and so are its stores of residues. Enough contiguous lines take both
    steps in one kernel, which reads each line from memory once (exact_line_planes, LINE_PLANES_MIN_LINES). k cut
    into ranges: ranged_planes."""
    if element_stride == 1 and lines >= LINE_PLANES_MIN_LINES:
        var planes = ResiduePlanes(I8Ptr(unsafe_from_address=residues), i32_at(exponents), x, length, line_stride,
                                   element_stride, bits, lines, 0, padded(length), lines)
        launch_grouped[LINE_LANES, exact_line_planes[moduli, LINE_LANES], whole_line_planes[moduli]](dev, lines,
                                                                                                   planes.args())
        return
    line_exponents_on(dev, exponents, partial, x, lines, length, line_stride, element_stride)
    line_residues[moduli](dev, residues, exponents, x, lines, length, line_stride, element_stride, bits, 0,
                          padded(length), lines)


def joined_size[terms: Int](sizes: Array[Int, terms], count: Int) -> Int:
    """The lines (or columns) of the first `count` operands joined along them: the sum of their sizes."""
    var total = 0
    for t in range(count):
        total += sizes[t]
    return total


def ranged_planes[moduli: Int, terms: Int](
    dev: DevicePtr, residues: Int, exponents: Int, partial: Int, x: Array[F32Ptr, terms], lines: Array[Int, terms],
    count: Int, length: Int, bits: Int, range_length: Int,
) raises:
    """residue_planes for the columns of Aᵀ·B's operands (x_t's lines lie `lines_t` apart, its k rows of them one
    after another), k cut into equal ranges of range_length whole blocks of EXPONENT_BLOCK (ranges_fused), each cut
    with its own exponents (exponent_at), of the first `count` operands joined along their lines: x_0's lines, then
    x_1's, … (B_0 | B_1 | …: the columns of products of one A, joined). Each operand's partial maxima at its first
    line of the joined layout, one pass over them for every range's exponents at exponents[range·lines + line]
    (lines: the total), then each operand's residues at its lines of the joined planes. A range of a line is a line
    of maxima, so a long range spreads over many tasks (with a task a range, a weight gradient of 768 × 768 over
    ranges of 8192 tokens ran 2.56 ms on the H200 against 1.69 this way)."""
    if range_length % EXPONENT_BLOCK != 0 or length % range_length != 0:
        raise Error("ranged_planes: k ranges must be equal and whole blocks of EXPONENT_BLOCK")
    var per_range = range_length // EXPONENT_BLOCK
    var ranges = length // range_length
    var total = joined_size(lines, count)
    var first = 0
    for t in range(count):
        _ = partial_maxima_on(dev, partial + 4 * first, x[t], lines[t], length, 1, lines[t], per_range, total)
        first += lines[t]
    exponents_of_maxima(dev, exponents, partial, ranges * total, per_range, ranges * total)
    first = 0
    for t in range(count):
        line_residues[moduli](dev, residues + first * padded(length), exponents + 4 * first, x[t], lines[t], length, 1,
                              lines[t], bits, range_length, padded(length), total)
        first += lines[t]


def line_residues[moduli: Int](
    dev: DevicePtr, residues: Int, exponents: Int, x: F32Ptr, lines: Int, length: Int, line_stride: Int,
    element_stride: Int, bits: Int, range_length: Int, plane_line: Int, plane_lines: Int,
) raises:
    """residue_planes' second step, the lines' exponents found: each line's residues from `residues` on, in lines of
    plane_line bytes, plane_lines of them a plane (exact_residues, exact_residues_across; ResiduePlanes)."""
    var planes = ResiduePlanes(I8Ptr(unsafe_from_address=residues), i32_at(exponents), x, length, line_stride,
                               element_stride, bits, lines, range_length, plane_line, plane_lines).args()
    var groups = padded(length) // RESIDUE_GROUP
    if element_stride == 1:
        launch_index[exact_residues[moduli]](dev, lines * groups, planes)
    else:
        var tiles = (lines + TILE_LINES - 1) // TILE_LINES * ((groups + TILE_GROUPS - 1) // TILE_GROUPS)
        launch_teams[moduli, TILE_TEAM, tile_scratch_floats(moduli), exact_residues_across, TILE_TEAMS_PER_SM](
            dev, tiles, planes
        )


def line_exponents_on(
    dev: DevicePtr, exponents: Int, partial: Int, x: F32Ptr, lines: Int, length: Int, line_stride: Int,
    element_stride: Int,
) raises:
    """exponents[line] = e of each line. Where a line's elements are contiguous, a GPU warp takes a line
    (line_exponents); else the lines' partial maxima over blocks of EXPONENT_BLOCK k (partial_maxima, into
    `partial`: exponent_blocks(length)·lines values; a partial maximum's bits are a magnitude's, so line_exponents
    over them finds the line's e). k cut into ranges: ranged_planes."""
    if element_stride == 1:
        contiguous_line_exponents(dev, exponents, x, lines, length, line_stride, False)
    else:
        var blocks = partial_maxima_on(dev, partial, x, lines, length, line_stride, element_stride)
        exponents_of_maxima(dev, exponents, partial, lines, blocks, lines)


def contiguous_line_exponents(
    dev: DevicePtr, exponents: Int, x: F32Ptr, lines: Int, length: Int, line_stride: Int, magnitudes: Bool
) raises:
    """line_exponents over lines whose elements are contiguous, a GPU warp a line: exponents[line] = each line's e,
    or with `magnitudes` the bits of its largest magnitude."""
    var exponents_of_lines = LineExponents(i32_at(exponents), x, length, line_stride, 1, magnitudes)
    launch_rows[line_exponents](dev, lines, exponents_of_lines.args())


def exponents_of_maxima(dev: DevicePtr, exponents: Int, partial: Int, lines: Int, per_line: Int, apart: Int) raises:
    """exponents[line] = e of each line from its `per_line` largest magnitudes' bits in `partial`, those of line l at
    partial[l + j·apart] (line_exponents over them: a maximum of bit patterns)."""
    var maxima = LineExponents(i32_at(exponents), f32_at(partial), per_line, 1, apart, False)
    launch_rows[line_exponents](dev, lines, maxima.args())


def partial_maxima_on(
    dev: DevicePtr, partial: Int, x: F32Ptr, lines: Int, length: Int, line_stride: Int, element_stride: Int,
    per_range: Int = 0, apart: Int = 0,
) raises -> Int:
    """partial[b·apart + line] = the bits of line `line`'s largest magnitude over k [64b, 64(b + 1)) (EXPONENT_BLOCK),
    or with per_range > 0 in partial_maxima's layout of k ranges; apart: `lines` (0), or more for lines joined with
    others' (PartialMaxima). Answers the number of blocks."""
    var blocks = exponent_blocks(length)
    var ranges = blocks // per_range if per_range > 0 else 0
    var maxima = PartialMaxima(i32_at(partial), x, length, line_stride, element_stride, lines, ranges, per_range,
                               apart if apart > 0 else lines)
    launch_index[partial_maxima](dev, blocks * lines, maxima.args())
    return blocks


def plane_products_on_tensor_cores(
    dev: DevicePtr, sums: Int, a_residues: Int, b_residues: Int, M: Int, N: Int, K: Int, moduli: Int
) raises:
    """The plane products' chunk sums by cuBLAS's int8 GEMM with int32 accumulation (exact): per chunk of k, one
    strided batched call over the moduli, S_i[m, n] = Σ_k a_i[m, k]·b_i[n, k], which in cuBLAS's column-major terms
    is S_iᵀ = B_i·A_iᵀ, the "TN" form its int8 kernels take (line lengths padded to 16 bytes)."""
    var handle = _get_global_handle[DType.int8](dev[].ctx())._get_cublas()
    var stride = padded(K)
    var chunks = (K + RESIDUE_CHUNK - 1) // RESIDUE_CHUNK
    var one = Int32(1)
    var zero = Int32(0)
    var alpha = Pointer[NoneType, ImmutAnyOrigin](unsafe_from_address=Int(UnsafePointer(to=one)))
    var beta = Pointer[NoneType, ImmutAnyOrigin](unsafe_from_address=Int(UnsafePointer(to=zero)))
    for chunk in range(chunks):
        var first = chunk * RESIDUE_CHUNK
        var length = min(stride, first + RESIDUE_CHUNK) - first
        var a = a_residues + first
        var b = b_residues + first
        var s = sums + 4 * chunk * M * N
        check_cublas_error(cublasGemmStridedBatchedEx(
            handle, cublasOperation_t.CUBLAS_OP_T, cublasOperation_t.CUBLAS_OP_N, Int64(N), Int64(M),
            Int64(length), alpha,
            Pointer[NoneType, ImmutAnyOrigin](unsafe_from_address=b), DataType.R_8I, Int64(stride), Int64(N * stride),
            Pointer[NoneType, ImmutAnyOrigin](unsafe_from_address=a), DataType.R_8I, Int64(stride), Int64(M * stride),
            beta, Pointer[NoneType, MutAnyOrigin](unsafe_from_address=s), DataType.R_32I, Int64(N),
            Int64(chunks * M * N), Int64(moduli), ComputeType.COMPUTE_32I, Algorithm.DEFAULT,
        ), msg="gemm_exact: cuBLAS's int8 products")


# ---- the fused form: plane products and reconstruction in one kernel (GPU only) ----------------------------
#
# The unfused form writes N(K) int32 planes of M·N chunk sums (44 bytes an output for 11 moduli) and crt_round
# reads them back. The fused kernel keeps one byte an output and modulus instead. A block of two warpgroups owns
# a tile of 128 × 256 or 128 × 128 outputs (FusedTile) and a range of k; modulus after modulus it streams the
# tile's lines of A's and B's planes through a ring of shared-memory stages (one thread's TMA tensor copies fill
# the next stages, each completing its slot's mbarrier, while Hopper's warpgroup tensor cores, wgmma int8 × int8 →
# int32, multiply the current one), and at the end of each
# chunk of k a thread folds its int32 sums modulo p_i into bytes in the workspace. After the last modulus the same
# thread reads its bytes back, reconstructs and rounds its outputs (crt_value, then finished) and stores the floats;
# where k is split into ranges, a second kernel does that for every tile once every range is folded
# (exact_fused_splits_summed), summing the ranges' residues.

comptime FUSED_ROWS = 128  # a tile's rows: two warpgroups of 64
comptime FUSED_TEAM = 256  # threads of a block: two warpgroups
comptime FUSED_K = 128  # k of a stage: one 128-byte line of the swizzled layout wgmma reads


struct FusedTile[columns: Int]:
    """The fused kernel's geometry for tiles of 128 rows × `columns` columns: 256 (one block a multiprocessor,
    the most products per staged byte) or 128 (two blocks a multiprocessor, so that one block's folds and
    reconstruction overlap the other's products). On the H200 (bench/RESULTS.md, 2026-11-30 23:25) this beat a
    persistent "ping-pong" kernel (two groups of a block taking its tiles in turn through one ring: 23 % slower, a
    lone group multiplying at about 60 % of two blocks' rate), persistent blocks (7-9 % slower) and tiles of 64 rows
    at three or four blocks a multiprocessor (13-16 % slower). Folding half a warpgroup's sums while the other half's
    products run does not fit the 128 registers a thread (ptxas then serializes every wgmma: 2026-12-01), nor do
    persistent blocks with warps of their own reconstructing the tile before (2.2× slower: two blocks of 320 threads
    leave 96 registers a thread, so two spilling warps a block reconstruct: 2026-12-01 08:28)."""

    comptime lines = FUSED_ROWS + Self.columns  # lines of a stage: the tile's rows of A, then its columns of B
    comptime stage_bytes = Self.lines * FUSED_K
    # Stages are copied `ahead` of their products, which run while the next stage is awaited. Narrow tiles refill
    # late: the slot of the stage before, after a barrier that every warpgroup reaches once it has waited for that
    # stage's products, so their ring holds ahead + 1 stages. Wide tiles refill the slot of the stage two before,
    # after a barrier at the stage's start, so theirs holds ahead + 2. On the H200 (measured when every thread
    # copied its pieces by cp.async) refilling late won 8–9 % at the encoder's shapes on narrow tiles; on wide tiles
    # (with 3 ahead) it lost 7 % at 8192³.
    comptime refill_late = Self.columns == 128
    comptime ahead = 2
    comptime slots = Self.ahead + (1 if Self.refill_late else 2)  # stages in the ring: 96 KB a block, or 192 KB
    comptime shared_bytes = Self.slots * Self.stage_bytes + 8 * Self.slots  # the ring, then a slot's mbarrier each
    comptime blocks_per_sm = 1 if Self.columns == 256 else 2
    comptime sums = Self.columns // 2  # int32 sums a thread holds (m64nNk32's accumulator fragment)
    comptime words = Self.sums // 4  # 32-bit words of a thread's residues modulo one modulus
    comptime outputs = FUSED_ROWS * Self.columns


comptime SharedBytes = Pointer[Int8, MutUntrackedOrigin, address_space=AddressSpace.SHARED]
comptime U32Ptr = Pointer[UInt32, MutUntrackedOrigin, address_space=AddressSpace.GLOBAL]


def fused_tiles(M: Int, N: Int, columns: Int) -> Int:
    """Tiles of 128 rows × `columns` columns covering the M × N outputs."""
    return (M + FUSED_ROWS - 1) // FUSED_ROWS * ((N + columns - 1) // columns)


@always_inline
def tile_origin(tile_index: Int, N: Int, columns: Int) -> Tuple[Int, Int]:
    """The first row and column of tile `tile_index` (row tiles × column tiles, column tiles fastest)."""
    var column_tiles = (N + columns - 1) // columns
    return (tile_index // column_tiles * FUSED_ROWS, tile_index % column_tiles * columns)


comptime FUSED_BLOCKS = 264  # blocks a fused product should give the GPU: two a multiprocessor of an H100 or H200
comptime FUSED_MAX_SPLITS = 32  # ranges of k at most: the splits' summed residues stay below 2^13 (32·255)
comptime FUSED_AUTO_SPLITS = 8  # ranges of k the kernel chooses at most
comptime FUSED_SPLIT_K = 4096  # k of the ranges it chooses, about, at least: folds stay small beside products


def fused_splits(M: Int, N: Int, K: Int, requested: Int) -> Int:
    """The ranges of k the fused kernel splits an M × N × K product into, each a whole number of stages and none
    empty (so the count is rounded to what equal ranges of whole stages give: 3 asked over 4 stages gives 2): about
    `requested` if positive (at most FUSED_MAX_SPLITS); else one where the 128 × 128 tiles fill a wave of
    FUSED_BLOCKS, and where they do not (a weight gradient's few outputs over a long k) the count up to
    FUSED_AUTO_SPLITS, ranges of about FUSED_SPLIT_K k at least, whose blocks fill their waves best (the fewest on
    a tie): blocks do equal work, so a last wave half full runs as long as a full one."""
    var slices = (padded(K) + FUSED_K - 1) // FUSED_K
    var wanted = min(requested, FUSED_MAX_SPLITS) if requested > 0 else 1
    var tiles = fused_tiles(M, N, 128)
    if requested <= 0 and tiles < FUSED_BLOCKS:
        var best = 0.0
        for splits in range(1, min(FUSED_AUTO_SPLITS, max(1, slices * FUSED_K // FUSED_SPLIT_K)) + 1):
            var blocks = tiles * splits
            var filled = Float64(blocks) / Float64((blocks + FUSED_BLOCKS - 1) // FUSED_BLOCKS * FUSED_BLOCKS)
            if filled > best:
                best = filled
                wanted = splits
    var per_split = (slices + wanted - 1) // wanted
    return (slices + per_split - 1) // per_split


def fused_pays(M: Int, N: Int, K: Int, requested: Int) -> Bool:
    """Whether a fused product asked for with `requested` splits (0: its own choice) runs the fused kernel: always
    when splits are asked for; else unless the kernel would split k itself (few outputs over a long k: a weight
    gradient), where cuBLAS's plane products and crt_round, which then has few outputs to reconstruct, take less
    time (768 × 768 over 65536 on the H200: 1.32 against 1.57 ms with the planes). Either way the same bits."""
    return requested > 0 or fused_splits(M, N, K, 0) == 1


def fused_columns(M: Int, N: Int, K: Int, splits: Int, ranges: Bool = False) -> Int:
    """The fused kernel's tile width: 256 for a product of at least 4096 k that its block reconstructs itself (its
    products dominate: the most of them per staged byte): an unsplit k, or each of `ranges` where their wide blocks
    make at least 2·FUSED_BLOCKS (four waves of one a multiprocessor); else 128 (two blocks a multiprocessor: one
    block's folds and reconstruction overlap the other's products; a split k's ranges are summed by
    exact_fused_splits_summed on tiles of 128). On the H200 (bench/RESULTS.md, 2026-12-01 04:25) ranges of 4096 over
    65536 k ran 6–9 % faster wide at 3072 × 768 and 768 × 3072 (1152 blocks), 7 % slower at 768 × 768 (288)."""
    if K // splits < 4096:
        return 128
    if splits == 1:
        return 256
    return 256 if ranges and splits * fused_tiles(M, N, 256) >= 2 * FUSED_BLOCKS else 128


def fused_scratch_bytes(M: Int, N: Int, K: Int, moduli: Int, splits: Int, ranges: Bool = False) -> Int:
    """Bytes of the fused kernel's residues: a byte an output of every tile (whole tiles), modulus and split."""
    var columns = fused_columns(M, N, K, splits, ranges)
    return splits * moduli * fused_tiles(M, N, columns) * FUSED_ROWS * columns


struct StageLoads[columns: Int](ImplicitlyCopyable, Movable):
    """The stream of a tile's stages: k [k, k + 128) of the tile's 128 lines of A's plane and `columns` lines of B's,
    k_begin to k_end, the moduli in turn, each stage copied by two TMA tensor copies (issued by thread 0) into its
    slot of the ring, in the K-major layout with 128-byte swizzling that wgmma reads (line l's 16-byte piece j at
    128·l + 16·(j XOR l mod 8)), completing the slot's mbarrier. The tensor maps (residue_map) fill lines past the
    operand's rows (A) or columns (B), and k past the line, with zeros. The stream's position is thread 0's alone:
    the other threads only wait on the slots' mbarriers."""

    var a_map: Int  # the addresses of the tensor maps of A's and B's planes (kernel parameters)
    var b_map: Int
    var row0: Int32  # the tile's first row of A and column of B
    var column0: Int32
    var k_begin: Int32  # the range of k this block multiplies, of every modulus
    var k_end: Int32
    var modulus: Int32  # the next stage to fill: modulus, k and slot of the ring
    var k: Int32
    var slot: Int32

    @always_inline
    def __init__(out self, a_map: Int, b_map: Int, row0: Int, column0: Int, k_begin: Int, k_end: Int):
        self.a_map = a_map
        self.b_map = b_map
        self.row0 = Int32(row0)
        self.column0 = Int32(column0)
        self.k_begin = Int32(k_begin)
        self.k_end = Int32(k_end)
        self.modulus = 0
        self.k = self.k_begin
        self.slot = 0

    @always_inline
    def start_next[moduli: Int](mut self, shared: SharedBytes, full: BarrierPtr):
        """Start filling the next stage of the stream (nothing once it is done): thread 0 tells the slot's mbarrier
        to expect the stage's bytes and issues its two tensor copies, which complete that mbarrier's phase."""
        if thread_idx.x == 0 and self.modulus < Int32(moduli):
            var stage = shared.unsafe_offset(Int(self.slot) * FusedTile[Self.columns].stage_bytes)
            var landed = full.unsafe_offset(Int(self.slot))
            mbarrier_arrive_expect_tx_shared(landed, Int32(FusedTile[Self.columns].stage_bytes))
            cp_async_bulk_tensor_shared_cluster_global(
                stage, OpaquePointer[mut=False, ImmutAnyOrigin](unsafe_from_address=self.a_map), landed,
                IndexList[3](Int(self.k), Int(self.row0), Int(self.modulus)),
            )
            cp_async_bulk_tensor_shared_cluster_global(
                stage.unsafe_offset(FUSED_ROWS * FUSED_K),
                OpaquePointer[mut=False, ImmutAnyOrigin](unsafe_from_address=self.b_map), landed,
                IndexList[3](Int(self.k), Int(self.column0), Int(self.modulus)),
            )
            self.k += FUSED_K
            if self.k >= self.k_end:
                self.k = self.k_begin
                self.modulus += 1
            self.slot = 0 if self.slot + 1 == Int32(FusedTile[Self.columns].slots) else self.slot + 1


comptime BarrierPtr = Pointer[Int64, MutUntrackedOrigin, address_space=AddressSpace.SHARED]


@always_inline
def wait_landed(landed: BarrierPtr, phase: Int32):
    """Wait until the mbarrier `landed` completes its phase of parity `phase` (its stage's copies have landed)."""
    inlined_assembly[
        "{ .reg .pred P1; LAB_WAIT: mbarrier.try_wait.parity.shared::cta.b64 P1, [$0], $1; @P1 bra DONE; "
        + "bra LAB_WAIT; DONE: }",
        NoneType,
        constraints="r,r",
    ](Int32(Int(landed)), phase)


def residue_map[lines: Int](dev: DevicePtr, planes: Int, rows: Int, K: Int, moduli: Int) raises -> TMADescriptor:
    """The tensor map of residue planes at `planes` (moduli planes of `rows` lines of padded(K) bytes) that copies
    boxes of `lines` lines × FUSED_K bytes with 128-byte swizzling: coordinates (k, line, modulus)."""
    var line = padded(K)
    var buffer = DeviceBuffer[DType.uint8](
        dev[].ctx(), Pointer[UInt8, MutAnyOrigin](unsafe_from_address=planes), moduli * rows * line, owning=False
    )
    return create_tma_descriptor[DType.uint8, 3, TensorMapSwizzle.SWIZZLE_128B](
        buffer, IndexList[3](moduli, rows, line), IndexList[3](rows * line, line, 1), IndexList[3](1, lines, FUSED_K)
    )


@always_inline
def swizzled_lines(lines: SharedBytes) -> Int64:
    """The wgmma descriptor of staged lines (StageLoads' layout): the start address, 1024 bytes between groups
    of 8 lines, 128-byte swizzling (addresses and offsets in 16-byte units; the leading offset is unused there)."""
    return Int64((Int(lines) & 0x3FFFF) >> 4) | (Int64(1) << 16) | (Int64(1024 >> 4) << 32) | (Int64(1) << 62)


@always_inline
def multiply_stage[columns: Int](
    sums: SIMD[DType.uint32, FusedTile[columns].sums], a: Int64, b: Int64
) -> SIMD[DType.uint32, FusedTile[columns].sums]:
    """sums + a warpgroup's 64 rows of A's staged lines · the `columns` columns of B's, over the stage's 128 k (a and
    b: swizzled_lines of both): four wgmma m64nNk32 (N = columns; int8 × int8, exact int32 sums), each reading the
    next 32 bytes of every line, started as one group: the caller waits for it (wgmma_wait_group_sync) before it
    reads the sums or refills the stage."""
    var result = sums
    wgmma_fence_aligned()
    comptime for step in range(FUSED_K // 32):
        result = wgmma_async[64, columns, 32, DType.uint32, FusedTile[columns].sums, a_type=DType.int8,
                             b_type=DType.int8](
            WGMMADescriptor[DType.int8](a + Int64(2 * step)), WGMMADescriptor[DType.int8](b + Int64(2 * step)), result
        )
    wgmma_commit_group_sync()
    return result


@always_inline
def fold_sums[p: Int, columns: Int, first_chunk: Bool](
    words: U32Ptr, sums: SIMD[DType.uint32, FusedTile[columns].sums], tid: Int
):
    """The thread's residues modulo p so far (none for the `first_chunk`, which reads nothing) plus its chunk sums,
    each reduced to [0, p), stored a byte an output: sums 4w … 4w + 3 in word w, at w·256 + tid, so that a warp's
    32 lanes store 128 contiguous bytes. One remainder a sum (p < 256): sum + B with B = p·⌈2^30/p⌉ is ≡ sum
    (mod p) and lies in [0, 2^31 − 256) for |sum| < 127²·2^16 (a chunk of symmetric residues within ±127), so
    adding a residue so far keeps it below 2^31 (remainder_below_2_31); p = 256 keeps the low byte."""
    comptime bias = UInt32(p * (((1 << 30) + p - 1) // p)) if p < 256 else UInt32(0)
    comptime for w in range(FusedTile[columns].words):
        var total = sums.slice[4, offset=4 * w]() + bias
        comptime if not first_chunk:
            total += bitcast[DType.uint8, 4](words.unsafe_load(w * FUSED_TEAM + tid)).cast[DType.uint32]()
        var residues: SIMD[DType.uint32, 4]
        comptime if p == 256:
            residues = total & 0xFF
        else:
            residues = remainder_below_2_31[p](total)
        words.unsafe_store(w * FUSED_TEAM + tid, bitcast[DType.uint32, 1](residues.cast[DType.uint8]()))


@fieldwise_init
struct FusedProduct(ImplicitlyCopyable, Movable):
    """The fused kernel's operands (the residue planes reach it through its tensor maps, residue_map): C (m × n
    float32, or with `ranges` a partial a split, m·n apart), the exponents of A's rows and B's columns (or a range's,
    m and n apart), the residue bytes its tiles fold (fused_scratch_bytes at `residues`), k split into `splits`
    ranges, `bits` bits a side; `accumulate` adds C's values."""

    var c: F32Ptr
    var a_exponents: I32Ptr
    var b_exponents: I32Ptr
    var residues: Int
    var m: Int
    var n: Int
    var k: Int
    var bits: Int
    var accumulate: Bool
    var splits: Int
    var ranges: Bool

    @always_inline
    def __init__(out self, args: Args):
        self.c = args.f32(0)
        self.a_exponents = args.i32(1)
        self.b_exponents = args.i32(2)
        self.residues = Int(args.addresses[3])
        self.m = args.size(0)
        self.n = args.size(1)
        self.k = args.size(2)
        self.bits = args.size(3)
        self.accumulate = args.flag(4)
        self.splits = args.size(5)
        self.ranges = args.flag(6)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.c))
        args.addresses[1] = Int64(Int(self.a_exponents))
        args.addresses[2] = Int64(Int(self.b_exponents))
        args.addresses[3] = Int64(self.residues)
        args.sizes[0] = Int64(self.m)
        args.sizes[1] = Int64(self.n)
        args.sizes[2] = Int64(self.k)
        args.sizes[3] = Int64(self.bits)
        args.sizes[4] = Int64(1 if self.accumulate else 0)
        args.sizes[5] = Int64(self.splits)
        args.sizes[6] = Int64(1 if self.ranges else 0)
        return args

    @always_inline
    def residue_block[moduli: Int, columns: Int](self, task: Int) -> Int:
        """Where the residue bytes of fused task `task` (split·tiles + tile) begin: a byte an output of the tile
        for each modulus."""
        return self.residues + task * moduli * FusedTile[columns].outputs


@always_inline  # one function: a call inside the kernel makes ptxas serialize its wgmma
def exact_fused_tile[moduli: Int, columns: Int](task: Int, args: Args, a_map: Int, b_map: Int):
    """Task `task` = split·tiles + tile (tiles: row tiles × column tiles, column tiles fastest) of the product whose
    residue planes residue_planes (or joined_planes) wrote: for every modulus the plane products of the split's
    range of k on the tensor cores, folded to residues; then, if k is not split, each thread reconstructs and rounds
    its outputs (128 or 64; else exact_fused_splits_summed does, after every split). With `ranges`, each split is a
    product of its own (gemm_exact_ranges_on's), which its block reconstructs into its own partial.

    The k of all moduli form one stream of stages of 128 k (modulus i's range, then modulus i + 1's); stage s is
    copied tile.ahead stages ahead of its products, which run while the next stage is awaited (FusedTile says when
    a slot is refilled). Warpgroup g sums a_i[m, k]·b_i[n, k] over its 64 rows × `columns` (int8 × int8 → int32,
    exact), in chunks of RESIDUE_CHUNK k as plane_products_on_tensor_cores does: a chunk's sum is at most 2^16
    products of magnitude ≤ 2^14 (symmetric residues of at least −128), so |sum| ≤ 2^30 and no int32 partial sum, in
    any order, overflows. After each chunk a thread folds its sums modulo p_i into its bytes of the workspace
    (fold_sums; written and read back only by the thread that owns them). A thread's sum j is wgmma's accumulator
    fragment: row 16·warp + lane ÷ 4 + 8·(j ÷ 2 mod 2) of its warpgroup's 64, column 8·(j ÷ 4) + 2·(lane mod 4) +
    j mod 2.
    Padding k (up to padded(K)) holds zeros, and the lines of a non-finite row or column hold zero residues
    (finished stores NaN there)."""
    var fused = FusedProduct(args)
    var M = fused.m
    var N = fused.n
    var line = padded(fused.k)
    var splits = fused.splits
    comptime tile = FusedTile[columns]
    var tiles = fused_tiles(M, N, columns)
    var row0, column0 = tile_origin(task % tiles, N, columns)
    var per_split = ((line + FUSED_K - 1) // FUSED_K + splits - 1) // splits * FUSED_K
    var k_begin = task // tiles * per_split
    var k_end = min(line, k_begin + per_split)
    var tid = Int(thread_idx.x)
    # a warp's lane 0's, so that the compiler knows it uniform: the wgmma descriptors derived from it then stay in
    # uniform registers instead of being moved there before every wgmma
    var warpgroup = Int(shuffle_idx(Int32(tid // 128), 0))
    var shared = external_memory[Int8, address_space=AddressSpace.SHARED, alignment=1024]()
    var full = BarrierPtr(unsafe_from_address=Int(shared.unsafe_offset(tile.slots * tile.stage_bytes)))
    if tid == 0:
        comptime for slot in range(tile.slots):
            mbarrier_init(full.unsafe_offset(slot), 1)
        fence_async_view_proxy()  # the initialised mbarriers visible to the tensor copies that complete them
    barrier()  # the mbarriers initialised before any thread waits on one
    var residues = fused.residue_block[moduli, columns](task)
    var loads = StageLoads[columns](a_map, b_map, row0, column0, k_begin, k_end)
    comptime for _ in range(tile.ahead):
        loads.start_next[moduli](shared, full)
    # The wgmma descriptors of slot 0's lines (the warpgroup's rows of A, and B); slot s's lie s·stage_bytes further.
    var a_lines = swizzled_lines(shared.unsafe_offset(64 * warpgroup * FUSED_K))
    var b_lines = swizzled_lines(shared.unsafe_offset(FUSED_ROWS * FUSED_K))
    var stages = Int32((k_end - k_begin + FUSED_K - 1) // FUSED_K)  # a modulus's stages
    var i = 0  # the modulus multiplied next
    var done = Int32(0)  # its stages multiplied so far (32-bit counters: fewer instructions a stage than Int's)
    var slot = Int32(0)  # the slot of the stage multiplied next
    var phase = Int32(0)  # the parity of the phase of slot's mbarrier that its next stage completes
    while i < moduli:
        var chunk_stages = min(stages - done, Int32(RESIDUE_CHUNK // FUSED_K))
        var sums = SIMD[DType.uint32, tile.sums](0)
        var stage = Int32(0)
        while stage < chunk_stages:
            wait_landed(full.unsafe_offset(Int(slot)), phase)  # this stage's copies have landed
            comptime if not tile.refill_late:
                barrier()  # every warpgroup done with the stage two before, whose slot the next copies refill
                loads.start_next[moduli](shared, full)
            var offset = Int64(slot * Int32(tile.stage_bytes >> 4))
            sums = multiply_stage[columns](sums, a_lines + offset, b_lines + offset)
            wgmma_wait_group_sync[1]()  # the stage before this one is done; this one's products run on
            comptime if tile.refill_late:
                barrier()  # every warpgroup done with the stage before, whose slot the next copies refill
                loads.start_next[moduli](shared, full)
            stage += 1
            slot += 1
            if slot == Int32(tile.slots):
                slot = 0
                phase ^= 1
        wgmma_wait_group_sync[0]()
        var words = U32Ptr(unsafe_from_address=residues + i * tile.outputs)
        comptime for j in range(moduli):
            if j == i:
                if done == 0:
                    fold_sums[MODULI[j], columns, True](words, sums, tid)
                else:
                    fold_sums[MODULI[j], columns, False](words, sums, tid)
        done += chunk_stages
        if done == stages:
            done = 0
            i += 1
    if fused.ranges:
        reconstruct_tile[moduli, columns](task % tiles, fused, task // tiles)
    elif splits == 1:
        reconstruct_tile[moduli, columns](task, fused)


@always_inline
def reconstruct_tile[moduli: Int, columns: Int](tile_index: Int, fused: FusedProduct, own_range: Int = -1):
    """Each thread of the block: its outputs of tile `tile_index` from their residues in the workspace, summed over
    the splits of k (each below p_i, so below 2^13 for at most 32 splits: crt_value's residues r_i ≡ X (mod p_i)),
    reconstructed and rounded by crt_value, as crt_round does from its residues: the same integer X, so the
    unfused form's bits. own_range ≥ 0 (`ranges`): that split's residues alone, its range's exponents (at
    range·M and range·N) and its partial (at range·M·N). On the H200 (bench/RESULTS.md, 2026-12-01 00:52) this
    SIMT form, on the FP64 and integer pipes beside the other block's products, beat the same sums as int8 products
    of residue rows and the constants' bytes on the tensor cores (9 % slower at k = 768: they spend the tensor cores
    and the shared memory the products need)."""
    var M = fused.m
    var N = fused.n
    var product = max(own_range, 0)  # the split summed first, and the product it belongs to: 0 unless `ranges`
    var splits = 1 if own_range >= 0 else fused.splits
    comptime tile = FusedTile[columns]
    var tiles = fused_tiles(M, N, columns)
    var row0, column0 = tile_origin(tile_index, N, columns)
    var tid = Int(thread_idx.x)
    var lane = tid % 32
    var row = row0 + 64 * (tid // 128) + 16 * (tid % 128 // 32) + lane // 4
    var a_exponents = fused.a_exponents.unsafe_offset(product * M)
    var b_exponents = fused.b_exponents.unsafe_offset(product * N)
    var c = fused.c.unsafe_offset(product * M * N)
    # Each word's residue bytes and column exponents are loaded one word ahead, so that their latency (the
    # workspace is in L2) overlaps the reconstruction of the word before; a thread's two rows stay its own throughout.
    var row_e = SIMD[DType.int32, 2](0)
    comptime for half in range(2):
        if row + 8 * half < M:
            row_e[half] = a_exponents.unsafe_load(row + 8 * half)
    var first_block = fused.residue_block[moduli, columns](product * tiles + tile_index)
    var next_packed = packed_residues[moduli, columns](first_block, 0, tid)
    var next_f = column_exponents(b_exponents, column0 + 2 * (lane % 4), N)
    for w in range(tile.words):
        var residues = SIMD[DType.uint32, 64](0)  # add_residue_bytes' layout: crt_value's for the word's 4 outputs
        add_residue_bytes[moduli](residues, next_packed)
        for split in range(product + 1, product + splits):
            var block = fused.residue_block[moduli, columns](split * tiles + tile_index)
            add_residue_bytes[moduli](residues, packed_residues[moduli, columns](block, w, tid))
        var column_f = next_f
        if w + 1 < tile.words:
            next_packed = packed_residues[moduli, columns](first_block, w + 1, tid)
            next_f = column_exponents(b_exponents, column0 + 8 * (w + 1) + 2 * (lane % 4), N)
        # The word's four outputs (two rows of two neighbouring columns) reconstruct side by side as crt_value's lanes:
        # four independent chains of multiply-adds, whose latency the few warps of a multiprocessor hide poorly
        # alone, and each constant weight moved into a register once for four outputs.
        var e = SIMD[DType.int32, 4](row_e[0], row_e[0], row_e[1], row_e[1])
        var f = SIMD[DType.int32, 4](column_f[0], column_f[1], column_f[0], column_f[1])
        var value = crt_value[moduli, False, 4](residues, e, f, fused.bits)
        var n = column0 + 8 * w + 2 * (lane % 4)
        comptime for j in range(4):
            var m = row + 8 * (j // 2)
            if m < M and n + j % 2 < N:
                var at = m * N + n + j % 2
                c.unsafe_store(at, finished(value.slice[1, offset=j](), c, at, e.slice[1, offset=j](),
                                            f.slice[1, offset=j](), fused.accumulate))


@always_inline
def packed_residues[moduli: Int, columns: Int](block: Int, w: Int, tid: Int) -> SIMD[DType.uint32, 16]:
    """Word w of the thread's residue bytes for each modulus (fold_sums' layout: modulus i's at i·outputs), in the
    workspace of one tile and split at `block`: lane i holds the residues of the thread's four outputs 4w … 4w + 3
    modulo MODULI[i], a byte each."""
    var packed = SIMD[DType.uint32, 16](0)
    comptime for i in range(moduli):
        packed[i] = U32Ptr(unsafe_from_address=block + i * FusedTile[columns].outputs).unsafe_load(w * FUSED_TEAM + tid)
    return packed


@always_inline
def add_residue_bytes[moduli: Int](mut residues: SIMD[DType.uint32, 64], packed: SIMD[DType.uint32, 16]):
    """residues[4i + j] += byte j of packed[i]: the residues of four outputs (packed_residues), one split's, in
    crt_value's layout for four lanes."""
    comptime for i in range(moduli):
        comptime for j in range(4):
            residues[4 * i + j] += (packed[i] >> UInt32(8 * j)) & 0xFF


@always_inline
def column_exponents(b_exponents: I32Ptr, n: Int, N: Int) -> SIMD[DType.int32, 2]:
    """The exponents of columns n and n + 1 (0 past the last column, whose outputs are not stored)."""
    var f = SIMD[DType.int32, 2](0)
    comptime for half in range(2):
        if n + half < N:
            f[half] = b_exponents.unsafe_load(n + half)
    return f


@always_inline
def exact_fused_wide[moduli: Int](task: Int, args: Args, a_map: Int, b_map: Int):
    """exact_fused_tile on tiles of 128 × 256 outputs."""
    exact_fused_tile[moduli, 256](task, args, a_map, b_map)


@always_inline
def exact_fused_narrow[moduli: Int](task: Int, args: Args, a_map: Int, b_map: Int):
    """exact_fused_tile on tiles of 128 × 128 outputs."""
    exact_fused_tile[moduli, 128](task, args, a_map, b_map)


def exact_fused_splits_summed[moduli: Int](task: Int, args: Args):
    """The outputs of tile `task` (128 × 128) of a product whose k exact_fused_tile split: reconstruct_tile."""
    reconstruct_tile[moduli, 128](task, FusedProduct(args))


def fused_products[moduli: Int](dev: DevicePtr, c: F32Ptr, a_residues: Int, b_residues: Int, a_exponents: Int,
                                b_exponents: Int, residues: Int, M: Int, N: Int, K: Int, bits: Int,
                                accumulate: Bool, splits: Int, ranges: Bool = False) raises:
    """The plane products and the reconstruction by exact_fused_tile, a block a tile of 128 × fused_columns
    outputs and a range of k (`splits` of them, then exact_fused_splits_summed if more than one, unless with
    `ranges` each is a product of its own); `residues` holds fused_scratch_bytes(M, N, K, moduli, splits)."""
    var args = FusedProduct(c, i32_at(a_exponents), i32_at(b_exponents), residues, M, N, K, bits, accumulate, splits,
                            ranges).args()
    var a_map = residue_map[FUSED_ROWS](dev, a_residues, M, K, moduli)
    if fused_columns(M, N, K, splits, ranges) == 256:
        comptime wide = FusedTile[256]
        launch_gpu_mapped_teams[moduli, FUSED_TEAM, wide.blocks_per_sm, exact_fused_wide, wide.shared_bytes](
            dev, splits * fused_tiles(M, N, 256), args, a_map, residue_map[256](dev, b_residues, N, K, moduli)
        )
        return
    comptime narrow = FusedTile[128]
    launch_gpu_mapped_teams[moduli, FUSED_TEAM, narrow.blocks_per_sm, exact_fused_narrow, narrow.shared_bytes](
        dev, splits * fused_tiles(M, N, 128), args, a_map, residue_map[128](dev, b_residues, N, K, moduli)
    )
    if splits > 1 and not ranges:
        launch_gpu_teams[moduli, FUSED_TEAM, narrow.blocks_per_sm, exact_fused_splits_summed](
            dev, fused_tiles(M, N, 128), args
        )


# ---- k ranges: a product per packed row, or block of rows, combined by the row tree ---------------------------
#
# The encoder's weight gradients sum over tokens by packed rows (docs/mesh.md): kernels.gemm's k_range cuts an Aᵀ·B
# product's k into ranges of one row's tokens, or of a block of rows where the rule takes a block's product
# (uform.nn.transformer.weight_gradient_range), and each range is an exact product of its own (its lines' exponents
# over its own elements, b from its own length), rounded once into a partial; the row tree (kernels/tree_sum.mojo)
# then adds the partials. A device holding an aligned block of ranges computes a subtree of the same sum. On a GPU
# with the fused kernel the ranges run together (one exponent pass, one residue pass and one fused launch whose
# splits are the ranges, each block reconstructing its range's partial), where the ranges are equal and a whole
# number of its stages; elsewhere one product per range.


def ranged_together(K: Int, range_length: Int, gpu: Bool, fused: Bool) -> Bool:
    """Whether the ranges of k run together, in one fused launch: on a Hopper GPU, in the fused form, for equal
    ranges of whole stages."""
    comptime if not HAS_HOPPER:
        return False
    return gpu and fused and K % range_length == 0 and range_length % FUSED_K == 0


def partials_bytes(ranges: Int, M: Int, N: Int) -> Int:
    """Bytes of the ranges' float32 partials, rounded up to 256 so that, one range at a time, the planes after them
    keep the 16-byte alignment their vector stores and copies need (run together, the partials come last)."""
    return (4 * ranges * M * N + 255) // 256 * 256


def ranged_workspace_bytes(M: Int, N: Int, K: Int, range_length: Int, gpu: Bool, fused: Bool) -> Int:
    """Bytes of gemm_exact_ranges_on's workspace: the partials (float32, a range each) and, where the ranges run
    together (ranged_together), the planes of the whole k, the ranges' exponents, their partial maxima and the fused
    kernel's residues (ranges_fused's layout); else one range's residue workspace."""
    var ranges = (K + range_length - 1) // range_length
    var partials = partials_bytes(ranges, M, N)
    if ranged_together(K, range_length, gpu, fused):
        var moduli = moduli_count(range_length)
        return (moduli * (M + N) * K + exponents_bytes(ranges * M) + exponents_bytes(ranges * N)
                + exponents_bytes(exponent_blocks(K) * max(M, N))
                + fused_scratch_bytes(M, N, K, moduli, ranges, ranges=True) + partials)
    var last = K - (ranges - 1) * range_length
    return partials + max(residue_workspace_bytes(M, N, range_length, 0, gpu),
                          residue_workspace_bytes(M, N, last, 0, gpu))


def gemm_exact_ranges_on[transpose_a: Bool, transpose_b: Bool, fused: Bool](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, accumulate: Bool, workspace: Int,
    range_length: Int, a_ready: Bool = False,
) raises:
    """C (+)= T(P_0, P_1, …) with P_r the exact product of k range r ([r·L, min((r + 1)·L, K)), L = range_length)
    and T the row tree (then C0 added once, as kernels.gemm's k ranges do); `workspace` holds
    ranged_workspace_bytes(M, N, K, L, dev[].is_gpu(), fused). a_ready (gemm_exact_residues_on's): taken where the
    ranges run together (ranges_fused_on); one range at a time finds A's planes range by range anyway."""
    comptime if not transpose_a or transpose_b:
        raise Error("gemm_exact: k ranges are for Aᵀ·B products")
    if ranged_together(K, range_length, dev[].is_gpu(), fused):
        ranges_fused_on(dev, Array[F32Ptr, 1](fill=c), a, Array[F32Ptr, 1](fill=b), M, Array[Int, 1](fill=N), 1, K,
                        accumulate, workspace, range_length, a_ready)
        return
    var ranges = (K + range_length - 1) // range_length
    var partials = workspace
    var rest = workspace + partials_bytes(ranges, M, N)
    for r in range(ranges):
        var first = r * range_length
        var length = min(range_length, K - first)
        # a(m, k) at k·M + m and b(k, n) at k·N + n: range r's operands start at row `first`; the fused form at its
        # own split (never fused_pays' cuBLAS, which a recorded device graph cannot hold)
        gemm_exact_residues_on[True, False, fused](dev, f32_at(partials + 4 * r * M * N), a.unsafe_offset(first * M),
                                                   b.unsafe_offset(first * N), M, N, length, False, rest,
                                                   fused_splits(M, N, length, 0))
    tree_of_ranges(dev, c, partials, M, N, ranges, accumulate, N)


def tree_of_ranges(dev: DevicePtr, c: F32Ptr, partials: Int, M: Int, N: Int, ranges: Int, accumulate: Bool,
                   stride: Int) raises:
    """C (+)= the row tree over the ranges' partials of C's M × N outputs, C's rows `stride` floats apart in a
    partial (N; or the joined columns' total, `partials` at C's first column: ranges_fused_on)."""
    var sum = TreeSum(c, f32_at(partials), M * N, ranges, accumulate, 0 if stride == N else N, stride)
    launch_elements[tree_sum, gpu_lanes=1](dev, M * N, sum.args())  # its stack of partials a lane: 1 a GPU thread


def columns_joined(K: Int, range_length: Int, products: Int, gpu: Bool) -> Bool:
    """Whether gemm_exact_shared_a_on runs products of one A as one product of their B's columns joined
    (ranges_fused_on): several Aᵀ·B products whose k ranges run together (ranged_together), so that their blocks
    share the GPU's waves (the weight gradients of q, k and v over ranges of 4096 tokens: 576 blocks of 128 × 128
    each, 2.2 waves of 264 apiece; joined, 864 blocks of 128 × 256)."""
    return products > 1 and 0 < range_length < K and ranged_together(K, range_length, gpu, True)


def ranges_fused_on[terms: Int](
    dev: DevicePtr, c: Array[F32Ptr, terms], a: F32Ptr, b: Array[F32Ptr, terms], M: Int, N: Array[Int, terms],
    products: Int, K: Int, accumulate: Bool, workspace: Int, range_length: Int, a_ready: Bool,
) raises:
    """C_t (+)= the row tree over every range's exact product of Aᵀ·B_t, for the first `products` B_t, the ranges of
    all of them in one fused launch over their columns joined (ranges_fused), then the tree of each C_t's columns.
    A product's bits are its own whatever it is joined with: an output's exact sum, exponents and rounding are its
    row's and column's alone. `workspace` holds ranged_workspace_bytes of the joined M × (N_0 + N_1 + …) product."""
    comptime if HAS_HOPPER:
        var partials: Int
        if moduli_count(range_length) == 11:
            partials = ranges_fused[11](dev, a, b, M, N, products, K, range_length, workspace, a_ready)
        else:
            partials = ranges_fused[12](dev, a, b, M, N, products, K, range_length, workspace, a_ready)
        var total = joined_size(N, products)
        var first = 0
        for t in range(products):
            tree_of_ranges(dev, c[t], partials + 4 * first, M, N[t], K // range_length, accumulate, total)
            first += N[t]
    else:
        raise Error("gemm_exact: k ranges run together only on a Hopper GPU")


def ranges_fused[moduli: Int, terms: Int](
    dev: DevicePtr, a: F32Ptr, b: Array[F32Ptr, terms], M: Int, N: Array[Int, terms], products: Int, K: Int,
    range_length: Int, workspace: Int, a_ready: Bool,
) raises -> Int:
    """Every range's exact product of Aᵀ·B, B the first `products` B_t joined along their columns, together (GPU,
    fused kernel): the ranges' exponents and the planes of the whole k cut range by range (ranged_planes; A's unless
    a_ready), then one fused launch whose splits are the ranges, each block reconstructing its range's partial.
    Answers where the partials are (range r's M × (N_0 + N_1 + …) floats at r·M·(N_0 + N_1 + …)): after
    everything else, so that A's part comes first, whatever N."""
    var ranges = K // range_length
    var bits = bits_per_side(range_length)
    var columns = joined_size(N, products)
    var a_residues = workspace  # A's part first, as in residue_product
    var a_exponents = a_residues + moduli * M * K
    var b_residues = a_exponents + exponents_bytes(ranges * M)
    var b_exponents = b_residues + moduli * columns * K
    var maxima = b_exponents + exponents_bytes(ranges * columns)
    var residues = maxima + exponents_bytes(exponent_blocks(K) * max(M, columns))
    var partials = residues + fused_scratch_bytes(M, columns, K, moduli, ranges, ranges=True)
    if not a_ready:
        ranged_planes[moduli](dev, a_residues, a_exponents, maxima, Array[F32Ptr, 1](fill=a), Array[Int, 1](fill=M), 1,
                              K, bits, range_length)
    ranged_planes[moduli](dev, b_residues, b_exponents, maxima, b, N, products, K, bits, range_length)
    fused_products[moduli](dev, f32_at(partials), a_residues, b_residues, a_exponents, b_exponents, residues, M,
                           columns, K, bits, False, ranges, ranges=True)
    return partials


# ---- the CPU's residue form: moduli below 2^12, int16 planes, pairs multiplied and added in int32 ---------------
#
# The CPU finds the same X from residues modulo the 8 WIDE_MODULI, primes below 2^12 whose product P ≈ 2^95.9 exceeds
# 2|X| for every K (|X| < K·2^(2b) ≤ 2^93, bits_per_side): 8 plane products where the MODULI take 11 or 12, for the
# CPU's integer multiplier is 16 bits wide. Each operand line's residues (symmetric, |r| ≤ 2046) are stored as an
# int16 plane (wide_planes), two neighbouring k making a 32-bit pair; a plane product is a blocked integer GEMM in
# the shape of gemm.mojo's CPU GEMM, each step AVX2's vpmaddwd, which multiplies the int16 halves of 8 pairs and
# adds each pair's two products in int32 (exact: |a_k·b_k + a_(k+1)·b_(k+1)| ≤ 2·2046² < 2^23; unlike
# vpmaddubsw it never saturates). A task takes one modulus and a run of rows of A against every column of B:
# per block of WIDE_KC k it packs each 16-column panel of B (pair-major, 8 KB) and walks the run's rows over it,
# 5 rows at a time: 10 accumulators of 8 int32 lanes, each lane one output's block sum (|·| < 128·2^23 = 2^30),
# which the tile reduces modulo p before adding it to the output's sum (below 2^25 after the 2^12 blocks of the
# longest k). crt_round[wide] then reconstructs X from the 8 sums as it does from the GPU's. Integer arithmetic
# throughout: blocking, order and thread count change no bit.

comptime WIDE_MODULI = (4093, 4091, 4079, 4073, 4057, 4051, 4049, 4027)  # the largest primes below 2^12
comptime WIDE_COUNT = 8
comptime WIDE_KC = 256  # k of one block: its 128 pairs' sum stays below 2^30
comptime Pairs = SIMD[DType.int32, 8]  # 8 lanes, each the int16 values of k and k + 1 (k even), k's in the low half
comptime PAIR_MR = 5  # rows of A a micro-kernel call: 10 accumulators, so nothing spills
comptime PAIR_NR = 16  # columns of B a panel: two vectors of Pairs
comptime PAIR_MAX_ROWS = 192  # rows of A a task takes at most
comptime PAIR_MIN_TASKS = 32  # fewer rows a task until the launch has this many, so the cores share it evenly
comptime I16Ptr = Pointer[Int16, MutUntrackedOrigin]


def wide_residue_product[transpose_a: Bool, transpose_b: Bool, terms: Int](
    dev: DevicePtr, c: F32Ptr, a: Array[F32Ptr, terms], b: Array[F32Ptr, terms], M: Int, N: Int, k: Joined[terms],
    accumulate: Bool, workspace: Int,
) raises:
    """gemm_exact_residues_on on the CPU: the lines' exponents, their int16 planes, the plane products, the
    reconstruction; with several terms (gemm_exact_summed_on), of their operands joined along k."""
    # |X| < P/2 for the 12 MODULI's P (bits_per_side), so twice that P leaves crt_round's estimate a margin of 1/4;
    # below 2^96, X is found modulo 2^96.
    comptime assert modulus_product[True, WIDE_COUNT]() > 2 * modulus_product[False, 12](), "too few WIDE_MODULI"
    comptime assert modulus_product[True, WIDE_COUNT]() < UInt128(1) << UInt128(CRT_BITS), "too many WIDE_MODULI"
    var bits = bits_per_side(k.total)
    var K = k.extent
    var a_planes = workspace
    var b_planes = a_planes + 2 * WIDE_COUNT * M * padded(K)
    var sums = b_planes + 2 * WIDE_COUNT * N * padded(K)
    var a_exponents = sums + 4 * WIDE_COUNT * M * N
    var b_exponents = a_exponents + 4 * M
    var partial = b_exponents + 4 * N
    joined_planes[WIDE_COUNT, terms, wide=True](dev, a_planes, a_exponents, partial, a, M, k, not transpose_a, bits)
    joined_planes[WIDE_COUNT, terms, wide=True](dev, b_planes, b_exponents, partial, b, N, k, transpose_b, bits)
    wide_products(dev, sums, a_planes, b_planes, M, N, K)
    reconstruct[WIDE_COUNT, True](dev, c, sums, a_exponents, b_exponents, M, N, K, bits, accumulate)


def wide_planes(
    dev: DevicePtr, planes: Int, exponents: Int, x: F32Ptr, lines: Int, length: Int, line_stride: Int,
    element_stride: Int, bits: Int, plane_line: Int, k_offset: Int,
) raises:
    """With the lines' exponents found, each line's symmetric residues modulo WIDE_MODULI[i] at
    planes[(i·lines + line)·plane_line + k_offset + k] (int16, zero in the padding and for a non-finite line), a
    task a line and group of 16 k, the group's 16 values converted at once. Tasks go along a line where its
    elements are contiguous, else across neighbouring lines, so that neighbouring tasks read neighbouring floats."""
    var groups = padded(length) // RESIDUE_GROUP
    var along = element_stride == 1

    def task_range(begin: Int, end: Int) {imm planes, imm exponents, imm x, imm lines, imm length, imm line_stride, imm element_stride, imm bits, imm groups, imm along, imm plane_line, imm k_offset}:
        var residues = I16Ptr(unsafe_from_address=planes)
        for task in range(begin, end):
            var line = task // groups if along else task % lines
            var first = (task % groups if along else task // lines) * RESIDUE_GROUP
            var e = i32_at(exponents).unsafe_load(line)
            var group = fixed_group(x.unsafe_offset(line * line_stride), element_stride, length, first, bits, e)
            comptime for i in range(WIDE_COUNT):
                residues.unsafe_store((i * lines + line) * plane_line + k_offset + first,
                                      group.residues[WIDE_MODULI[i], DType.int16]())

    cpu_parallel_for(dev, task_range, lines * groups)


@always_inline
def pair_products(a: Pairs, b: Pairs) -> Pairs:
    """Lane j: a_j.low·b_j.low + a_j.high·b_j.high, the products of the lanes' int16 halves added in int32
    (vpmaddwd)."""
    return llvm_intrinsic["llvm.x86.avx2.pmadd.wd", Pairs](bitcast[DType.int16, 16](a), bitcast[DType.int16, 16](b))


def pack_pair_panel(panel: I32Ptr, b: I32Ptr, n0: Int, N: Int, line_pairs: Int, p_begin: Int, p_end: Int):
    """Lines [n0, n0 + 16) of a plane, as pairs (line n's pair p at b[n·line_pairs + p]), over pairs
    [p_begin, p_end) (multiples of 8), pair-major: pair p of line n0 + j at panel[16(p − p_begin) + j], zero
    past N. Each 8 lines × 8 pairs move as one transposed 8 × 8 block."""
    for p in range(p_begin, p_end, 8):
        comptime for half in range(2):
            var lines = Array[Pairs, 8](fill=Pairs(0))
            comptime for j in range(8):
                if n0 + 8 * half + j < N:
                    lines[j] = b.unsafe_load[width=8]((n0 + 8 * half + j) * line_pairs + p)
            var columns = transposed(lines)
            comptime for c in range(8):
                panel.unsafe_store((p - p_begin + c) * PAIR_NR + 8 * half, columns[c])


@always_inline
def wide_micro_kernel[rows: Int, p: Int](
    sums: I32Ptr, a: I32Ptr, line_pairs: Int, panel: I32Ptr, pairs: Int, columns: Int, N: Int, first: Bool
):
    """For r < rows and j < columns, the block sum S = Σ_q a[r·line_pairs + q]·panel[16q + j] over q < pairs (each
    term a pair's two products; pairs ≤ 128, so |S| < 2^30) is reduced to
    R = (S + 2^30) mod p + (p − 2^30 mod p), in [0, 2p) and ≡ S (mod p), and sums[r·N + j] = R, or += R after
    the `first` block."""
    var lo = Array[Pairs, rows](fill=Pairs(0))
    var hi = Array[Pairs, rows](fill=Pairs(0))
    for q in range(pairs):
        var b_lo = panel.unsafe_load[width=8](q * PAIR_NR)
        var b_hi = panel.unsafe_load[width=8](q * PAIR_NR + 8)
        comptime for r in range(rows):
            var x = Pairs(a.unsafe_load(r * line_pairs + q))
            lo[r] += pair_products(x, b_lo)
            hi[r] += pair_products(x, b_hi)
    comptime for r in range(rows):
        var row = sums.unsafe_offset(r * N)
        var low = chunk_residue[p](lo[r]).cast[DType.int32]()
        var high = chunk_residue[p](hi[r]).cast[DType.int32]()
        if columns == PAIR_NR:
            if not first:
                low += row.unsafe_load[width=8](0)
                high += row.unsafe_load[width=8](8)
            row.unsafe_store(0, low)
            row.unsafe_store(8, high)
        else:
            for j in range(columns):
                var value = low[j] if j < 8 else high[j - 8]
                row.unsafe_store(j, value if first else row.unsafe_load(j) + value)


def wide_rows[p: Int](
    sums: I32Ptr, a: I32Ptr, b: I32Ptr, panel: I32Ptr, m_begin: Int, m_end: Int, N: Int, line_pairs: Int
):
    """Rows [m_begin, m_end) of one plane product, S[m, n] = Σ_k a[m, k]·b[n, k] reduced block by block (the planes
    as pairs, line_pairs a line): per block of WIDE_KC k, each 16-column panel packed and the rows walked over it
    PAIR_MR at a time, the last few together."""
    for p_begin in range(0, line_pairs, WIDE_KC // 2):
        var p_end = min(line_pairs, p_begin + WIDE_KC // 2)
        var pairs = p_end - p_begin
        for n0 in range(0, N, PAIR_NR):
            pack_pair_panel(panel, b, n0, N, line_pairs, p_begin, p_end)
            var columns = min(PAIR_NR, N - n0)

            @always_inline
            def tile[rows: Int](m0: Int) {imm sums, imm a, imm panel, imm N, imm line_pairs, imm p_begin, imm pairs, imm n0, imm columns}:
                wide_micro_kernel[rows, p](sums.unsafe_offset(m0 * N + n0), a.unsafe_offset(m0 * line_pairs + p_begin),
                                           line_pairs, panel, pairs, columns, N, p_begin == 0)

            var m0 = m_begin
            while m0 + PAIR_MR <= m_end:
                tile[PAIR_MR](m0)
                m0 += PAIR_MR
            comptime for left in range(1, PAIR_MR):
                if m_end - m0 == left:
                    tile[left](m0)


def wide_products(dev: DevicePtr, sums: Int, a_planes: Int, b_planes: Int, M: Int, N: Int, K: Int) raises:
    """sums[i·M·N + m·N + n] ≡ Σ_k a_i[m, k]·b_i[n, k] (mod WIDE_MODULI[i]), in [0, 2^25): wide_rows, a task a
    modulus and a run of rows."""
    var line_pairs = padded(K) // 2
    var row_blocks = (M + PAIR_MR - 1) // PAIR_MR
    var row_tasks = min(row_blocks, max((M + PAIR_MAX_ROWS - 1) // PAIR_MAX_ROWS,
                                        (PAIR_MIN_TASKS + WIDE_COUNT - 1) // WIDE_COUNT))
    var rows_per_task = (row_blocks + row_tasks - 1) // row_tasks * PAIR_MR
    row_tasks = (M + rows_per_task - 1) // rows_per_task

    def task_range(begin: Int, end: Int) {imm sums, imm a_planes, imm b_planes, imm M, imm N, imm line_pairs, imm row_tasks, imm rows_per_task}:
        var panel = i32_at(Int(alloc[Int32](WIDE_KC // 2 * PAIR_NR, alignment=64)))
        for task in range(begin, end):
            var i = task // row_tasks
            var m_begin = task % row_tasks * rows_per_task
            var m_end = min(M, m_begin + rows_per_task)
            var out = i32_at(sums + 4 * i * M * N)
            var a = i32_at(a_planes + 4 * i * M * line_pairs)
            var b = i32_at(b_planes + 4 * i * N * line_pairs)
            comptime for j in range(WIDE_COUNT):
                if i == j:
                    wide_rows[WIDE_MODULI[j]](out, a, b, panel, m_begin, m_end, N, line_pairs)
        panel.unsafe_free()

    cpu_parallel_for(dev, task_range, WIDE_COUNT * row_tasks)
