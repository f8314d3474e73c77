"""The float64 reference: gradients against finite differences and torch autograd,
logits and AdamW against torch.optim.AdamW."""

import numpy as np
import pytest

from uform.lm import LanguageModelConfig, parameter_registry, split_parameters
from uform.reference.lm_numpy import adamw_step, logits, loss, loss_and_gradients
from uform.reference.lm_torch import torch_loss

TINY = LanguageModelConfig(batch=2, length=5, width=16, heads=4, kv_heads=2, mlp=24, vocab_size=19, layers=2)


def random_model(c, seed=0):
    """Random parameters with non-trivial norm gains, and random ids."""
    rng = np.random.default_rng(seed)
    flat = rng.standard_normal(c.n_total) * 0.4
    for name, tensor in split_parameters(flat, c).items():
        if name.endswith("norm"):
            tensor += 1.0
    return flat, rng.integers(0, c.vocab_size, (c.batch, c.length + 1))


def test_gradients_match_central_differences():
    flat, ids = random_model(TINY)
    value, grad = loss_and_gradients(flat, ids, TINY)
    assert value == pytest.approx(loss(flat, ids, TINY), rel=1e-14)
    rng = np.random.default_rng(1)
    # Up to 8 entries of every tensor, so each one's backward is exercised.
    picks = np.concatenate([r["offset"] + rng.choice(r["size"], min(8, r["size"]), replace=False)
                            for r in parameter_registry(TINY)])
    h = 1e-6
    numeric = []
    for i in picks:
        plus, minus = flat.copy(), flat.copy()
        plus[i] += h
        minus[i] -= h
        numeric.append((loss(plus, ids, TINY) - loss(minus, ids, TINY)) / (2 * h))
    np.testing.assert_allclose(grad[picks], numeric, rtol=1e-6, atol=1e-8)


def test_unused_rows_of_the_embedding_get_no_gradient():
    flat, ids = random_model(TINY)
    ids[:] = 3
    grad = split_parameters(loss_and_gradients(flat, ids, TINY)[1], TINY)["embedding"]
    assert np.all(grad[np.arange(TINY.vocab_size) != 3] == 0) and np.any(grad[3] != 0)


def test_logits_match_the_loss_and_ragged_rows():
    c = LanguageModelConfig(batch=3, length=6, width=16, heads=4, kv_heads=1, mlp=24, vocab_size=19, layers=2)
    flat, ids = random_model(c, seed=2)
    z = logits(flat, ids[:, :-1], c)
    assert z.shape == (3, 6, 19)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, ids[:, 1:, None], -1).mean()
    assert ce == pytest.approx(loss(flat, ids, c), rel=1e-13)

    ragged = logits(flat, ids[:, :-1], c, lengths=[6, 2, 4])
    for row, n in enumerate([6, 2, 4]):
        np.testing.assert_array_equal(ragged[row, :n], logits(flat, ids[row:row + 1, :n], c)[0])
        assert np.all(ragged[row, n:] == 0) and not np.any(np.signbit(ragged[row, n:]))
    with pytest.raises(ValueError, match="lengths"):
        logits(flat, ids[:, :-1], c, lengths=[0, 2, 4])
    with pytest.raises(ValueError, match="length"):
        logits(flat, np.zeros((1, 7), int), c)
    with pytest.raises(ValueError, match=r"\[0, 19\)"):
        logits(flat, np.full((1, 2), 19), c)
    with pytest.raises(ValueError, match="shape"):
        loss(flat, ids[:, :-1], c)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_gradients_match_torch_autograd(kv_heads):
    torch = pytest.importorskip("torch")
    c = LanguageModelConfig(batch=2, length=7, width=16, heads=4, kv_heads=kv_heads, mlp=24, vocab_size=19,
                            layers=2, rope_base=50.0)
    flat, ids = random_model(c, seed=kv_heads)
    value, grad = loss_and_gradients(flat, ids, c)
    t = torch.tensor(flat, dtype=torch.float64, requires_grad=True)
    expected = torch_loss(torch, t, torch.tensor(ids), c)
    expected.backward()
    assert value == pytest.approx(expected.item(), rel=1e-12)
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    hyper = dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    p = rng.standard_normal(50)
    m, v = np.zeros(50), np.zeros(50)
    t = torch.tensor(p, requires_grad=True)
    optimizer = torch.optim.AdamW([t], **hyper)
    for step in range(1, 6):
        g = rng.standard_normal(50)
        p_next, m, v = adamw_step(p, g, m, v, step, **hyper)
        assert not np.shares_memory(p_next, p)
        p = p_next
        t.grad = torch.tensor(g)
        optimizer.step()
        np.testing.assert_allclose(p, t.detach().numpy(), rtol=1e-13, atol=1e-15)
    state = optimizer.state[t]
    np.testing.assert_allclose(m, state["exp_avg"].numpy(), rtol=1e-14)
    np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=1e-14)
    with pytest.raises(ValueError, match="1-based"):
        adamw_step(p, g, m, v, 0, **hyper)
