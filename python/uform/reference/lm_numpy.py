"""Float64 numpy reference of the language model: forward, backward and AdamW.

The engine's GPU kernels are checked against these functions. Shapes below use
B = batch, T = length, W = width, H = heads, K = kv_heads, G = H // K,
d = head_dim, V = vocab_size.

Forward, for ids of shape (B, T + 1): inputs = ids[:, :T], targets = ids[:, 1:].

    h = embedding[inputs]                                        (B, T, W)
    per layer:
      a = rmsnorm(h) * attention_norm,  rmsnorm(x) = x / sqrt(mean(x²) + norm_eps)
      q, k, v = a @ wq, a @ wk, a @ wv, split into H, K, K heads of width d
      q, k = rope(q), rope(k)
      o_h = softmax(q_h k_gᵀ / sqrt(d) + causal mask) v_g,  g = h // G
      h = h + concat_h(o_h) @ wo
      m = rmsnorm(h) * mlp_norm
      h = h + silu(m @ w_up) @ w_down,  silu(x) = x * sigmoid(x)
    logits = h @ head                                             (B, T, V)
    loss = mean over the B*T positions of logsumexp(logits) - logits[target]

rope ("half split", NeoX): for position t and pair i in [0, d/2), with
angle = t * rope_base^(-2i/d) and x1 = x[i], x2 = x[i + d/2]:
x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. Its backward is the same
rotation by -angle.
"""

from __future__ import annotations

import numpy as np

from ..lm.config import LanguageModelConfig, _config, split_parameters
from ..nn.transformer import LAYER_TENSORS


def _check_ids(ids, vocab_size: int) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be a 2-D integer array, got dtype {ids.dtype} and shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"ids must lie in [0, {vocab_size}), got values in [{ids.min()}, {ids.max()}]")
    return ids.astype(np.int64)


def _weights(flat_params, c: LanguageModelConfig) -> dict[str, np.ndarray]:
    return split_parameters(np.asarray(flat_params, dtype=np.float64), c)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


def _rmsnorm(x: np.ndarray, gain: np.ndarray, eps: float):
    """y = x * r * gain with r = 1 / sqrt(mean(x²) + eps); returns y and (n = x * r, r)."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    n = x * r
    return n * gain, (n, r)


def _rmsnorm_backward(dy: np.ndarray, gain: np.ndarray, cache):
    """dx = r * (dn - n * mean(dn * n)) with dn = dy * gain; dgain = Σ dy * n."""
    n, r = cache
    dn = dy * gain
    dx = r * (dn - n * np.mean(dn * n, axis=-1, keepdims=True))
    return dx, np.einsum("btw,btw->w", dy, n)


def _rope_tables(length: int, head_dim: int, base: float):
    freq = base ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    angle = np.arange(length)[:, None] * freq[None, :]
    return np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]      # (T, 1, d/2)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Half-split rotary rotation of x (B, T, heads, d); sin -> -sin inverts it."""
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _attention(a, w, c: LanguageModelConfig, rope):
    """Grouped-query causal attention of the normalised input a (B, T, W)."""
    B, T, _ = a.shape
    K, G, d = c.kv_heads, c.heads // c.kv_heads, c.head_dim
    cos, sin = rope
    q = _rotate((a @ w["wq"]).reshape(B, T, c.heads, d), cos, sin)
    k = _rotate((a @ w["wk"]).reshape(B, T, K, d), cos, sin)
    v = (a @ w["wv"]).reshape(B, T, K, d)
    # Query head h = g_kv * G + j reads kv head g_kv: group queries as (B, K, G, T, d).
    qg = q.reshape(B, T, K, G, d).transpose(0, 2, 3, 1, 4)
    kg = k.transpose(0, 2, 1, 3)[:, :, None]                         # (B, K, 1, T, d)
    vg = v.transpose(0, 2, 1, 3)[:, :, None]
    scores = (qg @ kg.swapaxes(-1, -2)) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    o = (p @ vg).transpose(0, 3, 1, 2, 4).reshape(B, T, c.heads * d)
    return o @ w["wo"], (a, qg, kg, vg, p, o)


def _attention_backward(dy, w, c: LanguageModelConfig, rope, cache, grads):
    """Adds d(wq, wk, wv, wo) to grads and returns d(a)."""
    a, qg, kg, vg, p, o = cache
    B, T, _ = dy.shape
    K, G, d = c.kv_heads, c.heads // c.kv_heads, c.head_dim
    cos, sin = rope
    grads["wo"] += np.einsum("bti,btj->ij", o, dy)
    do = (dy @ w["wo"].T).reshape(B, T, K, G, d).transpose(0, 2, 3, 1, 4)
    dv = (p.swapaxes(-1, -2) @ do).sum(axis=2)                       # (B, K, T, d)
    dp = do @ vg.swapaxes(-1, -2)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) / np.sqrt(d)
    dq = (ds @ kg).transpose(0, 3, 1, 2, 4).reshape(B, T, c.heads, d)
    dk = (ds.swapaxes(-1, -2) @ qg).sum(axis=2).transpose(0, 2, 1, 3)
    dq = _rotate(dq, cos, -sin).reshape(B, T, -1)
    dk = _rotate(dk, cos, -sin).reshape(B, T, -1)
    dv = dv.transpose(0, 2, 1, 3).reshape(B, T, -1)
    for name, dz in (("wq", dq), ("wk", dk), ("wv", dv)):
        grads[name] += np.einsum("bti,btj->ij", a, dz)
    return dq @ w["wq"].T + dk @ w["wk"].T + dv @ w["wv"].T


def _forward(P: dict, inputs: np.ndarray, c: LanguageModelConfig):
    """Final hidden state (B, T, W) and the per-layer caches the backward needs."""
    rope = _rope_tables(inputs.shape[1], c.head_dim, c.rope_base)
    h = P["embedding"][inputs]
    caches = []
    for i in range(c.layers):
        w = {n: P[f"layers.{i}.{n}"] for n in LAYER_TENSORS}
        a, norm1 = _rmsnorm(h, w["attention_norm"], c.norm_eps)
        out, attention = _attention(a, w, c, rope)
        h = h + out
        m, norm2 = _rmsnorm(h, w["mlp_norm"], c.norm_eps)
        u = m @ w["w_up"]
        s = u * _sigmoid(u)
        h = h + s @ w["w_down"]
        caches.append((norm1, attention, norm2, m, u, s))
    return h, (rope, caches)


def _split_ids(ids, c: LanguageModelConfig):
    ids = _check_ids(ids, c.vocab_size)
    if ids.shape != (c.batch, c.length + 1):
        raise ValueError(f"ids must have shape (batch, length + 1) = {(c.batch, c.length + 1)}, got {ids.shape}")
    return ids[:, :-1], ids[:, 1:]


def _cross_entropy(logits: np.ndarray, targets: np.ndarray):
    """Mean cross-entropy and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    logp = shifted - lse
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)
    onehot = np.arange(logits.shape[-1]) == targets[..., None]
    return -picked.mean(), (np.exp(logp) - onehot) / targets.size


def loss(flat_params, ids, shape: LanguageModelConfig | None = None) -> float:
    """Mean next-token cross-entropy of ids (shape.batch, shape.length + 1)."""
    c = _config(shape)
    inputs, targets = _split_ids(ids, c)
    P = _weights(flat_params, c)
    h, _ = _forward(P, inputs, c)
    return float(_cross_entropy(h @ P["head"], targets)[0])


def loss_and_gradients(flat_params, ids, shape: LanguageModelConfig | None = None):
    """Loss and its gradient with respect to the flat parameters (float64).

    ids has shape (shape.batch, shape.length + 1); the loss averages the
    batch * length next-token cross-entropies. The gradient is laid out like
    the parameters (see :func:`parameter_registry`).
    """
    c = _config(shape)
    inputs, targets = _split_ids(ids, c)
    P = _weights(flat_params, c)
    h, (rope, caches) = _forward(P, inputs, c)
    value, dlogits = _cross_entropy(h @ P["head"], targets)

    flat_grad = np.zeros(c.n_total, dtype=np.float64)
    D = split_parameters(flat_grad, c)
    D["head"] += np.einsum("btw,btv->wv", h, dlogits)
    dh = dlogits @ P["head"].T
    for i in reversed(range(c.layers)):
        w = {n: P[f"layers.{i}.{n}"] for n in LAYER_TENSORS}
        g = {n: D[f"layers.{i}.{n}"] for n in LAYER_TENSORS}
        norm1, attention, norm2, m, u, s = caches[i]
        # MLP: h += silu(u) @ w_down, u = m @ w_up, silu'(u) = σ(u) (1 + u (1 - σ(u))).
        g["w_down"] += np.einsum("btk,btw->kw", s, dh)
        sig = _sigmoid(u)
        du = (dh @ w["w_down"].T) * sig * (1 + u * (1 - sig))
        g["w_up"] += np.einsum("btw,btk->wk", m, du)
        dx, dgain = _rmsnorm_backward(du @ w["w_up"].T, w["mlp_norm"], norm2)
        g["mlp_norm"] += dgain
        dh = dh + dx
        # Attention: h += attention(rmsnorm(h) * attention_norm).
        da = _attention_backward(dh, w, c, rope, attention, g)
        dx, dgain = _rmsnorm_backward(da, w["attention_norm"], norm1)
        g["attention_norm"] += dgain
        dh = dh + dx
    np.add.at(D["embedding"], inputs.reshape(-1), dh.reshape(-1, c.width))
    return float(value), flat_grad


def logits(flat_params, ids, shape: LanguageModelConfig | None = None, lengths=None) -> np.ndarray:
    """Float64 logits (batch, length, vocab_size) for every position of ids.

    ids has shape (batch, length) with 1 <= length <= shape.length; the forward
    starts at position 0 of each row. With ``lengths``, row i is real at
    positions [0, lengths[i]) and its logits there are those of the row alone
    at that length; padding positions are +0.0.
    """
    c = _config(shape)
    ids = _check_ids(ids, c.vocab_size)
    B, T = ids.shape
    if B < 1 or not 1 <= T <= c.length:
        raise ValueError(f"ids must have shape (batch >= 1, length in [1, {c.length}]), got {ids.shape}")
    if lengths is None:
        lengths = np.full(B, T)
    else:
        lengths = np.asarray(lengths)
        if lengths.shape != (B,) or not np.issubdtype(lengths.dtype, np.integer):
            raise ValueError(f"lengths must be {B} integers, got {lengths!r}")
        if lengths.min() < 1 or lengths.max() > T:
            raise ValueError(f"lengths must lie in [1, {T}], got {lengths.tolist()}")
    P = _weights(flat_params, c)
    out = np.zeros((B, T, c.vocab_size), dtype=np.float64)
    for n in np.unique(lengths):
        rows = np.flatnonzero(lengths == n)
        h, _ = _forward(P, ids[rows, :n], c)
        out[rows, :n] = h @ P["head"]
    return out


def adamw_step(params, grads, m, v, step: int, lr: float, betas=(0.9, 0.999),
               eps: float = 1e-8, weight_decay: float = 0.01):
    """One AdamW update in float64, with PyTorch's semantics; returns (params, m, v).

    ``step`` is the 1-based index t of this update. Decay applies to every
    parameter:

        p <- p - lr * weight_decay * p
        m <- b1 m + (1 - b1) g
        v <- b2 v + (1 - b2) g²
        p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

    The inputs are not modified.
    """
    if int(step) < 1:
        raise ValueError(f"step is the 1-based update index, got {step}")
    b1, b2 = betas
    p, g = np.asarray(params, np.float64), np.asarray(grads, np.float64)
    m = b1 * np.asarray(m, np.float64) + (1 - b1) * g
    v = b2 * np.asarray(v, np.float64) + (1 - b2) * g * g
    p = p - lr * weight_decay * p
    p = p - lr * (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps)
    return p, m, v
