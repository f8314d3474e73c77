"""Decoding a step's media items on a pool of workers, so the host decodes while the device trains.

:class:`DecodePool` runs any per-item decode function -- :func:`.images.decode_image`,
:func:`.video.decode_video`, or another modality's with the same signature -- over
a list of items, on threads or on processes:

- **Threads** (the default). Pillow, PyAV and numpy release the interpreter lock
  while they decode, so large items decode in parallel. Each item is a task.
- **Processes** (``processes=True``): the items' Python work (a small PNG spends
  more in Pillow's Python than in its decoder) runs outside this interpreter, so
  it takes no turn of the lock from the thread that launches kernels. The items
  go in one contiguous chunk per worker, a task each. The workers are forked on
  the first submission, as PyTorch's ``DataLoader`` forks its workers on Linux:
  they inherit the modules already imported and never run the caller's
  ``__main__`` again, so a script needs no ``if __name__ == "__main__"`` guard.
  They run only the decoding, never the engine. The decode function and the
  contents must pickle: a module-level function, or a ``functools.partial`` of
  one. :func:`shared_pool` is one such pool per interpreter, the one every
  trainer decodes on.

- A decode function is called as ``decode(content, item)``: the item's content and
  its index in the step, which its refusals name. Bind its other arguments first
  (``functools.partial(decode_video, frame_stride=2)``).
- :meth:`DecodePool.submit` returns at once with a :class:`DecodeJob`; the caller
  launches device work and collects the decoded items with :meth:`DecodeJob.result`,
  in the order given, whatever order the workers finish in.
- An error surfaces from ``result`` for the lowest-indexed item that failed, and
  the items not yet started are cancelled. A ``UFormError`` passes as the decode
  function raised it; any other exception becomes
  ``UFormError(INVALID_ARGUMENT, "item 3: ...")``, chained to the original (on
  processes, to its remote traceback).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import threading
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Callable, Generic, Sequence, TypeVar

from ..errors import ErrorCode, UFormError
from .items import item_error

T = TypeVar("T")

DEFAULT_WORKERS = min(4, os.cpu_count() or 1)
"""Threads a pool runs when none are named: the machine's cores, at most 4."""
DEFAULT_PROCESSES = max(1, min(8, (os.cpu_count() or 1) - 1))
"""Processes a pool runs when none are named: the machine's cores but one (for the thread that drives the device),
at least 1, at most 8."""


def decode_chunk(decode: Callable[[Any, int], T], contents: Sequence[Any], items: Sequence[int]) -> list[T]:
    """``decode(contents[k], items[k])`` for every ``k`` in order: one task of a pool. The first failure raises,
    naming its item: a ``UFormError`` as raised, any other exception as ``"item i: could not decode: ..."``."""
    decoded = []
    for content, item in zip(contents, items):
        try:
            decoded.append(decode(content, item))
        except UFormError:
            raise
        except Exception as error:
            raise item_error(item, f"could not decode: {type(error).__name__}: {error}") from error
    return decoded


class DecodeJob(Generic[T]):
    """The decoding of a list of items under way; :meth:`result` waits for it."""

    def __init__(self, pool: DecodePool, futures: list[Future], items: list[list[int]]):
        self._pool = pool
        self._futures = futures
        self._items = items  # each task's items

    def done(self) -> bool:
        """Whether every item has finished (or failed, or been cancelled)."""
        return all(future.done() for future in self._futures)

    def result(self) -> list[T]:
        """Every item decoded, in the order submitted; raises for the first item (in that order) that failed."""
        decoded = []
        for future, items in zip(self._futures, self._items):
            try:
                decoded.extend(future.result())
            except BrokenExecutor as error:  # a worker process was killed, or crashed inside a decoder
                self.cancel()
                self._pool.broken = True
                raise UFormError(ErrorCode.INVALID_ARGUMENT,
                                 f"items {items[0]}–{items[-1]}: a decoding process died while decoding them "
                                 f"(killed, or crashed in a decoder); the pool starts afresh") from error
            except BaseException:
                self.cancel()
                raise
        return decoded

    def cancel(self) -> None:
        """Cancels the items not yet started."""
        for future in self._futures:
            future.cancel()


class DecodePool:
    """A pool of decoding threads, or of processes; use it as a context manager, or :meth:`close` it."""

    def __init__(self, workers: int | None = None, *, processes: bool = False):
        self.processes = processes
        self.broken = False  # a worker process died: the pool takes no more work
        self.pid = os.getpid()  # the process that made it: a forked child inherits the object, not the workers
        self.workers = workers or (DEFAULT_PROCESSES if processes else DEFAULT_WORKERS)
        if processes:
            self._executor: Executor = ProcessPoolExecutor(max_workers=self.workers,
                                                           mp_context=multiprocessing.get_context("fork"))
        else:
            self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="uform-media")

    def submit(self, decode: Callable[[Any, int], T], contents: Sequence[Any],
               items: Sequence[int] | None = None) -> DecodeJob[T]:
        """Starts ``decode(contents[k], items[k])`` for every ``k``; ``items`` defaults to ``0, 1, ...``."""
        items = list(range(len(contents))) if items is None else [int(item) for item in items]
        if len(items) != len(contents):
            raise UFormError(ErrorCode.SHAPE_MISMATCH, f"items: {len(items)} entries for {len(contents)} contents")
        chunk = -(-len(items) // self.workers) if self.processes else 1
        tasks = [items[k:k + chunk] for k in range(0, len(items), chunk)]
        return DecodeJob(self, [self._executor.submit(decode_chunk, decode, contents[k:k + chunk], task)
                                for k, task in zip(range(0, len(items), chunk), tasks)], tasks)

    def map(self, decode: Callable[[Any, int], T], contents: Sequence[Any],
            items: Sequence[int] | None = None) -> list[T]:
        """``submit(...).result()``: every item decoded, in order."""
        return self.submit(decode, contents, items).result()

    def close(self) -> None:
        """Cancels what has not started, waits for what has, and ends the workers (in the process that made the
        pool: a forked child leaves its parent's workers alone)."""
        if os.getpid() == self.pid:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


_shared: DecodePool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> DecodePool:
    """This interpreter's pool of decoding processes, made on the first call (and again after a worker died, or in
    a process forked from the one that made it, which inherits the object but not its workers) and closed at exit:
    every trainer decodes its media items on it, so that none starts processes of its own."""
    global _shared
    with _shared_lock:
        if _shared is not None and _shared.pid != os.getpid():
            _shared = None  # the parent's: its workers answer the parent alone
        if _shared is None or _shared.broken:
            if _shared is not None:
                _shared.close()
            _shared = DecodePool(processes=True)
            # closed at exit by multiprocessing's finalizers, which run before it joins a process's children: in a
            # process that multiprocessing started, an open pool's workers would keep that join waiting
            multiprocessing.util.Finalize(None, _shared.close, exitpriority=100)
        return _shared
