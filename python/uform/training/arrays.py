"""Taking caller arrays: any array-like in, a checked one-dimensional numpy array out; and the layout of groups
of entries laid back to back (:func:`group_entries`).

The C ABI takes ``size_t`` offsets, ``uint32`` ids and ``float32`` weights; a
caller hands lists, buffers or arrays of any integer type. Converting blindly
would wrap a negative id into a huge one, so these refuse what does not fit,
naming the array. An array already of the wanted dtype is borrowed, not copied.
"""

from __future__ import annotations

import numpy as np

from ..errors import ErrorCode, UFormError


def as_unsigned(name: str, value, dtype: type) -> np.ndarray:
    """A 1-D array of the unsigned ``dtype`` from non-negative integers; None is empty."""
    array = np.asarray(() if value is None else value)
    if array.size == 0:
        return np.empty(0, dtype)
    if array.ndim != 1:
        raise UFormError(ErrorCode.SHAPE_MISMATCH, f"{name}: must be one-dimensional, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: must hold integers, got {array.dtype}")
    if array.dtype.kind == "i" and array.min() < 0:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: must be non-negative, got {array.min()}")
    if array.max() > np.iinfo(dtype).max:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: {array.max()} does not fit {np.dtype(dtype)}")
    return array.astype(dtype, copy=False)


def as_float32(name: str, value) -> np.ndarray:
    """A 1-D float32 array from numbers; None is empty. Finiteness is the caller's to check."""
    try:
        array = np.asarray(() if value is None else value, dtype=np.float32)
    except (TypeError, ValueError):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: must hold numbers") from None
    if array.ndim != 1:
        raise UFormError(ErrorCode.SHAPE_MISMATCH, f"{name}: must be one-dimensional, got shape {array.shape}")
    return array


def per_item(name: str, value, item_count: int, dtype: type) -> np.ndarray | None:
    """One unsigned entry per item, or None when absent or empty (the seed's "empty" default)."""
    array = as_unsigned(name, value, dtype)
    if array.size == 0:
        return None
    if array.size != item_count:
        raise UFormError(ErrorCode.SHAPE_MISMATCH, f"{name}: {array.size} entries for {item_count} items")
    return array


def first_not_finite_non_negative(values: np.ndarray) -> int | None:
    """The index of the first value that is not a finite number ≥ 0 (a weight, a probability), or None."""
    bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0)))
    return int(bad[0]) if bad.size else None


def group_entries(counts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Groups of ``counts[g]`` entries laid back to back (a segment's tokens, a segment's draws): ``(first, owner,
    index)``, int64, each group's first entry, then each entry's group and its index within the group."""
    counts = np.asarray(counts, np.int64)
    first = np.cumsum(counts) - counts
    owner = np.repeat(np.arange(counts.size), counts)
    return first, owner, np.arange(owner.size) - first[owner]
