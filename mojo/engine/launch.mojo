"""The two launchers every kernel body runs under, and the operands they carry.

A kernel is written once as a body over an index (a row, an element, a column).
Its operands travel in `Args`: numbered slots of addresses, sizes and float scalars,
filled by the Python wrapper from the names its `Interface` lists (so no slot number
is ever written in Python). The body's first lines unpack the slots into named,
typed values in the same order as the interface; its math reads only those names.
On the CPU, `cpu_parallel_for` runs contiguous index ranges on the calling thread,
or on worker threads when the launch is large enough to pay for them; on a GPU,
`group_kernel` maps `global_idx.x` to the index. Both call the same body, so both
compute the same bits. An element-wise kernel's body takes a SIMD width: the CPU
runs it 8 elements a call, a GPU thread 4 (`launch_elements`). A team kernel (attention) gives each index to a team of
threads that share a scratch of shared memory and meet at barriers: on a GPU the
team is a thread block, each thread playing itself; on the CPU one call plays every
thread of the team, phase by phase, so each phase of every thread ends before the
next begins, as at a barrier (`launch_teams`): its body takes how many threads one
call plays as a compile-time parameter.
"""

from std.builtin.device_passable import DevicePassable, DeviceTypeEncoder
from std.collections import Optional
from std.sys import llvm_intrinsic, num_physical_cores
from std.time import perf_counter_ns
from std.python import PythonObject
from max.algorithm import parallelize
from std.memory import stack_allocation
from std.utils.static_tuple import StaticTuple
from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, barrier, block_idx, global_idx, thread_idx
from max.gpu.host import FuncAttribute
from max.gpu.host.nvidia.tma import TMADescriptor
from max.gpu.memory import AddressSpace
from engine.device import Device, F32Ptr, I32Ptr, f32_at, i32_at
from engine.target import HAS_ACCELERATOR

comptime GPU_BLOCK = 128
comptime ADDRESS_SLOTS = 12
comptime SIZE_SLOTS = 8
comptime SCALAR_SLOTS = 8

comptime DevicePtr = Pointer[Device, MutAnyOrigin]

comptime Launcher = def(DevicePtr, Int, Args) raises thin -> None
"""What every kernel's Python entry point ends in: run the kernel's tasks [0, n) with these operands on the
device (`launch_index[body]`, `launch_rows[body]`, ...). Plans record and replay launchers (engine.plan)."""


def gpu_blocks(n: Int) -> Int:
    return max(1, (n + GPU_BLOCK - 1) // GPU_BLOCK)


@fieldwise_init
struct Interface(ImplicitlyCopyable, Movable):
    """The names of a kernel's operands, space-separated, in slot order: buffers (addresses), sizes
    (integers and flags) and float scalars. The engine exports them; Python passes operands by name."""

    var buffers: StaticString
    var sizes: StaticString
    var scalars: StaticString


@fieldwise_init
struct Args(DevicePassable, ImplicitlyCopyable, Movable):
    """A kernel's operands in slots: ADDRESS_SLOTS addresses, SIZE_SLOTS sizes, SCALAR_SLOTS scalars. A GPU kernel
    takes them as one parameter (DevicePassable: the struct's bytes, as the host holds them)."""

    comptime device_type: AnyType = Self

    var addresses: SIMD[DType.int64, 16]  # ADDRESS_SLOTS used (a SIMD width is a power of two)
    var sizes: SIMD[DType.int64, SIZE_SLOTS]
    var scalars: SIMD[DType.float32, SCALAR_SLOTS]

    def _to_device_type(self, mut encoder: Some[DeviceTypeEncoder], target: MutOpaquePointer[_]):
        target.bitcast[Self]()[] = self

    @staticmethod
    def get_type_name() -> String:
        return "Args"

    @staticmethod
    def empty() -> Args:
        """Every slot zero: fill the ones a kernel reads."""
        return Args(SIMD[DType.int64, 16](0), SIMD[DType.int64, SIZE_SLOTS](0), SIMD[DType.float32, SCALAR_SLOTS](0))

    @always_inline
    def f32(self, slot: Int) -> F32Ptr:
        """Buffer `slot` as float32 elements (a null pointer for an absent optional buffer)."""
        return f32_at(Int(self.addresses[slot]))

    @always_inline
    def i32(self, slot: Int) -> I32Ptr:
        return i32_at(Int(self.addresses[slot]))

    @always_inline
    def given(self, slot: Int) -> Bool:
        """Whether optional buffer `slot` was passed."""
        return self.addresses[slot] != 0

    @always_inline
    def size(self, slot: Int) -> Int:
        return Int(self.sizes[slot])

    @always_inline
    def flag(self, slot: Int) -> Bool:
        return self.sizes[slot] != 0

    @always_inline
    def scalar(self, slot: Int) -> Float32:
        return self.scalars[slot]


def args_from_python(addresses: PythonObject, sizes: PythonObject, scalars: PythonObject) raises -> Args:
    """Args from three Python sequences (missing trailing entries are zero)."""
    var args = Args.empty()
    for i in range(min(ADDRESS_SLOTS, Int(py=len(addresses)))):
        args.addresses[i] = Int64(Int(py=addresses[i]))
    for i in range(min(SIZE_SLOTS, Int(py=len(sizes)))):
        args.sizes[i] = Int64(Int(py=sizes[i]))
    for i in range(min(SCALAR_SLOTS, Int(py=len(scalars)))):
        args.scalars[i] = Float32(py=scalars[i])
    return args


def with_ieee_subnormals[Body: def(Int, Int) -> None](body: Body, begin: Int, end: Int):
    """Run body(begin, end) with the x86 flush-to-zero and denormals-are-zero modes off.

    The runtime's worker threads start with both on, which would round subnormal
    results to zero where a GPU keeps them; IEEE 754 keeps them, and so do we.
    """
    comptime MXCSR_FTZ_DAZ = UInt32(0x8040)
    var saved = UInt32(0)
    var saved_at = Pointer(to=saved)
    llvm_intrinsic["llvm.x86.sse.stmxcsr", NoneType](saved_at)
    var ieee = saved & ~MXCSR_FTZ_DAZ
    llvm_intrinsic["llvm.x86.sse.ldmxcsr", NoneType](Pointer(to=ieee))
    body(begin, end)
    llvm_intrinsic["llvm.x86.sse.ldmxcsr", NoneType](saved_at)


comptime PROBE_NS = 20_000  # a launch's probe ends after this long, the rest then split
comptime MAX_SPLIT_COST_NS = 1_000_000  # a larger measure of one split counts as this


def cpu_parallel_for[Body: def(Int, Int) -> None](dev: DevicePtr, body: Body, n: Int):
    """Run `body(begin, end)` over `[0, n)` in contiguous ranges: a probe on the calling thread, then the
    rest there too when splitting it would not pay, else split a few chunks per core over the workers.

    The probe runs ranges of 1, 2, 4, … tasks from the start while timing them, which predicts the rest
    at the rate so far. Splitting the rest over the cores saves the share the other cores take, and costs
    what waking the workers takes and, once woken, their spinning beside the calling thread: the device
    keeps an average of the first (`split_cost_ns`, what a split took beyond the rest's share per core),
    and the rest stays on the calling thread unless the saving exceeds twice that. So a machine whose
    other cores are busy, or a model whose launches are all small, runs inline. Which thread runs a task
    never changes its arithmetic, so the split changes no bit of the results.
    """
    if n <= 0:
        return
    var cores = num_physical_cores()
    var start = perf_counter_ns()
    var done = 0
    var batch = 1
    var spent = 0
    while done < n:
        var end = min(n, done + batch)
        with_ieee_subnormals(body, done, end)
        done = end
        spent = Int(perf_counter_ns() - start)
        var saving = spent * (n - done) // done * (cores - 1) // cores
        if saving <= 2 * dev[].split_cost_ns:
            batch = n
        elif spent >= PROBE_NS:
            break
        else:
            batch *= 2
    if done == n:
        return
    var rest = n - done
    var chunks = min(rest, max(1, cores * 4))
    var per_chunk = (rest + chunks - 1) // chunks

    def run(chunk: Int) {imm body, imm per_chunk, imm done, imm n}:
        var begin = done + chunk * per_chunk
        var end = min(n, begin + per_chunk)
        if begin < end:
            with_ieee_subnormals(body, begin, end)

    var split = perf_counter_ns()
    parallelize(run, chunks)
    var share = spent * rest // done // cores
    var cost = min(max(Int(perf_counter_ns() - split) - share, 0), MAX_SPLIT_COST_NS)
    dev[].split_cost_ns = (3 * dev[].split_cost_ns + cost) // 4


def group_kernel[lanes: Int, body: def(Int, Int, Args) thin -> None](n: Int64, args: Args):
    """The GPU launcher: `lanes` consecutive threads share task i and run body(i, lane, args)."""
    var thread = Int(global_idx.x)
    var task = thread // lanes
    if task < Int(n):
        body(task, thread % lanes, args)


def enqueue_slots[
    Slots: TypeList[Trait=AnyType, ...], //, kernel: def(* args: * Slots) thin -> None
](dev: DevicePtr, n: Int, threads: Int, args: Args) raises:
    """Launch `kernel` (group_kernel, element_kernel: n, then Args) over n tasks on the GPU,
    with at least `threads` threads in blocks of GPU_BLOCK."""
    comptime if HAS_ACCELERATOR:
        dev[].ctx().enqueue_function[kernel](
            Int64(n), args,
            grid_dim=gpu_blocks(threads),
            block_dim=GPU_BLOCK,
        )


def enqueue_blocks[
    Slots: TypeList[Trait=AnyType, ...], //, kernel: def(* args: * Slots) thin -> None, dynamic_shared: Int = 0
](dev: DevicePtr, blocks: Int, team: Int, args: Args) raises:
    """Launch `kernel` (team_kernel, gpu_team_kernel: Args) as `blocks` blocks of `team`
    threads on the GPU, with `dynamic_shared` bytes of dynamic shared memory a block (none for 0)."""
    comptime if HAS_ACCELERATOR:
        var shared_bytes = Optional[Int](None)
        var attribute = Optional[FuncAttribute](None)
        comptime if dynamic_shared > 0:
            shared_bytes = dynamic_shared
            attribute = FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(dynamic_shared))
        dev[].ctx().enqueue_function[kernel](
            args,
            grid_dim=blocks,
            block_dim=team,
            shared_mem_bytes=shared_bytes,
            func_attribute=attribute,
        )


def launch_grouped[lanes: Int, gpu_body: def(Int, Int, Args) thin -> None, cpu_body: def(Int, Args) thin -> None](
    dev: DevicePtr, n: Int, args: Args
) raises:
    """Run every task in [0, n): on a GPU, `lanes` threads a task (gpu_body sees its lane); on the CPU,
    one task per call of cpu_body, which plays every lane itself."""
    if dev[].is_gpu():
        enqueue_slots[group_kernel[lanes, gpu_body]](dev, n, n * lanes, args)
        return

    def chunk(begin: Int, end: Int) {imm args}:
        for i in range(begin, end):
            cpu_body(i, args)

    cpu_parallel_for(dev, chunk, n)


def one_lane[body: def(Int, Args) thin -> None](task: Int, lane: Int, args: Args):
    """An index kernel's body as the single lane of its task."""
    body(task, args)


comptime RowBody = def[warp: Bool](Int, Int, Args) thin -> None
"""A row kernel's body: body[warp](row, lane, args). With warp, one of the 32 threads of a GPU warp that
share the row (engine.reduction.row_reduce); without, the one caller that takes the whole row (lane 0)."""


def whole_row[body: RowBody](row: Int, args: Args):
    body[False](row, 0, args)


def launch_rows[body: RowBody](dev: DevicePtr, n: Int, args: Args) raises:
    """body over every row in [0, n): a GPU warp a row, or one CPU call a row."""
    launch_grouped[32, body[True], whole_row[body]](dev, n, args)


def launch_index[body: def(Int, Args) thin -> None](dev: DevicePtr, n: Int, args: Args) raises:
    """body(i, args) for every i in [0, n), one GPU thread or one CPU call each."""
    launch_grouped[1, one_lane[body], body](dev, n, args)


comptime LanesBody = def[w: SIMDLength](Int, Args) thin -> None
"""An index kernel whose task is `lanes` independent lanes: body[w](task, args) computes them w at a time,
each lane exactly as body[1] computes it alone."""


def launch_lanes[lanes: Int, body: LanesBody](dev: DevicePtr, n: Int, args: Args) raises:
    """body over every task in [0, n): on a GPU one thread a task, taking its lanes one by one (body[1]); on the
    CPU one call a task, its lanes as one vector (body[lanes]). The same bits either way."""
    launch_grouped[1, one_lane[body[1]], body[lanes]](dev, n, args)


comptime CPU_LANES = 8  # float32 lanes of an x86-64-v3 vector register
comptime ElementBody = def[w: SIMDLength](Int, Args) thin -> None
"""An element-wise kernel's body: body[w](i, args) computes elements [i, i + w), each lane exactly as
body[1] computes it alone (the portable math is written over lanes that never interact)."""


comptime GPU_LANES = 4  # elements a GPU thread computes, as one vector: four independent chains in flight


def element_kernel[body: ElementBody, lanes: Int](n: Int64, args: Args):
    """The GPU launcher of an element-wise kernel: thread t computes elements [lanes·t, lanes·t + lanes) of [0, n)
    as one body[lanes] call, or the last few one by one."""
    var first = Int(global_idx.x) * lanes
    if first < Int(n):
        if first + lanes <= Int(n):
            body[lanes](first, args)
        else:
            for i in range(first, Int(n)):
                body[1](i, args)


def launch_elements[body: ElementBody, gpu_lanes: Int = GPU_LANES](dev: DevicePtr, n: Int, args: Args) raises:
    """body over the elements [0, n): on a GPU gpu_lanes elements a thread (1 for a body whose lane holds much
    state: four of them a thread ran slower), on the CPU CPU_LANES a call, the last few one by one. The same bits
    either way: each lane is computed alone."""
    if dev[].is_gpu():
        enqueue_slots[element_kernel[body, gpu_lanes]](dev, n, (n + gpu_lanes - 1) // gpu_lanes, args)
        return

    def groups(begin: Int, end: Int) {imm args, imm n}:
        for group in range(begin, end):
            var i = group * CPU_LANES
            if i + CPU_LANES <= n:
                body[CPU_LANES](i, args)
            else:
                for j in range(i, n):
                    body[1](j, args)

    cpu_parallel_for(dev, groups, (n + CPU_LANES - 1) // CPU_LANES)


comptime TeamBody = def[D: Int, played: Int, space: AddressSpace](
    Int, Int, Args, Pointer[Float32, MutUntrackedOrigin, address_space=space]
) thin -> None
"""A team kernel's body, specialised for size D (attention: the head dimension): body(task, first thread,
args, scratch) plays threads [first, first + played) of the team that computes task, with `scratch` the
team's shared floats."""


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(team)), `nvvm.minctasm`=SIMDLength(per_sm)
)
def team_kernel[D: Int, team: Int, scratch: Int, body: TeamBody, per_sm: Int](args: Args):
    """The GPU launcher of a team kernel: block i is the team of task i, each thread plays itself; `per_sm` teams
    are meant to share a multiprocessor (a register budget for the compiler)."""
    var shared = stack_allocation[scratch, Float32, alignment=64, address_space=AddressSpace.SHARED]()
    body[D, 1, AddressSpace.SHARED](Int(block_idx.x), Int(thread_idx.x), args, shared)


@always_inline
def sync[played: Int]():
    """The end of a phase: a barrier on a GPU; on the CPU the call has already played every thread to it."""
    comptime if played == 1:
        barrier()


def launch_teams[D: Int, team: Int, scratch: Int, body: TeamBody, per_sm: Int](
    dev: DevicePtr, n: Int, args: Args
) raises:
    """Run every task in [0, n) by a team of `team` threads sharing `scratch` floats: on a GPU a block of
    `team` threads a task (body[D, 1]), `per_sm` blocks meant to share a multiprocessor (the compiler's register
    budget); on the CPU one call of body[D, team] a task, playing the whole team."""
    if n <= 0:
        return
    if dev[].is_gpu():
        enqueue_blocks[team_kernel[D, team, scratch, body, per_sm]](dev, n, team, args)
        return

    def chunk(begin: Int, end: Int) {imm args}:
        var shared = f32_at(Int(alloc[Float32](scratch, alignment=64)))
        for task in range(begin, end):
            body[D, team, AddressSpace.GENERIC](task, 0, args, shared)
        shared.unsafe_free()

    cpu_parallel_for(dev, chunk, n)


comptime GpuTeamBody = def[D: Int](Int, Args) thin -> None
"""A GPU-only team kernel's body (fast attention), specialised for size D: body(task, args), run by every thread
of the block that computes task; each thread reads its own `thread_idx` and the body allocates its shared memory."""


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(team)), `nvvm.minctasm`=SIMDLength(per_sm)
)
def gpu_team_kernel[D: Int, team: Int, per_sm: Int, body: GpuTeamBody](args: Args):
    """Block i of `team` threads computes task i; `per_sm` blocks are meant to share a multiprocessor (a register
    budget for the compiler)."""
    body[D](Int(block_idx.x), args)


comptime GpuMappedTeamBody = def[D: Int](Int, Args, Int, Int) thin -> None
"""A GPU-only team kernel's body that copies its operands' tiles by TMA: body(task, args, a_map, b_map), the maps'
addresses (kernel parameters, so grid constants, as cp.async.bulk.tensor wants them)."""


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(team)), `nvvm.minctasm`=SIMDLength(per_sm)
)
@__llvm_arg_metadata(a_map, `nvvm.grid_constant`)
@__llvm_arg_metadata(b_map, `nvvm.grid_constant`)
def gpu_mapped_team_kernel[D: Int, team: Int, per_sm: Int, body: GpuMappedTeamBody](
    args: Args, a_map: TMADescriptor, b_map: TMADescriptor
):
    """gpu_team_kernel with two tensor maps beside Args."""
    body[D](Int(block_idx.x), args, Int(Pointer(to=a_map)), Int(Pointer(to=b_map)))


def launch_gpu_mapped_teams[D: Int, team: Int, per_sm: Int, body: GpuMappedTeamBody, dynamic_shared: Int](
    dev: DevicePtr, n: Int, args: Args, a_map: TMADescriptor, b_map: TMADescriptor
) raises:
    """launch_gpu_teams for a body that reads its operands through the tensor maps a_map and b_map. A launcher of
    its own because the maps are two more kernel parameters beside Args (grid constants; 128 bytes each),
    which the other team kernels need not carry."""
    if not dev[].is_gpu():
        raise Error("a GPU-only kernel was called on the CPU")
    comptime if HAS_ACCELERATOR:
        if n > 0:
            dev[].ctx().enqueue_function[gpu_mapped_team_kernel[D, team, per_sm, body]](
                args,
                a_map, b_map,
                grid_dim=n,
                block_dim=team,
                shared_mem_bytes=dynamic_shared,
                func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(dynamic_shared)),
            )


def launch_gpu_teams[D: Int, team: Int, per_sm: Int, body: GpuTeamBody, dynamic_shared: Int = 0](
    dev: DevicePtr, n: Int, args: Args
) raises:
    """Run every task in [0, n) by a block of `team` threads on a GPU. There is no CPU version: on the CPU
    (or in the CPU build) this raises, and the Python wrappers never call it there. `dynamic_shared` bytes of
    dynamic shared memory (the body reaches them by `external_memory`) let a block take more than the 48 KB a
    kernel's static allocations may."""
    if not dev[].is_gpu():
        raise Error("a GPU-only kernel was called on the CPU")
    if n > 0:
        enqueue_blocks[gpu_team_kernel[D, team, per_sm, body], dynamic_shared](dev, n, team, args)
