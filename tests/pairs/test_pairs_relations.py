"""pair_relations: each query attracts its document; pairs of one document ignore each other, whatever else holds."""

import numpy as np

import uform
from uform.pairs import pair_relations
from uform.training import pair_targets


def test_pairs_attract_their_partners_and_pairs_of_one_document_ignore_each_other():
    documents = ["a cat", "a dog", "a cat", "a bird", "a cat"]
    relations = pair_relations(documents, weights=[1, 2, 3, 4, 5])
    sign, weight = pair_targets(relations, 10, uform.Negatives.AMBIENT, 1.0)
    n = len(documents)
    label = np.array([0, 1, 0, 2, 0] * 2)
    pair = np.arange(2 * n) % n
    for i in range(2 * n):
        for j in range(2 * n):
            if i == j:
                continue
            if pair[i] == pair[j]:
                assert sign[i, j] == 1 and weight[i, j] == [1, 2, 3, 4, 5][pair[i]]
            elif label[i] == label[j]:
                assert sign[i, j] == 0
            else:
                assert sign[i, j] == -1


def test_distinct_documents_need_no_ignore_edges():
    relations = pair_relations(["x", "y", "z"])
    assert relations.ignore is None
    assert list(relations.attract.ids) == [3, 4, 5, 0, 1, 2]
