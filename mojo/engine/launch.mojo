"""The two launchers every kernel body runs under.

A kernel is written once as a body over an index (a row, an element, a column)
that reads its operands from `Args`: up to eight buffer addresses, four sizes
and four float scalars. On the CPU, `cpu_parallel_for` hands contiguous index
ranges to threads; on a GPU, `group_kernel` maps `global_idx.x` to the index.
Both call the same body, so both compute the same bits. A warp kernel
(attention) shares each index among the 32 lanes of a warp on the GPU, and
plays the lanes itself on the CPU, in the same order (`launch_warps`).
"""

from std.sys import llvm_intrinsic, num_physical_cores
from std.python import PythonObject
from max.algorithm import parallelize
from max.gpu import global_idx
from engine.device import Device
from engine.target import HAS_ACCELERATOR

comptime GPU_BLOCK = 128


def gpu_blocks(n: Int) -> Int:
    return max(1, (n + GPU_BLOCK - 1) // GPU_BLOCK)


@fieldwise_init
struct Args(ImplicitlyCopyable, Movable):
    """A kernel's operands: addresses a0…a7, sizes n0…n3, scalars x0…x3."""

    var a0: Int
    var a1: Int
    var a2: Int
    var a3: Int
    var a4: Int
    var a5: Int
    var a6: Int
    var a7: Int
    var n0: Int
    var n1: Int
    var n2: Int
    var n3: Int
    var x0: Float32
    var x1: Float32
    var x2: Float32
    var x3: Float32


def args_from_python(addresses: PythonObject, sizes: PythonObject, scalars: PythonObject) raises -> Args:
    """Args from three Python sequences (missing entries are zero)."""
    var a = List[Int]()
    var n = List[Int]()
    var x = List[Float32]()
    for i in range(8):
        a.append(Int(py=addresses[i]) if i < Int(py=len(addresses)) else 0)
    for i in range(4):
        n.append(Int(py=sizes[i]) if i < Int(py=len(sizes)) else 0)
        x.append(Float32(py=scalars[i]) if i < Int(py=len(scalars)) else 0)
    return Args(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], n[0], n[1], n[2], n[3], x[0], x[1], x[2], x[3])


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


def cpu_parallel_for[Body: def(Int, Int) -> None](body: Body, n: Int):
    """Run `body(begin, end)` over `[0, n)` split into contiguous chunks, a few per core."""
    if n <= 0:
        return
    var chunks = min(n, max(1, num_physical_cores() * 4))
    var per_chunk = (n + chunks - 1) // chunks

    def run(chunk: Int) {imm body, imm per_chunk, imm n}:
        var begin = chunk * per_chunk
        var end = min(n, begin + per_chunk)
        if begin < end:
            with_ieee_subnormals(body, begin, end)

    parallelize(run, chunks)


def device_of(py: PythonObject) raises -> Pointer[Device, MutAnyOrigin]:
    """The `Device` behind a Python `_engine.Device` object."""
    return py.downcast_value_ptr[Device]()


comptime WARP = 32


def group_kernel[lanes: Int, body: def(Int, Int, Args) thin -> None](
    n: Int64,
    a0: Int64, a1: Int64, a2: Int64, a3: Int64, a4: Int64, a5: Int64, a6: Int64, a7: Int64,
    n0: Int64, n1: Int64, n2: Int64, n3: Int64,
    x0: Float32, x1: Float32, x2: Float32, x3: Float32,
):
    """The GPU launcher: `lanes` consecutive threads share task i and run body(i, lane, args)."""
    var thread = Int(global_idx.x)
    var task = thread // lanes
    if task < Int(n):
        body(
            task,
            thread % lanes,
            Args(Int(a0), Int(a1), Int(a2), Int(a3), Int(a4), Int(a5), Int(a6), Int(a7),
                 Int(n0), Int(n1), Int(n2), Int(n3), x0, x1, x2, x3),
        )


def launch_grouped[lanes: Int, gpu_body: def(Int, Int, Args) thin -> None, cpu_body: def(Int, Args) thin -> None](
    device: PythonObject, n: Int, args: Args
) raises:
    """Run every task in [0, n): on a GPU, `lanes` threads a task (gpu_body sees its lane); on the CPU,
    one task per call of cpu_body, which plays every lane itself."""
    var dev = device_of(device)
    if dev[].is_gpu():
        comptime if HAS_ACCELERATOR:
            dev[].ctx().enqueue_function[group_kernel[lanes, gpu_body]](
                Int64(n),
                Int64(args.a0), Int64(args.a1), Int64(args.a2), Int64(args.a3),
                Int64(args.a4), Int64(args.a5), Int64(args.a6), Int64(args.a7),
                Int64(args.n0), Int64(args.n1), Int64(args.n2), Int64(args.n3),
                args.x0, args.x1, args.x2, args.x3,
                grid_dim=gpu_blocks(n * lanes),
                block_dim=GPU_BLOCK,
            )
        return

    def chunk(begin: Int, end: Int) {imm args}:
        for i in range(begin, end):
            cpu_body(i, args)

    cpu_parallel_for(chunk, n)


def one_lane[body: def(Int, Args) thin -> None](task: Int, lane: Int, args: Args):
    """An index kernel's body as the single lane of its task."""
    body(task, args)


def launch_warps[gpu_body: def(Int, Int, Args) thin -> None, cpu_body: def(Int, Args) thin -> None](
    device: PythonObject, n: PythonObject, addresses: PythonObject, sizes: PythonObject, scalars: PythonObject
) raises -> PythonObject:
    """A kernel whose task is shared by the 32 lanes of a GPU warp (gpu_body, with shuffles) and run by
    one CPU task that plays the 32 lanes itself (cpu_body); both keep the same lane order."""
    launch_grouped[WARP, gpu_body, cpu_body](device, Int(py=n), args_from_python(addresses, sizes, scalars))
    return PythonObject(None)


def launch_from_python[body: def(Int, Args) thin -> None](
    device: PythonObject, n: PythonObject, addresses: PythonObject, sizes: PythonObject, scalars: PythonObject
) raises -> PythonObject:
    """The Python entry point shared by every index kernel: (device, n, addresses, sizes, scalars);
    body(i, args) runs for every i in [0, n), one GPU thread or one CPU call each."""
    launch_grouped[1, one_lane[body], body](device, Int(py=n), args_from_python(addresses, sizes, scalars))
    return PythonObject(None)
