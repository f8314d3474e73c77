"""Span corruption (:mod:`uform.training.masking`) read from its module doc, one segment and one draw at a time,
in plain Python: each word from numpy's own ``Philox`` bit generator (the same Philox4x64-10), each step of the
doc a loop. The vectorised ``corrupt`` is checked against it (tests/training/test_keyed_draws.py)."""

from __future__ import annotations

import math

import numpy as np

from ..training.config import Masking
from ..training.masking import COVERAGE_STREAM, CUT_STREAM, SHOWN_STREAM, SPAN_STREAM
from ..training.vocabulary import IGNORED_TARGET, MASK

UINT64 = 1 << 64


def numpy_block(key: list[int], counter: list[int]) -> np.ndarray:
    """The Philox4x64-10 block of `key` at a 256-bit `counter` (four words, the first lowest) by numpy, which
    steps its counter, with carry, before each block."""
    value = (sum(word << (64 * lane) for lane, word in enumerate(counter)) - 1) % (UINT64 ** 4)
    start = [(value >> (64 * lane)) % UINT64 for lane in range(4)]
    return np.random.Philox(key=np.array(key, np.uint64), counter=np.array(start, np.uint64)).random_raw(4)


def segment_words(seed: int, step: int, item: int, stream: int, count: int) -> list[int]:
    """Words 0 .. count − 1 of `stream` under the item's key [seed, (step << 32) | item]."""
    key1 = (step << 32) | item
    return [int(numpy_block([seed, key1], [w // 4, stream, 0, 0])[w % 4]) for w in range(count)]


def corrupt_segment(tokens: list[int], masking: Masking, seed: int, step: int,
                    item: int) -> tuple[list[int], list[int]]:
    """(inputs, targets) of one segment's tokens: steps 1-4 of the module doc (`masking` derived)."""
    n = len(tokens)
    p, m = masking.token_mask_probability, masking.token_mean_span
    (u,) = segment_words(seed, step, item, COVERAGE_STREAM, 1)
    k = min(math.floor(p * n + (u >> 11) * 2.0 ** -53), math.floor(p * n) + 1, n)
    covered = []
    if k:
        q, thresholds = 1.0 - 1.0 / m, []
        for _ in range(k - 1):
            thresholds.append((thresholds[-1] if thresholds else 1.0) * q)
        spans, reach = [], 0
        for word in segment_words(seed, step, item, SPAN_STREAM, k):
            uniform = (word >> 11) * 2.0 ** -53
            length = 1 + sum(uniform < threshold for threshold in thresholds)
            spans.append(min(length, k - reach))
            reach += spans[-1]
            if reach == k:
                break
        free = n - k
        if len(spans) - 1 > free:
            spans = spans[:free] + [sum(spans[free:])]
        spare = free - (len(spans) - 1)
        cuts = sorted(((word >> 32) * (spare + 1)) >> 32
                      for word in segment_words(seed, step, item, CUT_STREAM, len(spans)))
        before = 0
        for i, (cut, length) in enumerate(zip(cuts, spans)):
            covered += range(cut + i + before, cut + i + before + length)
            before += length
    inputs, targets = list(tokens), [IGNORED_TARGET] * n
    for position, word in zip(covered, segment_words(seed, step, item, SHOWN_STREAM, k)):
        v, byte = (word >> 11) * 2.0 ** -53, word & 0xFF
        targets[position] = tokens[position]
        if v < masking.replace_fraction:
            inputs[position] = MASK
        elif v < masking.replace_fraction + masking.random_fraction:
            inputs[position] = byte
    return inputs, targets
