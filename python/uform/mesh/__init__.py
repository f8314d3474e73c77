"""Meshes: the processes of one run, joined through a shared directory, and the collectives among them.

- :mod:`.options` -- ``MeshOptions`` and :func:`checked_options`, its one door.
- :mod:`.description` -- ``MeshDescription``, ``MultimemTier``, ``GPUClass``.
- :mod:`.rendezvous` -- the directory protocol: announce, admit or refuse, clean older attempts.
- :mod:`.collectives` -- the collective interface and a process alone; :mod:`.gloo` -- the CPU backend;
  :mod:`.nccl` -- the GPU backend.
- :mod:`.agreement` -- every process checks the others passed the same settings.
- :mod:`.mesh` -- ``Mesh`` itself.

``docs/mesh.md`` describes the protocol, the timeouts, the faults and the backend choice.
"""

from .description import GPUClass, MeshDescription, MultimemTier
from .mesh import Mesh
from .options import DEFAULT_TIMEOUT_SECONDS, MeshOptions

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "GPUClass", "Mesh", "MeshDescription", "MeshOptions", "MultimemTier"]
