"""Span corruption of packed text for the MASKED and JOINT objectives.

For each packed segment of ``n`` bytes (after truncation):

1. **How much.** ``k = floor(p * n + u)`` positions are covered, ``p`` being
   ``token_mask_probability`` and ``u`` uniform in [0, 1): stochastic rounding,
   so coverage is ``p`` in expectation even for segments shorter than ``1 / p``.
2. **Spans.** Span lengths are drawn geometric on {1, 2, ...} with mean
   ``token_mean_span`` until they reach ``k``; the last is clipped so they sum
   to exactly ``k``. If the ``n - k`` uncovered bytes cannot separate them all,
   the trailing spans merge into one.
3. **Where.** The ``n - k`` uncovered bytes are split into the gaps before,
   between and after the spans -- every gap between two spans at least one byte,
   so spans never touch and keep their drawn lengths -- by sorted uniform cut
   points over the spare bytes.
4. **What shows.** Every covered position draws ``v`` uniform in [0, 1), then
   every covered position draws a byte uniform in 0..255: ``v <
   replace_fraction`` shows ``MASK``, ``v < replace_fraction + random_fraction``
   shows its drawn byte (which may equal the original), and the rest show the
   original byte.

Targets are the original byte at every covered position and ``IGNORED_TARGET``
(-1) everywhere else, padding included, so the loss reads covered positions only.

Every draw for a segment comes, in the order above, from
``numpy.random.Generator(numpy.random.Philox(key=[seed, (step << 32) | item]))``
where ``item`` is the item's index in the step (plus ``item_offset``, the index
of the process's first item when several processes feed one step). The draws
depend only on (seed, step, item) and the segment's length, so an item is
corrupted the same way whatever else shares its batch, wherever packing places
it, and on whatever host computes it (numpy keeps a ``Generator``'s streams
stable within a version, not promised across versions); the next step draws
afresh.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from .config import Masking
from .errors import ErrorCode, UFormError
from .packing import Packed
from .vocabulary import BYTE_COUNT, IGNORED_TARGET, MASK

_UINT32_LIMIT = 1 << 32
_UINT64_LIMIT = 1 << 64


def _corruption_key(seed: int, step: int, item: int) -> np.ndarray:
    """The Philox key of ``item``'s draws at ``step``: [seed, (step << 32) | item]."""
    seed, step, item = operator.index(seed), operator.index(step), operator.index(item)
    for name, value, limit in (("seed", seed, _UINT64_LIMIT), ("step", step, _UINT32_LIMIT),
                               ("item", item, _UINT32_LIMIT)):
        if not 0 <= value < limit:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: must lie in [0, {limit}), got {value}")
    return np.array([seed, (step << 32) | item], dtype=np.uint64)


def corruption_generator(seed: int, step: int, item: int) -> np.random.Generator:
    """The generator every corruption draw of ``item`` at ``step`` comes from."""
    return np.random.Generator(np.random.Philox(key=_corruption_key(seed, step, item)))


def _span_lengths(rng: np.random.Generator, covered: int, mean_span: float) -> np.ndarray:
    """Geometric span lengths of mean ``mean_span``, the last clipped so they sum to ``covered``.

    Lengths are drawn in batches of ``int(covered / mean_span * 1.5) + 8`` until they reach ``covered``.
    """
    draws = int(covered / mean_span * 1.5) + 8
    spans = rng.geometric(1.0 / mean_span, size=draws)
    reach = spans.cumsum()
    while reach[-1] < covered:
        spans = np.concatenate([spans, rng.geometric(1.0 / mean_span, size=draws)])
        reach = spans.cumsum()
    last = int(np.searchsorted(reach, covered))
    spans = spans[:last + 1]
    spans[-1] -= reach[last] - covered
    return spans


def _covered_indices(rng: np.random.Generator, length: int, masking: Masking) -> np.ndarray:
    """The covered positions of steps 1-3 of the module doc, ascending: span i covers ``spans[i]`` positions
    from its start, which lies after the gaps before it and the spans before it."""
    covered = math.floor(masking.token_mask_probability * length + rng.random())
    if covered == 0:
        return np.empty(0, np.int64)
    spans = _span_lengths(rng, covered, masking.token_mean_span)
    free = length - covered
    if spans.size - 1 > free:
        spans = np.append(spans[:free], spans[free:].sum())
    spare = free - (spans.size - 1)
    cuts = np.sort(rng.integers(0, spare + 1, size=spans.size))
    gaps_before = cuts + np.arange(spans.size)  # the uncovered positions before span i: cut i, plus i separators
    return np.arange(covered) + np.repeat(gaps_before, spans)


def covered_positions(rng: np.random.Generator, length: int, masking: Masking) -> np.ndarray:
    """A boolean mask over ``length`` positions: the spans of steps 1-3 of the module doc."""
    mask = np.zeros(length, bool)
    mask[_covered_indices(rng, length, masking)] = True
    return mask


def _corrupt_into(rng: np.random.Generator, inputs: np.ndarray, targets: np.ndarray, masking: Masking) -> None:
    """Steps 1-4 of the module doc for one segment, in place: ``inputs`` (its tokens) corrupted, ``targets``
    (all ``IGNORED_TARGET``) set at the covered positions."""
    where = _covered_indices(rng, inputs.size, masking)
    shown = rng.random(where.size)
    random_bytes = rng.integers(0, BYTE_COUNT, size=where.size, dtype=np.int32)
    original = inputs[where]
    targets[where] = original
    masked = shown < masking.replace_fraction
    randomized = shown < masking.replace_fraction + masking.random_fraction
    inputs[where] = np.where(masked, MASK, np.where(randomized, random_bytes, original))


def corrupt_segment(rng: np.random.Generator, tokens: np.ndarray,
                    masking: Masking) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)`` for one segment's tokens, drawn from ``rng`` as the module doc orders."""
    inputs = tokens.copy()
    targets = np.full(tokens.size, IGNORED_TARGET, np.int32)
    _corrupt_into(rng, inputs, targets, masking)
    return inputs, targets


def corrupt(packed: Packed, masking: Masking, seed: int, step: int, item_offset: int = 0,
            text_segments: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)``, each shaped like ``packed.tokens`` (int32): the corrupted grid and what to predict.

    ``masking`` is derived here, so zeros take their defaults. ``item_offset``
    is added to each segment's item index to form its key. ``text_segments``
    (a boolean per segment; None: all) says which segments are text: the others
    (media) pass through untouched, with no targets.
    """
    masking = masking.derived()
    columns = packed.tokens.shape[1]
    inputs = packed.tokens.copy().reshape(-1)
    targets = np.full(inputs.size, IGNORED_TARGET, np.int32)
    segments = np.arange(packed.segment_count) if text_segments is None else np.flatnonzero(text_segments)
    begins = (packed.segment_row[segments].astype(np.int64) * columns + packed.segment_start[segments]).tolist()
    lengths = packed.segment_length[segments].tolist()
    items = (item_offset + packed.item_of_segment[segments].astype(np.int64)).tolist()
    # corruption_generator(seed, step, item) for each segment, by setting one Philox to the state a fresh one has
    # under that key (its counter at zero, nothing buffered): the same draws, without building a generator each
    bit_generator = np.random.Philox(key=np.zeros(2, np.uint64))
    fresh = bit_generator.state
    generator = np.random.Generator(bit_generator)
    for begin, length, item in zip(begins, lengths, items):
        fresh["state"]["key"] = _corruption_key(seed, step, item)
        bit_generator.state = fresh
        end = begin + length
        _corrupt_into(generator, inputs[begin:end], targets[begin:end], masking)
    return inputs.reshape(packed.tokens.shape), targets.reshape(packed.tokens.shape)
