"""The contrastive targets of one step: three edge sets over the step's items.

An :class:`Edges` set is compressed sparse rows over the step's items: item
``i`` links to ``ids[offsets[i]:offsets[i + 1]]``, ascending within each run,
each edge weighing ``weights[k]`` (or 1 when no weights are given). Edges are
directed -- row ``i`` is anchor ``i``'s row of scores -- so a symmetric pair lists
both directions (``offsets=[0, 1, 2], ids=[1, 0]`` pairs items 0 and 1).

:class:`Relations` holds three sets, resolved per pair in the seed's order:

1. a pair ``ignore`` names is skipped (a known false negative; weights unread),
2. else one ``attract`` names pulls together,
3. else one ``repel`` names pushes apart,
4. else the run's ``Negatives``: ``AMBIENT`` repels it at the ambient weight,
   ``NAMED`` skips it.

The diagonal (an item against itself) is always skipped, so a self edge names
nothing; :func:`check_relations` refuses one as the mistake it almost surely is.
:func:`pair_targets` expands the sets into dense per-pair targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from .arrays import as_float32, as_unsigned, first_not_finite_non_negative
from .enums import Negatives
from ..errors import ErrorCode, UFormError

EDGE_SETS = ("attract", "repel", "ignore")
"""The edge sets of :class:`Relations`, in field order."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Edges:
    """One edge set over a step's items, as compressed sparse rows; empty offsets name no edges.

    Any array-like is taken and kept as numpy: ``offsets`` as ``uint64`` (the C
    side's ``size_t``), ``ids`` as ``uint32`` -- both empty when None -- and
    ``weights`` as ``float32``, or None when absent or empty (every edge weighs
    one). An array already of that dtype is borrowed, not copied.
    """

    offsets: np.ndarray | None = None
    """The step's item count plus one non-decreasing offsets into ``ids``."""
    ids: np.ndarray | None = None
    """Item ``i`` links to ``ids[offsets[i]:offsets[i + 1]]``, strictly ascending within each run."""
    weights: np.ndarray | None = None
    """The weight of each edge, paired with ``ids``; None weighs every edge one."""

    def __post_init__(self):
        weights = as_float32("Edges.weights", self.weights)
        object.__setattr__(self, "offsets", as_unsigned("Edges.offsets", self.offsets, np.uint64))
        object.__setattr__(self, "ids", as_unsigned("Edges.ids", self.ids, np.uint32))
        object.__setattr__(self, "weights", weights if weights.size else None)


_EdgesLike = Union[Edges, tuple, None]


def _as_edges(name: str, value: _EdgesLike) -> Edges | None:
    if value is None or isinstance(value, Edges):
        return value
    if isinstance(value, (tuple, list)) and len(value) in (2, 3):
        return Edges(**dict(zip(("offsets", "ids", "weights"), value)))
    raise UFormError(ErrorCode.INVALID_ARGUMENT,
                     f"Relations.{name}: expected Edges, (offsets, ids) or (offsets, ids, weights), "
                     f"got {type(value).__name__}")


@dataclass(frozen=True, kw_only=True, eq=False)
class Relations:
    """The contrastive targets of one step: ignored, attracted, repelled, then the run's negatives.

    Each set is an :class:`Edges`, a tuple ``(offsets, ids)`` or
    ``(offsets, ids, weights)``, or None for no edges.
    """

    attract: Edges | None = None
    """Pairs pulled together."""
    repel: Edges | None = None
    """Pairs pushed apart."""
    ignore: Edges | None = None
    """Pairs skipped, like known false negatives; their weights are not read."""

    def __post_init__(self):
        for name in EDGE_SETS:
            object.__setattr__(self, name, _as_edges(name, getattr(self, name)))


def edge_owners(offsets: np.ndarray) -> np.ndarray:
    """The item each edge belongs to, from offsets already checked non-decreasing."""
    counts = np.diff(offsets.astype(np.int64))
    return np.repeat(np.arange(counts.size, dtype=np.int64), counts)


def _check_edges(name: str, edges: Edges, item_count: int, max_edges: int | None) -> None:
    prefix = f"relations.{name}"
    offsets, ids = edges.offsets, edges.ids
    if offsets.size == 0:
        if ids.size:
            raise UFormError(ErrorCode.SHAPE_MISMATCH, f"{prefix}: {ids.size} ids but no offsets")
        return
    if offsets.size != item_count + 1:
        raise UFormError(ErrorCode.SHAPE_MISMATCH,
                         f"{prefix}: {offsets.size} offsets for {item_count} items, expected {item_count + 1}")
    if offsets[0] != 0:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{prefix}: offsets must start at 0, got {offsets[0]}")
    decreasing = np.flatnonzero(offsets[1:] < offsets[:-1])
    if decreasing.size:
        item = int(decreasing[0])
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"{prefix}: item {item}: offsets decrease from {offsets[item]} to {offsets[item + 1]}")
    if offsets[-1] != ids.size:
        raise UFormError(ErrorCode.SHAPE_MISMATCH,
                         f"{prefix}: offsets end at {offsets[-1]} but {ids.size} ids are given")
    if max_edges is not None and ids.size > max_edges:
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"{prefix}: {ids.size} edges exceed max_edges_per_device {max_edges}")

    owners = edge_owners(offsets)
    bad = np.flatnonzero(ids >= item_count)
    if bad.size:
        k = bad[0]
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"{prefix}: item {owners[k]} links to id {ids[k]}, past the step's {item_count} items")
    bad = np.flatnonzero(ids == owners)
    if bad.size:
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"{prefix}: item {owners[bad[0]]} links to itself (the diagonal is always skipped)")
    bad = np.flatnonzero((owners[1:] == owners[:-1]) & (ids[1:] <= ids[:-1]))
    if bad.size:
        k = bad[0]
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"{prefix}: item {owners[k]} lists ids [{ids[k]}, {ids[k + 1]}] "
                         f"out of strictly ascending order")

    weights = edges.weights
    if weights is None or name == "ignore":
        return
    if weights.size != ids.size:
        raise UFormError(ErrorCode.SHAPE_MISMATCH, f"{prefix}: {weights.size} weights for {ids.size} ids")
    k = first_not_finite_non_negative(weights)
    if k is not None:
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"{prefix}: item {owners[k]}'s edge to {ids[k]} weighs {weights[k]}, "
                         f"not a finite non-negative number")


def check_relations(relations: Relations | None, item_count: int, max_edges_per_device: int | None = None) -> None:
    """Refuses edge sets that do not describe ``item_count`` items, naming the set and the item.

    Per set: no offsets and no ids (no edges), or ``item_count + 1`` offsets
    starting at 0, non-decreasing, ending at ``len(ids)``; every id below
    ``item_count``, never the item itself, strictly ascending within its run;
    weights (unread for ``ignore``) as many as ids, finite and non-negative; and
    at most ``max_edges_per_device`` edges (None: uncapped). The cap is the
    capacity of the items checked, so a process checking the items of several
    devices passes their total. Length disagreements raise ``SHAPE_MISMATCH``,
    bad values ``INVALID_ARGUMENT``.
    """
    if relations is None:
        return
    for name in EDGE_SETS:
        edges = getattr(relations, name)
        if edges is not None:
            _check_edges(name, edges, item_count, max_edges_per_device)


def pair_targets(relations: Relations | None, item_count: int, negatives: Negatives,
                 ambient_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """Dense ``(item_count, item_count)`` float32 targets ``(sign, weight)`` of every anchor-candidate pair.

    ``sign[i, j]`` is +1 where anchor ``i`` attracts ``j``, -1 where it repels it
    and 0 where the pair is skipped; ``weight[i, j]`` is the edge's weight, the
    ambient weight for an ambient negative, and 0 for a skipped pair. The sets
    are written lowest priority first -- negatives, repel, attract, ignore, then
    the diagonal -- so each overwrites what it outranks. ``relations`` must have
    passed :func:`check_relations` for ``item_count`` items.
    """
    sign = np.zeros((item_count, item_count), np.float32)
    weight = np.zeros((item_count, item_count), np.float32)
    if Negatives(negatives) == Negatives.AMBIENT:
        sign.fill(-1.0)
        weight.fill(ambient_weight)
    if relations is not None:
        for name, value in (("repel", -1.0), ("attract", 1.0), ("ignore", 0.0)):
            edges = getattr(relations, name)
            if edges is None or edges.ids.size == 0:
                continue
            anchors, candidates = edge_owners(edges.offsets), edges.ids
            sign[anchors, candidates] = value
            if value == 0.0:
                weight[anchors, candidates] = 0.0
            else:
                weight[anchors, candidates] = 1.0 if edges.weights is None else edges.weights
    np.fill_diagonal(sign, 0.0)
    np.fill_diagonal(weight, 0.0)
    return sign, weight
