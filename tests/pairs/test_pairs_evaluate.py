"""recall@1, the bag-of-bytes baseline, and the held-out split."""

import numpy as np
import pytest

from uform.pairs import (BIGRAM_DIMENSIONS, Pair, bag_of_bytes_embeddings, bm25_scores, recall_at_1, retrieval_metrics,
                         split_by_document, split_pairs)


def test_identity_embeddings_recall_everything():
    x = np.random.default_rng(0).normal(size=(64, 16))
    assert recall_at_1(x, x) == 1.0
    assert recall_at_1(np.eye(10), 3.0 * np.eye(10)) == 1.0  # cosine: scale does not matter
    assert recall_at_1(np.ones((1, 4)), np.ones((1, 4))) == 1.0


def test_mismatched_orthogonal_embeddings_recall_nothing():
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(128, 128)))
    shifted = np.roll(q, 1, axis=0)  # every query's best match is its own row, now one row down
    assert recall_at_1(q, shifted) < 0.1
    other, _ = np.linalg.qr(np.random.default_rng(2).normal(size=(128, 128)))
    assert recall_at_1(q, other) < 0.1


def test_ties_are_misses():
    assert recall_at_1(np.ones((5, 3)), np.ones((5, 3))) == 0.0
    assert recall_at_1(np.zeros((4, 3)), np.zeros((4, 3))) == 0.0
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    d = np.array([[1.0, 0.0], [1.0, 0.0]])  # query 0 ties between documents 0 and 1
    assert recall_at_1(q, d) == 0.0


def test_recall_refuses_bad_shapes():
    with pytest.raises(ValueError, match="same shape"):
        recall_at_1(np.eye(3), np.eye(4))
    with pytest.raises(ValueError, match="2-D"):
        recall_at_1(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="non-finite"):
        recall_at_1(np.full((2, 2), np.nan), np.eye(2))


def test_bag_of_bytes_shape_and_norm():
    e = bag_of_bytes_embeddings(["hello world", b"ab", "a", ""])
    assert e.shape == (4, BIGRAM_DIMENSIONS) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e[:2], axis=1), 1.0, rtol=1e-6)
    assert not e[2].any() and not e[3].any()  # no bigram
    assert np.count_nonzero(e[1]) == 1
    np.testing.assert_array_equal(bag_of_bytes_embeddings(["hello world"])[0], e[0])


def test_split_is_deterministic_and_partitions():
    items = list(range(101))
    train, held = split_pairs(items, 0.2, seed=7)
    assert len(held) == 20 and sorted(train + held) == items
    assert train == sorted(train) and held == sorted(held)  # input order kept
    assert split_pairs(items, 0.2, seed=7) == (train, held)
    assert split_pairs(items, 0.2, seed=8)[1] != held
    assert split_pairs(items, 0.0, seed=7) == (items, [])
    assert split_pairs(items, 1.0, seed=7) == ([], items)
    with pytest.raises(ValueError, match="held_out_fraction"):
        split_pairs(items, 1.5, seed=0)


def test_bag_of_bytes_baseline_on_held_out_standard_library_pairs(standard_library_pairs):
    pairs = standard_library_pairs
    _, held = split_pairs(pairs, 500 / len(pairs), seed=0)
    assert len(held) == 500
    recall = recall_at_1(bag_of_bytes_embeddings([p.query for p in held]),
                         bag_of_bytes_embeddings([p.document for p in held]))
    print(f"\nbag-of-bytes recall@1 on {len(held)} held-out standard-library pairs: {recall:.3f}")
    assert 0.0 < recall < 1.0


def test_retrieval_metrics_rank_ties_against_the_correct_document():
    rng = np.random.default_rng(3)
    queries = rng.normal(size=(40, 6))
    documents = queries + 0.8 * rng.normal(size=(40, 6))
    metrics = retrieval_metrics(queries, documents)
    assert metrics["recall_at_1"] == recall_at_1(queries, documents)
    similarity = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ \
        (documents / np.linalg.norm(documents, axis=1, keepdims=True)).T
    ranks = 1 + np.array([np.sum(np.delete(row, i) >= row[i]) for i, row in enumerate(similarity)])
    assert metrics["mrr"] == pytest.approx(np.mean(1 / ranks))
    assert metrics["recall_at_10"] == pytest.approx(np.mean(ranks <= 10))
    assert metrics["recall_at_5"] == pytest.approx(np.mean(ranks <= 5))
    constant = retrieval_metrics(scores=np.ones((5, 5)))
    assert constant == {"recall_at_1": 0.0, "recall_at_5": 1.0, "recall_at_10": 1.0, "mrr": pytest.approx(1 / 5),
                        "ndcg_at_10": pytest.approx(1 / np.log2(6))}


def test_ndcg_at_10_is_scikit_learns_for_one_relevant_document():
    """With one relevant document a query and no ties, nDCG@10 is scikit-learn's ndcg_score at k=10."""
    from sklearn.metrics import ndcg_score

    rng = np.random.default_rng(9)
    scores = rng.normal(size=(30, 40))
    truth = rng.integers(0, 40, 30)
    relevance = np.zeros_like(scores)
    relevance[np.arange(30), truth] = 1
    assert retrieval_metrics(scores=scores, truth=truth)["ndcg_at_10"] == pytest.approx(
        ndcg_score(relevance, scores, k=10), rel=1e-12)


def test_bm25_finds_the_document_sharing_words():
    scores = bm25_scores(["red panda eats", "boiling water", "?"], ["water boils", "a panda", "the capital"])
    assert np.argmax(scores[0]) == 1 and np.argmax(scores[1]) == 0 and not scores[2].any()


def test_split_by_document_holds_out_every_pair_of_a_document():
    pairs = [Pair(query=f"q{i}", document=f"d{i % 7}") for i in range(50)]
    train, held = split_by_document(pairs, 3, seed=5)
    assert len(held) == 3 and len({p.document for p in held}) == 3
    assert not {p.document for p in held} & {p.document for p in train}
    assert len(train) == 50 - sum(p.document in {h.document for h in held} for p in pairs)
    assert split_by_document(pairs, 3, seed=5) == (train, held)


def test_retrieval_metrics_refuse_a_truth_outside_the_documents():
    with pytest.raises(ValueError, match="a document index per query"):
        retrieval_metrics(np.eye(3), np.eye(3), truth=[0, 1, 3])
    with pytest.raises(ValueError, match="a document index per query"):
        retrieval_metrics(scores=np.zeros((0, 4)))
    with pytest.raises(ValueError, match="same width"):
        retrieval_metrics(np.eye(3), np.eye(4))
