"""The CPU's residue form: moduli below 2^12, int16 planes, pairs multiplied and added in int32.

The CPU finds the same X from residues modulo the 8 WIDE_MODULI, primes below 2^12 whose product P ≈ 2^95.9 exceeds
2|X| for every K (|X| < K·2^(2b) ≤ 2^93, bits_per_side): 8 plane products where the MODULI take 11 or 12, for the
CPU's integer multiplier is 16 bits wide. Each operand line's residues (symmetric, |r| ≤ 2046) are stored as an
int16 plane (wide_planes), two neighbouring k making a 32-bit pair; a plane product is a blocked integer GEMM in
the shape of fma.mojo's CPU GEMM, each step AVX2's vpmaddwd, which multiplies the int16 halves of 8 pairs and
adds each pair's two products in int32 (exact: |a_k·b_k + a_(k+1)·b_(k+1)| ≤ 2·2046² < 2^23; unlike
vpmaddubsw it never saturates). A task takes one modulus and a run of rows of A against every column of B:
per block of WIDE_KC k it packs each 16-column panel of B (pair-major, 8 KB) and walks the run's rows over it,
5 rows at a time: 10 accumulators of 8 int32 lanes, each lane one output's block sum (|·| < 128·2^23 = 2^30),
which the tile reduces modulo p before adding it to the output's sum (below 2^25 after the 2^12 blocks of the
longest k). crt_round[wide] then reconstructs X from the 8 sums as it does from the GPU's. Integer arithmetic
throughout: blocking, order and thread count change no bit.
"""

from std.memory import bitcast
from std.collections import Array
from std.sys import llvm_intrinsic
from engine.device import F32Ptr, I32Ptr, i32_at
from engine.launch import DevicePtr, cpu_parallel_for
from kernels.gemm.fma import transposed
from kernels.gemm.exact.definition import bits_per_side
from kernels.gemm.exact.residues import Joined, RESIDUE_GROUP, fixed_group, joined_planes, padded
from kernels.gemm.exact.crt import CRT_BITS, chunk_residue, modulus_product, reconstruct


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
