"""The residue form's second pass: each operand line's fixed-point values as residue planes.

X = Σ_k A'·B' is found from its residues modulo the first N(K) MODULI (crt.mojo), whose product P exceeds 2|X|:
each operand is kept as N int8 residue planes (its symmetric residues, |r| ≤ 128). A line's values are cut as
the definition cuts them (fixed_point against its exponent) and reduced modulo each modulus: `exact_residues`
takes a task a line and group of 16 k; a transposed operand `exact_residues_across`, a team a tile of lines; many
contiguous lines take the exponent and the residues in one pass, `exact_line_planes`, a GPU half-warp a line.
`Joined` describes a product's operands joined along k (the summed terms of a group, or one term), and
joined_planes, residue_planes and ranged_planes run the passes for a whole operand, its k joined or cut into
ranges. Every body is integer arithmetic in 32 bits where the values allow.
"""

from std.bit import count_leading_zeros
from std.math import fma
from std.memory import bitcast
from std.collections import Array
from std.sys import inlined_assembly, is_nvidia_gpu
from engine.device import F32Ptr, I32Ptr, i32_at
from engine.launch import Args, DevicePtr, launch_grouped, launch_index, launch_teams, sync
from max.gpu.memory import AddressSpace
from max.gpu.primitives.warp import shuffle_xor
from engine.numerics import scale_by_power_of_two
from kernels.gemm.exact.definition import MODULI, NON_FINITE, exponent_of_largest, rounded, significand
from kernels.gemm.exact.exponents import (
    EXPONENT_BLOCK, exponent_blocks, exponents_of_maxima, joined_line_exponents, line_exponents_on,
    partial_maxima_on,
)
from kernels.gemm.exact.cpu_wide import wide_planes


comptime RESIDUE_CHUNK = 1 << 16  # k of one int32 residue sum: 2^16 products of at most 2^14 each
comptime RESIDUE_ALIGNMENT = 16  # a residue line's length is padded (with zeros) to a multiple of 16 bytes


def padded(K: Int) -> Int:
    """The stored length of a residue line of K values."""
    return (K + RESIDUE_ALIGNMENT - 1) // RESIDUE_ALIGNMENT * RESIDUE_ALIGNMENT


comptime I8Ptr = Pointer[Int8, MutUntrackedOrigin]


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
