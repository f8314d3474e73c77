"""Edge sets: conversion, every check_relations refusal, and the resolution order of pair_targets."""

import numpy as np
import pytest

from uform.training import Edges, ErrorCode, Negatives, Relations, UFormError, check_relations, pair_targets


def csr(runs):
    """Offsets and ids from one list of ids per item."""
    offsets = np.concatenate([[0], np.cumsum([len(run) for run in runs])])
    return offsets, [i for run in runs for i in run]


def test_edges_store_the_abi_dtypes():
    edges = Edges(offsets=[0, 1, 2], ids=[1, 0], weights=[0.5, 2])
    assert edges.offsets.dtype == np.uint64 and edges.ids.dtype == np.uint32 and edges.weights.dtype == np.float32
    assert Edges().offsets.size == 0 and Edges().ids.size == 0 and Edges().weights is None
    assert Edges(offsets=[0, 0], ids=[], weights=[]).weights is None


def test_edges_borrow_arrays_already_of_their_dtype():
    ids = np.array([1, 0], np.uint32)
    assert Edges(offsets=[0, 1, 2], ids=ids).ids is ids


def test_relations_take_tuples():
    relations = Relations(attract=([0, 1, 2], [1, 0]), repel=([0, 1, 2], [1, 0], [2.0, 3.0]))
    assert isinstance(relations.attract, Edges) and relations.attract.weights is None
    assert relations.repel.weights.tolist() == [2.0, 3.0]
    assert relations.ignore is None


@pytest.mark.parametrize("build, code, field", [
    (lambda: Edges(offsets=[0, 1], ids=[-1]), ErrorCode.INVALID_ARGUMENT, "Edges.ids"),
    (lambda: Edges(offsets=[0, 1], ids=[1.5]), ErrorCode.INVALID_ARGUMENT, "Edges.ids"),
    (lambda: Edges(offsets=[0, 1], ids=[2 ** 32]), ErrorCode.INVALID_ARGUMENT, "Edges.ids"),
    (lambda: Edges(offsets=[[0, 1]], ids=[1]), ErrorCode.SHAPE_MISMATCH, "Edges.offsets"),
    (lambda: Edges(offsets=[0, 1], ids=[1], weights=["x"]), ErrorCode.INVALID_ARGUMENT, "Edges.weights"),
    (lambda: Relations(attract=[0, 1, 2, 3]), ErrorCode.INVALID_ARGUMENT, "Relations.attract"),
    (lambda: Relations(repel="edges"), ErrorCode.INVALID_ARGUMENT, "Relations.repel"),
])
def test_constructors_refuse_unholdable_arrays(build, code, field):
    with pytest.raises(UFormError) as error:
        build()
    assert error.value.code == code
    assert str(error.value).startswith(f"{field}:")


def test_valid_relations_pass():
    offsets, ids = csr([[1, 3], [0], [], [0, 1]])
    check_relations(None, 4)
    check_relations(Relations(), 4)
    check_relations(Relations(attract=Edges()), 4)
    check_relations(Relations(attract=(offsets, ids), repel=(offsets, ids, np.ones(len(ids))),
                              ignore=([0, 0, 0, 0, 0], [])), 4, max_edges_per_device=5)


def refusal(relations, item_count=4, max_edges=None):
    with pytest.raises(UFormError) as error:
        check_relations(relations, item_count, max_edges)
    return error.value


@pytest.mark.parametrize("name", ["attract", "repel", "ignore"])
def test_every_set_is_checked_and_named(name):
    error = refusal(Relations(**{name: ([0, 1, 2], [1, 0])}))
    assert error.code == ErrorCode.SHAPE_MISMATCH
    assert str(error) == f"relations.{name}: 3 offsets for 4 items, expected 5"


@pytest.mark.parametrize("edges, code, message", [
    (([], [1]), ErrorCode.SHAPE_MISMATCH, "relations.attract: 1 ids but no offsets"),
    (([1, 1, 1, 1, 1], [0]), ErrorCode.INVALID_ARGUMENT, "relations.attract: offsets must start at 0, got 1"),
    (([0, 2, 1, 2, 2], [1, 2]), ErrorCode.INVALID_ARGUMENT,
     "relations.attract: item 1: offsets decrease from 2 to 1"),
    (([0, 1, 1, 1, 1], [1, 2]), ErrorCode.SHAPE_MISMATCH, "relations.attract: offsets end at 1 but 2 ids are given"),
    (([0, 1, 1, 2, 2], [1, 4]), ErrorCode.INVALID_ARGUMENT,
     "relations.attract: item 2 links to id 4, past the step's 4 items"),
    (([0, 1, 2, 2, 2], [1, 1]), ErrorCode.INVALID_ARGUMENT,
     "relations.attract: item 1 links to itself (the diagonal is always skipped)"),
    (([0, 0, 0, 0, 2], [2, 0]), ErrorCode.INVALID_ARGUMENT,
     "relations.attract: item 3 lists ids [2, 0] out of strictly ascending order"),
    (([0, 0, 2, 2, 2], [3, 3]), ErrorCode.INVALID_ARGUMENT,
     "relations.attract: item 1 lists ids [3, 3] out of strictly ascending order"),
    (([0, 1, 2, 2, 2], [1, 0], [1.0]), ErrorCode.SHAPE_MISMATCH, "relations.attract: 1 weights for 2 ids"),
    (([0, 1, 2, 2, 2], [1, 0], [1.0, -2.0]), ErrorCode.INVALID_ARGUMENT,
     "relations.attract: item 1's edge to 0 weighs -2.0, not a finite non-negative number"),
    (([0, 1, 2, 2, 2], [1, 0], [np.nan, 1.0]), ErrorCode.INVALID_ARGUMENT,
     "relations.attract: item 0's edge to 1 weighs nan, not a finite non-negative number"),
])
def test_check_relations_names_the_set_and_the_item(edges, code, message):
    error = refusal(Relations(attract=edges))
    assert error.code == code
    assert str(error) == message


def test_the_brief_example_message():
    offsets, ids = csr([[1], [], [], [5, 2], [], []])
    assert str(refusal(Relations(attract=(offsets, ids)), item_count=6)) == (
        "relations.attract: item 3 lists ids [5, 2] out of strictly ascending order")


def test_ascending_order_restarts_at_every_item():
    offsets, ids = csr([[3], [0, 2], [0], [1, 2]])
    check_relations(Relations(repel=(offsets, ids)), 4)


def test_ignore_weights_are_not_read():
    check_relations(Relations(ignore=([0, 1, 1, 1, 1], [1], [-5.0, 7.0])), 4)


def test_edge_capacity_is_per_set():
    offsets, ids = csr([[1, 2], [0], [], []])
    relations = Relations(attract=(offsets, ids), repel=(offsets, ids))
    check_relations(relations, 4, max_edges_per_device=3)
    error = refusal(relations, max_edges=2)
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert str(error) == "relations.attract: 3 edges exceed max_edges_per_device 2"


def test_pair_targets_resolve_in_priority_order():
    relations = Relations(
        attract=csr([[1, 2], [], [], []]) + ([4.0, 5.0],),
        repel=csr([[1, 2, 3], [], [], [0]]) + ([6.0, 7.0, 8.0, 9.0],),
        ignore=csr([[2], [], [], []]),
    )
    sign, weight = pair_targets(relations, 4, Negatives.AMBIENT, 0.5)
    assert sign.dtype == np.float32 and weight.dtype == np.float32
    assert (sign[0, 1], weight[0, 1]) == (1, 4)        # attract outranks repel
    assert (sign[0, 2], weight[0, 2]) == (0, 0)        # ignore outranks attract and repel
    assert (sign[0, 3], weight[0, 3]) == (-1, 8)       # repel alone
    assert (sign[3, 0], weight[3, 0]) == (-1, 9)       # edges are directed: row 3 is its own
    assert (sign[1, 0], weight[1, 0]) == (-1, 0.5)     # no edge: ambient negative
    assert np.all(np.diag(sign) == 0) and np.all(np.diag(weight) == 0)

    sign, weight = pair_targets(relations, 4, Negatives.NAMED, 0.5)
    assert (sign[1, 0], weight[1, 0]) == (0, 0)        # no edge: skipped
    assert (sign[0, 1], sign[0, 2], sign[0, 3]) == (1, 0, -1)


def reference_targets(relations, n, negatives, ambient):
    """Per pair, the first rule that applies, written as plainly as the seed states it."""
    def named(edges):
        if edges is None:
            return {}
        found = {}
        for item in range(n):
            for k in range(int(edges.offsets[item]), int(edges.offsets[item + 1])):
                found[item, int(edges.ids[k])] = 1.0 if edges.weights is None else float(edges.weights[k])
        return found if edges.offsets.size else {}

    ignore, attract, repel = named(relations.ignore), named(relations.attract), named(relations.repel)
    sign, weight = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i == j or (i, j) in ignore:
                continue
            if (i, j) in attract:
                sign[i, j], weight[i, j] = 1, attract[i, j]
            elif (i, j) in repel:
                sign[i, j], weight[i, j] = -1, repel[i, j]
            elif negatives == Negatives.AMBIENT:
                sign[i, j], weight[i, j] = -1, ambient
    return sign, weight


def random_edges(rng, n, density, weighted):
    runs = [sorted(j for j in range(n) if j != i and rng.random() < density) for i in range(n)]
    offsets, ids = csr(runs)
    return Edges(offsets=offsets, ids=ids, weights=rng.random(len(ids)) * 3 if weighted else None)


@pytest.mark.parametrize("seed", range(6))
def test_pair_targets_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    relations = Relations(attract=random_edges(rng, n, 0.3, seed % 2 == 0), repel=random_edges(rng, n, 0.4, True),
                          ignore=random_edges(rng, n, 0.2, False))
    check_relations(relations, n)
    for negatives in Negatives:
        sign, weight = pair_targets(relations, n, negatives, 0.25)
        expected_sign, expected_weight = reference_targets(relations, n, negatives, 0.25)
        np.testing.assert_array_equal(sign, expected_sign)
        np.testing.assert_allclose(weight, expected_weight, rtol=1e-6)


def test_pair_targets_without_relations_follow_the_negatives():
    off_diagonal = 1 - np.eye(3)
    sign, weight = pair_targets(None, 3, Negatives.AMBIENT, 2.0)
    np.testing.assert_array_equal(sign, -off_diagonal)
    np.testing.assert_array_equal(weight, 2 * off_diagonal)
    sign, weight = pair_targets(None, 3, Negatives.NAMED, 2.0)
    assert not sign.any() and not weight.any()
