"""``uform.Mesh``: the processes of one run, joined, and the collectives among them.

    executor = uform.Executor.for_ram()
    mesh = uform.Mesh.bootstrap(executor, uform.MeshOptions(host_domain_index=rank, host_domain_count=nodes,
                                                            directory=b"/shared/exchange", job="run-17"))
    trainer = uform.Trainer.init_vram(executor, mesh=mesh, ...)

Several processes meet through the directory (``mesh.rendezvous``), then connect their collectives: gloo
between CPU processes (``mesh.gloo``), NCCL between GPU processes (``mesh.nccl``), one GPU each. A CPU process
alone (host_domain_count 1, the derived default) writes no file and needs no backend; a GPU process alone makes
an NCCL communicator of one rank (its collectives are the ones a larger mesh runs). ``docs/mesh.md`` has the
protocol, the timeouts and the faults.
"""

from __future__ import annotations

import os

from ..engine import ENGINE_VARIANT
from ..executor import Executor
from ..errors import ErrorCode, UFormError
from .agreement import agree
from .collectives import Alone, Collectives
from .description import GPU_CLASS_OF_VARIANT, GPUClass, MeshDescription, MultimemTier
from .gloo import Gloo
from .nccl import Nccl, require as require_nccl
from .options import MeshOptions, checked_options
from .rendezvous import declaration, rendezvous


def _gpu_class(executor: Executor) -> GPUClass:
    """The class the executor's GPUs dispatch as: the loaded engine variant's (NONE for CPU devices)."""
    return GPU_CLASS_OF_VARIANT[ENGINE_VARIANT] if executor.is_gpu else GPUClass.NONE


class Mesh:
    """The processes of one run, one per host domain, each driving its executor's devices."""

    def __init__(self, executor: Executor, options: MeshOptions, collectives: Collectives, attempt: str):
        self._executor, self._options, self._collectives = executor, options, collectives
        devices = len(executor.devices)
        self._description = MeshDescription(
            host_domain_index=options.host_domain_index, host_domain_count=options.host_domain_count,
            devices_per_host_domain=devices, world_size=options.host_domain_count * devices,
            first_rank=options.host_domain_index * devices, backend=collectives.backend,
            job=options.job if options.host_domain_count > 1 else "", attempt=attempt,
            timeout_seconds=options.timeout_seconds, multimem_tier=MultimemTier.NONE, gpu_class=_gpu_class(executor))

    @classmethod
    def bootstrap(cls, executor: Executor, options: MeshOptions, /) -> Mesh:
        """Join this process to the run `options` describe, over `executor`'s devices. Raises INVALID_ARGUMENT
        naming a bad option, UNSUPPORTED for a GPU process of several GPUs or a missing backend (NCCL for GPUs,
        torch's gloo for CPU processes), CONFIG_MISMATCH when the processes declare different meshes (GPU and CPU
        processes in one mesh, say), PEER_LOST when one does not arrive within the timeout."""
        if not isinstance(executor, Executor):
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"executor: expected uform.Executor, got "
                                                         f"{type(executor).__name__}")
        options = checked_options(options)
        count, devices = options.host_domain_count, len(executor.devices)
        # The backend is checked before the rendezvous: a process without it must not keep the others waiting.
        if executor.is_gpu:
            require_nccl(devices, ", ".join(device.name for device in executor.devices))
        elif count > 1:
            Gloo.require()
        if count == 1:
            collectives = Nccl.connect(executor.devices[0], None, 0, 1, options.timeout_seconds) if executor.is_gpu \
                else Alone(options.timeout_seconds)
            return cls(executor, options, collectives, attempt="")
        roster = rendezvous(options, declaration(options, executor="gpu" if executor.is_gpu else "cpu",
                                                 devices=devices, gpu_class=_gpu_class(executor).name))
        if executor.is_gpu:
            collectives = Nccl.connect(executor.devices[0], roster.directory, options.host_domain_index, count,
                                       options.timeout_seconds)
        else:
            collectives = Gloo(os.path.join(roster.directory, b"gloo.store"), options.host_domain_index, count,
                               options.timeout_seconds)
        return cls(executor, options, collectives, roster.attempt)

    @property
    def executor(self) -> Executor:
        """The executor the mesh was made over; a trainer over the mesh runs on it."""
        return self._executor

    @property
    def options(self) -> MeshOptions:
        """The options, every zero derived, the directory as bytes."""
        return self._options

    @property
    def collectives(self) -> Collectives:
        """The collectives among the mesh's processes."""
        return self._collectives

    def describe(self) -> MeshDescription:
        """What the mesh spans: its host domains, devices, backend, multimem tier and GPU class."""
        return self._description

    def agree(self, what: str, settings: dict | UFormError) -> None:
        """Check that every process passed the same settings to `what` (``mesh.agreement``): CONFIG_MISMATCH
        on every process that did not refuse its own, naming each difference."""
        agree(self._collectives, what, settings)

    def close(self) -> None:
        """Leave the mesh: its collectives end, and every later one raises PEER_LOST."""
        self._collectives.close()

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        d = self._description
        return (f"Mesh(host domain {d.host_domain_index} of {d.host_domain_count}, {d.world_size} devices, "
                f"backend {d.backend})")
