"""Span corruption of packed text for the MASKED and JOINT objectives.

For each packed segment of ``n`` bytes (after truncation):

1. **How much.** ``k = floor(p * n + u)`` positions are covered, ``p`` being
   ``token_mask_probability`` and ``u`` uniform in [0, 1): stochastic rounding,
   so coverage is ``p`` in expectation even for segments shorter than ``1 / p``
   (in float64, then at most ``floor(p * n) + 1`` and ``n``, which a sum that
   rounded up to the next integer could pass).
2. **Spans.** Span lengths ``L_j`` (j = 0, 1, ...) are geometric on {1, 2, ...}
   with mean ``m = token_mean_span``, taken until they reach ``k``; the last is
   clipped so they sum to exactly ``k``. ``L_j = 1 + #{t in 1 .. k - 1 : U_j <
   q^t}`` for a uniform ``U_j``, with ``q = 1 - 1/m`` and ``q^t`` the running
   float64 product ``q · q · ...`` (``P(L > t) = q^t``: the geometric law by
   inversion, with no logarithm whose last bit could differ between hosts). If
   the ``n - k`` uncovered bytes cannot separate the spans, the trailing ones
   merge into one.
3. **Where.** The ``n - k`` uncovered bytes are split into the gaps before,
   between and after the ``c`` spans -- every gap between two spans at least one
   byte, so spans never touch and keep their drawn lengths -- by ``c`` sorted
   uniform cut points in 0 .. ``spare``, ``spare = n - k - (c - 1)`` being the
   bytes left after the separators.
4. **What shows.** Covered position ``i`` draws ``v_i`` uniform in [0, 1) and a
   byte ``b_i`` uniform in 0..255: ``v < replace_fraction`` shows ``MASK``, ``v <
   replace_fraction + random_fraction`` shows ``b_i`` (which may equal the
   original), and the rest show the original byte.

Targets are the original byte at every covered position and ``IGNORED_TARGET``
(-1) everywhere else, padding included, so the loss reads covered positions only.

**The draws.** Every draw is a word of Philox4x64-10 (:mod:`.philox`) under the
key ``[seed, (step << 32) | item]``, ``item`` being the item's index in the step
(plus ``item_offset``, the index of the process's first item when several
processes feed one step). Word ``w`` of stream ``s`` is lane ``w mod 4`` of the
block at counter ``[w div 4, s, 0, 0]``; a uniform is the word's top 53 bits
times 2⁻⁵³, a cut point in 0 .. ``spare`` is ``(word >> 32) · (spare + 1) >> 32``,
a byte is the word's low 8 bits. The streams are:

- 0: word 0 is ``u`` (step 1);
- 1: word ``j`` is ``U_j`` (step 2);
- 2: word ``j`` is the ``j``-th cut point, before sorting (step 3);
- 3: word ``i`` gives ``v_i`` (top bits) and ``b_i`` (low bits) (step 4).

A draw depends only on (seed, step, item), the segment's length and its index,
so an item is corrupted the same way whatever else shares its batch, wherever
packing places it, and on whatever host or numpy version computes it (the words
are the algorithm's, with no library stream behind them); the next step draws
afresh. Having no state, the draws of every segment of a step are computed at
once.
"""

from __future__ import annotations

import operator

import numpy as np

from .arrays import group_entries
from .config import Masking
from ..draws import check_key
from .packing import Packed
from .philox import below, stream_words, uniforms
from .vocabulary import BYTE_COUNT, IGNORED_TARGET, MASK

_UINT32_LIMIT = 1 << 32
COVERAGE_STREAM, SPAN_STREAM, CUT_STREAM, SHOWN_STREAM = 0, 1, 2, 3


class _Segments:
    """Segmented arrays: ``counts[s]`` entries for segment ``s``, back to back in segment order."""

    def __init__(self, counts: np.ndarray):
        self.first, self.owner, self.index = group_entries(counts)

    def exclusive_sums(self, values: np.ndarray) -> np.ndarray:
        """Each entry's sum of the entries before it in its segment."""
        running = np.cumsum(values) - values
        return running - running[self.first[self.owner]]


def _span_lengths(span_words: np.ndarray, covered: np.ndarray, lengths: np.ndarray,
                  mean_span: float) -> tuple[np.ndarray, np.ndarray]:
    """Step 2 for every segment from its ``k`` words of stream 1: ``(spans, counts)``, the span lengths back to
    back, clipped and merged."""
    if span_words.size == 0:
        return np.empty(0, np.int64), np.zeros_like(covered)
    draws = _Segments(covered)  # at most k spans, each at least 1 byte
    # thresholds q^t for t = 1 .. max k - 1, descending; L - 1 counts those above U (at most k - 1 of them)
    thresholds = np.multiply.accumulate(np.full(int(covered.max()) - 1, 1.0 - 1.0 / mean_span))
    above = thresholds.size - np.searchsorted(thresholds[::-1], uniforms(span_words), side="right")
    limit = covered[draws.owner]
    drawn = 1 + np.minimum(above, limit - 1)
    before = draws.exclusive_sums(drawn)
    kept = before < limit  # spans that start before k: a prefix, as every draw is at least 1
    spans, owner, index = np.minimum(drawn, limit - before)[kept], draws.owner[kept], draws.index[kept]
    counts = np.bincount(owner, minlength=covered.size)
    # spans from index n - k on merge into one, so that the n - k uncovered bytes can separate them
    free = lengths - covered
    merged_counts = np.minimum(counts, free + 1)
    group = (np.cumsum(merged_counts) - merged_counts)[owner] + np.minimum(index, free[owner])
    return np.bincount(group, weights=spans, minlength=int(merged_counts.sum())).astype(np.int64), merged_counts


def _covered_offsets(seed: int, key1: np.ndarray, lengths: np.ndarray,
                     masking: Masking) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 1-3 for every segment: ``(covered, offsets, shown_words)``: each segment's k, its covered positions
    (ascending offsets into the segment) and their words of stream 3, both back to back in segment order."""
    # streams 0, 1 and 3 in one call, 1 and 3 up to the most k can be (u < 1), then each segment's first k
    p = masking.token_mask_probability
    most = np.minimum(np.floor(p * lengths).astype(np.int64) + 1, lengths)
    segments = lengths.size
    words = stream_words(seed, np.tile(key1, 3), np.repeat([COVERAGE_STREAM, SPAN_STREAM, SHOWN_STREAM], segments),
                         np.concatenate([np.ones_like(most), most, most]))
    u, span_words, shown_words = np.split(words, [segments, segments + int(most.sum())])
    # the float64 sum can round up to the next integer; the exact one never passes floor(p·n) + 1, nor n
    covered = np.minimum(np.floor(p * lengths + uniforms(u)).astype(np.int64), most)
    drawn = _Segments(most)
    first_k = drawn.index < covered[drawn.owner]
    spans, counts = _span_lengths(span_words[first_k], covered, lengths, masking.token_mean_span)
    by_span = _Segments(counts)
    spare = lengths - covered - np.maximum(counts - 1, 0)
    cuts = below(stream_words(seed, key1, CUT_STREAM, counts), spare[by_span.owner] + 1)
    # sort the cuts within each segment: segments are already in order, so one sort of (segment, cut) does it
    cuts = np.sort((by_span.owner << 32) | cuts) & (_UINT32_LIMIT - 1)
    starts = cuts + by_span.index + by_span.exclusive_sums(spans)  # cut i, i separators and the spans before i
    return covered, np.repeat(starts, spans) + _Segments(spans).index, shown_words[first_k]


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
    begins = packed.segment_row[segments].astype(np.int64) * columns + packed.segment_start[segments]
    lengths = packed.segment_length[segments].astype(np.int64)
    item_of_segment = packed.item_of_segment[segments].astype(np.int64)
    offset = operator.index(item_offset)
    # the lowest and highest item indices, as Python ints (an offset past int64 is refused, not overflowed)
    check_key(seed, step, [offset + int(item_of_segment.min()), offset + int(item_of_segment.max())]
               if item_of_segment.size else [offset])
    key1 = (np.uint64(step) << np.uint64(32)) | (item_of_segment + offset).astype(np.uint64)
    covered, offsets, words = _covered_offsets(seed, key1, lengths, masking)
    where = np.repeat(begins, covered) + offsets
    shown = uniforms(words)
    random_bytes = (words % np.uint64(BYTE_COUNT)).astype(np.int32)
    original = inputs[where]
    targets[where] = original
    masked = shown < masking.replace_fraction
    randomized = shown < masking.replace_fraction + masking.random_fraction
    inputs[where] = np.where(masked, MASK, np.where(randomized, random_bytes, original))
    return inputs.reshape(packed.tokens.shape), targets.reshape(packed.tokens.shape)
