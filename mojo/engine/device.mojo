"""A device the engine computes on: the host CPU or one GPU.

Memory is addressed by plain integers (a host pointer or a device pointer), the
way llm.c passes raw pointers: every kernel takes addresses and sizes. The
`Device` owns each allocation it hands out and frees it on `free` or when the
device is dropped. A GPU device owns one `DeviceContext`, hence one stream; every
launch and copy is queued there in order.
"""

from std.collections import Dict, Optional
from std.ffi import external_call
from max.gpu.host import DeviceBuffer, DeviceContext, HostBuffer
from engine.gil import GilReleased
from engine.target import HAS_ACCELERATOR

comptime F32Ptr = Pointer[Float32, MutUntrackedOrigin]  # plain addresses: the engine manages lifetimes itself
comptime I32Ptr = Pointer[Int32, MutUntrackedOrigin]
comptime BytePtr = Pointer[UInt8, MutUntrackedOrigin]
comptime STAGED_UPLOAD_LIMIT = 1 << 25  # uploads up to this many bytes go through the pinned staging memory
comptime FIRST_STAGING_BYTES = 1 << 22  # the staging memory's first size; it grows to twice what a step stages
comptime STAGING_ALIGNMENT = 256


def f32_at(address: Int) -> F32Ptr:
    return F32Ptr(unsafe_from_address=address)


def i32_at(address: Int) -> I32Ptr:
    return I32Ptr(unsafe_from_address=address)


def bytes_at(address: Int) -> BytePtr:
    return BytePtr(unsafe_from_address=address)


def host_copy(destination: Int, source: Int, size: Int):
    """libc memcpy between two host addresses."""
    _ = external_call["memcpy", Int](destination, source, size)


def gpu_device_count() -> Int:
    comptime if HAS_ACCELERATOR:
        try:
            return DeviceContext.number_of_devices()
        except:
            return 0
    return 0


struct Device(Movable, Writable, Defaultable):
    """The CPU (ordinal -1) or GPU `ordinal`, with the allocations made on it."""

    var ordinal: Int
    var context: Optional[DeviceContext]
    var gpu_buffers: Dict[Int, DeviceBuffer[DType.uint8]]
    var host_buffers: Dict[Int, Int]  # address -> size, for the CPU device
    var split_cost_ns: Int  # the CPU: what handing work to the worker threads costs (cpu_parallel_for)
    var staging: Optional[HostBuffer[DType.uint8]]  # a GPU's pinned host memory that small uploads go through
    var staged: Int  # its bytes holding uploads queued since the device last finished its work
    var gemm_tiling: Int  # the fma chain's GPU tiling forced for tests and tuning (kernels/gemm/fma.mojo), -1 none

    def __init__(out self):
        self.ordinal = -1
        self.context = None
        self.gpu_buffers = Dict[Int, DeviceBuffer[DType.uint8]]()
        self.host_buffers = Dict[Int, Int]()
        self.split_cost_ns = 50_000
        self.staging = None
        self.staged = 0
        self.gemm_tiling = -1

    def open(mut self, ordinal: Int) raises:
        """Bind to the CPU (ordinal -1) or to GPU `ordinal`."""
        if ordinal < 0:
            self.ordinal = -1
            return
        comptime if HAS_ACCELERATOR:
            var count = gpu_device_count()
            if ordinal >= count:
                raise Error("GPU ", ordinal, " does not exist: this machine has ", count, " usable GPU(s)")
            self.context = DeviceContext(device_id=ordinal)
            self.ordinal = ordinal
        else:
            raise Error("GPU ", ordinal, " requested, but this engine variant was built without accelerator code")

    def is_gpu(self) -> Bool:
        return self.ordinal >= 0

    def ctx(ref self) -> ref[self.context._value] DeviceContext:
        return self.context.value()

    def alloc(mut self, size: Int) raises -> Int:
        """Allocate `size` bytes (at least one) and answer their address."""
        var n = max(size, 1)
        if self.is_gpu():
            comptime if HAS_ACCELERATOR:
                var buffer = self.ctx().enqueue_create_buffer[DType.uint8](n)
                var address = Int(buffer.unsafe_ptr())
                self.gpu_buffers[address] = buffer^
                return address
            raise Error("unreachable: GPU device without accelerator code")
        var p = alloc[UInt8](n, alignment=64)  # whole cache lines: kernels read rows 16 bytes at a time
        var address = Int(p)
        self.host_buffers[address] = n
        return address

    def free(mut self, address: Int) raises:
        if self.is_gpu():
            comptime if HAS_ACCELERATOR:
                _ = self.gpu_buffers.pop(address)
            return
        _ = self.host_buffers.pop(address)
        bytes_at(address).unsafe_free()

    def allocation(mut self, address: Int, size: Int, offset: Int = 0) raises -> DeviceBuffer[DType.uint8]:
        """`size` bytes from `offset` of the GPU allocation that starts at `address`."""
        if address not in self.gpu_buffers:
            raise Error("address ", address, " is not the start of an allocation on ", self)
        return self.gpu_buffers[address].create_sub_buffer[DType.uint8](offset, size)

    def upload(mut self, address: Int, offset: Int, host: Int, size: Int) raises:
        """Copy `size` bytes from host memory to the allocation at `address`, from its byte `offset`, in the order of
        the device's queue.

        On a GPU, a copy from pageable memory would first wait for all the work queued before it, stopping the
        host mid-step (a batch's inputs are written after the previous step's kernels are queued, a head's
        targets after the forward's). So an upload of up to STAGED_UPLOAD_LIMIT bytes is copied into pinned
        staging memory at once and queued from there, and the host goes on; the staging is reused after the
        device's next synchronize. A larger upload (parameters, checkpoints) copies from pageable memory, waiting
        without the GIL."""
        if self.is_gpu():
            comptime if HAS_ACCELERATOR:
                var destination = self.allocation(address, size, offset)
                if size <= STAGED_UPLOAD_LIMIT:
                    var staged = self.stage(host, size)
                    self.ctx().enqueue_copy(destination, staged)
                    return
                with GilReleased():
                    self.ctx().enqueue_copy(destination, bytes_at(host))
            return
        host_copy(address + offset, host, size)

    def stage(mut self, host: Int, size: Int) raises -> BytePtr:
        """`size` bytes of host memory copied into the pinned staging memory, where no queued copy still reads.
        When the uploads staged since the device was last idle would overflow it, the device finishes its queue
        first (its copies then read nothing), and if they would overflow it even then, it is replaced by one
        twice their size: the next step of the same kind stages them all without a wait. Python calls one
        device's engine methods one thread at a time (`Device.lock` in engine.py): no upload is staged while
        another call waits."""
        var demand = self.staged + size
        if demand > self.staging_capacity():
            self.synchronize()
            if demand > self.staging_capacity():
                self.staging = None  # no queued copy reads it: the queue is empty
                self.staging = self.ctx().enqueue_create_host_buffer[DType.uint8](max(FIRST_STAGING_BYTES, 2 * demand))
        var staged = BytePtr(unsafe_from_address=Int(self.staging.value().unsafe_ptr()) + self.staged)
        host_copy(Int(staged), host, size)
        self.staged += (size + STAGING_ALIGNMENT - 1) // STAGING_ALIGNMENT * STAGING_ALIGNMENT
        return staged

    def staging_capacity(self) -> Int:
        return len(self.staging.value()) if self.staging else 0

    def download(mut self, host: Int, address: Int, offset: Int, size: Int) raises:
        """Copy `size` bytes from byte `offset` of the allocation at `address` to host memory, and wait (on a GPU,
        without the GIL)."""
        if self.is_gpu():
            comptime if HAS_ACCELERATOR:
                var source = self.allocation(address, size, offset)
                self.ctx().enqueue_copy(bytes_at(host), source)
                self.synchronize()
            return
        host_copy(host, address + offset, size)

    def copy(mut self, destination: Int, source: Int, size: Int) raises:
        """Copy `size` bytes between two allocations of this device."""
        if self.is_gpu():
            comptime if HAS_ACCELERATOR:
                self.ctx().enqueue_copy(self.allocation(destination, size), self.allocation(source, size))
            return
        host_copy(destination, source, size)

    def synchronize(mut self) raises:
        """Wait for the work queued on this device (on a GPU, without the GIL)."""
        if self.is_gpu():
            comptime if HAS_ACCELERATOR:
                with GilReleased():
                    self.ctx().synchronize()
                self.staged = 0  # the queue is empty: no copy reads the staging

    def write_to[W: Writer](self, mut writer: W):
        if self.ordinal < 0:
            writer.write("Device(cpu)")
        else:
            writer.write("Device(gpu:", self.ordinal, ")")

    def write_repr_to[W: Writer](self, mut writer: W):
        self.write_to(writer)

    def __deinit__(deinit self):
        for entry in self.host_buffers.items():
            bytes_at(entry.key).unsafe_free()

