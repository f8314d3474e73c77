"""Per-item variable-length entries: a sequence of them, or one packed ``(data, offsets)`` tape.

``contents`` and ``choices`` are texts -- ``str`` (encoded as UTF-8) or any bytes-
like object per item -- and ``choice_targets`` are float32 buffers per item. Each
may also come as a tape: a ``(data, offsets)`` tuple whose ``offsets`` is an
integer array of the item count plus one entries, from 0, non-decreasing, ending
at ``len(data)``, entry ``i`` being ``data[offsets[i]:offsets[i + 1]]`` -- the shape
``text_choose`` answers its probabilities in. A 2-tuple is read as a tape only
when its second element is an integer array, so a tuple of two texts or of two
float buffers stays two entries.
"""

from __future__ import annotations

import numpy as np

from .arrays import as_float32, as_unsigned
from ..errors import ErrorCode, UFormError


def _is_tape(value) -> bool:
    if not (isinstance(value, tuple) and len(value) == 2):
        return False
    offsets = value[1]
    return isinstance(offsets, (np.ndarray, list, tuple, memoryview)) and np.asarray(offsets).dtype.kind in "iu"


def _split_tape(name: str, data, offsets, item_count: int | None) -> list:
    offsets = as_unsigned(f"{name} offsets", offsets, np.uint64)
    if item_count is None:
        item_count = max(offsets.size - 1, 0)
    if offsets.size != item_count + 1:
        raise UFormError(ErrorCode.SHAPE_MISMATCH,
                         f"{name}: {offsets.size} tape offsets for {item_count} items, expected {item_count + 1}")
    if offsets[0] != 0 or np.any(offsets[1:] < offsets[:-1]) or offsets[-1] != len(data):
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"{name}: tape offsets must run non-decreasing from 0 to the data's {len(data)} entries")
    bounds = offsets.astype(np.int64)
    return [data[begin:end] for begin, end in zip(bounds[:-1], bounds[1:])]


def _entries(name: str, value, item_count: int | None) -> list:
    """The entries of ``value``; ``item_count`` None takes as many as it holds."""
    if isinstance(value, RowsTape) and value.offsets is not None:
        value = (value, value.offsets)
    if _is_tape(value):
        entries = _split_tape(name, *value, item_count)
    else:
        try:
            entries = list(value)
        except TypeError:
            raise UFormError(ErrorCode.INVALID_ARGUMENT,
                             f"{name}: expected a sequence or a (data, offsets) tape, got {type(value).__name__}") from None
    if item_count is not None and len(entries) != item_count:
        raise UFormError(ErrorCode.SHAPE_MISMATCH, f"{name}: {len(entries)} entries for {item_count} items")
    return entries


def entries(name: str, value, item_count: int | None = None) -> list:
    """Each item's entry as given; ``item_count`` None takes as many items as ``value`` holds, as
    ``contents`` defines the step's count."""
    if isinstance(value, (str, bytes)):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: expected one entry per item, got a single text")
    return _entries(name, value, item_count)


def as_text(name: str, item: int, entry) -> bytes:
    """One item's bytes, ``str`` encoded as UTF-8; refuses other types naming the item."""
    if isinstance(entry, str):
        try:
            return entry.encode("utf-8")
        except UnicodeEncodeError as error:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: item {item} is not valid text: character "
                             f"{error.start} is a lone surrogate {entry[error.start]!r}") from None
    if isinstance(entry, (bytes, bytearray, memoryview)):
        return bytes(entry)
    if isinstance(entry, np.ndarray) and entry.dtype == np.uint8 and entry.ndim == 1:
        return entry.tobytes()
    raise UFormError(ErrorCode.INVALID_ARGUMENT,
                     f"{name}: item {item} is {type(entry).__name__}, not bytes, a uint8 array or str")


def as_texts(name: str, value, item_count: int | None = None) -> list[bytes]:
    """Each item's bytes (:func:`as_text`)."""
    return [as_text(name, item, entry) for item, entry in enumerate(entries(name, value, item_count))]


def tape_entries(offsets: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The entries of a tape with ``offsets`` that ``items`` own, in that order: (their indices into the
    tape's data, the int64 offsets of the tape they make)."""
    begins, ends = offsets[items].astype(np.int64), offsets[np.asarray(items) + 1].astype(np.int64)
    counts = ends - begins
    indices = np.repeat(begins - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
    return indices, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def as_float_entries(name: str, value, item_count: int) -> list[np.ndarray]:
    """Each item's float32 entries."""
    return [as_float32(f"{name} item {item}", entry) for item, entry in enumerate(_entries(name, value, item_count))]


class RowsTape(np.ndarray):
    """A float32 tape as ``text_choose`` answers it: the array holds every item's entries back to back, and
    ``offsets`` (uint64, the items plus one) says where each begins. ``choice_targets`` takes the tape itself
    or ``(tape, tape.offsets)``. A copy (and a pickle) keeps the offsets; indexing answers plain arrays."""

    offsets: np.ndarray | None

    def __new__(cls, data: np.ndarray, offsets: np.ndarray) -> RowsTape:
        tape = np.asarray(data, np.float32).view(cls)
        tape.offsets = np.asarray(offsets, np.uint64)
        return tape

    def __array_finalize__(self, obj) -> None:
        same = obj is not None and getattr(obj, "shape", None) == self.shape
        self.offsets = getattr(obj, "offsets", None) if same else None

    def __getitem__(self, key):
        return np.asarray(self)[key]

    def __reduce__(self):
        return RowsTape, (np.asarray(self), self.offsets)

    def entry(self, item: int) -> np.ndarray:
        """Item `item`'s entries, as a plain float32 array."""
        return np.asarray(self)[int(self.offsets[item]):int(self.offsets[item + 1])]
