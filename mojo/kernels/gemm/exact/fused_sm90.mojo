"""The exact GEMM's fused form on Hopper (sm_90a): plane products and reconstruction in one kernel.

The unfused form writes N(K) int32 planes of M·N chunk sums (44 bytes an output for 11 moduli) and crt_round
reads them back. The fused kernel keeps one byte an output and modulus instead. A block of two warpgroups owns
a tile of 128 × 256 or 128 × 128 outputs (FusedTile) and a range of k; modulus after modulus it streams the
tile's lines of A's and B's planes through a ring of shared-memory stages (StageLoads: one thread's TMA tensor
copies fill the next stages, each completing its slot's mbarrier, while Hopper's warpgroup tensor cores, wgmma
int8 × int8 → int32, multiply the current one: multiply_stage), and at the end of each chunk of k a thread folds
its int32 sums modulo p_i into bytes in the workspace (fold_sums). After the last modulus the same thread reads its
bytes back, reconstructs and rounds its outputs (reconstruct_tile: crt_value, then finished) and stores the
floats; where k is split into ranges, a second kernel does that for every tile once every range is folded
(exact_fused_splits_summed), summing the ranges' residues. fused_pays says when it beats the unfused form.
"""

from std.memory import bitcast
from std.sys import inlined_assembly
from std.utils import IndexList
from engine.device import F32Ptr, I32Ptr, i32_at
from engine.launch import Args, DevicePtr, launch_gpu_mapped_teams, launch_gpu_teams
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
from max.gpu.primitives.warp import shuffle_idx
from kernels.gemm.exact.definition import MODULI
from kernels.gemm.exact.residues import RESIDUE_CHUNK, padded, remainder_below_2_31
from kernels.gemm.exact.crt import crt_value, finished, modulus


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
