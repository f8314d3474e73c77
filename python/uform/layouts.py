"""Host-side layouts of the kernels' operands, a pure numpy function each: which keys each token attends to
(attention_spans) and the identical attention's tiles (attention_tiles), the rotary tables, and the tokens grouped
by id for the embedding backward (embedding_groups, and fast mode's chunks of them: embedding_chunks). The models
(uform.nn, uform.training, uform.lm) build them on the host and upload them beside the other operands.
"""

from __future__ import annotations

import numpy as np

from .kernels import ATTENTION_TILE, EMBEDDING_CHUNK



def attention_spans(tokens: int, seq_len: int, segments: np.ndarray | None = None) -> np.ndarray:
    """Each token's attention block [begin, end) as int32 (tokens, 2): its whole sequence of seq_len
    tokens, or with `segments` (one id per token, −1 for padding) the run of equal ids around it inside
    its sequence; a padding token's block is empty. A segment must be one contiguous run."""
    if segments is None:
        begin = np.arange(tokens) // seq_len * seq_len
        return np.stack([begin, begin + seq_len], 1).astype(np.int32)
    segments = np.asarray(segments).reshape(-1)
    if segments.size != tokens:
        raise ValueError(f"segments must hold {tokens} ids, holds {segments.size}")
    # a run starts at each sequence's first token and wherever the id changes; every token takes its run's bounds
    starts = np.empty(tokens, bool)
    starts[:1] = True
    np.not_equal(segments[1:], segments[:-1], out=starts[1:])
    starts[::seq_len] = True
    first = np.flatnonzero(starts).astype(np.int32)
    run = np.cumsum(starts, dtype=np.int32) - 1
    spans = np.empty((tokens, 2), np.int32)
    spans[:, 0] = first[run]
    spans[:, 1] = np.append(first[1:], np.int32(tokens))[run]
    padding = np.flatnonzero(segments < 0).astype(np.int32)
    spans[padding] = padding[:, None]
    return spans


def attention_tiles(spans: np.ndarray) -> np.ndarray:
    """The identical attention's tiles for these spans (attention_spans), (T, 2) int32 [start, end): every run of
    tokens that share a span (a packed segment, a sequence; consecutive padding tokens make one run) cut into
    tiles of ATTENTION_TILE tokens from its first, its last tile shorter. A tile of the fixed grid that straddles
    two runs walks the key blocks of both spans; these never do (the same bits: every sum belongs to one query or
    one key). They cover every token once, so T ≤ tokens."""
    spans = np.asarray(spans).reshape(-1, 2)
    tokens = spans.shape[0]
    begin = np.ascontiguousarray(spans[:, 0])
    padding = begin == spans[:, 1]
    # a run's tokens share its begin; a padding token's begin is its own index, so padding runs are merged
    starts_run = np.ones(tokens, bool)
    np.not_equal(begin[1:], begin[:-1], out=starts_run[1:])
    starts_run[1:] &= ~(padding[1:] & padding[:-1])
    starts = np.flatnonzero(starts_run)
    ends = np.r_[starts[1:], tokens]
    counts = -(-(ends - starts) // ATTENTION_TILE)
    run = np.repeat(np.arange(starts.size), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    begin = starts[run] + (np.arange(run.size) - first) * ATTENTION_TILE
    return np.stack([begin, np.minimum(begin + ATTENTION_TILE, ends[run])], 1).astype(np.int32)


def rotary_tables(max_positions: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of t·base^(−2i/D), computed in float64 and rounded once to float32."""
    if head_dim % 2:
        raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
    inverse_frequency = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inverse_frequency[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def embedding_groups(ids: np.ndarray, vocab_size: int, row_length: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Tokens grouped by id for the backward: a stable order and CSR offsets (int32); with row_length, grouped
    by (packed row of row_length tokens, id), offsets over rows × vocab_size groups."""
    ids = np.asarray(ids).reshape(-1)
    keys = ids if not row_length else np.arange(ids.size) // row_length * vocab_size + ids.astype(np.int64)
    groups = vocab_size if not row_length else -(-ids.size // row_length) * vocab_size
    if groups <= 65536:  # numpy's stable sort of 8- or 16-bit keys is a radix sort: the same order, in linear time
        keys = keys.astype(np.uint8 if groups <= 256 else np.uint16)
    order = np.argsort(keys, kind="stable").astype(np.int32)
    offsets = np.zeros(groups + 1, np.int32)
    np.cumsum(np.bincount(keys, minlength=groups), out=offsets[1:])
    return order, offsets


def embedding_chunks(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fast mode's cut of the id groups (``embedding_groups``' offsets) into chunks of EMBEDDING_CHUNK tokens:
    chunk_starts (CSR over the grouped order: chunk c holds positions [chunk_starts[c], chunk_starts[c + 1]))
    and id_chunks (CSR: id v's chunks are [id_chunks[v], id_chunks[v + 1])), both int32."""
    offsets = np.asarray(offsets, np.int64)
    per_id = -(-np.diff(offsets) // EMBEDDING_CHUNK)
    id_chunks = np.zeros(offsets.size, np.int64)
    np.cumsum(per_id, out=id_chunks[1:])
    first = np.repeat(id_chunks[:-1], per_id)  # each chunk's id's first chunk
    starts = np.repeat(offsets[:-1], per_id) + EMBEDDING_CHUNK * (np.arange(id_chunks[-1]) - first)
    return np.r_[starts, offsets[-1]].astype(np.int32), id_chunks.astype(np.int32)
