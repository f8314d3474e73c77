"""The two launchers every kernel body runs under.

A kernel is written once as a body over an index (a row, an element, a column).
On the CPU, `cpu_parallel_for` hands contiguous index ranges to threads; on a
GPU, a one-line kernel maps `global_idx.x` to the index and calls the same body.
"""

from std.sys import num_physical_cores
from std.python import PythonObject
from max.algorithm import parallelize
from engine.device import Device

comptime GPU_BLOCK = 128


def gpu_blocks(n: Int) -> Int:
    return max(1, (n + GPU_BLOCK - 1) // GPU_BLOCK)


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
            body(begin, end)

    parallelize(run, chunks)


def device_of(py: PythonObject) raises -> Pointer[Device, MutAnyOrigin]:
    """The `Device` behind a Python `_engine.Device` object."""
    return py.downcast_value_ptr[Device]()
