"""The residue form's reconstruction: the Chinese remainder theorem from the residues of X to X, rounded once.

A plane product sums int8 × int8 in int32 (exact; chunks of RESIDUE_CHUNK k keep |Σ| ≤ 2^30); the theorem's
weighted sum, X = Σ r_i·W_i − q·P (crt_round proves it), turns the N residues of X into X, and X is rounded as
the definition rounds it (`finished`). The weights and fractions are compile-time constants of the moduli (the
GPU's MODULI, or the CPU's WIDE_MODULI: `wide`). `crt_round` takes a thread an output; the fused kernel calls
crt_value and finished per output itself (fused_sm90.mojo).
"""

from std.math import fma
from std.memory import bitcast
from std.sys import inlined_assembly, is_nvidia_gpu
from engine.device import F32Ptr, I32Ptr, i32_at
from engine.launch import Args, DevicePtr, launch_elements
from engine.numerics import CANONICAL_NAN
from kernels.gemm.exact.definition import MODULI, NON_FINITE, rounded
from kernels.gemm.exact.residues import RESIDUE_CHUNK, remainder_below_2_31
from kernels.gemm.exact.cpu_wide import WIDE_MODULI


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


def reconstruct[moduli: Int, wide: Bool](
    dev: DevicePtr, c: F32Ptr, sums: Int, a_exponents: Int, b_exponents: Int, M: Int, N: Int, K: Int, bits: Int,
    accumulate: Bool,
) raises:
    """C from the plane products' sums: crt_round over every output."""
    var crt = CrtRound(c, i32_at(sums), i32_at(a_exponents), i32_at(b_exponents), M, N, K, bits, accumulate)
    launch_elements[crt_round[moduli, wide, ...], gpu_lanes=1](dev, M * N, crt.args())  # 4 a GPU thread: 19 % slower
