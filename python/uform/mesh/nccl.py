"""The GPU backend: NCCL, from NVIDIA's ``nvidia-nccl-cu13`` wheel, bound with ctypes (no torch on this path).

One rank per process, one GPU per process: the executor's only device. The communicator is made with
``ncclCommInitRankConfig`` and ``blocking = 0`` (non-blocking), so no NCCL call ever waits on a peer inside the
library: each returns at once, and this module polls ``ncclCommGetAsyncError`` (and the stream, once the operation
is queued) until it finishes, fails, or the mesh's timeout passes; then ``ncclCommAbort`` stops it (a kernel
waiting for a dead peer exits on the abort flag) and the collective raises, which breaks the mesh (PEER_LOST).

The communicator's unique id (``ncclGetUniqueId``: 128 bytes naming host domain 0's bootstrap socket) is drawn by
host domain 0 after the roster and written into the attempt's directory as ``nccl-id`` (atomically, like every
file of the protocol); the others read it, waiting at most the timeout. The read and the connection share one
deadline, so ``Mesh.bootstrap`` still ends within twice the timeout. A process alone draws its own id and
writes nothing.

The primitives take and return host numpy arrays: they are copied as bytes into buffers of the engine's device
(``Device.put``), gathered there, and copied back. ``all_gather_device`` gathers the engine's device buffers
directly. NCCL runs on a stream of its own, made with the CUDA driver API (``libcuda.so.1``, which every NVIDIA
driver installs) in the device's primary context, the context the engine's buffers and NCCL's runtime use: the
engine's device is synchronized before each collective (its stream wrote the inputs) and the NCCL stream is
polled to completion after it, so the two streams never overlap.

NVLink multicast stays off: ``NCCL_NVLS_ENABLE=0`` is set before NCCL initialises unless the environment already
says otherwise (docs/mesh.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import time

import numpy as np

from .._loader import nvidia_wheel_library
from ..engine import Buffer, Device
from ..files import write_atomically
from ..errors import ErrorCode, UFormError, UFormRuntimeError, UFormValueError
from .collectives import Collectives, peer_lost
from .options import shown

NCCL_LIBRARY = "libnccl.so.2"
"""The NCCL of the ``nvidia-nccl-cu13`` wheel (``site-packages/nvidia/nccl/lib``), or one on the loader's path."""
UNIQUE_ID_FILE = b"nccl-id"
"""The communicator's unique id in the attempt's directory, written by host domain 0 after the roster."""
UNIQUE_ID_BYTES = 128
"""sizeof(ncclUniqueId)."""
POLL_SECONDS = 0.05
"""How often a process waiting for the unique id looks at the directory (the rendezvous's pace)."""
SPIN_SECONDS = 0.0002
"""How long a collective sleeps between two polls of NCCL and its stream: short, since most finish in microseconds."""

NCCL_SUCCESS, NCCL_IN_PROGRESS = 0, 7
NCCL_UINT8 = 1
"""ncclUint8: every collective moves bytes, whatever the array's dtype."""
NCCL_CONFIG_MAGIC = 0xCAFEBEEF
NCCL_CONFIG_VERSION = 21400
"""NCCL_VERSION(2, 14, 0): the first whose config carries ``blocking``, all this module sets."""
CUDA_SUCCESS, CUDA_ERROR_NOT_READY = 0, 600
CU_STREAM_NON_BLOCKING = 1
CU_POINTER_ATTRIBUTE_CONTEXT = 1


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]  # bytes, zeros among them (not a C string)


class _Config(ctypes.Structure):
    """The leading fields of ``ncclConfig_t``: NCCL copies ``size`` bytes of it over NCCL_CONFIG_INITIALIZER's
    values, so the fields after ``blocking`` keep their defaults."""

    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int)]


class _Libraries:
    """NCCL and the CUDA driver, their functions typed."""

    def __init__(self, nccl: ctypes.CDLL, cuda: ctypes.CDLL):
        self.nccl, self.cuda = nccl, cuda
        pointer, size, result = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        for name, arguments in [
                ("ncclGetUniqueId", [ctypes.POINTER(_UniqueId)]),
                ("ncclCommInitRankConfig", [ctypes.POINTER(pointer), ctypes.c_int, _UniqueId, ctypes.c_int,
                                            ctypes.POINTER(_Config)]),
                ("ncclCommGetAsyncError", [pointer, ctypes.POINTER(result)]),
                ("ncclAllGather", [pointer, pointer, size, ctypes.c_int, pointer, pointer]),
                ("ncclBroadcast", [pointer, pointer, size, ctypes.c_int, ctypes.c_int, pointer, pointer]),
                ("ncclCommFinalize", [pointer]), ("ncclCommDestroy", [pointer]), ("ncclCommAbort", [pointer])]:
            function = getattr(nccl, name)
            function.argtypes, function.restype = arguments, result
        nccl.ncclGetErrorString.argtypes, nccl.ncclGetErrorString.restype = [result], ctypes.c_char_p
        nccl.ncclGetLastError.argtypes, nccl.ncclGetLastError.restype = [pointer], ctypes.c_char_p
        for name, arguments in [
                ("cuInit", [ctypes.c_uint]), ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(pointer), ctypes.c_int]),
                ("cuDevicePrimaryCtxRelease_v2", [ctypes.c_int]), ("cuCtxPushCurrent_v2", [pointer]),
                ("cuCtxPopCurrent_v2", [ctypes.POINTER(pointer)]),
                ("cuStreamCreate", [ctypes.POINTER(pointer), ctypes.c_uint]), ("cuStreamQuery", [pointer]),
                ("cuStreamDestroy_v2", [pointer]), ("cuPointerGetAttribute", [pointer, ctypes.c_int, pointer]),
                ("cuGetErrorString", [result, ctypes.POINTER(ctypes.c_char_p)])]:
            function = getattr(cuda, name)
            function.argtypes, function.restype = arguments, result

    def nccl_error(self, result: int, comm=None) -> str:
        """NCCL's words for `result`, with its last error message when it has one."""
        text = self.nccl.ncclGetErrorString(result).decode(errors="replace")
        last = self.nccl.ncclGetLastError(comm)
        return f"{text}: {last.decode(errors='replace')}" if last else text

    def cuda_check(self, what: str, result: int) -> None:
        """RuntimeError naming `what` unless the driver call succeeded."""
        if result != CUDA_SUCCESS:
            text = ctypes.c_char_p()
            self.cuda.cuGetErrorString(result, ctypes.byref(text))
            raise RuntimeError(f"{what}: CUDA error {result} ({(text.value or b'?').decode(errors='replace')})")


@functools.cache
def _libraries() -> _Libraries:
    """NCCL and the CUDA driver, loaded once; UNSUPPORTED naming what is missing."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (docs/mesh.md); read at NCCL's init
    try:
        nccl = nvidia_wheel_library(NCCL_LIBRARY)
    except OSError as error:
        raise UFormRuntimeError(ErrorCode.UNSUPPORTED, f"mesh: GPU processes meet through NCCL, which cannot be loaded "
                                f"({error}); install it with: pip install nvidia-nccl-cu13") from None
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise UFormRuntimeError(ErrorCode.UNSUPPORTED, f"mesh: NCCL needs the CUDA driver ({error})") from None
    return _Libraries(nccl, cuda)


def require(device_count: int, device_names: str) -> None:
    """UNSUPPORTED unless NCCL loads and the process drives one GPU (one rank per process)."""
    if device_count != 1:
        raise UFormError(ErrorCode.UNSUPPORTED, f"mesh: a GPU process drives one GPU (one NCCL rank per process); "
                         f"this executor has {device_count} ({device_names}): start one process per GPU, each with "
                         "Executor.for_vram(devices=[i])")
    _libraries()


def draw_unique_id() -> bytes:
    """A fresh communicator id from ``ncclGetUniqueId`` (it opens this process's bootstrap socket)."""
    libraries = _libraries()
    unique = _UniqueId()
    result = libraries.nccl.ncclGetUniqueId(ctypes.byref(unique))
    if result != NCCL_SUCCESS:
        raise UFormRuntimeError(ErrorCode.PEER_LOST, f"mesh: ncclGetUniqueId failed: {libraries.nccl_error(result)}")
    return bytes(unique.internal)


def shared_unique_id(attempt: bytes, host_domain_index: int, deadline: float, timeout_seconds: float,
                     draw=draw_unique_id) -> bytes:
    """The communicator's unique id: host domain 0 draws it (`draw`) and writes it into attempt directory `attempt`;
    every other reads it there, waiting until `deadline` (time.monotonic), then PEER_LOST. CORRUPTED when the file
    is not an id."""
    path = os.path.join(attempt, UNIQUE_ID_FILE)
    if host_domain_index == 0:
        unique = draw()
        write_atomically(path, [unique])
        return unique
    while True:
        try:
            with open(path, "rb") as file:
                unique = file.read()
        except FileNotFoundError:
            unique = None
        if unique is not None:
            if len(unique) != UNIQUE_ID_BYTES:
                raise UFormError(ErrorCode.CORRUPTED, f"mesh: {shown(path)} holds {len(unique)} bytes, not NCCL's "
                                                      f"{UNIQUE_ID_BYTES}-byte unique id")
            return unique
        if time.monotonic() > deadline:
            raise peer_lost(f"mesh: host domain 0 never wrote NCCL's unique id ({shown(path)}) within "
                            f"{timeout_seconds:g} s of the roster")
        time.sleep(POLL_SECONDS)


class Nccl(Collectives):
    """Collectives among GPU processes, one rank each, through an NCCL communicator."""

    backend = "nccl"

    def __init__(self, device: Device, unique_id: bytes, rank: int, size: int, timeout_seconds: float,
                 deadline: float):
        """Connect rank `rank` of `size` on `device` to the communicator `unique_id` names, by `deadline`
        (time.monotonic); PEER_LOST when the peers do not all connect by then, UNSUPPORTED when the engine's
        buffers do not live where NCCL can reach them."""
        super().__init__(rank, size, timeout_seconds)
        self._device = device
        self._libraries = libraries = _libraries()
        self._comm, self._stream, self._context = None, None, None
        cuda = libraries.cuda
        context = ctypes.c_void_p()
        try:
            libraries.cuda_check("cuInit", cuda.cuInit(0))
            libraries.cuda_check(f"retaining {device.name}'s primary context",
                                 cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device.ordinal))
        except RuntimeError as error:
            raise UFormRuntimeError(ErrorCode.UNSUPPORTED, f"mesh: NCCL cannot use {device.name}: {error}") from None
        self._context = context
        try:
            self._connect(unique_id, deadline)
        except BaseException:
            self._abort()
            self._release()
            raise

    def _connect(self, unique_id: bytes, deadline: float) -> None:
        """Make NCCL's stream and the communicator, and wait until every rank has joined it."""
        libraries, cuda, rank, size = self._libraries, self._libraries.cuda, self.rank, self.size
        self._check_engine_memory()
        with self._current():
            stream = ctypes.c_void_p()
            libraries.cuda_check("creating NCCL's stream", cuda.cuStreamCreate(ctypes.byref(stream),
                                                                               CU_STREAM_NON_BLOCKING))
            self._stream = stream
            comm = ctypes.c_void_p()
            config = _Config(size=ctypes.sizeof(_Config), magic=NCCL_CONFIG_MAGIC, version=NCCL_CONFIG_VERSION,
                             blocking=0)
            result = libraries.nccl.ncclCommInitRankConfig(ctypes.byref(comm), size,
                                                            _UniqueId.from_buffer_copy(unique_id), rank,
                                                            ctypes.byref(config))
            self._comm = comm if comm.value else None
            try:
                self._finish("connection", result, deadline, stream_too=False)
            except RuntimeError as error:
                raise peer_lost(f"mesh: NCCL could not connect host domain {rank} of {size} within "
                                f"{self.timeout_seconds:g} s: {error}") from None

    @classmethod
    def connect(cls, device: Device, attempt: bytes | None, rank: int, size: int, timeout_seconds: float) -> Nccl:
        """Rank `rank` of `size`, its unique id exchanged through attempt directory `attempt` (None: a process
        alone, which draws its own); the exchange and the connection end within `timeout_seconds` together."""
        deadline = time.monotonic() + timeout_seconds
        unique_id = draw_unique_id() if attempt is None else shared_unique_id(attempt, rank, deadline,
                                                                              timeout_seconds)
        return cls(device, unique_id, rank, size, timeout_seconds, deadline)

    @contextlib.contextmanager
    def _current(self):
        """The device's primary context current on this thread (NCCL takes its device from it), then the one before."""
        cuda = self._libraries.cuda
        self._libraries.cuda_check("making the primary context current", cuda.cuCtxPushCurrent_v2(self._context))
        try:
            yield
        finally:
            cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def _check_engine_memory(self) -> None:
        """UNSUPPORTED unless the engine allocates in the primary context, or from a memory pool of the device (whose
        memory names no context): NCCL's kernels run in the primary context and could not read another's memory."""
        probe = self._device.empty(1, np.uint8)
        self._device.synchronize()
        owner = ctypes.c_void_p()
        result = self._libraries.cuda.cuPointerGetAttribute(ctypes.byref(owner), CU_POINTER_ATTRIBUTE_CONTEXT,
                                                            probe.address)
        if result == CUDA_SUCCESS and owner.value not in (None, self._context.value):
            raise UFormRuntimeError(ErrorCode.UNSUPPORTED, f"mesh: the engine's buffers on {self._device.name} live in "
                                    "a CUDA context other than the device's primary one, where NCCL runs")

    def _finish(self, verb: str, result: int, deadline: float, stream_too: bool = True) -> None:
        """Wait until the operation NCCL answered `result` to is done: queued (the communicator's async state leaves
        ncclInProgress) and, with `stream_too`, run (NCCL's stream is idle). On an error or at `deadline` the
        communicator is aborted and RuntimeError raised: the mesh is broken."""
        libraries = self._libraries
        try:
            if result not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
                raise RuntimeError(f"NCCL's {verb} failed: {libraries.nccl_error(result, self._comm)}")
            if self._comm is None:
                raise RuntimeError(f"NCCL's {verb} made no communicator")
            state = ctypes.c_int()
            while True:
                libraries.nccl.ncclCommGetAsyncError(self._comm, ctypes.byref(state))
                if state.value == NCCL_SUCCESS:
                    if not stream_too:
                        return
                    queried = libraries.cuda.cuStreamQuery(self._stream)
                    if queried == CUDA_SUCCESS:
                        return
                    if queried != CUDA_ERROR_NOT_READY:
                        libraries.cuda_check(f"NCCL's {verb}", queried)
                elif state.value != NCCL_IN_PROGRESS:
                    raise RuntimeError(f"NCCL's {verb} failed: {libraries.nccl_error(state.value, self._comm)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"NCCL's {verb} did not finish within {self.timeout_seconds:g} s; "
                                       "the communicator was aborted")
                time.sleep(SPIN_SECONDS)
        except RuntimeError:
            self._abort()
            raise

    def _abort(self) -> None:
        """Stop the communicator at once (its kernels exit on the abort flag); it is unusable after."""
        if self._comm is not None:
            comm, self._comm = self._comm, None
            self._libraries.nccl.ncclCommAbort(comm)

    def _collective(self, verb: str, launch) -> None:
        """Run one NCCL operation (`launch`: the call, answering NCCL's result) after the engine's pending work, and
        wait for it; RuntimeError (the mesh breaks) when it fails or passes the timeout."""
        if self._comm is None:
            raise RuntimeError(f"NCCL's communicator was aborted before this {verb}")
        self._device.synchronize()  # the engine's stream wrote the inputs
        with self._current():
            deadline = time.monotonic() + self.timeout_seconds
            self._finish(verb, launch(), deadline)

    def _gather(self, send: int, recv: int, nbytes: int) -> None:
        nccl = self._libraries.nccl
        self._collective("all_gather", lambda: nccl.ncclAllGather(send, recv, nbytes, NCCL_UINT8, self._comm,
                                                                  self._stream))

    def all_gather_device(self, send: Buffer, recv: Buffer) -> None:
        """Every process's `send` (a buffer of this process's GPU, the same size on each) into `recv` (size times
        as many bytes), in rank order; no host copy. INVALID_ARGUMENT for buffers that do not fit; PEER_LOST (and a
        broken mesh) when a peer does not answer within the timeout."""
        for name, buffer in (("send", send), ("recv", recv)):
            if not isinstance(buffer, Buffer) or buffer.device.ordinal != self._device.ordinal:
                raise UFormValueError(ErrorCode.INVALID_ARGUMENT, f"all_gather_device: {name} must be a Buffer on "
                                      f"{self._device.name}, got {buffer!r}")
        if recv.nbytes != self.size * send.nbytes:
            raise UFormValueError(ErrorCode.INVALID_ARGUMENT, f"all_gather_device: recv holds {recv.nbytes} bytes; "
                                  f"{self.size} processes' {send.nbytes} need {self.size * send.nbytes}")
        self._guarded("all_gather_device", lambda: self._gather(send.address, recv.address, send.nbytes))

    def _all_gather(self, array: np.ndarray) -> np.ndarray:
        gathered = np.empty((self.size, *array.shape), array.dtype)
        if array.nbytes:
            send = self._device.put(array.reshape(-1).view(np.uint8))
            recv = self._device.empty(self.size * array.nbytes, np.uint8)
            self._gather(send.address, recv.address, array.nbytes)
            gathered.reshape(-1).view(np.uint8)[:] = recv.numpy()
        return gathered

    def _broadcast(self, array: np.ndarray, root: int) -> np.ndarray:
        if not array.nbytes:
            return array.copy()
        buffer = self._device.put(array.reshape(-1).view(np.uint8))
        nccl = self._libraries.nccl
        self._collective("broadcast", lambda: nccl.ncclBroadcast(buffer.address, buffer.address, array.nbytes,
                                                                 NCCL_UINT8, root, self._comm, self._stream))
        return buffer.numpy().view(array.dtype).reshape(array.shape)

    def _close(self) -> None:
        """Finalize the communicator (its operations flushed, within the timeout) and destroy it, or abort it when it
        cannot finalize: closing never raises. NCCL's stream and the primary context are released either way."""
        try:
            if self._comm is not None:
                with contextlib.suppress(RuntimeError), self._current():  # _finish aborted it
                    self._finish("finalize", self._libraries.nccl.ncclCommFinalize(self._comm),
                                 time.monotonic() + self.timeout_seconds, stream_too=False)
                    comm, self._comm = self._comm, None
                    self._libraries.nccl.ncclCommDestroy(comm)
        finally:
            self._release()

    def _release(self) -> None:
        cuda = self._libraries.cuda
        if self._stream is not None:
            stream, self._stream = self._stream, None
            with self._current():
                cuda.cuStreamDestroy_v2(stream)
        if self._context is not None:
            self._context = None
            cuda.cuDevicePrimaryCtxRelease_v2(self._device.ordinal)
