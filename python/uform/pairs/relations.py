"""The contrastive targets of a step of (query, document) pairs.

A step of n pairs is 2n items: the queries 0 … n−1, then their documents n … 2n−1. Each query
attracts its own document and each document its query, with the pair's weight; under the run's
ambient negatives every other item repels. Two pairs whose documents are equal (a caption drawn
twice in one step) would repel each other's halves though they say the same thing, so every item of
the one and every item of the other ignore each other (``Relations.ignore``: neither attracted nor
repelled), as OpenCLIP's users dedupe captions and SigLIP's zero-shot labels do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..training.relations import Relations


def distinct(values: Sequence) -> tuple[list, np.ndarray]:
    """The distinct ``values`` in order of first appearance, and each value's index among them (int64)."""
    index: dict = {}
    labels = np.array([index.setdefault(value, len(index)) for value in values], np.int64)
    return list(index), labels


def pair_relations(documents: Sequence, weights: Sequence[float] | None = None) -> Relations:
    """The relations of the 2n items of n pairs whose documents are ``documents`` (compared with ==, so text,
    bytes or labels), each pair weighted by ``weights`` (default 1); see the module doc."""
    n = len(documents)
    partners = np.r_[np.arange(n, 2 * n), np.arange(n)]
    weights = np.ones(n) if weights is None else np.asarray(weights, np.float64)
    label = distinct(documents)[1]
    pair, label = np.r_[np.arange(n), np.arange(n)], np.r_[label, label]
    rows, columns = np.nonzero((label[:, None] == label[None, :]) & (pair[:, None] != pair[None, :]))
    ignore = (np.r_[0, np.cumsum(np.bincount(rows, minlength=2 * n))], columns) if rows.size else None
    return Relations(attract=(np.arange(2 * n + 1), partners, np.r_[weights, weights]), ignore=ignore)
