"""Devices and device buffers: the host side of the Mojo engine.

The engine (``uform._engine``) addresses memory by integers. This module gives
those integers an owner: a :class:`Buffer` is an allocation of a known shape and
dtype on one :class:`Device`, freed when the buffer is collected. Numpy arrays go
in with :meth:`Device.put` and come back with :meth:`Buffer.numpy`.

An allocation the device cannot serve raises ``MemoryError`` naming the device
and the size. The engine aborts the process on a failed host allocation, so on
the CPU the size is first tried with the C library's ``malloc`` (and freed).

:meth:`Device.record` turns the kernel launches a function makes into a :class:`Plan`,
replayed with one engine call (``mojo/engine/plan.mojo``).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from collections.abc import Callable
from functools import cached_property

import numpy as np

from ._loader import load_engine
from .errors import ErrorCode, UFormRuntimeError

_engine, ENGINE_VARIANT = load_engine()
_libc = ctypes.CDLL(None)
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.uint16))
"""float32, int32, bytes, and uint16 for the bits of bfloat16 values (fast mode's GEMM operands)."""


def gpu_count() -> int:
    """GPUs the loaded engine variant can use (0 for the CPU variant)."""
    return int(_engine.gpu_count())


class Device:
    """The host CPU (``Device.cpu()``) or one GPU (``Device.gpu(i)``)."""

    def __init__(self, ordinal: int = -1):
        if isinstance(ordinal, bool) or not isinstance(ordinal, (int, np.integer)):
            raise TypeError(f"Device takes an integer ordinal (-1: the CPU), got {ordinal!r}; use Device.cpu() or "
                            "Device.gpu(i)")
        self._handle = _engine.Device()
        try:
            self._handle.open(int(ordinal))
        except Exception as error:  # the engine raises a plain Exception with its message
            raise UFormRuntimeError(ErrorCode.UNSUPPORTED, f"cannot open {'cpu' if ordinal < 0 else f'gpu:{ordinal}'}: "
                                    f"{error}") from None
        self.ordinal = int(ordinal)
        tiling = os.environ.get("UFORM_GEMM_TILE")  # read once: the fma chain's GPU tiling, forced (tests, tuning)
        if tiling:
            tilings = _engine.FACTS["gemm_tilings"]
            if tiling not in tilings:
                raise UFormRuntimeError(ErrorCode.INVALID_ARGUMENT, f"UFORM_GEMM_TILE: one of {sorted(tilings)} "
                                                                    f"(or unset), got {tiling!r}")
            self._handle.set_gemm_tiling(tilings[tiling])
        self.allocated_bytes = 0  # held now by this device's buffers
        self.peak_bytes = 0       # the most ever held at once
        self._scratch: Buffer | None = None
        self._recorded_scratch: list[Buffer] | None = None  # the workspaces a recording plan reads
        # Held by every launch and copy, and by a recording throughout: a launch from another thread must not land
        # in a plan being recorded, nor a copy be refused because one is.
        self.lock = threading.RLock()

    @classmethod
    def cpu(cls) -> Device:
        return cls(-1)

    @classmethod
    def gpu(cls, ordinal: int = 0) -> Device:
        if ordinal < 0:
            raise ValueError(f"GPU ordinal must be >= 0, got {ordinal}")
        return cls(ordinal)

    @property
    def is_gpu(self) -> bool:
        return self.ordinal >= 0

    @property
    def name(self) -> str:
        return f"gpu:{self.ordinal}" if self.is_gpu else "cpu"

    def __repr__(self) -> str:
        return f"Device({self.name})"

    def empty(self, shape, dtype=np.float32) -> Buffer:
        return Buffer(self, shape, dtype)

    def zeros(self, shape, dtype=np.float32) -> Buffer:
        return self.put(np.zeros(shape, dtype))

    def put(self, array) -> Buffer:
        """A new buffer on this device holding a copy of ``array``."""
        array = np.ascontiguousarray(array)
        buffer = Buffer(self, array.shape, array.dtype)
        buffer.write(array)
        return buffer

    def allocate(self, nbytes: int) -> int:
        """The address of `nbytes` new bytes on this device; MemoryError when the device has not got them."""
        if not self.is_gpu:
            probe = _libc.malloc(nbytes)
            if not probe:
                raise MemoryError(f"cpu: cannot allocate {nbytes} bytes")
            _libc.free(probe)
        try:
            return int(self._handle.alloc(nbytes))
        except Exception as error:  # the engine raises a plain Exception with its message
            raise MemoryError(f"{self.name}: cannot allocate {nbytes} bytes: {error}") from None

    def synchronize(self) -> None:
        with self.lock:
            self._handle.synchronize()

    def scratch(self, size: int) -> Buffer:
        """A float32 workspace of at least `size` values, reused by every kernel call on this device that
        needs one (calls on one device run in order, so one call's scratch is free when the next starts)."""
        if self._scratch is None or self._scratch.size < size:
            self._scratch = None
            self._scratch = Buffer(self, max(size, 1))
        if self._recorded_scratch is not None:  # the plan keeps it, even once a larger one replaces it here
            self._recorded_scratch.append(self._scratch)
        return self._scratch

    def record(self, launches: Callable[[], None], *, keep: tuple = (), graph: bool = True) -> Plan:
        """The kernel launches `launches()` makes on this device, recorded (not run) as a Plan.

        Only launches are recorded: an upload, a download or a copy inside raises, so whatever changes between
        replays must be written to its buffers before each ``Plan.run()``. The plan holds addresses: `keep` (any
        objects) and the workspaces the launches took stay alive as long as the plan. graph: on a GPU, replay the
        plan as one device graph; else (and always on the CPU) as a loop over the launches."""
        with self.lock:
            self._handle.plan_begin()
            self._recorded_scratch = []
            try:
                launches()
            except BaseException:
                self._handle.plan_free(self._handle.plan_end(False))
                raise
            finally:
                scratch, self._recorded_scratch = self._recorded_scratch, None
            return Plan(self, int(self._handle.plan_end(bool(graph))), (*keep, *scratch))

    def copy(self, destination: Buffer, source: Buffer) -> None:
        if destination.nbytes != source.nbytes:
            raise ValueError(f"copy between buffers of {source.nbytes} and {destination.nbytes} bytes")
        with self.lock:
            self._handle.copy(destination.address, source.address, source.nbytes)


class Plan:
    """Kernel launches recorded on a device (``Device.record``), replayed by ``run()`` in one engine call, with the
    same operands and in the same order as recorded: the same bits as the launches themselves."""

    def __init__(self, device: Device, id: int, keep: tuple):
        self.device, self.id, self._keep = device, id, keep

    def run(self) -> None:
        with self.device.lock:
            self.device._handle.plan_run(self.id)

    def __del__(self):
        if getattr(self, "id", None) is not None:
            self.device._handle.plan_free(self.id)
            self.id = None


def shape_tuple(shape) -> tuple[int, ...]:
    """A buffer's shape as a tuple of ints: an int is one dimension (plain Python on the common forms, since views
    are made on every step's hot path)."""
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    if isinstance(shape, (tuple, list)) and all(isinstance(s, (int, np.integer)) for s in shape):
        return tuple(int(s) for s in shape)
    return tuple(int(s) for s in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)


class Buffer:
    """One allocation on a device, with a shape and a dtype."""

    def __init__(self, device: Device, shape, dtype=np.float32, *, view_of: Buffer | None = None, offset: int = 0):
        dtype = np.dtype(dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"unsupported buffer dtype {dtype}; use one of {[str(d) for d in SUPPORTED_DTYPES]}")
        self.device = device
        self.shape = shape_tuple(shape)
        self.dtype = dtype
        self.owner = view_of  # a view keeps its allocation alive and never frees it
        if view_of is None:
            self.address = device.allocate(self.nbytes)
            device.allocated_bytes += self.nbytes
            device.peak_bytes = max(device.peak_bytes, device.allocated_bytes)
        else:
            self.address = view_of.address + offset * dtype.itemsize

    def view(self, offset: int, shape, dtype=None) -> Buffer:
        """The elements [offset, offset + prod(shape)) of this buffer as a buffer of `shape` (no copy); with
        `dtype`, read as that dtype of the same size (a language-model step's one upload holds float32 scalars
        among its int32 ids).

        Kernels read and write any view, and so do copies to and from the host."""
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize:
            raise ValueError(f"a {self.dtype} buffer cannot be viewed as {dtype}: their sizes differ")
        view = Buffer(self.device, shape, dtype, view_of=self, offset=offset)
        if offset < 0 or offset + view.size > self.size:
            raise ValueError(f"view [{offset}, {offset + view.size}) is outside a buffer of {self.size} values")
        return view

    @cached_property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def _root(self) -> Buffer:
        """The allocation this buffer is or views."""
        root = self
        while root.owner is not None:
            root = root.owner
        return root

    def write(self, array) -> None:
        array = np.ascontiguousarray(array, dtype=self.dtype)
        if array.size != self.size:
            raise ValueError(f"cannot write {array.size} values into a buffer of shape {self.shape}")
        root = self._root()
        with self.device.lock:
            self.device._handle.upload(root.address, self.address - root.address, array.ctypes.data, self.nbytes)

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        root = self._root()
        with self.device.lock:
            self.device._handle.download(out.ctypes.data, root.address, self.address - root.address, self.nbytes)
        return out

    def __del__(self):
        address = getattr(self, "address", None)
        if address is not None and getattr(self, "owner", True) is None:
            self.device._handle.free(address)
            self.device.allocated_bytes -= self.nbytes
            self.address = None

    def __repr__(self) -> str:
        return f"Buffer({self.device.name}, shape={self.shape}, dtype={self.dtype})"
