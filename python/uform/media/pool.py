"""Decoding a step's media items on a pool of threads, so the host decodes while the device trains.

:class:`DecodePool` runs any per-item decode function -- :func:`.images.decode_image`,
:func:`.video.decode_video`, or another modality's with the same signature -- over
a list of items on ``concurrent.futures`` threads. Pillow, PyAV and numpy release
the interpreter lock while they decode, so the threads run in parallel.

- A decode function is called as ``decode(content, item)``: the item's content and
  its index in the step, which its refusals name. Bind its other arguments first
  (``functools.partial(decode_video, frame_stride=2)``).
- :meth:`DecodePool.submit` returns at once with a :class:`DecodeJob`; the caller
  launches device work and collects the decoded items with :meth:`DecodeJob.result`,
  in the order given, whatever order the threads finish in.
- An error surfaces from ``result`` for the lowest-indexed item that failed, and
  the items not yet started are cancelled. A ``UFormError`` passes as the decode
  function raised it; any other exception becomes
  ``UFormError(INVALID_ARGUMENT, "item 3: ...")``, chained to the original.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Generic, Sequence, TypeVar

from ..training.errors import ErrorCode, UFormError
from .items import item_error

T = TypeVar("T")

DEFAULT_WORKERS = min(4, os.cpu_count() or 1)
"""Threads a pool runs when none are named: the machine's cores, at most 4."""


class DecodeJob(Generic[T]):
    """The decoding of a list of items under way; :meth:`result` waits for it."""

    def __init__(self, futures: list[Future], items: list[int]):
        self._futures = futures
        self._items = items

    def done(self) -> bool:
        """Whether every item has finished (or failed, or been cancelled)."""
        return all(future.done() for future in self._futures)

    def result(self) -> list[T]:
        """Every item decoded, in the order submitted; raises for the first item (in that order) that failed."""
        decoded = []
        for future, item in zip(self._futures, self._items):
            try:
                decoded.append(future.result())
            except UFormError:
                self.cancel()
                raise
            except Exception as error:
                self.cancel()
                raise item_error(item, f"could not decode: {type(error).__name__}: {error}") from error
        return decoded

    def cancel(self) -> None:
        """Cancels the items not yet started."""
        for future in self._futures:
            future.cancel()


class DecodePool:
    """A pool of decoding threads; use it as a context manager, or :meth:`close` it."""

    def __init__(self, workers: int | None = None):
        self._executor = ThreadPoolExecutor(max_workers=workers or DEFAULT_WORKERS,
                                            thread_name_prefix="uform-media")

    def submit(self, decode: Callable[[Any, int], T], contents: Sequence[Any],
               items: Sequence[int] | None = None) -> DecodeJob[T]:
        """Starts ``decode(contents[k], items[k])`` for every ``k``; ``items`` defaults to ``0, 1, ...``."""
        items = list(range(len(contents))) if items is None else [int(item) for item in items]
        if len(items) != len(contents):
            raise UFormError(ErrorCode.SHAPE_MISMATCH, f"items: {len(items)} entries for {len(contents)} contents")
        return DecodeJob([self._executor.submit(decode, content, item) for content, item in zip(contents, items)],
                         items)

    def map(self, decode: Callable[[Any, int], T], contents: Sequence[Any],
            items: Sequence[int] | None = None) -> list[T]:
        """``submit(...).result()``: every item decoded, in order."""
        return self.submit(decode, contents, items).result()

    def close(self) -> None:
        """Cancels what has not started, waits for what has, and ends the threads."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
