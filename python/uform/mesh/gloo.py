"""The CPU backend: gloo, as PyTorch builds it, over a FileStore in the attempt's directory.

Gloo connects the processes over TCP after exchanging addresses through a store; ``torch.distributed.FileStore``
keeps that store in one file, here ``<directory>/<job>/<attempt>/gloo.store``, fresh for every attempt. The
process group is made directly (``ProcessGroupGloo``), not through ``init_process_group``, so it leaves
torch's global state alone and a process may hold several meshes. Every operation waits at most the mesh's
timeout; a peer that dies breaks its TCP pairs and the others' operations fail at once. Gloo picks its
network interface from the host name, or from ``GLOO_SOCKET_IFNAME`` (docs/mesh.md, "Launching").

torch is imported only here, when a mesh of several CPU processes is made: it is the ``mesh`` extra of the
package (and already a test dependency), not a dependency of uform itself.
"""

from __future__ import annotations

import datetime
import os

import numpy as np

from ..errors import ErrorCode, UFormRuntimeError
from .collectives import Collectives, peer_lost


def _torch_distributed():
    try:
        import torch
        import torch.distributed as distributed
    except ImportError:
        raise UFormRuntimeError(ErrorCode.UNSUPPORTED, "mesh: several CPU processes meet through gloo, which comes "
                                "with torch; install it with: pip install 'uform[mesh]'") from None
    if not distributed.is_available() or not distributed.is_gloo_available():
        raise UFormRuntimeError(ErrorCode.UNSUPPORTED, f"mesh: this torch ({torch.__version__}) was built without "
                                "gloo, which several CPU processes meet through")
    return torch, distributed


class Gloo(Collectives):
    """Collectives among CPU processes through a gloo process group."""

    backend = "gloo"

    @staticmethod
    def require() -> None:
        """UNSUPPORTED unless this process has torch with gloo."""
        _torch_distributed()

    def __init__(self, store_path: bytes, rank: int, size: int, timeout_seconds: float):
        super().__init__(rank, size, timeout_seconds)
        self._torch, distributed = _torch_distributed()
        timeout = datetime.timedelta(seconds=timeout_seconds)
        try:
            store = distributed.FileStore(os.fsdecode(store_path), size)
            store.set_timeout(timeout)
            self._group = distributed.ProcessGroupGloo(store, rank, size, timeout)
        except Exception as error:  # gloo's own error: the store or a peer's connection
            raise peer_lost(f"mesh: gloo could not connect host domain {rank} of {size} within "
                            f"{timeout_seconds:g} s: {error}") from None

    def _all_gather(self, array: np.ndarray) -> np.ndarray:
        gathered = np.empty((self.size, *array.shape), array.dtype)
        outputs = [self._torch.from_numpy(part) for part in gathered]
        self._group.allgather([outputs], [self._torch.from_numpy(array.copy())]).wait()
        return gathered

    def _broadcast(self, array: np.ndarray, root: int) -> np.ndarray:
        result = array.copy()
        self._group.broadcast(self._torch.from_numpy(result), root).wait()
        return result

    def _close(self) -> None:
        self._group.shutdown()
