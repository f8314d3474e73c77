"""fp32 GEMM: C = op(A)·op(B), or C += op(A)·op(B), with op a transpose or not.

    C[m, n] = C0[m, n] + Σ_k a(m, k)·b(k, n)      (C0 = 0 unless accumulating)

The canonical order: every output is one chain of fma over k = 0, 1, …, K−1,
starting from +0, and C0 is added once at the end. An Aᵀ·B product with a small output
and a long k (the weight gradients: hidden × hidden summed over every token) is cut
into `k_chunks(M, N, K)` consecutive k ranges instead: each range its own chain from
+0, the ranges' partial sums then added in ascending order, then C0. The count
depends on M, N and K alone, so every device cuts the same ranges; A·B and A·Bᵀ
products are never cut, so each output row depends on its own row of A alone. A
caller may instead name the ranges' length (`range_length`, Aᵀ·B only: the encoder's
weight gradients, one range per packed row): each range its own chain from +0, the
ranges then combined by the row tree (kernels/tree_sum.mojo), then C0. Both launchers keep it:
the CPU kernel vectorises across n (each SIMD lane its own chain), the GPU
kernel gives each thread an 8×8 (large tiles) or 4×8 (small tiles) block of outputs, each its own chain, while the
block stages k slices of A and B through two shared-memory stages (below). Tile
sizes, slice depth, staging and which products share a launch (`gemm_group_on`: q, k and v of one input in
one launch) are free; the chains and the k ranges are not.

Layouts (row-major storage): a(m, k) = A[m·K + k], or A[k·M + m] when A is
stored transposed (K×M); b(k, n) = B[k·N + n], or B[n·K + k] when B is stored
transposed (N×K). Backward passes need A·B, Aᵀ·B and A·Bᵀ.
"""

from std.collections import Array
from std.memory import stack_allocation
from max.gpu import barrier, block_idx, thread_idx
from max.gpu.memory import AddressSpace
from std.utils.static_tuple import StaticTuple
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from engine.device import F32Ptr, f32_at
from engine.launch import Args, DevicePtr, Interface, cpu_parallel_for, launch_elements, launch_index
from engine.target import HAS_ACCELERATOR
from kernels.tree_sum import TreeSum, tree_sum


@always_inline
def a_index[transpose_a: Bool](m: Int, k: Int, M: Int, K: Int) -> Int:
    comptime if transpose_a:
        return k * M + m
    else:
        return m * K + k


@always_inline
def b_index[transpose_b: Bool](k: Int, n: Int, K: Int, N: Int) -> Int:
    comptime if transpose_b:
        return n * K + k
    else:
        return k * N + n


# ---- GPU: a BM×BN output tile per block, TM×8 outputs per thread --------------------------
# The block stages KT-deep slices of op(A) and op(B) through two shared-memory stages. While it
# multiplies one stage, each thread loads its share of the next slice from global memory into
# registers (the loads issued before the products, so their latency hides behind them) and stores it
# to the other stage after them: one barrier per slice. A slice of 16 k comes in two halves, each
# loaded before and stored after half of the products, which halves the registers it holds. Loads
# are 128-bit where the layout allows it (`vec`). Shared rows are padded by 4 floats, so the
# transposing stores (the operand stored k-contiguous) meet no bank conflicts. Each thread's outputs
# are one or two 4-row blocks (BM/2 rows apart) by two 4-column blocks (BN/2 apart), or one (H = 1);
# a warp's threads form 4 rows × 8 columns of such blocks, so its fragment loads are conflict-free
# 128-bit shared loads. None of this touches the order: each output is still its own chain over k, slice after slice.
# Large launches take 128×128 tiles of 8×8 per thread (256 threads, two blocks per multiprocessor);
# smaller ones 64×64 tiles of 4×8 per thread (128 threads), so more warps share the multiprocessors
# (the weight gradients: 768 × 3072 outputs over 65,536 tokens are 144 large tiles on 132
# multiprocessors, but 576 small ones of 4 warps each); a product cut into k ranges takes the large tiles from
# about two blocks a multiprocessor over all its ranges; one cut into few long ranges of few outputs 32×32 tiles of
# 4×4 per thread (64 threads) in slices of 32 k, so that its blocks reach every multiprocessor and each slice's
# products cover the next slice's loads.

comptime BK = 8  # the k ranges of the split (`chunk_length`) are whole multiples of this; part of the order
comptime SMALL_OUTPUT_BLOCKS = 132  # fewer 128×128 tiles than this: split k (part of the canonical order)
comptime SPLIT_MIN_K = 4096
comptime MIN_CHUNK = 256  # the byte LM's weight gradients over 8192 tokens: 32 ranges (2048 gave 4: 2–4× slower)
comptime MAX_CHUNKS = 32
comptime LARGE_TILE_MIN_BLOCKS = 4 * 132  # fewer 128×128 blocks: 64×64 tiles (speed only, free)
# The same for a product in k ranges, over all its ranges' blocks: 256, not 2·132, so that the byte LM's largest
# weight gradient (8 large tiles × 32 ranges) takes the large tiles, which ran it in 52 µs against 62 (small).
comptime RANGED_LARGE_MIN_BLOCKS = 256
comptime PAD = 4  # floats added to every shared row

comptime Quad = SIMD[DType.float32, 4]


def large_tiles(M: Int, N: Int) -> Int:
    """128×128 tiles of an M×N output."""
    return ((N + 127) // 128) * ((M + 127) // 128)


def small_output(M: Int, N: Int) -> Bool:
    return large_tiles(M, N) < SMALL_OUTPUT_BLOCKS


def k_chunks(M: Int, N: Int, K: Int, transpose_a: Bool, range_length: Int) -> Int:
    """How many consecutive k ranges the canonical order cuts this product into: K / range_length rounded up
    when a range length is named, else the small-output rule for Aᵀ·B products."""
    if range_length > 0:
        return (K + range_length - 1) // range_length
    if not transpose_a or not small_output(M, N) or K < SPLIT_MIN_K:
        return 1
    return min(MAX_CHUNKS, K // MIN_CHUNK)


def chunk_length(K: Int, chunks: Int) -> Int:
    """Each range's length: K / chunks rounded up to whole BK tiles (the last range takes the rest)."""
    var length = (K + chunks - 1) // chunks
    return (length + BK - 1) // BK * BK


@always_inline
def load_quad[k_contiguous: Bool, vec: Bool](p: F32Ptr, r: Int, k: Int, R: Int, K: Int, k_end: Int) -> Quad:
    """Four neighbours along an operand's stored axis, zero outside rows < R and k < k_end.
    k_contiguous (stored R×K, element (r, k) at p[r·K + k]): (r, k … k+3); else (stored K×R, at
    p[k·R + r]): (r … r+3, k). With `vec`, the quad is one aligned 128-bit load, all in or all out."""
    comptime if k_contiguous:
        comptime if vec:
            if r < R and k < k_end:
                return p.unsafe_load[width=4, alignment=16](r * K + k)
            return Quad(0)
        else:
            var q = Quad(0)
            if r < R:
                comptime for i in range(4):
                    if k + i < k_end:
                        q[i] = p.unsafe_load(r * K + k + i)
            return q
    else:
        comptime if vec:
            if r < R and k < k_end:
                return p.unsafe_load[width=4, alignment=16](k * R + r)
            return Quad(0)
        else:
            var q = Quad(0)
            if k < k_end:
                comptime for i in range(4):
                    if r + i < R:
                        q[i] = p.unsafe_load(k * R + r + i)
            return q


@always_inline
def quad_place[k_contiguous: Bool, BR: Int, threads: Int](tid: Int, e: Int) -> Tuple[Int, Int]:
    """(row, k) in the tile of the first element of the e-th quad a thread stages. k-contiguous: two
    threads cover a row's 8 k, a warp 16 rows (32-byte pieces); otherwise a warp reads 32 consecutive quads of
    rows: 128 rows of one k in a 128-row tile, 64 rows of two k in a 64-row tile."""
    var f = tid + e * threads
    comptime if k_contiguous:
        return ((f // 2) % BR, 4 * (f % 2 + 2 * (f // (2 * BR))))
    else:
        return (4 * (f % (BR // 4)), f // (BR // 4))


comptime Shared = Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED]


@always_inline
def thread_place[BN: Int, H: Int]() -> Tuple[Int, Int]:
    """The thread's place (ty, tx) among a tile's blocks of 4 rows × 4H columns: a warp's threads form 4 rows × 8
    columns of them, the warps tiling the BN columns first."""
    comptime WARPS_N = BN // (4 * H) // 8  # warps across the tile's columns
    var tid = Int(thread_idx.x)
    var warp = tid // 32
    var lane = tid % 32
    return ((warp // WARPS_N) * 4 + lane // 8, (warp % WARPS_N) * 8 + lane % 8)


@always_inline
def tile_products[
    transpose_a: Bool, transpose_b: Bool, BM: Int, BN: Int, TM: Int, KT: Int, threads: Int, vec: Bool, H: Int,
](
    mut acc: Array[Quad, H * TM], As: Shared, Bs: Shared, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, row0: Int,
    col0: Int, k_begin: Int, k_end: Int,
):
    """acc[H·r + h] += the thread's outputs of tile (row0, col0) over k in [k_begin, k_end), each one fma chain over
    k ascending, the slices staged through As and Bs (two stages each); every thread of the block calls it, and
    it ends at a barrier, so the stages may be staged again after it."""
    comptime RB = TM // 4  # blocks of 4 rows per thread, BM/RB rows apart
    comptime TX = BN // (4 * H)  # threads across the tile's columns
    comptime assert RB * 4 == TM and (RB == 1 or RB == 2), "4 or 8 rows per thread"
    comptime assert H == 1 or H == 2, "one or two blocks of 4 columns per thread"
    comptime assert (BM // TM) * TX == threads, "one thread per TM×4H outputs"
    comptime assert TX % 8 == 0 and (BM // TM) % 4 == 0, "warps of 4×8 threads"
    comptime assert KT % 8 == 0, "k-contiguous staging covers 8 k per thread pair"
    comptime A_QUADS = BM * KT // 4 // threads
    comptime B_QUADS = BN * KT // 4 // threads
    comptime assert A_QUADS * threads * 4 == BM * KT and B_QUADS * threads * 4 == BN * KT, "whole quads per thread"
    comptime assert A_QUADS == B_QUADS and KT % A_QUADS == 0, "the slice staged in equal parts"
    comptime PARTS = A_QUADS  # each part: one quad of A and one of B per thread
    comptime SA = BM + PAD
    comptime SB = BN + PAD
    comptime A_STAGE = KT * SA
    comptime B_STAGE = KT * SB
    comptime A_KC = not transpose_a  # A stored M×K: k-contiguous
    comptime B_KC = transpose_b  # B stored N×K: k-contiguous
    var tid = Int(thread_idx.x)
    var ty, tx = thread_place[BN, H]()

    var a_next = Array[Quad, PARTS](fill=Quad(0))
    var b_next = Array[Quad, PARTS](fill=Quad(0))

    @always_inline
    def fetch(k0: Int, e: Int) {mut a_next, mut b_next, imm a, imm b, imm tid, imm row0, imm col0, imm M, imm N, imm K, imm k_end}:
        var a_place = quad_place[A_KC, BM, threads](tid, e)
        comptime if A_KC:
            a_next[e] = load_quad[True, vec](a, row0 + a_place[0], k0 + a_place[1], M, K, k_end)
        else:
            a_next[e] = load_quad[False, vec](a, row0 + a_place[0], k0 + a_place[1], M, K, k_end)
        var b_place = quad_place[B_KC, BN, threads](tid, e)
        comptime if B_KC:
            b_next[e] = load_quad[True, vec](b, col0 + b_place[0], k0 + b_place[1], N, K, k_end)
        else:
            b_next[e] = load_quad[False, vec](b, col0 + b_place[0], k0 + b_place[1], N, K, k_end)

    @always_inline
    def stage(s: Int, e: Int) {imm a_next, imm b_next, imm As, imm Bs, imm tid}:
        var a_stage = As.unsafe_offset(s * A_STAGE)
        var b_stage = Bs.unsafe_offset(s * B_STAGE)
        var a_place = quad_place[A_KC, BM, threads](tid, e)
        comptime if A_KC:
            comptime for i in range(4):
                a_stage.unsafe_store((a_place[1] + i) * SA + a_place[0], a_next[e][i])
        else:
            a_stage.unsafe_store[alignment=16](a_place[1] * SA + a_place[0], a_next[e])
        var b_place = quad_place[B_KC, BN, threads](tid, e)
        comptime if B_KC:
            comptime for i in range(4):
                b_stage.unsafe_store((b_place[1] + i) * SB + b_place[0], b_next[e][i])
        else:
            b_stage.unsafe_store[alignment=16](b_place[1] * SB + b_place[0], b_next[e])

    @always_inline
    def step(s: Int, kk: Int) {mut acc, imm As, imm Bs, imm ty, imm tx}:
        var a_row = As.unsafe_offset(s * A_STAGE + kk * SA + 4 * ty)
        var b_row = Bs.unsafe_offset(s * B_STAGE + kk * SB + 4 * tx)
        var b_quads = Array[Quad, H](fill=Quad(0))
        comptime for h in range(H):
            b_quads[h] = b_row.unsafe_load[width=4, alignment=16](h * (BN // H))
        comptime for rb in range(RB):
            var a_quad = a_row.unsafe_load[width=4, alignment=16](rb * (BM // RB))
            comptime for i in range(4):
                var x = Quad(a_quad[i])
                comptime for h in range(H):
                    acc[H * (4 * rb + i) + h] = x.fma(b_quads[h], acc[H * (4 * rb + i) + h])

    var span = k_end - k_begin
    var full_tiles = span // KT
    var tiles = (span + KT - 1) // KT
    if tiles > 0:
        comptime for e in range(PARTS):
            fetch(k_begin, e)
            stage(0, e)
    barrier()
    for t in range(tiles):
        var s = t % 2
        var k_next = k_begin + (t + 1) * KT
        if t < full_tiles:
            # The next slice comes in parts, each loaded before a share of the products and stored to
            # the free stage after it: its loads are in flight meanwhile, and it holds few registers.
            comptime for e in range(PARTS):
                fetch(k_next, e)  # zeros past the range's end: the last slice stages zeros, never read
                comptime for kk in range(e * (KT // PARTS), (e + 1) * (KT // PARTS)):
                    step(s, kk)
                stage(1 - s, e)
        else:
            # The last, partial slice (never followed by another) stops at the range's end exactly,
            # as the CPU does.
            for kk in range(span - t * KT):
                step(s, kk)
        barrier()


@always_inline
def store_tile[BM: Int, BN: Int, TM: Int, threads: Int, vec: Bool, H: Int](
    acc: Array[Quad, H * TM], target: F32Ptr, M: Int, N: Int, row0: Int, col0: Int, accumulate: Bool
):
    """The thread's outputs of tile (row0, col0) into target [M, N]: C0 + acc when accumulating (C0 read there, once),
    else acc."""
    comptime RB = TM // 4
    var ty, tx = thread_place[BN, H]()
    comptime for r in range(TM):
        var m = row0 + 4 * ty + (r % 4) + (r // 4) * (BM // RB)
        if m < M:
            comptime for h in range(H):
                var n = col0 + 4 * tx + h * (BN // H)
                var value = acc[H * r + h]
                comptime if vec:
                    if n < N:
                        if accumulate:
                            value = target.unsafe_load[width=4, alignment=16](m * N + n) + value
                        target.unsafe_store[alignment=16](m * N + n, value)
                else:
                    comptime for j in range(4):
                        if n + j < N:
                            var v = value[j]
                            if accumulate:
                                v = target.unsafe_load(m * N + n + j) + v
                            target.unsafe_store(m * N + n + j, v)


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(threads)), `nvvm.minctasm`=SIMDLength(blocks_per_sm)
)
def gemm_gpu[
    transpose_a: Bool, transpose_b: Bool, BM: Int, BN: Int, TM: Int, KT: Int, threads: Int, blocks_per_sm: Int,
    vec: Bool, H: Int = 2,
](c: F32Ptr, a: F32Ptr, b: F32Ptr, M64: Int64, N64: Int64, K64: Int64, accumulate: Int64, chunk64: Int64):
    """C[m, n] (+)= Σ_k a(m, k)·b(k, n) over k range z, each output one fma chain over k ascending
    from +0, C0 added once after it (the canonical order above). Block (x, y, z) computes output tile
    (y, x) over k range z; with several ranges, `c` is the partial sums [ranges, M, N] and accumulate
    is 0. TM×4H outputs per thread (TM = 4 or 8 rows; H = 2 or 1 column blocks of 4, BN/H apart); KT: the k
    depth of a staged slice."""
    var M = Int(M64)
    var N = Int(N64)
    var K = Int(K64)
    var row0 = Int(block_idx.y) * BM
    var col0 = Int(block_idx.x) * BN
    var k_begin = Int(block_idx.z) * Int(chunk64)
    var k_end = min(K, k_begin + Int(chunk64))
    # As[stage][k][m], Bs[stage][k][n]: both read along their last index in the products.
    var As = stack_allocation[2 * KT * (BM + PAD), Float32, alignment=16, address_space=AddressSpace.SHARED]()
    var Bs = stack_allocation[2 * KT * (BN + PAD), Float32, alignment=16, address_space=AddressSpace.SHARED]()
    var acc = Array[Quad, H * TM](fill=Quad(0))  # acc[H·r + h]: row r (0…TM−1), column block h
    tile_products[transpose_a, transpose_b, BM, BN, TM, KT, threads, vec, H](
        acc, As, Bs, a, b, M, N, K, row0, col0, k_begin, k_end
    )
    store_tile[BM, BN, TM, threads, vec, H](
        acc, c.unsafe_offset(Int(block_idx.z) * M * N), M, N, row0, col0, accumulate != 0
    )


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(threads)), `nvvm.minctasm`=SIMDLength(blocks_per_sm)
)
def gemm_group_gpu[
    transpose_a: Bool, transpose_b: Bool, BM: Int, BN: Int, TM: Int, KT: Int, threads: Int, blocks_per_sm: Int,
    vec: Bool, H: Int = 2,
](
    c0: F32Ptr, c1: F32Ptr, c2: F32Ptr, a0: F32Ptr, a1: F32Ptr, a2: F32Ptr, b0: F32Ptr, b1: F32Ptr, b2: F32Ptr,
    M64: Int64, N64: Int64, K64: Int64, x0: Int64, x1: Int64, x2: Int64, terms: Int64, summed: Int64,
    accumulate: Int64,
):
    """A group of up to three products in one launch (`gemm_group_on`), each term t = (c_t, a_t, b_t) with its
    varying size x_t, every output still one fma chain over k ascending from +0. Apart (summed = 0): term t is
    C_t (+)= op(A_t)·op(B_t), N = x_t, computed by the blocks of z = t (a block past its term's columns returns).
    Summed: one C (c0, N columns) = op(A_0)·op(B_0) (+ C0 when accumulating), then + op(A_1)·op(B_1), …, K = x_t,
    each term's chain added to what the block stored of the terms before, as separate launches would."""
    var M = Int(M64)
    var row0 = Int(block_idx.y) * BM
    var col0 = Int(block_idx.x) * BN
    var As = stack_allocation[2 * KT * (BM + PAD), Float32, alignment=16, address_space=AddressSpace.SHARED]()
    var Bs = stack_allocation[2 * KT * (BN + PAD), Float32, alignment=16, address_space=AddressSpace.SHARED]()
    var cs = (c0, c1, c2)
    var as_ = (a0, a1, a2)
    var bs = (b0, b1, b2)
    var xs = (Int(x0), Int(x1), Int(x2))
    var count = 1 if summed == 0 else Int(terms)
    for i in range(count):
        var t = i if summed != 0 else Int(block_idx.z)
        var c = c0
        var a = a0
        var b = b0
        var x = xs[0]
        comptime for u in range(1, 3):
            if t == u:
                c = cs[u]
                a = as_[u]
                b = bs[u]
                x = xs[u]
        var N = Int(N64) if summed != 0 else x
        var K = x if summed != 0 else Int(K64)
        if col0 >= N:
            return
        var acc = Array[Quad, H * TM](fill=Quad(0))
        tile_products[transpose_a, transpose_b, BM, BN, TM, KT, threads, vec, H](
            acc, As, Bs, a, b, M, N, K, row0, col0, 0, K
        )
        store_tile[BM, BN, TM, threads, vec, H](acc, c, M, N, row0, col0, accumulate != 0 or i > 0)


# ---- CPU: 6×16 register blocks over a packed 16-column panel of B ------------------------
# A task packs one 16-column panel of op(B) and walks a run of rows of C over it, six rows at a
# time: twelve accumulators of 8 lanes (with the two panel rows and the broadcast of a, 15 of the 16
# vector registers), each lane one output's chain over k.

comptime MR = 6
comptime NR = 16
comptime MAX_ROWS_PER_TASK = 192  # the panel is packed once for up to this many rows
comptime K_UNROLL = 4  # k steps of the micro-kernel's loop unrolled (speed only)
comptime MIN_TASKS = 32  # fewer rows a task until the launch has this many, so the threads share it evenly


@always_inline
def cpu_micro_kernel[rows: Int, transpose_a: Bool](
    c: F32Ptr, a: F32Ptr, panel: F32Ptr, m0: Int, n0: Int, M: Int, N: Int, K: Int, k_begin: Int, k_end: Int,
    accumulate: Bool,
):
    """`rows` (≤ MR) rows × NR columns of C over k in [k_begin, k_end), from A and the packed panel. With
    transpose_a, `a` is the rows' block of the packed A (``pack_a_columns``): k-major, MR values a k."""
    var lo = Array[SIMD[DType.float32, 8], rows](fill=SIMD[DType.float32, 8](0))
    var hi = Array[SIMD[DType.float32, 8], rows](fill=SIMD[DType.float32, 8](0))

    @always_inline
    def step(k: Int) {mut lo, mut hi, imm a, imm panel, imm m0, imm M, imm K, imm k_begin}:
        var b_lo = panel.unsafe_load[width=8]((k - k_begin) * NR)
        var b_hi = panel.unsafe_load[width=8]((k - k_begin) * NR + 8)
        comptime for r in range(rows):
            var a_at = (k - k_begin) * MR + r if transpose_a else a_index[transpose_a](m0 + r, k, M, K)
            var a_value = SIMD[DType.float32, 8](a.unsafe_load(a_at))
            lo[r] = a_value.fma(b_lo, lo[r])
            hi[r] = a_value.fma(b_hi, hi[r])

    # k ascends either way; unrolled, the loop's own work between the fmas shrinks
    var k = k_begin
    while k + K_UNROLL <= k_end:
        comptime for kk in range(K_UNROLL):
            step(k + kk)
        k += K_UNROLL
    while k < k_end:
        step(k)
        k += 1
    comptime for r in range(rows):
        var at = (m0 + r) * N + n0
        if n0 + NR <= N:
            var out_lo = lo[r]
            var out_hi = hi[r]
            if accumulate:
                out_lo = c.unsafe_load[width=8](at) + out_lo
                out_hi = c.unsafe_load[width=8](at + 8) + out_hi
            c.unsafe_store(at, out_lo)
            c.unsafe_store(at + 8, out_hi)
        else:
            for j in range(N - n0):
                var value = lo[r][j] if j < 8 else hi[r][j - 8]
                if accumulate:
                    value = c.unsafe_load(at + j) + value
                c.unsafe_store(at + j, value)


@always_inline
def cpu_rows[transpose_a: Bool](
    c: F32Ptr, a: F32Ptr, panel: F32Ptr, m_begin: Int, m_end: Int, n0: Int, M: Int, N: Int, K: Int,
    k_begin: Int, k_end: Int, accumulate: Bool,
):
    """Rows [m_begin, m_end) of C's 16 columns from n0: MR rows a block, then the last few together (with
    transpose_a, `a` is those rows' packed A: ``pack_a_columns``)."""

    @always_inline
    def block(m0: Int) {imm a, imm m_begin, imm k_begin, imm k_end} -> F32Ptr:
        return a.unsafe_offset((m0 - m_begin) // MR * (k_end - k_begin) * MR) if transpose_a else a

    var m0 = m_begin
    while m0 + MR <= m_end:
        cpu_micro_kernel[MR, transpose_a](c, block(m0), panel, m0, n0, M, N, K, k_begin, k_end, accumulate)
        m0 += MR
    comptime for rows in range(1, MR):
        if m_end - m0 == rows:
            cpu_micro_kernel[rows, transpose_a](c, block(m0), panel, m0, n0, M, N, K, k_begin, k_end, accumulate)


comptime Row8 = SIMD[DType.float32, 8]


@always_inline
def transposed[dtype: DType, //](rows: Array[SIMD[dtype, 8], 8]) -> Array[SIMD[dtype, 8], 8]:
    """The 8 × 8 block's columns: result[k][j] = rows[j][k] (pairs, then quads, then halves interleaved)."""
    comptime Row = SIMD[dtype, 8]
    var pairs = Array[Row, 8](fill=Row(0))  # pairs[2i], pairs[2i+1]: rows 2i and 2i+1 interleaved
    comptime for i in range(4):
        pairs[2 * i] = rows[2 * i].shuffle[0, 8, 1, 9, 4, 12, 5, 13](rows[2 * i + 1])
        pairs[2 * i + 1] = rows[2 * i].shuffle[2, 10, 3, 11, 6, 14, 7, 15](rows[2 * i + 1])
    var quads = Array[Row, 8](fill=Row(0))  # quads[4h + c]: rows 4h … 4h+3 at k = c and c + 4
    comptime for h in range(2):
        comptime for p in range(2):
            quads[4 * h + 2 * p] = pairs[4 * h + p].shuffle[0, 1, 8, 9, 4, 5, 12, 13](pairs[4 * h + 2 + p])
            quads[4 * h + 2 * p + 1] = pairs[4 * h + p].shuffle[2, 3, 10, 11, 6, 7, 14, 15](pairs[4 * h + 2 + p])
    var columns = Array[Row, 8](fill=Row(0))
    comptime for c in range(4):
        columns[c] = quads[c].shuffle[0, 1, 2, 3, 8, 9, 10, 11](quads[4 + c])
        columns[c + 4] = quads[c].shuffle[4, 5, 6, 7, 12, 13, 14, 15](quads[4 + c])
    return columns^


@always_inline
def pack_panel[transpose_b: Bool](panel: F32Ptr, b: F32Ptr, n0: Int, N: Int, K: Int, k_begin: Int, k_end: Int):
    """b(k, n0:n0+16) for k in [k_begin, k_end), contiguous, zero past N (those lanes are never stored)."""
    var k = k_begin
    comptime if transpose_b:
        if n0 + NR <= N:  # 16 rows of B, each contiguous in k: moved 8 k at a time as transposed 8 × 8 blocks
            while k + 8 <= k_end:
                comptime for half in range(2):
                    var rows = Array[Row8, 8](fill=Row8(0))
                    comptime for j in range(8):
                        rows[j] = b.unsafe_load[width=8]((n0 + 8 * half + j) * K + k)
                    var columns = transposed(rows)
                    comptime for c in range(8):
                        panel.unsafe_store((k - k_begin + c) * NR + 8 * half, columns[c])
                k += 8
    for kk in range(k, k_end):
        var row = panel.unsafe_offset((kk - k_begin) * NR)
        comptime if not transpose_b:
            if n0 + NR <= N:  # a row of B holds the 16 columns side by side
                row.unsafe_store(0, b.unsafe_load[width=8](kk * N + n0))
                row.unsafe_store(8, b.unsafe_load[width=8](kk * N + n0 + 8))
                continue
        for j in range(NR):
            var n = n0 + j
            row.unsafe_store(j, b.unsafe_load(b_index[transpose_b](kk, n, K, N)) if n < N else Float32(0))


@always_inline
def pack_a_columns(packed: F32Ptr, a: F32Ptr, m_begin: Int, m_end: Int, M: Int, k_begin: Int, k_end: Int):
    """A transposed A's rows [m_begin, m_end) over k in [k_begin, k_end) (a(m, k) = A[k·M + m]) as blocks of MR
    rows, each k-major with MR values a k, read along m: the micro-kernel's strided loads of A (a stride of M
    floats, which for M a power of two keeps hitting the same cache sets) become sequential. A copy: same bits."""
    var block_stride = (k_end - k_begin) * MR
    for k in range(k_begin, k_end):
        var source = a.unsafe_offset(k * M + m_begin)
        var target = packed.unsafe_offset((k - k_begin) * MR)
        var r = 0
        for j in range(m_end - m_begin):
            target.unsafe_store(r, source.unsafe_load(j))
            r += 1
            if r == MR:
                r = 0
                target = target.unsafe_offset(block_stride)


def gemm_cpu[transpose_a: Bool, transpose_b: Bool](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, ranges: Int, length: Int,
    accumulate: Bool,
):
    """C (+)= the product, or with several k ranges, range z's product over [z·length, (z + 1)·length) into
    C + z·M·N. All ranges are one launch: the weight gradients' ranges (one per packed row) are short, so
    one range alone has too few tasks to keep the cores busy."""
    var column_blocks = (N + NR - 1) // NR
    var row_blocks = (M + MR - 1) // MR
    var blocks = ranges * column_blocks
    var row_tasks = min(row_blocks, max((M + MAX_ROWS_PER_TASK - 1) // MAX_ROWS_PER_TASK,
                                        (MIN_TASKS + blocks - 1) // blocks))
    var rows_per_task = (row_blocks + row_tasks - 1) // row_tasks * MR
    row_tasks = (M + rows_per_task - 1) // rows_per_task
    var span = max(min(K, length), 1)

    def task_range(begin: Int, end: Int) {imm c, imm a, imm b, imm M, imm N, imm K, imm length, imm span, imm accumulate, imm column_blocks, imm row_tasks, imm rows_per_task}:
        var panel = f32_at(Int(alloc[Float32](span * NR, alignment=64)))
        var a_panel = f32_at(Int(alloc[Float32](span * rows_per_task if transpose_a else 1, alignment=64)))
        var packed_rows = -1  # the (range, row task) whose A a_panel holds: consecutive tasks share it
        for task in range(begin, end):
            var z = task // (column_blocks * row_tasks)
            var in_range = task % (column_blocks * row_tasks)
            var n0 = (in_range % column_blocks) * NR
            var m_begin = (in_range // column_blocks) * rows_per_task
            var k_begin = z * length
            var k_end = min(K, k_begin + length)
            var m_end = min(M, m_begin + rows_per_task)
            pack_panel[transpose_b](panel, b, n0, N, K, k_begin, k_end)
            comptime if transpose_a:
                var rows_key = task // column_blocks
                if rows_key != packed_rows:
                    pack_a_columns(a_panel, a, m_begin, m_end, M, k_begin, k_end)
                    packed_rows = rows_key
            cpu_rows[transpose_a](c.unsafe_offset(z * M * N), a_panel if transpose_a else a, panel, m_begin, m_end, n0,
                                  M, N, K, k_begin, k_end, accumulate)
        panel.unsafe_free()
        a_panel.unsafe_free()

    cpu_parallel_for(dev, task_range, ranges * column_blocks * row_tasks)


comptime SUM_CHUNKS = Interface("c partials", "size chunks accumulate", "")


def sum_chunks(i: Int, args: Args):
    """C[i] = (C0[i] +) ((p_0[i] + p_1[i]) + p_2[i]) + …, from partials [chunks, M·N]."""
    var c = args.f32(0)
    var partials = args.f32(1)
    var size = args.size(0)
    var chunks = args.size(1)
    var accumulate = args.flag(2)
    var total = partials.unsafe_load(i)
    for z in range(1, chunks):
        total = total + partials.unsafe_load(z * size + i)
    if accumulate:
        total = c.unsafe_load(i) + total
    c.unsafe_store(i, total)


# ---- dispatch ---------------------------------------------------------------------------

comptime LARGE = 0  # 128×128 tiles, 8×8 outputs per thread (256 threads), slices of 8 k
comptime LARGE_K16 = 1  # the same with slices of 16 k, staged in two halves
comptime SMALL = 2  # 64×64 tiles, 4×8 outputs per thread (128 threads), slices of 8 k
comptime SMALL_8X8 = 3  # 64×64 tiles, 8×8 outputs per thread (64 threads), slices of 8 k
comptime TINY = 4  # 32×32 tiles, 4×4 outputs per thread (64 threads), slices of 32 k
comptime TINY_MAX_BLOCKS = 2 * 132  # a product in long k ranges with fewer 64×64 blocks than this: TINY (speed only)
comptime TINY_MIN_RANGE = 1024  # k of a range TINY takes at least


def gpu_tiling[transpose_b: Bool](M: Int, N: Int, chunks: Int, length: Int, forced: Int) -> Int:
    """The GPU tiling for an M×N output in `chunks` k ranges of `length`: large tiles when the launch has at least
    LARGE_TILE_MIN_BLOCKS blocks of 128×128 (LARGE_K16 for A·Bᵀ, the fastest there on the encoder's shapes;
    LARGE, whose slices are half as deep, for the others), or, in k ranges, RANGED_LARGE_MIN_BLOCKS over all its
    ranges (on the H200 the byte LM's weight gradients, 256 × 512 over 32 ranges of 256: 52 against 62 µs); else
    SMALL. A device's forced tiling (`forced` ≥ 0: Device.gemm_tiling, which python/uform/engine.py sets from
    UFORM_GEMM_TILE = large, large-k16, small, small-8x8 or tiny once, when it opens the device) takes its place,
    for tests and tuning: the tiling never changes a bit. A product cut into ranges of at least TINY_MIN_RANGE with fewer than TINY_MAX_BLOCKS 64×64
    blocks over all its ranges (a weight gradient by packed rows below the exact GEMM's rule: 256 × 256 outputs over
    4 rows of 2048 tokens are 64 blocks on 132 multiprocessors) takes TINY, four times the blocks of a
    quarter the outputs, in slices of 32 k (with two warps a block and few blocks a multiprocessor, a slice of 8 k
    did not cover the next slice's loads; over ranges of 256 it lost to SMALL)."""
    if forced >= 0:
        return forced
    if chunks > 1:
        if length >= TINY_MIN_RANGE and ((N + 63) // 64) * ((M + 63) // 64) * chunks < TINY_MAX_BLOCKS:
            return TINY
        return LARGE if large_tiles(M, N) * chunks >= RANGED_LARGE_MIN_BLOCKS else SMALL
    if large_tiles(M, N) < LARGE_TILE_MIN_BLOCKS:
        return SMALL
    return LARGE_K16 if transpose_b else LARGE


def launch_gemm[
    transpose_a: Bool, transpose_b: Bool, BM: Int, TM: Int, KT: Int, threads: Int, blocks_per_sm: Int, H: Int = 2
](
    dev: DevicePtr, target: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, flag: Int64, length: Int,
    chunks: Int,
) raises:
    # 128-bit loads and stores need every quad aligned: the stored rows a multiple of 4 floats long
    # (the k ranges already are) and 16-byte aligned operands.
    var a_row = M if transpose_a else K
    var b_row = K if transpose_b else N
    var vec = a_row % 4 == 0 and b_row % 4 == 0 and N % 4 == 0 and (Int(a) | Int(b) | Int(target)) % 16 == 0
    var grid = ((N + BM - 1) // BM, (M + BM - 1) // BM, chunks)
    if vec:
        dev[].ctx().enqueue_function[
            gemm_gpu[transpose_a, transpose_b, BM, BM, TM, KT, threads, blocks_per_sm, True, H]
        ](target, a, b, Int64(M), Int64(N), Int64(K), flag, Int64(length), grid_dim=grid, block_dim=threads)
    else:
        dev[].ctx().enqueue_function[
            gemm_gpu[transpose_a, transpose_b, BM, BM, TM, KT, threads, blocks_per_sm, False, H]
        ](target, a, b, Int64(M), Int64(N), Int64(K), flag, Int64(length), grid_dim=grid, block_dim=threads)


def gemm_on[transpose_a: Bool, transpose_b: Bool](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, accumulate: Bool, partials: F32Ptr,
    range_length: Int,
) raises:
    """The product in the canonical order; with several k ranges, through `partials` [chunks, M, N]. A positive
    `range_length` names the ranges (Aᵀ·B only), combined by the row tree."""
    if range_length > 0 and not transpose_a:
        raise Error("gemm: k ranges of a named length are for Aᵀ·B products")
    var chunks = k_chunks(M, N, K, transpose_a, range_length)
    var length = range_length if range_length > 0 else chunk_length(K, chunks)
    if chunks > 1 and Int(partials) == 0:
        raise Error("gemm: a ", M, "×", N, "×", K, " product needs a partial-sums workspace")
    var target = c if chunks == 1 else partials
    if dev[].is_gpu():
        comptime if HAS_ACCELERATOR:
            var flag = Int64(1 if accumulate and chunks == 1 else 0)
            var tiling = gpu_tiling[transpose_b](M, N, chunks, length, dev[].gemm_tiling)
            if tiling == LARGE:
                launch_gemm[transpose_a, transpose_b, 128, 8, 8, 256, 2](dev, target, a, b, M, N, K, flag, length, chunks)
            elif tiling == LARGE_K16:
                launch_gemm[transpose_a, transpose_b, 128, 8, 16, 256, 2](dev, target, a, b, M, N, K, flag, length, chunks)
            elif tiling == SMALL:
                launch_gemm[transpose_a, transpose_b, 64, 4, 8, 128, 5](dev, target, a, b, M, N, K, flag, length, chunks)
            elif tiling == TINY:
                launch_gemm[transpose_a, transpose_b, 32, 4, 32, 64, 12, 1](dev, target, a, b, M, N, K, flag, length,
                                                                            chunks)
            else:
                launch_gemm[transpose_a, transpose_b, 64, 8, 8, 64, 6](dev, target, a, b, M, N, K, flag, length, chunks)
    else:
        gemm_cpu[transpose_a, transpose_b](dev, target, a, b, M, N, K, chunks, length, accumulate and chunks == 1)
    if chunks > 1:
        var args = TreeSum(c, partials, M * N, chunks, accumulate, 0, 0).args()  # SUM_CHUNKS reads the same slots
        if range_length > 0:
            launch_elements[tree_sum, gpu_lanes=1](dev, M * N, args)  # its stack of partials a lane: 1 a GPU thread
        else:
            launch_index[sum_chunks](dev, M * N, args)


comptime GROUP_TERMS = 3  # products a group may hold


def gemm_group_on[transpose_a: Bool, transpose_b: Bool](
    dev: DevicePtr, terms: Int, summed: Bool, c: Array[F32Ptr, GROUP_TERMS], a: Array[F32Ptr, GROUP_TERMS],
    b: Array[F32Ptr, GROUP_TERMS], M: Int, N: Int, K: Int, x: Array[Int, GROUP_TERMS], accumulate: Bool,
    partials: F32Ptr, range_length: Int,
) raises:
    """A group of `terms` products, with the bits of each launched alone in order (their canonical order is per
    output, so a launch's company changes no bit). Apart: C_t (+)= op(A_t)·op(B_t) with N = x_t and the shared
    K (the byte LM's q, k and v from one input; their weight gradients). Summed: C (+)= op(A_0)·op(B_0), then
    C += op(A_t)·op(B_t) for t = 1, 2, … with K = x_t and the shared N (the byte LM's input gradient through q, k
    and v; summed products the exact GEMM takes are one product over the joined k: gemm_exact_summed_on).
    On a GPU, products of one k range that take the small tiles (the byte LM's: a few blocks each, whose time is
    their launch) run as one launch of gemm_group_gpu; otherwise, and on the CPU, one product after another
    (`gemm_on`, through `partials` for a product cut into k ranges)."""
    var grouped = dev[].is_gpu()
    var widest = 0
    var vec = True  # 128-bit loads and stores, as launch_gemm decides them, for every term
    for t in range(terms):
        var n = N if summed else x[t]
        var k = x[t] if summed else K
        widest = max(widest, n)
        grouped = grouped and k_chunks(M, n, k, transpose_a, range_length) == 1
        var a_row = M if transpose_a else k
        var b_row = k if transpose_b else n
        vec = vec and a_row % 4 == 0 and b_row % 4 == 0 and n % 4 == 0
        vec = vec and (Int(a[t]) | Int(b[t]) | Int(c[t])) % 16 == 0
    grouped = grouped and gpu_tiling[transpose_b](M, widest, 1, K, dev[].gemm_tiling) == SMALL
    if not grouped:
        for t in range(terms):
            if summed:
                gemm_on[transpose_a, transpose_b](dev, c[0], a[t], b[t], M, N, x[t], accumulate or t > 0, partials,
                                                  range_length)
            else:
                gemm_on[transpose_a, transpose_b](dev, c[t], a[t], b[t], M, x[t], K, accumulate, partials,
                                                  range_length)
        return
    if vec:
        launch_group[transpose_a, transpose_b, True](dev, terms, summed, c, a, b, M, N, K, x, accumulate, widest)
    else:
        launch_group[transpose_a, transpose_b, False](dev, terms, summed, c, a, b, M, N, K, x, accumulate, widest)


def launch_group[transpose_a: Bool, transpose_b: Bool, vec: Bool](
    dev: DevicePtr, terms: Int, summed: Bool, c: Array[F32Ptr, GROUP_TERMS], a: Array[F32Ptr, GROUP_TERMS],
    b: Array[F32Ptr, GROUP_TERMS], M: Int, N: Int, K: Int, x: Array[Int, GROUP_TERMS], accumulate: Bool, widest: Int,
) raises:
    """gemm_group_gpu over the group in the small tiles (64 × 64, 128 threads): its output tiles of the widest
    term, its terms along z unless summed."""
    comptime if HAS_ACCELERATOR:
        dev[].ctx().enqueue_function[gemm_group_gpu[transpose_a, transpose_b, 64, 64, 4, 8, 128, 5, vec]](
            c[0], c[1], c[2], a[0], a[1], a[2], b[0], b[1], b[2], Int64(M), Int64(N), Int64(K), Int64(x[0]),
            Int64(x[1]), Int64(x[2]), Int64(terms), Int64(1 if summed else 0), Int64(1 if accumulate else 0),
            grid_dim=((widest + 63) // 64, (M + 63) // 64, 1 if summed else terms), block_dim=128,
        )
