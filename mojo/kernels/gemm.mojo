"""fp32 GEMM: C = op(A)·op(B), or C += op(A)·op(B), with op a transpose or not.

    C[m, n] = C0[m, n] + Σ_k a(m, k)·b(k, n)      (C0 = 0 unless accumulating)

The canonical order: every output is one chain of fma over k = 0, 1, …, K−1,
starting from +0, and C0 is added once at the end. A product with a small output
and a long k (the weight gradients: hidden × hidden summed over every token) is cut
into `k_chunks(M, N, K)` consecutive k ranges instead: each range its own chain from
+0, the ranges' partial sums then added in ascending order, then C0. The count
depends on M, N and K alone, so every device cuts the same ranges. Both launchers keep it:
the CPU kernel vectorises across n (each SIMD lane its own chain), the GPU
kernel gives each thread an 8×8 block of outputs, each its own chain, while the
block stages 128×8 and 8×128 tiles of A and B through shared memory.

Layouts (row-major storage): a(m, k) = A[m·K + k], or A[k·M + m] when A is
stored transposed (K×M); b(k, n) = B[k·N + n], or B[n·K + k] when B is stored
transposed (N×K). Backward passes need A·B, Aᵀ·B and A·Bᵀ.
"""

from std.collections import Array
from std.memory import stack_allocation
from max.gpu import barrier, block_idx, thread_idx
from max.gpu.memory import AddressSpace
from engine.device import F32Ptr, f32_at
from engine.launch import Args, DevicePtr, Interface, cpu_parallel_for, launch_index
from engine.target import HAS_ACCELERATOR


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


# ---- GPU: a BM×BN output tile per block of 256 threads, TM×TN outputs per thread ----------
# Large outputs take 128×128 tiles of 8×8 per thread. Small outputs with a long k (the weight
# gradients: hidden × hidden, summed over every token) would leave most multiprocessors idle, so
# they take 64×64 tiles of 4×4 per thread: four times the threads. Each output keeps its own chain.

comptime BK = 8
comptime THREADS = 256
comptime SMALL_OUTPUT_BLOCKS = 132  # fewer 128×128 tiles than an H200 has multiprocessors
comptime SPLIT_MIN_K = 4096
comptime MIN_CHUNK = 2048
comptime MAX_CHUNKS = 32


def small_output(M: Int, N: Int) -> Bool:
    return ((N + 127) // 128) * ((M + 127) // 128) < SMALL_OUTPUT_BLOCKS


def k_chunks(M: Int, N: Int, K: Int) -> Int:
    """How many consecutive k ranges the canonical order cuts this product into."""
    if not small_output(M, N) or K < SPLIT_MIN_K:
        return 1
    return min(MAX_CHUNKS, K // MIN_CHUNK)


def chunk_length(K: Int, chunks: Int) -> Int:
    """Each range's length: K / chunks rounded up to whole BK tiles (the last range takes the rest)."""
    var length = (K + chunks - 1) // chunks
    return (length + BK - 1) // BK * BK


def gemm_gpu[transpose_a: Bool, transpose_b: Bool, BM: Int, BN: Int, TM: Int, TN: Int](
    c: F32Ptr, a: F32Ptr, b: F32Ptr, M64: Int64, N64: Int64, K64: Int64, accumulate: Int64, chunk64: Int64
):
    """Block (x, y, z) computes output tile (y, x) over k range z; with several ranges, `c` is the
    partial sums [ranges, M, N] and accumulate is 0."""
    comptime assert (BM // TM) * (BN // TN) == THREADS, "one thread per TM×TN outputs"
    comptime A_LOADS = BM * BK // THREADS
    comptime B_LOADS = BK * BN // THREADS
    var M = Int(M64)
    var N = Int(N64)
    var K = Int(K64)
    var tid = Int(thread_idx.x)
    var row0 = Int(block_idx.y) * BM
    var col0 = Int(block_idx.x) * BN
    var tr = tid // (BN // TN)
    var tc = tid % (BN // TN)
    var k_begin = Int(block_idx.z) * Int(chunk64)
    var k_end = min(K, k_begin + Int(chunk64))
    var out = c + Int(block_idx.z) * M * N

    # As[k][m] and Bs[k][n]: both read along their second index in the inner loop.
    var As = stack_allocation[BK * BM, Float32, address_space=AddressSpace.SHARED]()
    var Bs = stack_allocation[BK * BN, Float32, address_space=AddressSpace.SHARED]()

    var acc = Array[SIMD[DType.float32, TN], TM](fill=SIMD[DType.float32, TN](0))

    var k0 = k_begin
    while k0 < k_end:
        # Stage the tiles; consecutive threads read consecutive addresses of the stored layout.
        comptime for e in range(A_LOADS):
            var linear = tid + e * THREADS
            var m: Int
            var k: Int
            comptime if transpose_a:
                k = linear // BM
                m = linear % BM
            else:
                m = linear // BK
                k = linear % BK
            var gm = row0 + m
            var gk = k0 + k
            var value = Float32(0)
            if gm < M and gk < k_end:
                value = a.unsafe_load(a_index[transpose_a](gm, gk, M, K))
            As.unsafe_store(k * BM + m, value)
        comptime for e in range(B_LOADS):
            var linear = tid + e * THREADS
            var n: Int
            var k: Int
            comptime if transpose_b:
                n = linear // BK
                k = linear % BK
            else:
                k = linear // BN
                n = linear % BN
            var gn = col0 + n
            var gk = k0 + k
            var value = Float32(0)
            if gn < N and gk < k_end:
                value = b.unsafe_load(b_index[transpose_b](gk, gn, K, N))
            Bs.unsafe_store(k * BN + n, value)
        barrier()

        @always_inline
        def step(kk: Int) {mut acc, imm As, imm Bs, imm tr, imm tc}:
            var b_frag = Bs.unsafe_load[width=TN](kk * BN + tc * TN)
            var a_frag = As.unsafe_load[width=TM](kk * BM + tr * TM)
            comptime for i in range(TM):
                acc[i] = SIMD[DType.float32, TN](a_frag[i]).fma(b_frag, acc[i])

        if k0 + BK <= k_end:
            comptime for kk in range(BK):
                step(kk)
        else:
            # The last, partial tile stops at the range's end exactly, as the CPU does.
            for kk in range(k_end - k0):
                step(kk)
        barrier()
        k0 += BK

    comptime for i in range(TM):
        var m = row0 + tr * TM + i
        if m < M:
            comptime for j in range(TN):
                var n = col0 + tc * TN + j
                if n < N:
                    var value = acc[i][j]
                    if accumulate != 0:
                        value = out.unsafe_load(m * N + n) + value
                    out.unsafe_store(m * N + n, value)


# ---- CPU: 4×16 register blocks over a packed 16-column panel of B ------------------------

comptime MR = 4
comptime NR = 16
comptime ROWS_PER_TASK = 64


@always_inline
def cpu_micro_kernel[rows: Int, transpose_a: Bool](
    c: F32Ptr, a: F32Ptr, panel: F32Ptr, m0: Int, n0: Int, M: Int, N: Int, K: Int, k_begin: Int, k_end: Int,
    accumulate: Bool,
):
    """`rows` (≤ MR) rows × NR columns of C over k in [k_begin, k_end), from A and the packed panel."""
    var lo = Array[SIMD[DType.float32, 8], rows](fill=SIMD[DType.float32, 8](0))
    var hi = Array[SIMD[DType.float32, 8], rows](fill=SIMD[DType.float32, 8](0))
    for k in range(k_begin, k_end):
        var b_lo = panel.unsafe_load[width=8]((k - k_begin) * NR)
        var b_hi = panel.unsafe_load[width=8]((k - k_begin) * NR + 8)
        comptime for r in range(rows):
            var a_value = SIMD[DType.float32, 8](a.unsafe_load(a_index[transpose_a](m0 + r, k, M, K)))
            lo[r] = a_value.fma(b_lo, lo[r])
            hi[r] = a_value.fma(b_hi, hi[r])
    comptime for r in range(rows):
        var m = m0 + r
        for j in range(min(NR, N - n0)):
            var value = lo[r][j] if j < 8 else hi[r][j - 8]
            if accumulate:
                value = c.unsafe_load(m * N + n0 + j) + value
            c.unsafe_store(m * N + n0 + j, value)


def gemm_cpu[transpose_a: Bool, transpose_b: Bool](
    c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, k_begin: Int, k_end: Int, accumulate: Bool
):
    """C (+)= the product over k in [k_begin, k_end)."""
    var column_blocks = (N + NR - 1) // NR
    var row_tasks = (M + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    var span = max(k_end - k_begin, 1)

    def task_range(begin: Int, end: Int) {imm c, imm a, imm b, imm M, imm N, imm K, imm k_begin, imm k_end, imm span, imm accumulate, imm column_blocks}:
        var panel = f32_at(Int(alloc[Float32](span * NR)))
        for task in range(begin, end):
            var n0 = (task % column_blocks) * NR
            var m_begin = (task // column_blocks) * ROWS_PER_TASK
            var m_end = min(M, m_begin + ROWS_PER_TASK)
            # Pack b(k, n0:n0+16) contiguously, zero past N (those lanes are never stored).
            for k in range(k_begin, k_end):
                for j in range(NR):
                    var n = n0 + j
                    panel.unsafe_store((k - k_begin) * NR + j,
                                       b.unsafe_load(b_index[transpose_b](k, n, K, N)) if n < N else Float32(0))
            var m0 = m_begin
            while m0 + MR <= m_end:
                cpu_micro_kernel[MR, transpose_a](c, a, panel, m0, n0, M, N, K, k_begin, k_end, accumulate)
                m0 += MR
            while m0 < m_end:
                cpu_micro_kernel[1, transpose_a](c, a, panel, m0, n0, M, N, K, k_begin, k_end, accumulate)
                m0 += 1
        panel.unsafe_free()

    cpu_parallel_for(task_range, column_blocks * row_tasks)


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

def gemm_on[transpose_a: Bool, transpose_b: Bool](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, accumulate: Bool, partials: F32Ptr,
) raises:
    """The product in the canonical order; with several k ranges, through `partials` [chunks, M, N]."""
    var chunks = k_chunks(M, N, K)
    var length = chunk_length(K, chunks)
    if chunks > 1 and Int(partials) == 0:
        raise Error("gemm: a ", M, "×", N, "×", K, " product needs a partial-sums workspace")
    var target = c if chunks == 1 else partials
    if dev[].is_gpu():
        comptime if HAS_ACCELERATOR:
            var flag = Int64(1 if accumulate and chunks == 1 else 0)
            if small_output(M, N):
                dev[].ctx().enqueue_function[gemm_gpu[transpose_a, transpose_b, 64, 64, 4, 4]](
                    target, a, b, Int64(M), Int64(N), Int64(K), flag, Int64(length),
                    grid_dim=((N + 63) // 64, (M + 63) // 64, chunks), block_dim=THREADS,
                )
            else:
                dev[].ctx().enqueue_function[gemm_gpu[transpose_a, transpose_b, 128, 128, 8, 8]](
                    target, a, b, Int64(M), Int64(N), Int64(K), flag, Int64(length),
                    grid_dim=((N + 127) // 128, (M + 127) // 128, chunks), block_dim=THREADS,
                )
    else:
        for z in range(chunks):
            gemm_cpu[transpose_a, transpose_b](
                target.unsafe_offset(z * M * N), a, b, M, N, K, z * length, min(K, (z + 1) * length),
                accumulate and chunks == 1,
            )
    if chunks > 1:
        var args = Args.empty()  # SUM_CHUNKS
        args.addresses[0] = Int64(Int(c))
        args.addresses[1] = Int64(Int(partials))
        args.sizes[0] = Int64(M * N)
        args.sizes[1] = Int64(chunks)
        args.sizes[2] = Int64(1 if accumulate else 0)
        launch_index[sum_chunks](dev, M * N, args)

