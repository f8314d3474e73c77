"""What a mesh spans: ``MeshDescription``, with its ``MultimemTier`` and ``GPUClass``.

The seeds name the three types and two fields (``multimem_tier``, ``gpu_class``); the values and the other
fields are this project's. NVLink multicast (multimem) is never used: the tier is reported, not relied on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class MultimemTier(IntEnum):
    """How far NVLink multicast (multimem) reaches among the mesh's GPUs; reported, never used."""

    NONE = 0
    """No multicast: CPU devices, a single GPU, or GPUs without NVLink multicast."""
    SINGLE_HOST = 1
    """Multicast among the GPUs of one host (an NVSwitch)."""
    MULTI_HOST = 2
    """Multicast across the hosts of one NVLink domain (multi-node NVLink)."""


class GPUClass(IntEnum):
    """The kernels every GPU of the run dispatches as: the engine variant it loads."""

    NONE = 0
    """The run has no GPU: its devices are CPUs."""
    AMPERE = 1
    """NVIDIA compute capability 8.x, the ``sm_80`` variant."""
    HOPPER = 2
    """NVIDIA compute capability 9.x, the ``sm_90a`` variant."""
    CDNA3 = 3
    """AMD MI300, the ``gfx942`` variant."""


GPU_CLASS_OF_VARIANT = {"cpu": GPUClass.NONE, "sm_80": GPUClass.AMPERE, "sm_90a": GPUClass.HOPPER,
                        "gfx942": GPUClass.CDNA3}
"""The GPU class of each engine variant (docs/engine.md, "Build variants")."""


@dataclass(frozen=True)
class MeshDescription:
    """A mesh as ``mesh.describe()`` answers it."""

    host_domain_index: int
    """This process's host domain."""
    host_domain_count: int
    """The run's processes, one per host domain."""
    devices_per_host_domain: int
    """Devices (replicas) each process drives: its executor's devices."""
    world_size: int
    """Devices in the run: host_domain_count times devices_per_host_domain."""
    first_rank: int
    """The world rank of this process's first device; its devices are first_rank .. first_rank + devices - 1."""
    backend: str
    """What carries the collectives between processes: "none" for a CPU process alone, "gloo" between CPU
    processes, "nccl" for GPU processes (a GPU process alone too)."""
    job: str
    """The run's name in the mesh directory ("" for a process alone)."""
    attempt: str
    """The attempt's identifier in the job's directory, drawn by host domain 0 ("" for a process alone)."""
    timeout_seconds: float
    """How long a collective waits for its peers before PEER_LOST."""
    multimem_tier: MultimemTier
    """How far NVLink multicast reaches among the run's GPUs (reported; never used)."""
    gpu_class: GPUClass
    """The class every GPU of the run dispatches as (NONE for CPU devices)."""
