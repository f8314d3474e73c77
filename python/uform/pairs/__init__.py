"""Text pairs for ``python -m uform train``: the JSONL format, a step's relations, and evaluation (the built-in
sets are in :mod:`uform.datasets`).

- :mod:`.jsonl`: :class:`Pair`, :func:`read_pairs`, :func:`write_pairs` -- one
  ``{"query": ..., "document": ..., "weight"?: ..., "group"?: ...}`` object per line.
- :mod:`.relations`: :func:`pair_relations` -- a step's attract edges, and ignore edges between pairs whose
  documents are equal; :func:`distinct` -- values in order of first appearance, and each one's index.
- :mod:`.evaluate`: :func:`recall_at_1` (cosine, ties are misses), :func:`retrieval_metrics` (recall@1/@10,
  MRR), :func:`bag_of_bytes_embeddings` (the hashed byte-bigram baseline), :func:`bm25_scores` (BM25, bm25s),
  :func:`split_pairs` (deterministic held-out split) and :func:`split_by_document` (held-out documents
  unseen in training).
"""

from .evaluate import (BIGRAM_DIMENSIONS, bag_of_bytes_embeddings, bm25_scores, recall_at_1, retrieval_metrics,
                       split_by_document, split_pairs)
from .jsonl import Pair, PairFormatError, read_pairs, write_pairs
from .relations import distinct, pair_relations

__all__ = [
    "BIGRAM_DIMENSIONS", "Pair", "PairFormatError", "bag_of_bytes_embeddings", "bm25_scores", "distinct",
    "pair_relations", "read_pairs", "recall_at_1", "retrieval_metrics", "split_by_document", "split_pairs",
    "write_pairs",
]
