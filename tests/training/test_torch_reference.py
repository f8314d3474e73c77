"""The PyTorch reference of docs/encoder.md: pair targets and each form's closed form by hand, float64
gradients against finite differences, matryoshka widths, temperature groups and packing invariance."""

import math

import numpy as np
import pytest

from uform.training import Negatives, Objective, PairLossForm, Relations, pack_items, pair_targets
from uform.nn.resident import named_tensors as split
from uform.nn.resident import registry_size
from uform.reference.encoder_torch import encode, encoder_registry, pair_loss, pair_scores, step_loss
from uform.training.vocabulary import MASK, PAD, VOCABULARY_SIZE

torch = pytest.importorskip("torch")


def sp(x):
    """softplus, by hand."""
    return math.log1p(math.exp(x))


def loss_of(z, sign, weight, form):
    return float(pair_loss(torch, torch.tensor(z, dtype=torch.float64), sign, weight, form))


# A fixed, asymmetric score matrix of 4 items; the diagonal is never read.
Z = np.array([[9.0, 0.7, -0.4, 1.3],
              [0.2, 9.0, -1.1, 0.5],
              [-0.6, 0.9, 9.0, -0.3],
              [1.5, -0.8, 0.4, 9.0]])


def symmetric_pair(n, i, j, weights=None):
    """Edges pairing items i < j both ways, as (offsets, ids[, weights])."""
    counts = np.zeros(n, np.int64)
    counts[[i, j]] = 1
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return (offsets, [j, i]) if weights is None else (offsets, [j, i], weights)


# ---------------------------------------------------------------------------------------------- pair targets

def test_sigmoid_one_attract_pair_with_ambient_repulsion():
    z = Z[:3, :3]
    a = 0.25
    sign, weight = pair_targets(Relations(attract=symmetric_pair(3, 0, 1)), 3, Negatives.AMBIENT, a)
    expected = (sp(-z[0, 1]) + sp(-z[1, 0])
                + a * (sp(z[0, 2]) + sp(z[1, 2]) + sp(z[2, 0]) + sp(z[2, 1]))) / 3
    assert loss_of(z, sign, weight, "sigmoid") == pytest.approx(expected, rel=1e-14)
    # DERIVED is the sigmoid form for pooled embeddings, and the enum is taken as well as the name.
    assert loss_of(z, sign, weight, PairLossForm.DERIVED) == pytest.approx(expected, rel=1e-14)
    assert loss_of(z, sign, weight, PairLossForm.SIGMOID) == pytest.approx(expected, rel=1e-14)


def test_balanced_normalises_each_half_by_its_weight():
    z = Z[:3, :3]
    a = 0.25
    sign, weight = pair_targets(Relations(attract=symmetric_pair(3, 0, 1, [2.0, 0.5])), 3, Negatives.AMBIENT, a)
    pulled = (2.0 * sp(-z[0, 1]) + 0.5 * sp(-z[1, 0])) / 2.5
    pushed = (sp(z[0, 2]) + sp(z[1, 2]) + sp(z[2, 0]) + sp(z[2, 1])) / 4  # a·Σ / 4a
    assert loss_of(z, sign, weight, "balanced") == pytest.approx(pulled + pushed, rel=1e-14)
    # The ambient weight cancels in the repel half.
    sign2, weight2 = pair_targets(Relations(attract=symmetric_pair(3, 0, 1, [2.0, 0.5])), 3, Negatives.AMBIENT, 7.0)
    assert loss_of(z, sign2, weight2, "balanced") == pytest.approx(pulled + pushed, rel=1e-14)


def test_balanced_half_with_no_pairs_contributes_zero():
    z = Z[:3, :3]
    sign, weight = pair_targets(Relations(attract=symmetric_pair(3, 0, 1)), 3, Negatives.NAMED, 1.0)
    assert loss_of(z, sign, weight, "balanced") == pytest.approx((sp(-z[0, 1]) + sp(-z[1, 0])) / 2, rel=1e-14)
    sign, weight = pair_targets(Relations(repel=symmetric_pair(3, 1, 2)), 3, Negatives.NAMED, 1.0)
    assert loss_of(z, sign, weight, "balanced") == pytest.approx((sp(z[1, 2]) + sp(z[2, 1])) / 2, rel=1e-14)
    sign, weight = pair_targets(None, 3, Negatives.NAMED, 1.0)
    assert loss_of(z, sign, weight, "balanced") == 0.0


def test_ranked_closed_form_and_bias_cancellation():
    # Items 0 and 1 attract (weights 2 and 1), every other pair ambient at weight 0.5.
    a = 0.5
    sign, weight = pair_targets(Relations(attract=symmetric_pair(4, 0, 1, [2.0, 1.0])), 4, Negatives.AMBIENT, a)
    z = Z
    # Row 0: positive 1 (w 2) over negatives 2, 3; row 1: positive 0 (w 1) over negatives 2, 3;
    # rows 2 and 3 have no positive.
    numerator = (2 * a * (sp(z[0, 2] - z[0, 1]) + sp(z[0, 3] - z[0, 1]))
                 + 1 * a * (sp(z[1, 2] - z[1, 0]) + sp(z[1, 3] - z[1, 0])))
    denominator = 2 * a * 2 + 1 * a * 2
    expected = numerator / denominator
    assert loss_of(z, sign, weight, "ranked") == pytest.approx(expected, rel=1e-14)
    # A constant added to every score of a row (a per-anchor bias) leaves the loss unchanged.
    shifted = z + np.array([3.0, -7.0, 11.0, 0.5])[:, None]
    assert loss_of(shifted, sign, weight, "ranked") == pytest.approx(expected, rel=1e-13)
    # Not so for the other forms.
    assert loss_of(shifted, sign, weight, "sigmoid") != pytest.approx(loss_of(z, sign, weight, "sigmoid"))
    # No positive-negative pair at all: 0.
    sign, weight = pair_targets(None, 4, Negatives.AMBIENT, a)
    assert loss_of(z, sign, weight, "ranked") == 0.0


def test_ignore_beats_attract_beats_repel_beats_ambient():
    # Anchor 0 names 1 in ignore, attract and repel; 2 in attract (w 2) and repel (w 5); 3 in repel (w 3).
    relations = Relations(
        ignore=([0, 1, 1, 1, 1], [1]),
        attract=([0, 2, 2, 2, 2], [1, 2], [4.0, 2.0]),
        repel=([0, 3, 3, 3, 3], [1, 2, 3], [6.0, 5.0, 3.0]))
    a = 0.5
    sign, weight = pair_targets(relations, 4, Negatives.AMBIENT, a)
    assert sign[0].tolist() == [0, 0, 1, -1]
    assert weight[0].tolist() == [0, 0, 2, 3]
    np.testing.assert_array_equal(sign[1:], -1 + np.eye(4)[1:])
    np.testing.assert_array_equal(weight[1:], a * (1 - np.eye(4)[1:]))
    z = Z
    ambient = sum(sp(z[i, j]) for i in range(1, 4) for j in range(4) if i != j)
    expected = (2 * sp(-z[0, 2]) + 3 * sp(z[0, 3]) + a * ambient) / 4
    assert loss_of(z, sign, weight, "sigmoid") == pytest.approx(expected, rel=1e-14)
    # The ignored pair and the diagonal are never read.
    poked = z.copy()
    poked[0, 1] = 50.0
    np.fill_diagonal(poked, -50.0)
    for form in ("sigmoid", "balanced", "ranked"):
        assert loss_of(poked, sign, weight, form) == pytest.approx(loss_of(z, sign, weight, form), rel=1e-14)


def test_named_skips_unnamed_pairs():
    relations = Relations(attract=([0, 1, 1, 1, 1], [1]), repel=([0, 1, 1, 1, 1], [2], [1.5]))
    sign, weight = pair_targets(relations, 4, Negatives.NAMED, 0.5)
    expected = (sp(-Z[0, 1]) + 1.5 * sp(Z[0, 2])) / 4  # S counts every packed segment
    assert loss_of(Z, sign, weight, "sigmoid") == pytest.approx(expected, rel=1e-14)
    assert loss_of(Z, sign, weight, "balanced") == pytest.approx(sp(-Z[0, 1]) + sp(Z[0, 2]), rel=1e-14)
    assert loss_of(Z, sign, weight, "ranked") == pytest.approx(sp(Z[0, 2] - Z[0, 1]), rel=1e-14)
    poked = Z + 10 * np.ones((4, 4))
    poked[0, 1:3] = Z[0, 1:3]
    for form in ("sigmoid", "balanced", "ranked"):
        assert loss_of(poked, sign, weight, form) == pytest.approx(loss_of(Z, sign, weight, form), rel=1e-14)


# ---------------------------------------------------------------------------------------------- the step

HIDDEN, DEPTH, ROWS, COLUMNS = 128, 1, 2, 8
TEXTS = [b"hello", b"ab", b"wxyz", b"cat"]  # rows: [hello|ab|pad], [wxyz|cat|pad]


def geometry():
    packed = pack_items(TEXTS, None, ROWS, COLUMNS, 4)
    tokens = packed.tokens.copy()
    targets = np.full_like(tokens, -1)
    for (row, column) in [(0, 1), (0, 2), (0, 6), (1, 0), (1, 5)]:  # covered positions
        targets[row, column] = tokens[row, column]
        tokens[row, column] = MASK
    tokens[1, 1] = ord("q")  # a covered position showing a random byte
    targets[1, 1] = packed.tokens[1, 1]
    return packed, tokens, targets


def random_flat(registry, seed=0, log_scale=1.0, bias=-1.0):
    rng = np.random.default_rng(seed)
    flat = torch.tensor(rng.standard_normal(registry_size(registry)) * 0.1, dtype=torch.float64)
    P = split(flat, registry)
    for name, tensor in P.items():
        if name.endswith("norm"):
            tensor += 1.0
        elif name == "temperature.log_scale":
            tensor += log_scale
        elif name == "temperature.bias":
            tensor += bias
    return flat


def relations_targets():
    """Pair targets of the 4 packed segments."""
    # 0 and 2 attract (weights 1 and 2), so do 1 and 3; 0 repels 3 (weight 1.5); the rest is ambient.
    relations = Relations(attract=([0, 1, 2, 3, 4], [2, 3, 0, 1], [1.0, 1.0, 2.0, 1.0]),
                          repel=([0, 1, 1, 1, 1], [3], [1.5]))
    return pair_targets(relations, 4, Negatives.AMBIENT, 0.5)


def run(flat, registry, objective, form="sigmoid", widths=(), groups=(0, 0, 0, 0), text_weight=0.7, packed=None,
        tokens=None, targets=None, sign=None, weight=None):
    if packed is None:
        packed, tokens, targets = geometry()
    if sign is None:
        sign, weight = relations_targets()
    return step_loss(torch, flat, registry, hidden=HIDDEN, depth=DEPTH, tokens=tokens, segments=packed.segment_ids,
                     positions=packed.positions, targets=targets, groups=np.array(groups), sign=sign,
                     weight=weight, widths=widths, form=form, objective=objective, text_weight=text_weight)


def test_registry_order_and_sizes():
    H, V = HIDDEN, VOCABULARY_SIZE
    names = [r["name"] for r in encoder_registry(H, 2, groups=3, objective="joint")]
    block = ["attention_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_up", "w_down"]
    assert names == (["embedding"] + [f"layers.{i}.{n}" for i in range(2) for n in block]
                     + ["final_norm", "masked_head", "temperature.log_scale", "temperature.bias"])
    assert "masked_head" not in [r["name"] for r in encoder_registry(H, 1, objective=Objective.CONTRASTIVE)]
    assert [r["name"] for r in encoder_registry(H, 1, objective="masked")][-1] == "masked_head"
    registry = encoder_registry(H, 1, groups=2, objective="joint")
    shapes = {r["name"]: r["shape"] for r in registry}
    assert shapes["embedding"] == (V, H) and shapes["layers.0.w_up"] == (H, 4 * H)
    assert shapes["layers.0.w_down"] == (4 * H, H) and shapes["masked_head"] == (H, V)
    assert shapes["temperature.bias"] == (2,)
    offset = 0
    for r in registry:
        assert r["offset"] == offset and r["size"] == math.prod(r["shape"])
        offset += r["size"]
    assert registry_size(registry) == 2 * V * H + 4 * H * H + 8 * H * H + 3 * H + 4
    with pytest.raises(ValueError):
        encoder_registry(64, 1)


def test_totals_and_masked_closed_form():
    registry = encoder_registry(HIDDEN, DEPTH, groups=1, objective="joint")
    flat = random_flat(registry)
    joint = run(flat, registry, "joint")
    masked = run(flat, registry, "masked")
    contrastive = run(flat, registry, "contrastive")
    assert float(joint["loss"]) == pytest.approx(0.7 * float(joint["masked"]) + float(joint["contrastive"]), 1e-14)
    assert float(masked["loss"]) == pytest.approx(0.7 * float(joint["masked"]), rel=1e-14)
    assert float(masked["contrastive"]) == 0.0 and float(contrastive["masked"]) == 0.0
    assert float(contrastive["loss"]) == pytest.approx(float(joint["contrastive"]), rel=1e-14)
    # The masked loss by hand: mean CE over the six covered positions of the final-norm states.
    packed, tokens, targets = geometry()
    P = split(flat, registry)
    y = encode(torch, P, tokens, packed.segment_ids, packed.positions, hidden=HIDDEN, depth=DEPTH)
    covered = np.argwhere(targets >= 0)
    assert len(covered) == 6
    ce = []
    for row, column in covered:
        logits = (y[row, column] @ P["masked_head"]).tolist()
        top = max(logits)
        ce.append(top + math.log(sum(math.exp(v - top) for v in logits)) - logits[targets[row, column]])
    assert float(joint["masked"]) == pytest.approx(sum(ce) / 6, rel=1e-12)
    # Pooling by hand: the mean of each segment's final-norm states.
    for s in range(4):
        row, start, length = packed.segment_row[s], packed.segment_start[s], packed.segment_length[s]
        torch.testing.assert_close(joint["pooled"][s], y[row, start:start + length].mean(dim=0), rtol=1e-13, atol=0)
    # With nothing covered it is 0, and so is its gradient.
    none = run(flat, registry, "masked", packed=packed, tokens=tokens, targets=np.full_like(targets, -1))
    assert float(none["masked"]) == 0.0
    # The contrastive part equals pair_loss over the pooled embeddings.
    sign, weight = relations_targets()
    z = pair_scores(torch, joint["pooled"], P["temperature.log_scale"], P["temperature.bias"], np.zeros(4, int), HIDDEN)
    assert float(joint["contrastive"]) == pytest.approx(float(pair_loss(torch, z, sign, weight, "sigmoid")), 1e-14)


def test_packing_and_padding_invariance():
    """Each segment alone in its own row (positions restarting at 0) pools and reconstructs the same."""
    registry = encoder_registry(HIDDEN, DEPTH, groups=1, objective="joint")
    flat = random_flat(registry)
    packed, tokens, targets = geometry()
    together = run(flat, registry, "joint", packed=packed, tokens=tokens, targets=targets)

    apart_tokens = np.full((4, COLUMNS), PAD, np.int32)
    apart_segments = np.full((4, COLUMNS), -1, np.int32)
    apart_positions = np.zeros((4, COLUMNS), np.int32)
    apart_targets = np.full((4, COLUMNS), -1, np.int64)
    for s in range(4):
        row, start, length = packed.segment_row[s], packed.segment_start[s], packed.segment_length[s]
        apart_tokens[s, :length] = tokens[row, start:start + length]
        apart_targets[s, :length] = targets[row, start:start + length]
        apart_segments[s, :length] = s
        apart_positions[s, :length] = np.arange(length)
    # Padding tokens are never seen: give them arbitrary bytes.
    apart_tokens[apart_segments < 0] = np.arange((apart_segments < 0).sum()) % 256
    sign, weight = relations_targets()
    apart = step_loss(torch, flat, registry, hidden=HIDDEN, depth=DEPTH, tokens=apart_tokens, segments=apart_segments,
                      positions=apart_positions, targets=apart_targets, groups=np.zeros(4, int), sign=sign,
                      weight=weight, widths=(), form="sigmoid", objective="joint", text_weight=0.7)
    torch.testing.assert_close(apart["pooled"], together["pooled"], rtol=1e-12, atol=1e-12)
    for key in ("masked", "contrastive", "loss"):
        assert float(apart[key]) == pytest.approx(float(together[key]), rel=1e-12)


CASES = [("masked", "sigmoid")] + [(o, f) for o in ("contrastive", "joint") for f in ("sigmoid", "balanced", "ranked")]


@pytest.mark.parametrize("objective,form", CASES)
def test_gradcheck_on_a_handful_of_parameters(objective, form):
    registry = encoder_registry(HIDDEN, DEPTH, groups=2, objective=objective)
    base = random_flat(registry, seed=3)
    packed, tokens, targets = geometry()
    rng = np.random.default_rng(4)
    used = np.unique(tokens)
    picks = []
    for r in registry:
        if r["name"] == "embedding":
            rows = rng.choice(used, 2, replace=False)
            picks += [r["offset"] + row * HIDDEN + rng.integers(HIDDEN) for row in rows]
        else:
            picks += list(r["offset"] + rng.choice(r["size"], min(2, r["size"]), replace=False))
    picks = torch.tensor(sorted(set(int(p) for p in picks)))

    def f(values):
        flat = base.index_put((picks,), values)
        return run(flat, registry, objective, form=form, widths=(64, 128), groups=(0, 1, 0, 1),
                   packed=packed, tokens=tokens, targets=targets)["loss"]

    values = base[picks].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (values,), eps=1e-6, atol=1e-7, rtol=1e-5)
    # The whole-vector gradient is finite and reaches every tensor the objective reads.
    flat = base.clone().requires_grad_(True)
    run(flat, registry, objective, form=form, widths=(64, 128), groups=(0, 1, 0, 1))["loss"].backward()
    assert torch.isfinite(flat.grad).all()
    for name, grad in split(flat.grad, registry).items():
        assert grad.abs().sum() > 0, name


def test_matryoshka_is_the_mean_over_widths():
    registry = encoder_registry(HIDDEN, DEPTH, groups=1, objective="contrastive")
    flat = random_flat(registry)
    for form in ("sigmoid", "balanced", "ranked"):
        both = float(run(flat, registry, "contrastive", form=form, widths=(64, 128))["contrastive"])
        narrow = float(run(flat, registry, "contrastive", form=form, widths=(64,))["contrastive"])
        full = float(run(flat, registry, "contrastive", form=form, widths=(128,))["contrastive"])
        default = float(run(flat, registry, "contrastive", form=form, widths=())["contrastive"])
        assert narrow != pytest.approx(full, rel=1e-6)
        assert both == pytest.approx((narrow + full) / 2, rel=1e-14)
        assert default == pytest.approx(full, rel=1e-14)


def test_temperature_groups_are_read_per_anchor():
    registry = encoder_registry(HIDDEN, DEPTH, groups=2, objective="contrastive")
    flat = random_flat(registry)
    groups = np.array([0, 1, 0, 1])
    pooled = run(flat, registry, "contrastive", groups=groups)["pooled"]
    P = split(flat, registry)
    z = pair_scores(torch, pooled, P["temperature.log_scale"], P["temperature.bias"], groups, HIDDEN)
    changed = flat.clone()
    Q = split(changed, registry)
    Q["temperature.log_scale"][1] += 0.3
    Q["temperature.bias"][1] -= 0.8
    z2 = pair_scores(torch, pooled, Q["temperature.log_scale"], Q["temperature.bias"], groups, HIDDEN)
    torch.testing.assert_close(z2[groups == 0], z[groups == 0], rtol=0, atol=0)
    assert (z2[groups == 1] != z[groups == 1]).all()
    # z of a group-1 anchor uses exactly exp(log_scale[1])·cos + bias[1].
    u = pooled / pooled.norm(dim=1, keepdim=True)
    cos = u @ u.T
    torch.testing.assert_close(z2[1], math.exp(float(Q["temperature.log_scale"][1])) * cos[1]
                               + float(Q["temperature.bias"][1]), rtol=1e-12, atol=1e-12)

    # Through the step: with only group-0 anchors' rows targeted, group 1's parameters change nothing.
    sign, weight = relations_targets()
    rows0 = (groups == 0)[:, None].astype(np.float32)
    for form in ("sigmoid", "balanced", "ranked"):
        kw = dict(groups=groups, form=form, sign=sign * rows0, weight=weight * rows0)
        assert float(run(changed, registry, "contrastive", **kw)["loss"]) == pytest.approx(
            float(run(flat, registry, "contrastive", **kw)["loss"]), rel=1e-14)
        kw = dict(groups=groups, form=form, sign=sign * (1 - rows0), weight=weight * (1 - rows0))
        assert float(run(changed, registry, "contrastive", **kw)["loss"]) != pytest.approx(
            float(run(flat, registry, "contrastive", **kw)["loss"]), rel=1e-6)
