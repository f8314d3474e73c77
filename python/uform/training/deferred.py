"""Deferred steps: a trainer's verbs submitted to its worker thread, and the host work done ahead of them.

``trainer.on(executor)`` answers :class:`On`, whose verbs block; ``trainer.deferred(executor)`` answers
:class:`DeferredOn`, whose verbs answer a :class:`Deferred` at once and run, in order, on the trainer's one
worker thread. A deferred step prefetches (:class:`Prefetch`): its media items start decoding when it is
submitted, and its batch is packed while the step before it runs on the device, assuming every step submitted
before it succeeds; a step that finds its batch prepared for another step number (an earlier one was refused)
packs its own (:func:`ready`). The steps end with the bits of blocking steps (``docs/guarantees.md``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from ..media.pool import shared_pool
from .encoder import StepBatch
from .media_step import PendingMedia, submit_items
from .packing import Packed
from .step_inputs import StepInputs
from .tapes import entries

DECODE_AHEAD = 2
"""Deferred steps whose media items decode (and whose batches are prepared) before they run, at most: a bound on
the decoded items and batches held."""


@dataclass
class PreparedStep:
    """A deferred step's host work done before it runs (``Prefetch.prepare``): its checked inputs and its
    packed, corrupted batch, for the step number it assumed (corruption is keyed by it)."""

    step: int
    inputs: StepInputs
    batch: StepBatch
    packed: Packed


class Prefetch:
    """A trainer's deferred steps' host work done ahead of them: their media items decoding on the shared pool as
    soon as they are submitted (at most DECODE_AHEAD steps at once), and their batches packed, in order, on the
    thread that drives the device while earlier steps run there (``run_queued``, which the trainer runs in each
    step's queued phase: ``uform.training.world.world_step``), each for the step number it assumes."""

    def __init__(self, trainer):
        self._trainer = trainer
        self.decoding = threading.BoundedSemaphore(DECODE_AHEAD)  # deferred steps decoding early
        self.queue: deque[tuple[Future, Callable[[], None]]] = deque()  # deferred steps' batches to pack ahead, in
        # order: each step's future batch and the call that packs it
        self.in_flight = 0  # deferred steps submitted and not finished: the steps a prepared batch assumes before it
        self._lock = threading.Lock()

    def decode(self, modalities, contents) -> tuple:
        """(modalities, contents, pending): a deferred step's inputs read once, as the step will take them
        (so a generator is not used up, nor a list refilled meanwhile), with its media items' preparation
        started on the pool; the inputs as given and None when they do not read as items (the step itself
        then refuses them)."""
        try:
            items = entries("contents", contents)
            modalities = modalities if isinstance(modalities, np.ndarray) else list(modalities)
            kinds = np.asarray(modalities, dtype=np.int64).reshape(-1)
        except Exception:
            return modalities, contents, None
        trainer = self._trainer
        if kinds.size != len(items) or not np.all(np.isin(kinds, list(trainer._modalities_enabled()))):
            return modalities, items, None
        return kinds, items, submit_items(kinds, items, trainer._run.batch, shared_pool())

    def prepare(self, modalities, contents, decoded: PendingMedia | None, options: dict) -> Future | None:
        """A deferred step's host work (its inputs checked, packed, corrupted and resolved), queued to run while
        earlier steps run on the device, assuming every step submitted before it succeeds; None in a mesh, whose
        processes exchange their items when the step runs. A refusal there is left for the step to meet again, in
        order. The queue runs on the thread that drives the device, once a step has queued its kernels and before it
        waits for them (the step's queued phase), or when the step needs its batch first: a thread of its own
        would take the GIL from the launching of kernels in the interpreter's 5 ms turns, starving the device."""
        trainer = self._trainer
        if trainer._world.collectives is not None:
            return None
        prepared = Future()

        def prepare() -> None:
            try:
                inputs = trainer._checked_inputs(modalities, contents, **options)
                batch, packed = trainer.step_batch(inputs, options.get("bags") is not None, assumed,
                                                   decoded=decoded, devices=trainer._world.size)
            except Exception as refusal:  # the step meets it again when it runs
                prepared.set_exception(refusal)
            except BaseException as interruption:  # a Ctrl-C while packing: the step packs again, the Ctrl-C goes on
                prepared.set_exception(interruption)
                raise
            else:
                prepared.set_result(PreparedStep(assumed, inputs, batch, packed))

        with self._lock:
            assumed = trainer._step + 1 + self.in_flight
            self.in_flight += 1
            self.queue.append((prepared, prepare))
        return prepared

    def run_queued(self, until: Future | None = None) -> None:
        """Run the queued preparations in order: all of them, or until `until` is prepared."""
        while until is None or not until.done():
            with self._lock:
                if not self.queue:
                    return
                _, prepare = self.queue.popleft()
            prepare()

    def step_done(self, prepared: Future) -> None:
        """A deferred step has run (or failed before it needed its batch): its preparation leaves the queue if it
        is still there, and the step no longer counts as in flight."""
        with self._lock:
            self.queue = deque(entry for entry in self.queue if entry[0] is not prepared)
            self.in_flight -= 1

    def close(self) -> None:
        """Drop what is still queued: the trainer is closing and no step will run to need it."""
        with self._lock:
            self.queue.clear()


def ready(prepared: Future | None, step: int) -> PreparedStep | None:
    """The batch prepared ahead for this step, or None: none was, its preparation raised (the step meets the
    refusal itself), or it assumed another step number (an earlier step was refused)."""
    if prepared is None or prepared.exception() is not None:
        return None
    found = prepared.result()
    return found if found.step == step else None


class On:
    """The trainer's verbs, blocking."""

    def __init__(self, trainer):
        self._trainer = trainer

    def step(self, *args, **kwargs):
        return self._trainer.step(*args, **kwargs)

    def save(self, *args, **kwargs):
        return self._trainer.save(*args, **kwargs)


class Deferred:
    """A submitted call: wait(), done(), result(), exception(), cancel()."""

    def __init__(self, future: Future):
        self._future = future

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the call is final (or `timeout` seconds pass); answers whether it is."""
        try:
            self._future.exception(timeout)
        except FutureTimeout:
            return False
        return True

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None):
        """The call's answer, raising what it raised."""
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None):
        return self._future.exception(timeout)

    def cancel(self) -> bool:
        """Withdraw the call if it has not started; answers whether it was withdrawn (it then never runs)."""
        return self._future.cancel()


class DeferredOn:
    """The trainer's verbs, each submitted to the trainer's worker, answering a Deferred at once."""

    def __init__(self, trainer, worker: ThreadPoolExecutor):
        self._trainer, self._worker = trainer, worker

    def step(self, modalities, contents, /, **options) -> Deferred:
        """Submits the step. Its media items start decoding at once, while earlier steps still run, when
        fewer than DECODE_AHEAD submitted steps are decoding early; otherwise when the step runs."""
        trainer = self._trainer
        prefetch = trainer._prefetch
        if not prefetch.decoding.acquire(blocking=False):
            return Deferred(self._worker.submit(trainer.step, modalities, contents, **options))
        try:
            modalities, contents, decoded = prefetch.decode(modalities, contents)
            prepared = prefetch.prepare(modalities, contents, decoded, options)
        except BaseException:
            prefetch.decoding.release()
            raise

        def finished() -> None:  # the step ran, or was cancelled before it could
            if prepared is not None:
                prefetch.step_done(prepared)
            prefetch.decoding.release()

        def run():
            try:
                return trainer.step(modalities, contents, _decoded=decoded, _prepared=prepared, **options)
            finally:
                finished()

        future = self._worker.submit(run)
        future.add_done_callback(lambda done: finished() if done.cancelled() else None)
        return Deferred(future)

    def save(self, *args, **kwargs) -> Deferred:
        return Deferred(self._worker.submit(self._trainer.save, *args, **kwargs))
