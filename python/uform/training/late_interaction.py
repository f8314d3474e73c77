"""Late interaction on the host: which packed positions are query and document rows, and their targets.

An item's ``LateInteractionSide`` says what its tokens do (``docs/encoder.md``): a QUERY item's first
``max_query_span`` positions are its query rows, a DOCUMENT item's every position is a document row,
QUERY_AND_DOCUMENT both, NONE neither. The pair targets are the pooled term's (the same relations and
negatives) kept where the anchor is a query and the candidate a document, and folded for the
late-interaction pair-loss form. A step whose rows pass the run's capacities is refused here, before
anything runs, naming the item that passes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrays import group_entries
from .config import LateInteraction
from .enums import LateInteractionSide
from ..errors import ErrorCode, UFormError
from .packing import Packed

QUERY_BIT = LateInteractionSide.QUERY.value          # a side's bit 0: its tokens query
DOCUMENT_BIT = LateInteractionSide.DOCUMENT.value    # bit 1: its tokens are scored


@dataclass(frozen=True, eq=False)
class LateBatch:
    """One step's late-interaction rows (int32 flat token indices, segment after segment, positions in
    order) and its folded pair targets over the packed segments."""

    query_tokens: np.ndarray      # (Q,)
    query_segment: np.ndarray     # (Q,) the segment of each query row
    query_starts: np.ndarray      # (S,) each segment's first query row
    query_counts: np.ndarray      # (S,) its query rows; 0 for a segment that is not a query
    document_tokens: np.ndarray   # (D,)
    document_segment: np.ndarray  # (D,)
    document_starts: np.ndarray   # (S,)
    document_counts: np.ndarray   # (S,)
    sign: np.ndarray              # (S, S) float32: +1 attract, −1 repel, 0 skipped or not (query, document)
    weight: np.ndarray            # (S, S) float32, the form's normalisation folded in
    form: int
    ranked_norm: float


def side_rows(packed: Packed, segment_sides: np.ndarray, max_query_span: int) -> tuple:
    """(query rows, document rows), each (tokens, segment, starts, counts) as int32 arrays."""
    columns = packed.tokens.shape[1]
    first = (packed.segment_row.astype(np.int64) * columns + packed.segment_start).astype(np.int64)
    lengths = packed.segment_length.astype(np.int64)
    answers = []
    for bit, span in ((QUERY_BIT, max_query_span), (DOCUMENT_BIT, None)):
        counts = np.where(segment_sides & bit, lengths if span is None else np.minimum(lengths, span), 0)
        starts, segment, within = group_entries(counts)
        tokens = first[segment] + within
        answers.append(tuple(a.astype(np.int32) for a in (tokens, segment, starts, counts)))
    return tuple(answers)


def _refuse_past(counts: np.ndarray, capacity: int, items: np.ndarray, what: str, field: str) -> None:
    """Refuse the first segment whose running total of `counts` passes `capacity`, naming its item."""
    past = np.flatnonzero(np.cumsum(counts) > capacity)
    if past.size:
        segment = int(past[0])
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"sides: item {int(items[segment])} brings the step's {what} to "
                         f"{int(np.cumsum(counts)[segment])}, past late_interaction.{field} {capacity}")


def late_batch(packed: Packed, sides: np.ndarray, late: LateInteraction, sign: np.ndarray, weight: np.ndarray,
               form: int, ranked_norm: float) -> LateBatch:
    """The step's LateBatch from its packing, each item's side (int32) and the folded late-interaction
    targets over its segments; refuses rows past the capacities of the derived `late`."""
    items = packed.item_of_segment
    segment_sides = sides[items]
    query, document = side_rows(packed, segment_sides, late.max_query_span)
    _refuse_past(query[3], late.max_query_tokens_per_device, items, "query tokens", "max_query_tokens_per_device")
    _refuse_past((segment_sides & DOCUMENT_BIT) > 0, late.max_documents_per_device, items, "documents",
                 "max_documents_per_device")
    _refuse_past(document[3], late.max_document_tokens_per_device, items, "document tokens",
                 "max_document_tokens_per_device")
    return LateBatch(*query, *document, sign=sign, weight=weight, form=form, ranked_norm=ranked_norm)


def late_targets(sign: np.ndarray, weight: np.ndarray, segment_sides: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pooled pair targets over the segments kept where the anchor is a query and the candidate a
    document (zero elsewhere)."""
    keep = ((segment_sides & QUERY_BIT) > 0)[:, None] & ((segment_sides & DOCUMENT_BIT) > 0)[None, :]
    return np.where(keep, sign, 0).astype(sign.dtype), np.where(keep, weight, 0).astype(weight.dtype)


def maxsim(queries, documents) -> np.ndarray:
    """Hard MaxSim scores (len(queries), len(documents)) float32 between token vectors as
    ``encode_tokens`` answers them: Σ over a query's rows of the largest dot product with a document's rows
    (float64 on the host, rounded once; 0 where either side has no rows). Each argument is a sequence of
    (rows, width) arrays, one per item. Each query is one product with every document's rows at once."""
    for name, value in (("queries", queries), ("documents", documents)):
        if isinstance(value, np.ndarray):
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"maxsim: {name} must be a sequence of (rows, width) "
                             f"arrays, one per item (as encode_tokens answers), got one {value.ndim}-D array")
    scores = np.zeros((len(queries), len(documents)))
    counts = np.array([len(d) for d in documents], np.int64)
    present = np.flatnonzero(counts)
    if present.size == 0:
        return scores.astype(np.float32)
    rows = np.concatenate([np.asarray(documents[j], np.float64) for j in present])
    starts = np.concatenate([[0], np.cumsum(counts[present])[:-1]])
    for i, query in enumerate(queries):
        if len(query):
            similarity = np.asarray(query, np.float64) @ rows.T
            scores[i, present] = np.maximum.reduceat(similarity, starts, axis=1).sum(axis=0)
    return scores.astype(np.float32)
