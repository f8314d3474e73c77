"""Find and load the engine variant that matches this machine.

The engine is built once per target (``uform._build``). At import we look for a
usable GPU (NVIDIA through the driver library, AMD through the KFD topology),
load the matching variant if it was built, and otherwise fall back to the CPU
variant with a message that says why. ``UFORM_ENGINE_VARIANT`` names a variant
explicitly (``cpu`` forces the CPU build).

Loading the Mojo runtime sets environment variables at the C level
(``PYTHONEXECUTABLE``, ``PYTHONPATH``, ``MOJO_PYTHON_LIBRARY``), which every
child process would inherit: ``subprocess.run([sys.executable, ...])`` would
start another interpreter. ``load_variant`` puts the environment back as it
found it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import sys
import warnings
from pathlib import Path

from . import _build

NVIDIA_VARIANTS = {(9, 0): "sm_90a", (8, 0): "sm_80"}
AMD_VARIANTS = {"90402": "gfx942"}


def nvidia_capability() -> tuple[int, int] | None:
    """Compute capability of the first NVIDIA GPU, or None when no driver answers."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return None
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, 0)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, 0)  # ..._MINOR
    return major.value, minor.value


def amd_target_version() -> str | None:
    nodes = Path("/sys/class/kfd/kfd/topology/nodes")
    if not Path("/dev/kfd").exists() or not nodes.is_dir():
        return None
    for properties in sorted(nodes.glob("*/properties")):
        for line in properties.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "gfx_target_version" and value.strip() not in ("", "0"):
                return value.strip()
    return None


def wanted_variant() -> tuple[str, str]:
    """The variant this machine should run, and a sentence saying why."""
    forced = os.environ.get("UFORM_ENGINE_VARIANT")
    if forced:
        return forced, f"UFORM_ENGINE_VARIANT={forced}"
    capability = nvidia_capability()
    if capability is not None:
        variant = NVIDIA_VARIANTS.get(capability) or NVIDIA_VARIANTS.get((capability[0], 0))
        if variant:
            return variant, f"NVIDIA GPU of compute capability {capability[0]}.{capability[1]}"
        return "cpu", f"NVIDIA GPU of compute capability {capability[0]}.{capability[1]} has no engine variant"
    amd = amd_target_version()
    if amd is not None:
        if amd in AMD_VARIANTS:
            return AMD_VARIANTS[amd], f"AMD GPU gfx target {amd}"
        return "cpu", f"AMD GPU gfx target {amd} has no engine variant"
    return "cpu", "no GPU found"


def c_environment() -> dict[bytes, bytes]:
    """The process environment as the C library holds it (what a child process inherits), which
    ``os.environ`` does not see change."""
    entries = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    environment, index = {}, 0
    while entries[index]:
        name, _, value = entries[index].partition(b"=")
        environment[name] = value
        index += 1
    return environment


def restore_environment(before: dict[bytes, bytes]) -> None:
    """Put the C environment back to `before`: every variable changed since is reset, every new one unset."""
    for name, value in c_environment().items():
        if name not in before:
            os.unsetenv(name)
        elif value != before[name]:
            os.putenv(name, before[name])


def load_variant(variant: str):
    folder = _build.VARIANTS_DIR / variant
    module_path = folder / "_engine.so"
    if not module_path.exists():
        raise ImportError(
            f"the uform engine variant {variant!r} is not built ({module_path} is missing); "
            f"build it with: python python/uform/_build.py --target {variant}"
        )
    environment = c_environment()
    try:
        # The runtime libraries sit beside the module; load them first so the module resolves against them.
        for name in _build.RUNTIME_LIBRARIES:
            library = folder / name
            if library.exists():
                ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
        spec = importlib.util.spec_from_file_location("uform._engine", module_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        restore_environment(environment)
    sys.modules["uform._engine"] = module
    return module


def load_engine():
    """Load the best usable variant: the machine's GPU build, else the CPU build."""
    variant, reason = wanted_variant()
    if variant != "cpu":
        try:
            module = load_variant(variant)
            if module.gpu_count() > 0:
                return module, variant
            reason += f", but the '{variant}' engine finds no usable device"
        except ImportError as error:
            reason += f", but {error}"
        warnings.warn(f"uform: {reason}; falling back to the CPU engine", RuntimeWarning, stacklevel=3)
    return load_variant("cpu"), "cpu"


def nvidia_wheel_library(name: str, *, mode: int = ctypes.DEFAULT_MODE) -> ctypes.CDLL:
    """Load the shared library `name` from the loader's search path or, failing that, from NVIDIA's wheels.

    NVIDIA's wheels (``nvidia-cublas``, ``nvidia-nccl-cu13``, ..., which PyTorch installs) keep their libraries
    under ``site-packages/nvidia/*/lib``, off the loader's search path: every ``sys.path`` entry is searched
    there. Raises OSError naming where it looked."""
    try:
        return ctypes.CDLL(name, mode=mode)
    except OSError:
        pass
    candidates = [path for entry in sys.path if entry and Path(entry).is_dir()
                  for path in sorted(Path(entry).glob(f"nvidia/*/lib/{name}"))]
    looked = [f"{name}: the loader's search path and {len(candidates)} nvidia wheel copies"]
    for path in candidates:
        try:
            return ctypes.CDLL(str(path), mode=mode)
        except OSError as error:
            looked.append(f"{path}: {error}")
    raise OSError("; ".join(looked))


CUBLAS_LIBRARIES = ("libcublasLt.so.13", "libcublas.so.13")  # Lt first: libcublas needs it


@functools.cache
def load_cublas() -> None:
    """Make cuBLAS loadable for fast mode's GEMMs (mojo/kernels/gemm/fast.mojo).

    MAX's binding opens ``libcublas.so.13`` by name, which the dynamic loader finds on its search path
    or, failing that, among the libraries already loaded. NVIDIA's ``nvidia-cublas`` wheel (which
    PyTorch installs) keeps it under ``site-packages/nvidia/*/lib``, off the search path: load it from
    there once, globally, so that the binding's open finds it. Raises OSError naming where it looked."""
    for name in CUBLAS_LIBRARIES:
        try:
            nvidia_wheel_library(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            raise OSError(f"cannot load cuBLAS ({error}); install nvidia-cublas (CUDA 13) or put its lib directory "
                          "on LD_LIBRARY_PATH") from None
