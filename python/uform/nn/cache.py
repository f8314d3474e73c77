"""Buffers kept per geometry, a bounded number of them.

A model makes its buffers for a geometry (a token count, a batch size, a number of packed segments) on
first use and reuses them while the geometry repeats. A ``RecentCache`` keeps the ``capacity`` most
recently used geometries' buffers and drops the least recent when a new one arrives, so a caller that
walks through many geometries (logits at every batch size, steps packing every segment count) holds at
most ``capacity`` sets at once; a dropped set is freed as soon as nothing refers to it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

GEOMETRIES_KEPT = 4
"""Geometries whose buffers each cache keeps: enough for a step's and an evaluation's to live side by side."""


class RecentCache:
    """``cache(key)``: the value ``make(key)`` made for key, made on first use; the least recently used
    value is dropped once more than ``capacity`` keys are held."""

    def __init__(self, make: Callable, capacity: int = GEOMETRIES_KEPT):
        self._make, self._capacity = make, capacity
        self._values: OrderedDict = OrderedDict()

    def __call__(self, key: Hashable):
        if key in self._values:
            self._values.move_to_end(key)
        else:
            if len(self._values) >= self._capacity:
                self._values.popitem(last=False)
            self._values[key] = self._make(key)
        return self._values[key]

    def keys(self) -> list:
        """The keys held, least recently used first."""
        return list(self._values)
