"""The same language model written in PyTorch, for the tests (float64 autograd) and the benchmarks
(float32 on a GPU, the peer the engine is measured against). Needs torch, which uform does not."""

from __future__ import annotations

from ..lm.config import LanguageModelConfig, parameter_registry
from ..nn.resident import named_tensors


def torch_loss(torch, flat, ids, c: LanguageModelConfig):
    """Mean cross-entropy of ids (B, T+1) under the flat parameter tensor `flat`, any dtype and device.

    Built from F.rms_norm, SDPA with enable_gqa and F.cross_entropy, independently of uform.reference.lm_numpy."""
    F = torch.nn.functional
    P = named_tensors(flat, parameter_registry(c))
    x, y = ids[:, :-1], ids[:, 1:]
    B, T = x.shape
    d = c.head_dim
    angle = torch.arange(T, dtype=torch.float64, device=flat.device)[:, None] * c.rope_base ** (
        -torch.arange(0, d, 2, dtype=torch.float64, device=flat.device) / d)
    cos, sin = angle.cos().to(flat.dtype), angle.sin().to(flat.dtype)

    def rope(t):
        t1, t2 = t[..., :d // 2], t[..., d // 2:]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

    h = P["embedding"][x]
    for i in range(c.layers):
        w = lambda name: P[f"layers.{i}.{name}"]  # noqa: E731
        a = F.rms_norm(h, (c.width,), w("attention_norm"), c.norm_eps)
        q = (a @ w("wq")).view(B, T, c.heads, d).transpose(1, 2)
        k = (a @ w("wk")).view(B, T, c.kv_heads, d).transpose(1, 2)
        v = (a @ w("wv")).view(B, T, c.kv_heads, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, enable_gqa=True)
        h = h + o.transpose(1, 2).reshape(B, T, -1) @ w("wo")
        m = F.rms_norm(h, (c.width,), w("mlp_norm"), c.norm_eps)
        h = h + F.silu(m @ w("w_up")) @ w("w_down")
    return F.cross_entropy((h @ P["head"]).reshape(-1, c.vocab_size), y.reshape(-1))
