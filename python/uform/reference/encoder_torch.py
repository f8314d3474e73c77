"""The encoder of ``docs/encoder.md`` and its losses written in PyTorch, for the tests (float64
autograd) and as the peer the engine is measured against. Needs torch, which uform does not.

Independent of the engine: dense masks, plain autograd, any dtype and device. The parameter order is
:func:`encoder_registry`'s, the pair-loss forms are :func:`pair_loss`'s and the scores it reads are
:func:`pair_scores`'s; :func:`step_loss` joins them into one step's loss.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from ..kernels import NORM_EPSILON
from ..nn.resident import named_tensors
from ..training.encoder import EncoderGeometry, encoder_registry as engine_registry
from ..training.enums import Objective


HEAD_DIM = 64
"""Every attention head is 64 wide; ``hidden / 64`` heads."""
EPSILON_POOL = NORM_EPSILON
"""Added to the squared norm of a pooled prefix before its square root: the engine's constant."""
FORMS = ("sigmoid", "balanced", "ranked")
OBJECTIVES = ("masked", "contrastive", "joint")


def _name(value, choices, what):
    """``value`` (a str or an enum member, any case) as one of ``choices``; ``derived`` is ``sigmoid``."""
    name = (value.name if isinstance(value, Enum) else str(value)).lower()
    if what == "form" and name == "derived":
        name = "sigmoid"
    if name not in choices:
        raise ValueError(f"{what}: expected one of {choices}, got {value!r}")
    return name


def encoder_registry(hidden: int, depth: int, groups: int = 1, objective="joint", media=()) -> list[dict]:
    """The engine's flat parameter order (``uform.training.encoder.encoder_registry``), with the objective
    also given by name; the tests pin it against ``docs/encoder.md``. ``media``: (name, width) per media
    modality."""
    objective = Objective[_name(objective, OBJECTIVES, "objective").upper()]
    if hidden <= 0 or hidden % 128:
        raise ValueError(f"hidden: a positive multiple of 128, got {hidden}")
    return engine_registry(EncoderGeometry(hidden=hidden, depth=depth, groups=groups, objective=objective,
                                           max_columns=1, media=tuple(media)))


def pair_scores(torch, pooled, log_scale, bias, groups, width):
    """``z_ij = exp(log_scale[g_i]) · cos_ij + bias[g_i]`` over the first ``width`` dims of ``pooled`` (S, H)."""
    e = pooled[:, :width]
    u = e / torch.sqrt((e * e).sum(dim=1, keepdim=True) + EPSILON_POOL)
    cos = u @ u.T
    g = torch.as_tensor(groups, dtype=torch.long, device=pooled.device)
    return torch.exp(log_scale[g])[:, None] * cos + bias[g][:, None]


def _safe_ratio(torch, numerator, denominator):
    """``numerator / denominator``, 0 where the denominator is 0 (a term with no pairs contributes nothing)."""
    empty = denominator == 0
    return torch.where(empty, torch.zeros_like(numerator), numerator / torch.where(empty, 1, denominator))


def pair_loss(torch, z, sign, weight, form):
    """One width's contrastive loss ``L_d`` from scores ``z`` (S, S) and pair targets ``sign``, ``weight`` (S, S).

    ``sigmoid``: ``Σ_{s≠0} w·softplus(−s·z) / S``; ``balanced``: the attract and repel halves, each
    ``Σ w·softplus(∓z) / Σ w`` (0 with no pairs); ``ranked``: every positive's score over every
    negative's in the anchor's row, ``Σ w_ip·w_in·softplus(z_in − z_ip) / Σ w_ip·w_in`` (0 with none).
    """
    F = torch.nn.functional
    form = _name(form, FORMS, "form")
    sign = torch.as_tensor(sign, dtype=z.dtype, device=z.device)
    weight = torch.as_tensor(weight, dtype=z.dtype, device=z.device)
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    S = z.shape[0]
    attract, repel = sign > 0, sign < 0
    w_attract = torch.where(attract, weight, zero)
    w_repel = torch.where(repel, weight, zero)
    if form == "sigmoid":
        if S == 0:
            return zero
        cells = torch.where(sign != 0, weight * F.softplus(-sign * z), zero)
        return cells.sum() / S
    if form == "balanced":
        pulled = _safe_ratio(torch, (w_attract * F.softplus(-z)).sum(), w_attract.sum())
        pushed = _safe_ratio(torch, (w_repel * F.softplus(z)).sum(), w_repel.sum())
        return pulled + pushed
    # ranked: [i, p, n] = anchor i, positive p, negative n.
    pair_weight = w_attract[:, :, None] * w_repel[:, None, :]
    margins = F.softplus(z[:, None, :] - z[:, :, None])
    return _safe_ratio(torch, (pair_weight * margins).sum(), pair_weight.sum())


def _rms_norm(torch, x, gain, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * gain


def rotary_angles(torch, positions, d, rope_base):
    """The rotary angle of every pair of every token, (B, 1, T, d/2): pair i turns by θ_i = base^(−2i/d)
    times its position. Positions (B, T) are one axis; (B, T, 3) are (time, row, column), the pairs cut
    into sections: time the first ⌊d/8⌋, row the next ⌊(d/2 − ⌊d/8⌋)/2⌋, column the rest."""
    half = d // 2
    inverse = rope_base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
    if positions.dim() == 2:
        return positions.to(torch.float64)[:, None, :, None] * inverse
    time_end = half // 4
    row_end = time_end + (half - time_end) // 2
    axis = torch.cat([torch.full((time_end,), 0), torch.full((row_end - time_end,), 1),
                      torch.full((half - row_end,), 2)]).to(positions.device)
    return positions.to(torch.float64)[:, :, axis][:, None] * inverse


def encode(torch, P, tokens, segments, positions, *, hidden, depth, norm_eps=1e-5, rope_base=10000.0, media=None):
    """The final-norm states ``y`` (rows, columns, H) of the tower, from the named parameters ``P``.

    ``media`` (a ``training.media_step.MediaBatch`` or None): each media modality's tokens add their values and
    position features times ``P[name.patch_embedding]`` stacked over ``P[name.position_embedding]`` to their
    id's embedding row."""
    F = torch.nn.functional
    device, dtype = P["embedding"].device, P["embedding"].dtype
    tokens, segments, positions = (torch.as_tensor(a, dtype=torch.long, device=device)
                                   for a in (tokens, segments, positions))
    B, T = tokens.shape
    H, d = hidden, HEAD_DIM
    heads = H // d

    # Rotary at each token's position inside its segment, half-split.
    angle = rotary_angles(torch, positions, d, rope_base)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)

    def rope(t):
        t1, t2 = t[..., :d // 2], t[..., d // 2:]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

    # Dense mask (B, 1, T, T): a query sees the real keys of its own segment. A padding query would see
    # nothing, which SDPA cannot express, so it sees itself and its output is zeroed.
    real = segments >= 0
    allowed = (segments[:, :, None] == segments[:, None, :]) & real[:, None, :]
    allowed = (allowed | torch.eye(T, dtype=torch.bool, device=device)[None])[:, None]
    query_real = real[:, None, :, None].to(dtype)

    h = P["embedding"][tokens]
    if media is not None:
        h = h.reshape(B * T, H)
        for name, rows in media.modalities.items():
            inputs = torch.as_tensor(rows.inputs, dtype=dtype, device=device)
            placed = torch.as_tensor(rows.tokens, dtype=torch.long, device=device)
            weight = torch.cat([P[f"{name}.patch_embedding"], P[f"{name}.position_embedding"]])
            h = h.index_add(0, placed, inputs @ weight)
        h = h.reshape(B, T, H)
    for i in range(depth):
        w = lambda name: P[f"layers.{i}.{name}"]  # noqa: E731
        a = _rms_norm(torch, h, w("attention_norm"), norm_eps)
        q = (a @ w("wq")).view(B, T, heads, d).transpose(1, 2)
        k = (a @ w("wk")).view(B, T, heads, d).transpose(1, 2)
        v = (a @ w("wv")).view(B, T, heads, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(rope(q), rope(k), v, attn_mask=allowed) * query_real
        o = o.transpose(1, 2).reshape(B, T, H)
        h = h + o @ w("wo")
        m = _rms_norm(torch, h, w("mlp_norm"), norm_eps)
        h = h + F.silu(m @ w("w_up")) @ w("w_down")
    return _rms_norm(torch, h, P["final_norm"], norm_eps)


def pool(torch, y, segments, segment_count, hidden=()):
    """``e_s``: the mean of ``y`` (rows, columns, H) over each segment's positions, (S, H) by segment index; the
    flat positions in ``hidden`` (a media item's hidden tokens) take no part."""
    H = y.shape[-1]
    segments = torch.as_tensor(segments, dtype=torch.long, device=y.device).reshape(-1).clone()
    segments[torch.as_tensor(np.asarray(hidden, np.int64), device=y.device)] = -1
    member = (segments[None, :] == torch.arange(segment_count, device=y.device)[:, None]).to(y.dtype)
    counts = member.sum(dim=1, keepdim=True)
    return (member @ y.reshape(-1, H)) / torch.clamp(counts, min=1)


def masked_loss(torch, y, head, targets):
    """``Σ_covered CE(y·head, target) / covered``, 0 when nothing is covered (targets −1 are ignored)."""
    F = torch.nn.functional
    targets = torch.as_tensor(targets, dtype=torch.long, device=y.device).reshape(-1)
    logits = y.reshape(-1, y.shape[-1]) @ head
    covered = int((targets >= 0).sum())
    if covered == 0:
        return (logits * 0).sum()
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction="sum") / covered


def reconstruction_loss(torch, y, head, hidden_tokens, targets):
    """``Σ_hidden mean_d (y·head − target)² / hidden``: a media modality's reconstruction term."""
    states = y.reshape(-1, y.shape[-1])[torch.as_tensor(hidden_tokens, dtype=torch.long, device=y.device)]
    error = states @ head - torch.as_tensor(targets, dtype=y.dtype, device=y.device)
    return (error * error).mean(dim=1).sum() / max(len(hidden_tokens), 1)


def unit_rows(torch, x):
    """Each row of ``x`` over its norm (with the engine's epsilon under the square root)."""
    return x / torch.sqrt((x * x).sum(dim=1, keepdim=True) + EPSILON_POOL)


def late_interaction_loss(torch, y, head, log_scale, bias, groups, query_rows, document_rows, sign, weight, form):
    """The late-interaction term before its weight. ``query_rows`` / ``document_rows``: per segment, the flat
    token indices of its query / document rows (empty: not on that side). Token vectors are the states
    through ``head``, L2-normalised; score_ij = Σ_(a ∈ i) max_(b ∈ j) q_a·d_b with the maximum taken at its
    lowest index (ties); z = exp(log_scale[g_i])·score + bias[g_i]; the pair loss over the (query,
    document) block of ``sign``, ``weight`` (S, S)."""
    flat = y.reshape(-1, y.shape[-1])
    queries = [i for i, rows in enumerate(query_rows) if len(rows)]
    documents = [j for j, rows in enumerate(document_rows) if len(rows)]
    if not queries or not documents:
        return flat.sum() * 0

    def vectors(rows):
        return unit_rows(torch, flat[torch.as_tensor(rows, dtype=torch.long, device=y.device)] @ head)

    document_vectors = [vectors(document_rows[j]) for j in documents]
    rows = []
    for i in queries:
        q = vectors(query_rows[i])
        scores = []
        for d in document_vectors:
            sim = q @ d.T
            first = torch.as_tensor(np.argmax(sim.detach().cpu().numpy(), axis=1)[:, None], device=y.device)
            scores.append(sim.gather(1, first).sum())
        rows.append(torch.stack(scores))
    g = torch.as_tensor(np.asarray(groups)[queries], dtype=torch.long, device=y.device)
    z = torch.exp(log_scale[g])[:, None] * torch.stack(rows) + bias[g][:, None]
    block = np.ix_(queries, documents)
    return pair_loss(torch, z, np.asarray(sign)[block], np.asarray(weight)[block], form)


def choices_loss(torch, y, head, positions, offsets, legal, targets):
    """The choices term before its weight: the mean over the choosing items of −Σ_k t_k log p_k, p the softmax
    of the masked head's logits at the item's MASK position (flat index ``positions[c]``) over its legal
    bytes ``legal[offsets[c]:offsets[c + 1]]``."""
    flat = y.reshape(-1, y.shape[-1])
    logits = flat[torch.as_tensor(positions, dtype=torch.long, device=y.device)] @ head
    terms = []
    for c in range(len(positions)):
        k = slice(int(offsets[c]), int(offsets[c + 1]))
        chosen = logits[c, torch.as_tensor(np.asarray(legal[k]), dtype=torch.long, device=y.device)]
        t = torch.as_tensor(np.asarray(targets[k]), dtype=y.dtype, device=y.device)
        terms.append(-(t * torch.log_softmax(chosen, dim=0)).sum())
    return torch.stack(terms).mean()


def step_loss(torch, flat, registry, *, hidden, depth, tokens, segments, positions, targets, groups, sign, weight,
              widths, form, objective, text_weight, norm_eps=1e-5, rope_base=10000.0, media=None,
              media_weights=None, late=None, choices=None) -> dict:
    """One step's losses under the flat parameter tensor ``flat`` laid out by ``registry``.

    ``tokens``, ``segments`` (packed segment index 0..S−1 or −1 for padding), ``positions`` (inside the
    segment) and ``targets`` (the original byte at covered positions, else −1) are (rows, columns);
    ``groups`` (S,) the temperature group of each segment, ``sign`` and ``weight`` (S, S) the segments'
    pair targets; ``widths`` the matryoshka prefixes (empty: (hidden,)); ``media`` a step's media rows
    (``MediaBatch``) and ``media_weights`` their reconstruction weights by name; ``late`` a dict of
    :func:`late_interaction_loss`'s ``query_rows``, ``document_rows``, ``sign``, ``weight``, ``form`` and its
    ``loss_weight``; ``choices`` a dict of :func:`choices_loss`'s ``positions``, ``offsets``, ``legal``,
    ``targets`` and its ``loss_weight``. Returns ``loss``, ``masked``, ``contrastive`` (0 when the
    objective lacks it), ``reconstruction`` (by media name), ``late_interaction`` (weighted), ``choices``
    (unweighted) and ``pooled``, the (S, H) embeddings before normalisation.
    """
    objective = _name(objective, OBJECTIVES, "objective")
    form = _name(form, FORMS, "form")
    if hidden % 128 or hidden <= 0:
        raise ValueError(f"hidden: a positive multiple of 128, got {hidden}")
    P = named_tensors(flat, registry)
    zero = flat.sum() * 0  # a zero in the graph, of flat's dtype and device
    y = encode(torch, P, tokens, segments, positions, hidden=hidden, depth=depth, norm_eps=norm_eps,
               rope_base=rope_base, media=media)
    S = len(groups)
    pooled = pool(torch, y, segments, S, media.hidden_tokens if media is not None else ())

    masked = zero
    if objective != "contrastive":
        masked = masked_loss(torch, y, P["masked_head"], targets)

    contrastive = zero
    if objective != "masked":
        widths = tuple(widths) or (hidden,)
        per_width = [pair_loss(torch, pair_scores(torch, pooled, P["temperature.log_scale"], P["temperature.bias"],
                                                  groups, d), sign, weight, form) for d in widths]
        contrastive = sum(per_width) / len(per_width)

    reconstruction = {}
    if objective != "contrastive" and media is not None:
        reconstruction = {name: reconstruction_loss(torch, y, P[f"{name}.reconstruction"], rows.hidden,
                                                    rows.targets)
                          for name, rows in media.modalities.items() if len(rows.hidden)}
    weights = media_weights or {}
    reconstructed = sum((weights.get(name, 0.0) * value for name, value in reconstruction.items()), zero)

    late_term = zero
    if late is not None:
        late_term = late["loss_weight"] * late_interaction_loss(
            torch, y, P["late_interaction.token_head"], P["late_interaction.log_scale"], P["late_interaction.bias"],
            groups, late["query_rows"], late["document_rows"], late["sign"], late["weight"], late["form"])
    choice_term = zero
    if choices is not None and len(choices["positions"]):
        choice_term = choices_loss(torch, y, P["masked_head"], choices["positions"], choices["offsets"],
                                   choices["legal"], choices["targets"])
    chosen = choice_term * (choices["loss_weight"] if choices is not None else 0.0)

    if objective == "masked":
        loss = text_weight * masked + reconstructed + chosen
    elif objective == "contrastive":
        loss = contrastive + late_term
    else:
        loss = text_weight * masked + reconstructed + contrastive + late_term + chosen
    return {"loss": loss, "masked": masked, "contrastive": contrastive, "reconstruction": reconstruction,
            "late_interaction": late_term, "choices": choice_term, "pooled": pooled}
