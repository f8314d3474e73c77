"""Reusable host memory a step lands the pooled embeddings in.

A step given an :class:`Arena` copies the pooled embedding of every packed
segment -- as the contrastive loss scored it, before the update -- into the
arena's one buffer, converted to the step's ``outputs_scalar``, and answers a
view of it. The buffer grows (to at least double) when a step needs more and is
otherwise reused, so a training loop that reads embeddings allocates nothing per
step. The answered rows stay valid until the next step writes the same arena;
copy them to keep them longer.

``Scalar.BF16`` has no numpy dtype, so BF16 rows are ``uint16`` bit patterns:
the float32 value rounded to nearest-even in its top 16 bits (NaN stays a quiet
NaN). ``Scalar.F16`` rows are ``float16``, ``Scalar.F32`` rows ``float32``.
"""

from __future__ import annotations

import numpy as np

from .enums import Scalar

SCALAR_DTYPES = {Scalar.F32: np.dtype(np.float32), Scalar.BF16: np.dtype(np.uint16), Scalar.F16: np.dtype(np.float16)}
"""The numpy dtype rows of each scalar land as; BF16 as its raw bits."""

_BF16_QUIET_NAN = np.uint16(0x7FC0)


def to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (``uint16``), rounded to nearest-even."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), _BF16_QUIET_NAN, rounded)


class Arena:
    """One growing host buffer the step's pooled embeddings land in; ``rows`` views the last landing."""

    def __init__(self, capacity: int = 0):
        """``capacity``: bytes to reserve up front, so the first steps need not grow it."""
        self._storage = np.empty(capacity, np.uint8)
        self._rows: np.ndarray | None = None

    @property
    def capacity(self) -> int:
        """Bytes the buffer holds now."""
        return int(self._storage.size)

    @property
    def rows(self) -> np.ndarray | None:
        """A view of the last embeddings landed, ``(segments, width)``; None before the first."""
        return self._rows

    def land(self, embeddings: np.ndarray, scalar: Scalar = Scalar.F32) -> np.ndarray:
        """Converts ``embeddings`` to ``scalar``, writes them into the buffer, and answers the view."""
        scalar = Scalar(scalar)
        embeddings = np.asarray(embeddings, np.float32)
        converted = to_bfloat16_bits(embeddings) if scalar == Scalar.BF16 else embeddings.astype(SCALAR_DTYPES[scalar])
        if converted.nbytes > self._storage.size:
            self._storage = np.empty(max(converted.nbytes, 2 * self._storage.size), np.uint8)
        view = self._storage[:converted.nbytes].view(converted.dtype).reshape(converted.shape)
        view[...] = converted
        self._rows = view
        return view
