"""The collectives a mesh's processes run together, behind one small interface.

:class:`Collectives` is what the rest of uform calls: ``all_gather`` of equally shaped arrays,
``all_gather_bytes`` and ``broadcast_bytes`` of byte strings of any length, and ``barrier``, each waiting at
most the mesh's timeout for every peer. A backend implements two primitives over numpy arrays
(``_all_gather`` and ``_broadcast``) and ``_close``; the byte-string verbs are built on them here, once.
:class:`Alone` is the world of one CPU process; ``mesh.gloo.Gloo`` joins CPU processes; ``mesh.nccl.Nccl``
joins GPU processes, staging the arrays through device buffers.

A collective that fails (a peer died, or did not answer in time) raises PEER_LOST and leaves the mesh
broken: every later collective raises PEER_LOST at once, since the peers no longer agree on what ran.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod

import numpy as np

from ..errors import ErrorCode, UFormRuntimeError


def peer_lost(message: str) -> UFormRuntimeError:
    return UFormRuntimeError(ErrorCode.PEER_LOST, message)


class Collectives(ABC):
    """Collectives among `size` processes, this one being `rank`."""

    backend = "none"

    def __init__(self, rank: int, size: int, timeout_seconds: float):
        self.rank, self.size, self.timeout_seconds = rank, size, timeout_seconds
        self._broken: str | None = None

    def _guarded(self, verb: str, run):
        if self._broken is not None:
            raise peer_lost(f"mesh: {verb}: the mesh broke in an earlier collective ({self._broken}); "
                            "restart every process of the run")
        try:
            return run()
        except RuntimeError as error:  # what a backend raises when a peer died or timed out
            self._broken = f"{verb}: {error}"
            with contextlib.suppress(RuntimeError):  # a backend that broke may fail to close, too
                self._close()
            raise peer_lost(f"mesh: {verb} failed on host domain {self.rank} of {self.size}: a peer died or did "
                            f"not answer within {self.timeout_seconds:g} s ({error})") from None

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        """Every process's `array` (the same shape and dtype on each), stacked in rank order: (size, *shape)."""
        array = np.ascontiguousarray(array)
        return self._guarded("all_gather", lambda: self._all_gather(array))

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every process's byte string, in rank order; the strings may differ in length."""
        lengths = self.all_gather(np.array([len(data)], np.int64))[:, 0]
        padded = np.zeros(max(1, int(lengths.max())), np.uint8)  # gloo moves no empty tensor
        padded[:len(data)] = np.frombuffer(data, np.uint8)
        gathered = self.all_gather(padded)
        return [gathered[rank, :length].tobytes() for rank, length in enumerate(lengths)]

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        """`root`'s byte string on every process (the others pass None)."""
        length = self._broadcast_array(np.array([len(data) if self.rank == root else 0], np.int64), root)
        payload = np.zeros(max(1, int(length[0])), np.uint8)  # gloo moves no empty tensor
        if self.rank == root:
            payload[:len(data)] = np.frombuffer(data, np.uint8)
        return self._broadcast_array(payload, root)[:int(length[0])].tobytes()

    def barrier(self) -> None:
        """Returns once every process has called it."""
        self.all_gather(np.zeros(1, np.uint8))

    def close(self) -> None:
        """Leaves the collectives; later calls raise PEER_LOST."""
        if self._broken is None:
            self._broken = "closed"
            self._close()

    def _broadcast_array(self, array: np.ndarray, root: int) -> np.ndarray:
        return self._guarded("broadcast", lambda: self._broadcast(np.ascontiguousarray(array), root))

    @abstractmethod
    def _all_gather(self, array: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _broadcast(self, array: np.ndarray, root: int) -> np.ndarray: ...

    @abstractmethod
    def _close(self) -> None: ...


class Alone(Collectives):
    """The collectives of a process alone: every gather is its own value."""

    def __init__(self, timeout_seconds: float):
        super().__init__(0, 1, timeout_seconds)

    def _all_gather(self, array: np.ndarray) -> np.ndarray:
        return array[None].copy()

    def _broadcast(self, array: np.ndarray, root: int) -> np.ndarray:
        return array.copy()

    def _close(self) -> None:
        pass
