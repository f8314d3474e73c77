"""Executors: the devices a trainer runs on, and the numeric modes.

``Executor.for_vram(devices=[0, 1])`` names GPUs as the seeds do;
``Executor.for_ram()`` is the host CPU, which this project also trains on, with
the same results bit for bit ("identical" numerics); ``Executor.for_ram(device_count=4)``
makes it four devices, one replica each in a mesh (docs/mesh.md). ``default_executor()`` is
the first usable GPU, else the CPU, unless ``set_default_executor`` or the
environment variable ``UFORM_DEVICE`` (``cpu`` or ``gpu:N``) says otherwise.

A run's numeric mode (docs/numerics.md) is "identical" (the default: the same bits on every device) or
"fast" (bf16 tensor cores on a GPU; the identical kernels on the CPU). Each trainer takes it as the
keyword ``numerics``; left at None, the process mode (``set_numeric_mode``) decides.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from . import _loader, errors
from .engine import ENGINE_VARIANT, Device, gpu_count

NUMERIC_MODES = ("identical", "fast")
_numeric_mode = "identical"
_default_executor: Executor | None = None


def _refused(message: str, code: str = "INVALID_ARGUMENT", kind: str = "UFormValueError"):
    """A refused request: a UFormError that is also the ValueError (or, with `kind`, RuntimeError) callers
    catch."""
    return getattr(errors, kind)(errors.ErrorCode[code], message)


class Executor:
    """An ordered set of devices of one kind: GPUs (``for_vram``) or the CPU (``for_ram``)."""

    def __init__(self, devices: Sequence[Device]):
        if not devices:
            raise _refused("an executor needs at least one device")
        self.devices = list(devices)

    @classmethod
    def for_vram(cls, devices: Sequence[int] | None = None) -> Executor:
        """The GPUs of the given ordinals (default: every GPU the engine sees)."""
        available = gpu_count()
        if available == 0:
            raise _refused(f"Executor.for_vram: no usable GPU (engine variant '{ENGINE_VARIANT}'); use "
                           "Executor.for_ram() to train on the CPU", "UNSUPPORTED", "UFormRuntimeError")
        ordinals = list(range(available)) if devices is None else [int(d) for d in devices]
        if len(set(ordinals)) != len(ordinals):
            raise _refused(f"Executor.for_vram: devices {ordinals} repeat an ordinal")
        for ordinal in ordinals:
            if not 0 <= ordinal < available:
                raise _refused(f"Executor.for_vram: GPU {ordinal} does not exist; this machine has {available}")
        return cls([Device.gpu(ordinal) for ordinal in ordinals])

    @classmethod
    def for_ram(cls, device_count: int = 1) -> Executor:
        """The host CPU, as `device_count` devices: one replica each in a mesh, as GPUs would hold them (what
        tests of several devices run on a machine without GPUs). The devices share the CPU's cores."""
        if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count < 1:
            raise _refused(f"Executor.for_ram: device_count must be a positive integer, got {device_count!r}")
        return cls([Device.cpu() for _ in range(device_count)])

    @property
    def is_gpu(self) -> bool:
        return self.devices[0].is_gpu

    def __repr__(self) -> str:
        return f"Executor({', '.join(d.name for d in self.devices)})"


def devices_executor(spec: str) -> Executor:
    """An executor of several devices from a name: 'gpu:0,gpu:1' (those GPUs), 'all' (every GPU) or 'cpu:N' (the
    CPU as N devices, ``Executor.for_ram(N)``); a single name as ``executor_from`` reads it."""
    name = spec.strip().lower()
    if name == "all":
        return Executor.for_vram()
    if name.startswith("cpu:") and name[4:].isdigit():
        return Executor.for_ram(int(name[4:]))
    names = [part.strip() for part in name.split(",")]
    if len(names) > 1:
        ordinals = [gpu_ordinal(part) for part in names]
        if None in ordinals:
            raise _refused(f"cannot make an executor from {spec!r}: list GPUs as 'gpu:0,gpu:1'")
        return Executor.for_vram(ordinals)
    return executor_from(name)


def gpu_ordinal(name: str) -> int | None:
    """N of a device name 'gpu:N' (lower case, stripped), else None."""
    return int(name[4:]) if name.startswith("gpu:") and name[4:].isdigit() else None


def executor_from(spec) -> Executor:
    """An Executor from an Executor, a Device, or a name: 'cpu', 'gpu' or 'gpu:N'."""
    if isinstance(spec, Executor):
        return spec
    if isinstance(spec, Device):
        return Executor([spec])
    if isinstance(spec, str):
        name = spec.strip().lower()
        if name == "cpu":
            return Executor.for_ram()
        if name == "gpu":
            return Executor.for_vram([0])
        if (ordinal := gpu_ordinal(name)) is not None:
            return Executor.for_vram([ordinal])
    raise _refused(f"cannot make an executor from {spec!r}: pass an Executor, a Device, 'cpu' or 'gpu:N'")


def default_executor() -> Executor:
    """The process default: set_default_executor, else UFORM_DEVICE, else GPU 0 if usable, else the CPU."""
    if _default_executor is not None:
        return _default_executor
    if os.environ.get("UFORM_DEVICE"):
        return executor_from(os.environ["UFORM_DEVICE"])
    return Executor.for_vram([0]) if gpu_count() > 0 else Executor.for_ram()


def set_default_executor(spec) -> None:
    """Set (or with None, clear) the executor trainers use when given none."""
    global _default_executor
    _default_executor = None if spec is None else executor_from(spec)


def numeric_mode() -> str:
    """The process numeric mode, which runs given no `numerics` use: "identical" unless set_numeric_mode."""
    return _numeric_mode


def set_numeric_mode(mode: str) -> None:
    """Set the process numeric mode: "identical" or "fast"."""
    global _numeric_mode
    _numeric_mode = _checked_mode(mode, "set_numeric_mode")


def _checked_mode(mode, what: str) -> str:
    if not isinstance(mode, str) or mode not in NUMERIC_MODES:
        raise _refused(f"{what}: numeric mode {mode!r} is not one of {list(NUMERIC_MODES)}")
    return mode


def run_numerics(numerics: str | None, executor: Executor) -> str:
    """A run's numeric mode: `numerics`, or the process mode when None. Fast mode on a GPU needs cuBLAS
    (its GEMMs): it is loaded here, and its absence refused with UNSUPPORTED, before any device work."""
    mode = numeric_mode() if numerics is None else _checked_mode(numerics, "numerics")
    if mode == "fast" and executor.is_gpu:
        try:
            _loader.load_cublas()
        except OSError as error:
            raise _refused(f"numerics: fast mode's GEMMs need cuBLAS: {error}", "UNSUPPORTED",
                           "UFormRuntimeError") from None
    return mode
