"""Reproducible next-byte training batches from a byte corpus.

A corpus of N bytes holds N - length windows of length + 1 bytes, starting at
offsets 0 .. N - length - 1. Epoch e visits every window once, in the order

    order_e = argsort(Philox4x64-10(key = seed + 2**64 * e, counter = 0).random_raw(N - length))

(a stable sort, so ties go to the lower offset). The sample stream is the
concatenation order_0, order_1, ...; batch i takes samples
[i * batch, (i + 1) * batch) of it, so a batch may straddle two epochs. Raw
Philox output is fixed by the algorithm, so the order does not depend on the
numpy version.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import numpy as np

from ..errors import type_error, value_error

N_VOCAB = 256
SCHEDULE_FORMAT = "uform.lm.corpus/1"
ORDER = ("windows of length+1 bytes at offsets 0..N-length-1; epoch e visits them in the stable argsort "
         "of Philox4x64-10(key=seed+2**64*e, counter=0).random_raw(N-length); batch i row r reads "
         "sample i*batch+r of the concatenated epochs")


class TokenBatches:
    """(batch, length + 1) int32 byte-id batches in a recorded, reproducible order.

    Parameters
    ----------
    data : bytes, bytearray, memoryview, str or os.PathLike
        The corpus: raw bytes, text (encoded as UTF-8), or a file path
        (``pathlib.Path`` or another ``os.PathLike``; a plain ``str`` is text).
    batch, length : int
        Rows per batch (kept as ``batch_size``; :meth:`batch` returns a batch)
        and predicted positions per row.
    seed : int
        Philox key for the window order, in [0, 2**64).
    name : str or None
        Corpus name recorded in :meth:`data_schedule`; defaults to the file
        name for a path and ``"inline"`` otherwise.
    steps : int or None
        Planned number of training steps; recorded, and bounds iteration.
    """

    def __init__(self, data, *, batch: int, length: int, seed: int = 0, name: str | None = None,
                 steps: int | None = None):
        if isinstance(data, os.PathLike):
            with open(data, "rb") as f:
                corpus = f.read()
            default_name = os.path.basename(os.fspath(data))
        elif isinstance(data, str):
            corpus, default_name = data.encode("utf-8"), "inline"
        elif isinstance(data, (bytes, bytearray, memoryview)):
            corpus, default_name = bytes(data), "inline"
        else:
            raise type_error(f"data must be bytes, str or a path, got {type(data).__name__}")
        for label, value in (("batch", batch), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise value_error(f"{label} must be a positive integer, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise value_error(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
            raise value_error(f"steps must be a non-negative integer or None, got {steps!r}")
        if len(corpus) < length + 1:
            raise value_error(f"the corpus has {len(corpus)} bytes; a window needs length + 1 = {length + 1}")
        self.batch_size, self.length, self.seed, self.steps = batch, length, seed, steps
        self.name = default_name if name is None else str(name)
        self._corpus = np.frombuffer(corpus, dtype=np.uint8)
        self._sha256 = hashlib.sha256(corpus).hexdigest()
        self._orders: dict[int, np.ndarray] = {}

    @property
    def n_windows(self) -> int:
        """Windows per epoch: corpus bytes - length."""
        return self._corpus.size - self.length

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            keys = np.random.Philox(key=self.seed + (epoch << 64)).random_raw(self.n_windows)
            self._orders[epoch] = np.argsort(keys, kind="stable")
        return self._orders[epoch]

    def offsets(self, i: int) -> np.ndarray:
        """Corpus offsets of the windows in batch i, one per row (int64)."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
            raise value_error(f"batch index must be a non-negative integer, got {i!r}")
        samples = int(i) * self.batch_size + np.arange(self.batch_size)
        epochs, positions = np.divmod(samples, self.n_windows)
        starts = np.empty(self.batch_size, dtype=np.int64)
        for epoch in np.unique(epochs):
            rows = epochs == epoch
            starts[rows] = self._order(int(epoch))[positions[rows]]
        return starts

    def batch(self, i: int) -> np.ndarray:
        """Batch i as an int32 array of shape (batch, length + 1)."""
        starts = self.offsets(i)
        return self._corpus[starts[:, None] + np.arange(self.length + 1)].astype(np.int32)

    def __iter__(self) -> Iterator[np.ndarray]:
        """Batches 0, 1, ...: ``steps`` of them when planned, endlessly otherwise."""
        i = 0
        while self.steps is None or i < self.steps:
            yield self.batch(i)
            i += 1

    def data_schedule(self) -> dict:
        """A JSON-serialisable record of the corpus and the batch order."""
        schedule = {
            "format": SCHEDULE_FORMAT,
            "corpus": self.name,
            "corpus_bytes": int(self._corpus.size),
            "corpus_sha256": self._sha256,
            "n_vocab": N_VOCAB,
            "batch": self.batch_size,
            "length": self.length,
            "seed": self.seed,
            "windows_per_epoch": self.n_windows,
            "order": ORDER,
        }
        if self.steps is not None:
            schedule["planned_steps"] = self.steps
        return schedule

    @classmethod
    def from_data_schedule(cls, data, schedule: dict) -> "TokenBatches":
        """Rebuild the batches a schedule records, checking that ``data`` is its corpus."""
        if not isinstance(schedule, dict) or schedule.get("format") != SCHEDULE_FORMAT:
            raise value_error(f"not a {SCHEDULE_FORMAT} data schedule")
        batches = cls(data, batch=schedule["batch"], length=schedule["length"], seed=schedule["seed"],
                      name=schedule["corpus"], steps=schedule.get("planned_steps"))
        if batches._sha256 != schedule["corpus_sha256"]:
            raise value_error(f"corpus SHA-256 {batches._sha256} differs from the schedule's "
                              f"{schedule['corpus_sha256']}: this is not the recorded corpus")
        return batches
