"""Every kernel against its float64 numpy reference, on the CPU (and a GPU when one is there)."""

import zlib

import numpy as np
import pytest

from kernel_cases import all_cases, attention_inputs, gemm_group_operands, run_attention
import uform
from uform import kernels as K
from uform import layouts


@pytest.mark.parametrize("name,case,kwargs", all_cases(), ids=[c[0] for c in all_cases()])
def test_kernel_matches_float64_reference(device, name, case, kwargs):
    outputs = case(device, seed=zlib.crc32(name.encode()), **kwargs)
    for output_name, (out, ref, tolerance, *magnitude) in outputs.items():
        assert out.shape == ref.shape, output_name
        assert np.all(np.isfinite(out)), f"{name}/{output_name}: non-finite output"
        error = np.max(np.abs(out - ref)) / ((magnitude[0] if magnitude else np.max(np.abs(ref))) + 1e-30)
        assert error <= tolerance, f"{name}/{output_name}: relative error {error:.3g} > {tolerance:.3g}"


def test_silu_kernel_gives_unary_silus_bits(device):
    """kernels.silu, SiLU's kernel of its own, and unary("silu") compute the same function: the same bits over
    normal, large, tiny and subnormal values, signed zeros, infinities and NaN (as the canonical NaN)."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.standard_normal(4099) * 6, rng.standard_normal(64) * 200, [0.0, -0.0, np.inf, -np.inf,
                        np.nan, 1e-40, -1e-40, 88.0, -104.0]]).astype(np.float32)
    xb, own, generic = device.put(x), device.empty(x.shape), device.empty(x.shape)
    K.silu(own, xb)
    K.unary("silu", generic, xb)
    assert np.array_equal(own.numpy().view(np.uint32), generic.numpy().view(np.uint32))


@pytest.mark.parametrize("sizes,k,summed,one_a,form", [
    ((128, 37, 600), 512, True, False, "exact_summed"),  # 765 k joined: the rule takes it, no term alone
    ((128, 37), 256, True, True, "fma"),  # 165 k joined: below the rule
    ((512, 520), 512, False, True, "exact_shared_a"),  # q, k and v of one input at an exact size
    ((512, 520), 512, False, False, "apart"),  # exact products of two A: each runs alone
    ((512, 64), 512, False, True, "apart"),  # one exact product beside an fma one
    ((64, 32, 32), 512, False, True, "fma"),
])
def test_gemm_group_form_follows_the_shape_rule(sizes, k, summed, one_a, form):
    """The engine's one group rule (mojo/kernels/gemm, group_form), which gemm_group asks: summed terms are one exact
    product where gemm_is_exact takes their joined k; products apart are exact together only when the rule takes
    every one and they share an A."""
    m = 520
    n = 512 if summed else sizes[0]
    assert K._gemm_group_form(m, n, k, sizes, summed, one_a, 0) == K.GEMM_GROUP_FORMS[form]


@pytest.mark.parametrize("summed", [False, True], ids=["apart", "summed"])
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("m,sizes,shared,accumulate", [
    (64, (32, 16, 16), 32, False),  # the byte LM's q, k and v (apart) and the gradient through them (summed)
    (37, (5, 13, 8), 19, True),  # no size a multiple of 4: the scalar loads and stores
    (130, (70, 129, 3), 257, False),  # several tiles, partial at every edge
    (40, (24, 8, 16), 5000, True),  # k ≥ 4096: an Aᵀ·B product with small outputs cut into k ranges
    (520, (512, 520, 600), 512, True),  # shapes the exact GEMM's rule takes: apart each runs alone, exactly
    (520, (128, 37, 600), 512, False),  # summed, 765 k: one exact product, although two terms alone are not
])
def test_gemm_group_gives_each_products_bits(device, summed, transpose_a, transpose_b, m, sizes, shared, accumulate):
    """gemm_group, one launch or one product after another, gives the bits of its products launched alone in order
    (summed: into one C, accumulating after the first), with and without C0; summed products whose joined k the
    exact GEMM's rule takes, the bits of one product of the operands joined along k."""
    rng = np.random.default_rng(m + shared)
    shapes, a, b, c0 = gemm_group_operands(rng, m, sizes, shared, transpose_a, transpose_b, summed)
    options = dict(transpose_a=transpose_a, transpose_b=transpose_b)
    a_on, b_on = [device.put(x) for x in a], [device.put(x) for x in b]
    if summed:
        n, joined = shapes[0][0], sum(k for _, k in shapes)
        alone = device.put(c0[0])
        if K.gemm_is_exact(m, n, joined):
            K.gemm(alone, device.put(np.concatenate(a, 0 if transpose_a else 1)),
                   device.put(np.concatenate(b, 1 if transpose_b else 0)), m, n, joined, accumulate=accumulate,
                   **options)
        else:
            for t, (_, k) in enumerate(shapes):
                K.gemm(alone, a_on[t], b_on[t], m, n, k, accumulate=accumulate or t > 0, **options)
        grouped = device.put(c0[0])
        K.gemm_group([grouped] * 3, a_on, b_on, m, [n] * 3, [k for _, k in shapes], summed=True,
                     accumulate=accumulate, **options)
        pairs = [(alone, grouped)]
    else:
        alone = [device.put(x) for x in c0]
        for t, (n, k) in enumerate(shapes):
            K.gemm(alone[t], a_on[t], b_on[t], m, n, k, accumulate=accumulate, **options)
        grouped = [device.put(x) for x in c0]
        K.gemm_group(grouped, a_on, b_on, m, [n for n, _ in shapes], [shared] * 3, accumulate=accumulate, **options)
        pairs = list(zip(alone, grouped))
    for one, group in pairs:
        assert np.array_equal(one.numpy().view(np.uint32), group.numpy().view(np.uint32))


@pytest.mark.parametrize("transpose_a,transpose_b,k_range,m,sizes", [
    (False, False, 0, 520, (512, 520, 640)), (True, False, 0, 520, (512, 520, 640)),
    (False, True, 0, 520, (512, 520, 640)), (True, False, 512, 520, (512, 520, 640)),
    (False, False, 0, 517, (1030, 515, 513)),  # no size a multiple of 4 (the exponents padded), the widest first
    (True, False, 512, 517, (1030, 515, 513)),
])
def test_exact_products_of_one_a_group_with_each_products_bits(device, transpose_a, transpose_b, k_range, m, sizes):
    """Exact products apart of one A (q, k and v of one input; their weight gradients by rows), which a group runs
    with A's residue planes found once on a GPU: each product's bits launched alone, onto its C0."""
    k = 1024
    rng = np.random.default_rng(11)
    a = device.put(rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32))
    bs = [device.put(rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)) for n in sizes]
    c0 = [rng.standard_normal((m, n)).astype(np.float32) for n in sizes]
    assert all(K.gemm_is_exact(m, n, k, k_range) for n in sizes)
    options = dict(transpose_a=transpose_a, transpose_b=transpose_b, accumulate=True, k_range=k_range)
    alone = [device.put(x) for x in c0]
    for c, b, n in zip(alone, bs, sizes):
        K.gemm(c, a, b, m, n, k, **options)
    grouped = [device.put(x) for x in c0]
    K.gemm_group(grouped, [a] * 3, bs, m, list(sizes), [k] * 3, **options)
    for one, group in zip(alone, grouped):
        assert np.array_equal(one.numpy().view(np.uint32), group.numpy().view(np.uint32))


@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, False), (False, True)])
def test_summed_exact_products_join_their_lines_across_terms(device, transpose_a, transpose_b):
    """Summed exact products are one product over the joined k: a line's exponent is its largest magnitude's over
    every term (terms 10⁴ apart; a row whose only nonzero values are subnormals in one term and zero in the others;
    a NaN in one term's row, which makes that row's outputs NaN), and the padding between terms adds nothing."""
    m, n, ks = 513, 515, (700, 45, 300)
    rng = np.random.default_rng(5)
    a = [(rng.standard_normal((k, m) if transpose_a else (m, k)) * 10.0 ** (4 * t)).astype(np.float32)
         for t, k in enumerate(ks)]
    b = [rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32) for k in ks]

    def row(x, r):  # row r of op(A_t), as a view to write
        return x[:, r] if transpose_a else x[r]

    for t in range(3):
        row(a[t], 7)[:] = 0
        row(a[t], 9)[:] = 0
    row(a[1], 7)[::3] = np.float32(3e-42)  # subnormals: the joined row's exponent is theirs, below the zeros' 0
    row(a[2], 9)[5] = np.nan
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    c0[7] = 0
    options = dict(transpose_a=transpose_a, transpose_b=transpose_b, accumulate=True)
    assert K.gemm_is_exact(m, n, sum(ks)) and not K.gemm_is_exact(m, n, ks[1])
    grouped = device.put(c0)
    K.gemm_group([grouped] * 3, [device.put(x) for x in a], [device.put(x) for x in b], m, [n] * 3, list(ks),
                 summed=True, **options)
    joined = device.put(c0)
    K.gemm(joined, device.put(np.concatenate(a, 0 if transpose_a else 1)),
           device.put(np.concatenate(b, 1 if transpose_b else 0)), m, n, sum(ks), **options)
    out = grouped.numpy()
    assert np.array_equal(out.view(np.uint32), joined.numpy().view(np.uint32))
    assert np.isnan(out[9]).all() and np.isfinite(np.delete(out, 9, 0)).all()
    assert np.count_nonzero(out[7]) > n // 2  # the subnormals' products, alone in their row


@pytest.mark.parametrize("m,n,k,transpose_a,ranges", [
    (256, 512, 8192, True, 32),  # the byte LM's large weight gradients: ranges of 256 tokens
    (24, 8, 5000, True, 19),
    (256, 256, 4096, True, 16),
    (256, 256, 65536, True, 32),  # at most 32 ranges
    (256, 256, 4095, True, 1),  # below k = 4096: one chain
    (256, 256, 8192, False, 1),  # A·B is never cut
    (2048, 1088, 8192, True, 1),  # 144 tiles of 128 × 128: not a small output
])
def test_fma_chain_cuts_small_weight_gradients_into_canonical_ranges(m, n, k, transpose_a, ranges):
    """The fma chain's canonical split (docs/numerics.md): an Aᵀ·B product with fewer than 132 tiles of 128 × 128
    and k ≥ 4096 is min(32, k // 256) ranges, their partial sums in the workspace; every other product one chain
    an output. A property of the shape alone, so every device cuts alike."""
    for gpu in (False, True):
        expected = 4 * ranges * m * n if ranges > 1 else 0
        assert K._gemm_workspace_bytes(m, n, k, transpose_a, 0, gpu, True) == expected


def test_gemm_group_refuses_bad_groups_before_any_product(device):
    """A group's refusals name what was wrong and leave every C as it was, also where its products would run one
    by one (the exact GEMM's shapes): a wrong-sized operand in the last product stops the first one too."""
    m, k = 520, 512
    a = device.put(np.ones((m, k), np.float32))
    b, short = device.put(np.ones((k, 512), np.float32)), device.put(np.ones((k, 100), np.float32))
    cs = [device.put(np.full((m, 512), 7.0, np.float32)) for _ in range(2)]
    assert K.gemm_is_exact(m, 512, k)
    with pytest.raises(ValueError, match=r"B must hold 262144 values, holds 51200 \(shape \(512, 100\)\)"):
        K.gemm_group(cs, [a, a], [b, short], m, [512, 512], [k, k])
    with pytest.raises(ValueError, match="takes 1 to 3 products"):
        K.gemm_group(cs * 2, [a] * 4, [b] * 4, m, [512] * 4, [k] * 4)
    with pytest.raises(ValueError, match="summed products share their C and n"):
        K.gemm_group(cs, [a, a], [b, b], m, [512, 512], [k, k], summed=True)
    with pytest.raises(ValueError, match="products apart share k"):
        K.gemm_group(cs, [a, a], [b, b], m, [512, 512], [k, 256])
    with pytest.raises(ValueError, match="each C must be a buffer of its own"):
        K.gemm_group([cs[0], cs[0]], [a, a], [b, b], m, [512, 512], [k, k])  # one C twice
    with pytest.raises(ValueError, match="gemm_group: k_range must be 0, or positive for an Aᵀ·B product, got 256"):
        K.gemm_group(cs, [a, a], [b, b], m, [512, 512], [k, k], k_range=256)  # k ranges of an A·B product
    square = device.put(np.full((8, 8), 7.0, np.float32))
    with pytest.raises(ValueError, match="apart from every A and B"):
        K.gemm_group([square], [square], [device.put(np.ones((8, 8), np.float32))], 8, [8], [8])  # C read as A
    whole = device.put(np.full(2 * m * 512, 7.0, np.float32))
    inside = whole.view(m * 512 - 8, (m, 512))  # a C that starts inside the other C and runs past it
    with pytest.raises(ValueError, match="each C must be a buffer of its own"):
        K.gemm_group([whole.view(0, (m, 512)), inside], [a, a], [b, b], m, [512, 512], [k, k])
    with pytest.raises(ValueError, match="apart from every A and B"):  # a C that starts inside A
        K.gemm_group([cs[0], inside], [a, whole.view(0, (m, k))], [b, b], m, [512, 512], [k, k])
    with pytest.raises(ValueError, match="summed exact products take no k ranges"):  # Aᵀ·B, a (k, m) A
        K.gemm_group([cs[0]] * 2, [a, a], [b, b], m, [512, 512], [k, k], summed=True, transpose_a=True, k_range=k)
    assert all((c.numpy() == 7.0).all() for c in (*cs, square, whole))


ATTENTION_CASES = [c for c in all_cases() if c[0].startswith("attention-")]


@pytest.mark.parametrize("name,case,kwargs", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention_by_rows_gives_the_teams_bits(device, monkeypatch, name, case, kwargs):
    """Attention's two identical forms (UFORM_ATTENTION: teams of 64-token tiles, or a row per query or key) walk
    one canonical order, so they give the same bits: every attention case (spans over several blocks, segments,
    padding, causal, grouped heads, every head dim) in both, o, dq, dk, dv and lse compared."""
    outputs = {}
    for form in ("teams", "rows"):
        monkeypatch.setenv("UFORM_ATTENTION", form)
        outputs[form] = case(device, seed=zlib.crc32(name.encode()), **kwargs)
    for output_name, (teams, *_) in outputs["teams"].items():
        rows = outputs["rows"][output_name][0]
        differing = int(np.count_nonzero(teams.view(np.uint32) != rows.view(np.uint32)))
        assert differing == 0, f"{name}/{output_name}: {differing} of {teams.size} values differ"


@pytest.mark.parametrize("name,case,kwargs", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention_backward_with_kept_score_gradients_gives_the_same_bits(device, monkeypatch, name, case, kwargs):
    """The dq kernel reading the dk/dv kernel's ds from d_scores gives the bits of computing them again: every
    attention case with span_limit the sequence's length (every tile reads them), and with a third of it (a
    segmented case then has tiles of both kinds, as its random segments fall), against none."""
    monkeypatch.setenv("UFORM_ATTENTION", "teams")
    seed = zlib.crc32(name.encode())
    outputs = {limit: case(device, seed=seed, **kwargs, span_limit=limit)
               for limit in (0, kwargs["seq_len"], max(kwargs["seq_len"] // 3, 1))}
    for limit in outputs:
        for output_name, (got, *_) in outputs[limit].items():
            expected = outputs[0][output_name][0]
            differing = int(np.count_nonzero(got.view(np.uint32) != expected.view(np.uint32)))
            assert differing == 0, f"{name}/{output_name}, span_limit {limit}: {differing} of {got.size} values differ"


@pytest.mark.parametrize("name,case,kwargs", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention_by_tiles_aligned_to_spans_gives_the_same_bits(device, monkeypatch, name, case, kwargs):
    """The team kernels' tasks from attention_tiles (each run of tokens sharing a span cut from its first token)
    instead of the fixed 64-token grid: every sum belongs to one query or one key, so the bits are the same, with
    and without the kept score gradients."""
    monkeypatch.setenv("UFORM_ATTENTION", "teams")
    seed = zlib.crc32(name.encode())
    for limit in (0, kwargs["seq_len"]):
        grid, aligned = (case(device, seed=seed, **kwargs, span_limit=limit, tiles=tiles) for tiles in (False, True))
        for output_name, (got, *_) in aligned.items():
            expected = grid[output_name][0]
            differing = int(np.count_nonzero(got.view(np.uint32) != expected.view(np.uint32)))
            assert differing == 0, f"{name}/{output_name}, span_limit {limit}: {differing} of {got.size} values differ"


def test_attention_tiles_cut_each_run_of_one_span_from_its_first_token():
    """attention_tiles: the tiles cover every token once, in order; each lies in one run (a segment, a sequence, or
    consecutive padding), holds at most ATTENTION_TILE tokens and starts at its run's first token plus a multiple
    of ATTENTION_TILE."""
    segments = np.full(3 * 200, -1, np.int32)
    segments[0:150] = 0
    segments[150:151] = 1  # a segment of one token
    segments[160:200] = 2  # padding before it, a row's end after it
    segments[200:400] = 3  # a whole row
    segments[400:530] = 4
    spans = layouts.attention_spans(600, 200, segments)
    tiles = layouts.attention_tiles(spans)
    assert tiles[0, 0] == 0 and tiles[-1, 1] == 600 and (tiles[1:, 0] == tiles[:-1, 1]).all()
    assert ((tiles[:, 1] - tiles[:, 0] >= 1) & (tiles[:, 1] - tiles[:, 0] <= K.ATTENTION_TILE)).all()
    runs = [(0, 150), (150, 151), (151, 160), (160, 200), (200, 400), (400, 530), (530, 600)]
    expected = [(s, min(s + K.ATTENTION_TILE, end)) for begin, end in runs for s in range(begin, end, K.ATTENTION_TILE)]
    assert [tuple(t) for t in tiles] == expected
    assert (layouts.attention_tiles(layouts.attention_spans(256, 128)).tolist()
            == [[s, s + 64] for s in range(0, 256, 64)])


@pytest.mark.parametrize("causal", [False, True])
def test_attention_keeps_the_score_gradient_of_each_pair_a_query_sees(device, monkeypatch, causal):
    """d_scores after the backward: ds_ij = p_ij (dp_ij − δ_i) (float64 reference) at query i's row, key j's offset
    in i's span, for each pair the query sees, of the spans no longer than span_limit; every other slot untouched
    (the NaN it was filled with). Two sequences of 100 tokens, and segments of 30 and 70 in the second."""
    monkeypatch.setenv("UFORM_ATTENTION", "teams")
    rng = np.random.default_rng(3 + causal)
    tokens, heads, head_dim, limit = 200, 2, 16, 64
    q, k, v, d_out = attention_inputs(rng, tokens, heads, 1, head_dim)
    spans = layouts.attention_spans(tokens, 100, np.r_[np.zeros(100), np.ones(30), np.full(70, 2)].astype(np.int32))
    geometry = dict(heads=heads, kv_heads=1, head_dim=head_dim, causal=causal, spans=device.put(spans))
    qb, kb, vb = device.put(q), device.put(k), device.put(v)
    o, lse = device.empty(q.shape), device.empty((tokens, heads))
    K.attention_forward(o, lse, qb, kb, vb, **geometry)
    d_scores = device.put(np.full((tokens, heads, limit), np.nan, np.float32))
    K.attention_backward(device.empty(q.shape), device.empty(k.shape), device.empty(v.shape), device.put(d_out), o,
                         lse, qb, kb, vb, **geometry, d_scores=d_scores, span_limit=limit)
    expected = np.full((tokens, heads, limit), np.nan)
    o64 = o.numpy().astype(np.float64)
    for begin, end in {tuple(span) for span in spans}:
        if end - begin > limit:
            continue
        for h in range(heads):
            cols = slice(h * head_dim, (h + 1) * head_dim)
            qs, ks, vs = (x[begin:end, c].astype(np.float64) for x, c in ((q, cols), (k, slice(0, head_dim)),
                                                                         (v, slice(0, head_dim))))
            scores = qs @ ks.T / np.sqrt(head_dim)
            if causal:
                scores[np.triu_indices(end - begin, 1)] = -np.inf
            p = np.exp(scores - scores.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            do = d_out[begin:end, cols].astype(np.float64)
            ds = p * (do @ vs.T - (do * o64[begin:end, cols]).sum(1, keepdims=True))
            seen = np.tril(np.ones((end - begin,) * 2, bool)) if causal else np.ones((end - begin,) * 2, bool)
            expected[begin:end, h, :end - begin] = np.where(seen, ds, np.nan)
    got = d_scores.numpy()
    assert np.array_equal(np.isnan(got), np.isnan(expected)) and np.isfinite(expected).sum() > 0
    assert np.allclose(got[~np.isnan(got)], expected[~np.isnan(expected)], rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_the_dq_kernel_reads_the_kept_score_gradients(device, monkeypatch, causal):
    """After a backward that keeps every span's ds, the dq kernel run again on a d_scores of zeros gives dq = 0,
    and on one of NaN a NaN at every query that sees a key: it reads them rather than computing them; without
    d_scores it gives the backward's dq."""
    monkeypatch.setenv("UFORM_ATTENTION", "teams")
    rng = np.random.default_rng(5 + causal)
    tokens, heads, head_dim, length = 160, 2, 16, 80
    q, k, v, d_out = (device.put(x) for x in attention_inputs(rng, tokens, heads, 1, head_dim))
    geometry = dict(heads=heads, kv_heads=1, head_dim=head_dim, causal=causal,
                    spans=device.put(layouts.attention_spans(tokens, length)))
    o, lse = device.empty((tokens, heads * head_dim)), device.empty((tokens, heads))
    delta = device.empty((tokens, heads))
    K.attention_forward(o, lse, q, k, v, **geometry)
    dq, dk, dv = device.empty(q.shape), device.empty(k.shape), device.empty(v.shape)
    d_scores = device.empty(tokens * heads * length)
    K.attention_backward(dq, dk, dv, d_out, o, lse, q, k, v, **geometry, delta=delta, d_scores=d_scores,
                         span_limit=length)
    operands = dict(o=o, lse=lse, q=q, k=k, v=v, spans=geometry["spans"], d_out=d_out, delta=delta, dk=dk, dv=dv,
                    **K._attention_geometry(tokens, heads, 1, head_dim, causal))
    tasks = -(-tokens // K.ATTENTION_TILE) * heads
    again = device.empty(q.shape)
    K._launch("attention_backward_dq", tasks, dq=again, **operands)
    assert np.array_equal(again.numpy().view(np.uint32), dq.numpy().view(np.uint32))
    for fill in (0.0, np.nan):
        d_scores.write(np.full(d_scores.size, fill, np.float32))
        K._launch("attention_backward_dq", tasks, dq=again, d_scores=d_scores, span_limit=length, **operands)
        if fill == 0.0:
            assert not again.numpy().any()
        else:
            assert np.isnan(again.numpy()).all()


def test_a_training_stack_keeps_a_d_scores_workspace(monkeypatch):
    """A training stack in identical mode keeps its backward's score gradients (span_limit its positions: a
    sequence, or a packed row); one that only runs forward, fast mode's, and one past D_SCORES_BYTES keep none."""
    from uform.nn import transformer

    geometry = transformer.StackGeometry(width=32, heads=4, kv_heads=2, head_dim=8, mlp=64, layers=1,
                                         norm_eps=1e-6, rope_base=1e4, causal=False)
    cpu = uform.Device.cpu()
    kept = transformer.TransformerStack(cpu, geometry, 64).buffers(128).work.d_scores
    assert kept is not None and kept.size == 128 * 4 * 64
    assert transformer.TransformerStack(cpu, geometry, 64, training=False).buffers(128).work.d_scores is None
    assert transformer.TransformerStack(cpu, geometry, 64, fast=True).buffers(128).work.d_scores is None
    monkeypatch.setitem(transformer.D_SCORES_BYTES, False, 4 * 128 * 4 * 64 - 4)
    assert transformer.TransformerStack(cpu, geometry, 64).buffers(128).work.d_scores is None


def test_attention_backward_refuses_a_d_scores_that_does_not_fit(device):
    """d_scores must hold tokens · heads · span_limit floats, and span_limit and d_scores come together: each
    refused, naming it, before any launch (dq keeps its values)."""
    rng = np.random.default_rng(2)
    q, k, v, d_out = (device.put(x) for x in attention_inputs(rng, 8, 2, 1, 16))
    dq, dk, dv = device.put(np.full((8, 32), 7.0, np.float32)), device.empty((8, 16)), device.empty((8, 16))
    o, lse = device.empty((8, 32)), device.empty((8, 2))
    geometry = dict(spans=device.put(layouts.attention_spans(8, 8)), heads=2, kv_heads=1, head_dim=16, causal=False)
    for kept, message in ((dict(d_scores=device.empty(63), span_limit=4), "d_scores must hold 64 values, holds 63"),
                          (dict(d_scores=device.empty(64)), "d_scores needs a span_limit of at least 1, got 0"),
                          (dict(span_limit=4), "span_limit sizes a d_scores workspace; got 4 without one")):
        with pytest.raises(ValueError, match=message):
            K.attention_backward(dq, dk, dv, d_out, o, lse, q, k, v, **geometry, **kept)
    assert (dq.numpy() == 7.0).all()


def test_attention_refuses_a_tile_table_it_cannot_read(device):
    """The tile table must be whole int32 (start, end) pairs, at most one a token, right after the spans in one
    allocation (where the kernels read it): each refused, naming it, before any launch (o and dq keep their
    values)."""
    rng = np.random.default_rng(3)
    q, k, v, d_out = (device.put(x) for x in attention_inputs(rng, 8, 2, 1, 16))
    spans = layouts.attention_spans(8, 8)
    layout = device.put(np.concatenate([spans, layouts.attention_tiles(spans), np.zeros((8, 2), np.int32)]))
    apart = device.put(layouts.attention_tiles(spans))
    o, dq = device.put(np.full((8, 32), 7.0, np.float32)), device.put(np.full((8, 32), 7.0, np.float32))
    lse, dk, dv = device.empty((8, 2)), device.empty((8, 16)), device.empty((8, 16))
    geometry = dict(spans=layout.view(0, spans.shape), heads=2, kv_heads=1, head_dim=16, causal=False)
    for tiles, error, message in (
            (apart, ValueError, "attention tiles must be .* right after the spans"),
            (layout.view(16, (9, 2)), ValueError, r"attention tiles must be \(T, 2\) int32 with 0 < T ≤ 8"),
            (layout.view(16, 3), ValueError, "tiles must hold 2 values, holds 3"),
            (layout.view(16, (1, 2), np.float32), TypeError, "tiles must be int32, got float32")):
        with pytest.raises(error, match=message):
            K.attention_forward(o, lse, q, k, v, **geometry, tiles=tiles)
        with pytest.raises(error, match=message):
            K.attention_backward(dq, dk, dv, d_out, o, lse, q, k, v, **geometry, tiles=tiles)
    assert (o.numpy() == 7.0).all() and (dq.numpy() == 7.0).all()


def test_an_unknown_attention_form_is_refused(device, monkeypatch):
    """UFORM_ATTENTION other than rows or teams is refused, naming it, before any launch."""
    monkeypatch.setenv("UFORM_ATTENTION", "row")
    rng = np.random.default_rng(1)
    q, k, v, d_out = attention_inputs(rng, 8, 2, 1, 16)
    with pytest.raises(ValueError, match="UFORM_ATTENTION must be rows or teams \\(or unset\\), got 'row'"):
        run_attention(device, q, k, v, d_out, layouts.attention_spans(8, 8), 2, 1, 16, False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_attention_of_a_segment_is_the_same_wherever_it_lies(device, causal, head_dim):
    """Attention's blocks start at each span's first token, so a segment gives the same bits at any offset in
    the batch, beside any other segments: a 150-token segment alone, then after 37 and before 80 other tokens."""
    rng = np.random.default_rng(head_dim + causal)
    heads, kv_heads, length, before, after = 4, 2, 150, 37, 80
    tokens = before + length + after
    q, k, v, d_out = attention_inputs(rng, tokens, heads, kv_heads, head_dim)
    segments = np.r_[np.zeros(before - 5), -np.ones(5), np.ones(length), np.full(after, 2)].astype(np.int32)
    placed = run_attention(device, q, k, v, d_out, layouts.attention_spans(tokens, tokens, segments), heads, kv_heads,
                           head_dim, causal)
    inside = slice(before, before + length)
    alone = run_attention(device, q[inside], k[inside], v[inside], d_out[inside],
                          layouts.attention_spans(length, length), heads, kv_heads, head_dim, causal)
    for name, a, b in zip(("o", "dq", "dk", "dv", "lse"), alone, placed):
        assert np.array_equal(a.view(np.uint32), b[inside].view(np.uint32)), name


@pytest.mark.parametrize("k", [3, 4096, 70000])
def test_exact_gemm_gives_its_definitions_bits(device, k):
    """kernels.gemm_exact equals uform.reference.exact_gemm bit for bit (zeros' signs included), NaN wherever a
    row or column holds an infinity or a NaN; k = 70000 takes 12 moduli' budget."""
    from uform.reference import exact_gemm

    rng = np.random.default_rng(k)
    m, n = 4, 3
    a = ((rng.random((m, k)) - 0.5) * np.exp(rng.standard_normal((m, k)))).astype(np.float32)
    b = ((rng.random((k, n)) - 0.5) * np.exp(rng.standard_normal((k, n)))).astype(np.float32)
    a[2, k // 3], b[k - 1, 1] = -np.inf, np.nan
    c = device.empty((m, n))
    K.gemm_exact(c, device.put(a), device.put(b), m, n, k)
    got, expected = c.numpy(), exact_gemm.exact_gemm(a, b)
    assert np.array_equal(np.isnan(got), np.isnan(expected)) and np.isnan(expected).sum() == m + n - 1
    finite = ~np.isnan(expected)
    assert np.array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32))
    with pytest.raises(ValueError, match="k up to"):
        K.gemm_exact(device.empty((1, 1)), device.empty(K.EXACT_GEMM_MAX_K + 1), device.empty(K.EXACT_GEMM_MAX_K + 1),
                     1, 1, K.EXACT_GEMM_MAX_K + 1)
    with pytest.raises(ValueError, match="residues must be False, True or 'fused'"):
        K.gemm_exact(c, device.put(a), device.put(b), m, n, k, residues="unfused")
    with pytest.raises(ValueError, match="splits must be an int >= 0, got -1"):
        K.gemm_exact(c, device.put(a), device.put(b), m, n, k, residues="fused", splits=-1)


@pytest.mark.parametrize("m,n,k,ta,tb,acc", [(1, 1, 1, False, False, False), (7, 5, 33, False, False, True),
                                              (9, 6, 300, True, False, False), (5, 8, 700, False, True, True),
                                              (40, 36, 50, False, True, True), (40, 70, 100, False, False, False),
                                              (70, 33, 130, True, False, False), (3, 2, 70000, False, False, False),
                                              (4, 3, 140000, False, False, True), (13, 35, 1100, True, False, True),
                                              (50, 20, 600, False, True, False), (200, 17, 530, False, False, True),
                                              (9, 40, 66000, True, False, False)])
def test_exact_gemm_through_residues_gives_the_limbs_bits(device, m, n, k, ta, tb, acc):
    """The tensor-core forms (residues modulo the primes, the weighted-sum reconstruction; unfused, and fused into
    one kernel on a GPU) equal the limb form bit for bit, k past one int32 chunk (2^16) included, NaN lines too; on
    the CPU, which runs its own residue form for both, shapes past its plane products' tiles (5 rows, 16 columns,
    blocks of 256 k, runs of rows) and both transposes."""
    rng = np.random.default_rng(m * n + k)
    a = ((rng.random((k, m) if ta else (m, k)) - 0.5) * np.exp(2 * rng.standard_normal((k, m) if ta else (m, k))))
    b = ((rng.random((n, k) if tb else (k, n)) - 0.5) * np.exp(2 * rng.standard_normal((n, k) if tb else (k, n))))
    a, b = a.astype(np.float32), b.astype(np.float32)
    if m > 2:
        a.reshape(-1)[5] = np.nan
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    results = []
    for residues in (False, True, "fused"):
        c = device.put(c0)
        K.gemm_exact(c, device.put(a), device.put(b), m, n, k, transpose_a=ta, transpose_b=tb, accumulate=acc,
                     residues=residues)
        results.append(c.numpy().view(np.uint32))
    assert np.array_equal(results[0], results[1]) and np.array_equal(results[0], results[2])


def assert_every_exact_form_is_the_definition(device, a: np.ndarray, b: np.ndarray, transpose_a: bool = False,
                                              transpose_b: bool = False) -> None:
    """Each form of kernels.gemm_exact (limbs, residues, fused) gives uform.reference.exact_gemm's bits for op(A)·op(B)
    = a·b, with A and B stored transposed where asked."""
    from uform.reference import exact_gemm

    expected = exact_gemm.exact_gemm(a, b).view(np.uint32)
    stored_a = device.put(np.ascontiguousarray(a.T) if transpose_a else a)
    stored_b = device.put(np.ascontiguousarray(b.T) if transpose_b else b)
    (m, k), n = a.shape, b.shape[1]
    for residues in (False, True, "fused"):
        c = device.empty((m, n))
        K.gemm_exact(c, stored_a, stored_b, m, n, k, transpose_a=transpose_a, transpose_b=transpose_b,
                     residues=residues)
        assert np.array_equal(c.numpy().view(np.uint32), expected), residues


@pytest.mark.parametrize("k", [2, 96])
def test_exact_gemm_rounds_the_edges_as_its_definition(device, k):
    """Every form of the exact GEMM gives the definition's bits where the rounding is delicate: outputs from
    above float32's largest (overflow to inf) down through the subnormals to below half the smallest one, exact
    cancellations, ties between subnormals, and sums whose integers cross 2^63 (the reconstruction converts
    those of at most 63 bits directly and rounds the longer ones to odd first)."""
    from uform.reference import exact_gemm

    rng = np.random.default_rng(k)
    m, n = 48, 40
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-75, 64, (m, 1)))).astype(np.float32)
    b = (rng.standard_normal((k, n)) * np.exp2(rng.integers(-75, 64, (1, n)))).astype(np.float32)
    a[0], a[1, :2], b[:2, 0] = 0.0, [1.0, -1.0], [1.0, 1.0]  # a zero row; an exact cancellation
    a[2, :2], b[:2, 1] = [np.float32(1 + 2**-3), 0.0], [2.0**-147, 0.0]  # a tie between two subnormals
    a[3, 1:], b[1:, 2] = 0.0, 0.0
    a[3, 0], b[0, 2] = 2.0**-100, 2.0**-50  # below half the smallest subnormal
    a[4], b[:, 3] = 3e38, 2.0  # overflows
    a[5] = rng.integers(1, 2**23, k) * np.float32(2**-23)  # long integers: sums past 2^63
    a[6], b[:, 4] = rng.standard_normal(k) * 2.0**-30, rng.standard_normal(k) * 2.0**-30  # sums below 2^63:
    a[6, 0], b[0, 4], b[1, 4] = 1.0, 0.0, 1.0  # each line's largest is 1, the products' sum about 2^-30
    expected = exact_gemm.exact_gemm(a, b)
    assert np.isinf(expected).any() and (np.abs(expected[expected != 0]) < 2.0**-126).any()
    assert_every_exact_form_is_the_definition(device, a, b)


@pytest.mark.parametrize("m,n,k,ta", [(33, 20, 700, False), (150, 300, 5000, True), (9, 130, 70000, False)])
def test_exact_gemm_ignores_the_order_of_k(device, m, n, k, ta):
    """A random permutation of k (A's columns and B's rows alike) gives the same bits in every form, and the fused
    form gives them whatever ranges it splits k into: the sum is one integer, whatever its order."""
    rng = np.random.default_rng(m + k)
    a = (rng.standard_normal((m, k)) * np.exp(rng.standard_normal((m, k)))).astype(np.float32)
    b = (rng.standard_normal((k, n)) * np.exp(rng.standard_normal((k, n)))).astype(np.float32)
    order = rng.permutation(k)
    results = []
    for x, y in ((a, b), (a[:, order], b[order])):
        stored = np.ascontiguousarray(x.T) if ta else x
        for residues, splits in ((False, 0), (True, 0), ("fused", 0), ("fused", 1), ("fused", 3)):
            c = device.empty((m, n))
            K.gemm_exact(c, device.put(stored), device.put(y), m, n, k, transpose_a=ta, residues=residues,
                         splits=splits)
            results.append(c.numpy().view(np.uint32))
    assert all(np.array_equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("k", [1, 255, 256, 257, 4099, 70000])
def test_exact_gemm_residues_at_the_largest_sums(device, k):
    """Every form gives the definition's bits where |Σ A'·B'| comes nearest its bound K·2^(2b): every value the
    largest below 1 (so A' = B' = 2^b − 2^(b−24) throughout), rows and columns of one sign, of the other, and
    alternating; k across the CPU's blocks of 256 and past one GPU chunk."""
    top = np.float32(np.nextafter(np.float32(1), np.float32(0)))
    signs = np.stack([np.ones(k), -np.ones(k), (-1.0) ** np.arange(k)])
    a = (top * signs).astype(np.float32)
    b = (top * signs.T).astype(np.float32)
    assert_every_exact_form_is_the_definition(device, a, b)


@pytest.mark.parametrize("k", [2, 300])
def test_exact_gemm_rounds_at_the_edges(device, k):
    """Every form gives the definition's bits where the one rounding is delicate: ties to even either way, just above
    a tie, the largest finite value, a tie up to infinity, overflow, subnormal results, underflow to +0 and −0, and
    half the smallest subnormal (each row holds two values, the rest of k zeros; the columns scale them)."""
    from uform.reference import exact_gemm

    ldexp = np.ldexp
    rows = [(1.0, ldexp(1.0, -24)), (1 + ldexp(1.0, -23), ldexp(1.0, -24)), (1.0, ldexp(1.0, -24) + ldexp(1.0, -40)),
            ((2 - ldexp(1.0, -23)) * ldexp(1.0, 127), 0.0), ((2 - ldexp(1.0, -23)) * ldexp(1.0, 127), ldexp(1.0, 103)),
            (ldexp(1.0, -100), 0.0), (-ldexp(1.0, -100), 0.0), (ldexp(1.0, -90), ldexp(1.0, -112)),
            (ldexp(1.0, -90), 0.0), (-1.0, -ldexp(1.0, -24))]
    columns = [1.0, 4.0, ldexp(1.0, -40), ldexp(1.0, -60), -ldexp(1.0, -60)]
    a = np.zeros((len(rows), k), np.float32)
    a[:, :2] = np.array(rows)
    b = np.tile(np.array(columns, np.float32), (k, 1))
    expected = exact_gemm.exact_gemm(a, b).view(np.uint32)
    assert np.isinf(expected.view(np.float32)).any() and (expected == 0x80000000).any()  # the edges are reached
    assert_every_exact_form_is_the_definition(device, a, b)


@pytest.mark.parametrize("k,ta,tb", [(1, False, False), (300, False, False), (300, True, False), (300, False, True),
                                    (70000, True, False)])
def test_exact_gemm_converts_values_of_every_scale(device, k, ta, tb):
    """Every form gives the definition's bits whatever the lines' fixed-point values look like: each line's values
    spread over a window of binades below its own largest (none, 10, 30, 60 or all of float32's), placed anywhere
    from the subnormals to near the largest finite, signs at random, so that the residues see values shifted left
    by up to 42 bits (a line of subnormals), right past 31 bits (truncated to nothing) and everything between;
    contiguous and transposed lines alike."""
    rng = np.random.default_rng(k + 2 * ta + tb)
    m, n = 24, 20

    def operand(lines, length):
        width = rng.choice([0, 10, 30, 60, 280], (lines, 1))
        top = rng.integers(-149, 127, (lines, 1))
        binades = np.clip(top - rng.integers(0, width + 1, (lines, length)), -150, 126)
        signs = rng.choice([-1.0, 1.0], (lines, length))
        return (signs * np.ldexp(1 + rng.random((lines, length)), binades)).astype(np.float32)

    assert_every_exact_form_is_the_definition(device, operand(m, k), operand(n, k).T, ta, tb)


@pytest.mark.parametrize("k,ta,tb,side", [(2, False, False, "a"), (33, True, False, "a"), (300, False, True, "a"),
                                         (300, False, False, "b"), (129, True, False, "b"), (77, False, True, "b"),
                                         (70000, True, False, "a"), (70000, False, True, "b")])
def test_exact_gemm_converts_each_value_alone(device, k, ta, tb, side):
    """Each output one value's fixed point, so that no rounding of a sum can hide a wrong low bit: a line holds its
    largest magnitude (random bits, or an edge: the smallest subnormals, the largest subnormal, the smallest and
    largest normals, 1) then values of random bits below it, both signs; the other operand picks one value for each
    output (0s and one 1). Lines of A (side "a") or columns of B ("b"), every layout, k past 2^16 (12 moduli),
    every form against the definition."""
    rng = np.random.default_rng(k + 4 * ta + 2 * tb + (side == "b"))
    lines, picked = 40, min(k - 1, 48)
    largest = rng.integers(1, 0x7F7FFFFF, lines).astype(np.uint32)
    largest[:8] = [1, 2, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x3F800000, 0x00400000, 0x0C000000]
    below = np.minimum((rng.random((lines, k - 1)) * (largest[:, None] + 1.0)).astype(np.uint32), largest[:, None])
    signs = rng.integers(0, 2, (lines, k)).astype(np.uint32) << 31
    values = (np.concatenate([largest[:, None], below], 1) | signs).view(np.float32)
    pick = np.zeros((k, picked), np.float32)
    pick[rng.choice(np.arange(1, k), picked, replace=False), np.arange(picked)] = 1.0
    a, b = (values, pick) if side == "a" else (pick.T.copy(), values.T.copy())
    assert_every_exact_form_is_the_definition(device, a, b, ta, tb)


def test_rmsnorm_takes_its_residual_and_sum_together(device):
    """The norm with its residual add needs both the residual and the buffer h that keeps the sum; one alone is
    refused before any launch, the output untouched."""
    x, weight = device.put(np.ones((2, 4), np.float32)), device.put(np.ones(4, np.float32))
    y, rstd, residual = device.put(np.full((2, 4), 7.0, np.float32)), device.empty(2), device.empty((2, 4))
    for given in (dict(residual=residual), dict(h=residual)):
        with pytest.raises(ValueError, match="takes residual and h together"):
            K.rmsnorm_forward(y, rstd, x, weight, 1e-5, **given)
    assert (y.numpy() == 7.0).all()


@pytest.mark.parametrize("m,n,k,ta,tb,acc", [(512, 512, 512, False, False, False), (600, 513, 600, True, False, True),
                                              (513, 600, 513, False, True, False)])
def test_identical_gemm_is_the_exact_gemm_from_the_rules_shape(device, m, n, k, ta, tb, acc):
    """kernels.gemm gives the exact GEMM's bits (uform.reference.exact_gemm, then C0 added) where the canonical
    shape rule takes a product (k ≥ 512, m and n ≥ 512), in every layout; one short of the rule it gives the fma
    chain's (kernels.gemm_fma), whose roundings differ from the exact sum's."""
    from uform.reference import exact_gemm

    assert K.gemm_is_exact(m, n, k)
    assert not any((K.gemm_is_exact(511, n, k), K.gemm_is_exact(m, 511, k), K.gemm_is_exact(m, n, 511)))
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    stored_a, stored_b = (np.ascontiguousarray(a.T) if ta else a), (np.ascontiguousarray(b.T) if tb else b)
    c = device.put(c0)
    K.gemm(c, device.put(stored_a), device.put(stored_b), m, n, k, transpose_a=ta, transpose_b=tb, accumulate=acc)
    expected = exact_gemm.exact_gemm(a, b)
    if acc:
        expected = c0 + expected
    assert np.array_equal(c.numpy().view(np.uint32), expected.view(np.uint32))
    below, chain = device.empty((m, n)), device.empty((m, n))
    K.gemm(below, device.put(a[:, :511]), device.put(b[:511]), m, n, 511)
    K.gemm_fma(chain, device.put(a[:, :511]), device.put(b[:511]), m, n, 511)
    assert np.array_equal(below.numpy().view(np.uint32), chain.numpy().view(np.uint32))
    assert (below.numpy() != exact_gemm.exact_gemm(a[:, :511], b[:511])).any()


def test_weight_gradients_sum_exact_products_over_blocks_of_rows():
    """The stack's k range for a weight gradient: blocks of the largest power of two of rows within 4096 tokens where
    the exact GEMM's rule takes the product over a block, a row where it does not (the fma chain's partials, or a
    grouped-query head narrower than 512), none without rows; a world's devices hold whole blocks."""
    from uform.nn.transformer import StackGeometry, exact_block_rows, weight_gradient_range, world_block_rows

    assert [exact_block_rows(r) for r in (1024, 512, 700, 2048, 3000, 5000, 100)] == [4, 8, 4, 2, 1, 1, 32]
    assert weight_gradient_range(768, 3072, 65536, 1024) == 4096
    assert weight_gradient_range(768, 256, 65536, 1024) == 1024  # n below the rule: a row
    assert weight_gradient_range(512, 512, 64 * 100, 100) == 3200  # exact over a block, though not over a row
    assert weight_gradient_range(768, 768, 1024, 1024) == 4096  # one block longer than k: one product over k
    assert weight_gradient_range(768, 768, 65536, 0) == 0
    geometry = dict(kv_heads=4, head_dim=64, layers=1, norm_eps=1e-6, rope_base=1e4, causal=False)
    assert world_block_rows(StackGeometry(width=512, heads=8, mlp=2048, **geometry), 512) == 8
    assert world_block_rows(StackGeometry(width=256, heads=4, mlp=1024, **geometry), 512) == 1


@pytest.mark.parametrize("k,k_range,acc", [(3 * 512, 512, True), (5 * 512, 512, False), (2 * 640 + 100, 640, True)])
def test_identical_gemm_adds_exact_k_ranges_in_the_row_tree(device, k, k_range, acc):
    """An Aᵀ·B product cut into k ranges (the encoder's weight gradients, a range a packed row) whose length the rule
    takes: each range's exact product (the reference's bits) rounded alone, the ranges added in the row tree
    (T(0..n) = T(0..m) + T(m..n)), then C0; a shorter last range its own length's product; kernels.gemm and
    gemm_exact's residue forms alike."""
    from uform.reference import exact_gemm
    from uform.training.world import row_tree

    m, n = 520, 600
    rng = np.random.default_rng(k)
    a = (rng.standard_normal((k, m)) * np.exp(rng.standard_normal((k, 1)))).astype(np.float32)  # stored Aᵀ
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    parts = [exact_gemm.exact_gemm(np.ascontiguousarray(a[r:r + k_range].T), b[r:r + k_range])
             for r in range(0, k, k_range)]
    expected = row_tree(parts)
    if acc:
        expected = c0 + expected
    assert K.gemm_is_exact(m, n, k, k_range)
    results = []
    c = device.put(c0)
    K.gemm(c, device.put(a), device.put(b), m, n, k, transpose_a=True, k_range=k_range, accumulate=acc)
    results.append(c.numpy())
    for residues in (True, "fused"):
        c = device.put(c0)
        K.gemm_exact(c, device.put(a), device.put(b), m, n, k, transpose_a=True, k_range=k_range, accumulate=acc,
                     residues=residues)
        results.append(c.numpy())
    for got in results:
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    with pytest.raises(ValueError, match="k_range must be 0, or positive for an Aᵀ·B product in a residue form"):
        K.gemm_exact(c, device.put(a), device.put(b), m, n, k, transpose_a=True, k_range=k_range)


def test_exact_gemm_refuses_k_ranges_it_does_not_define(device):
    """gemm_exact's k_range: an int >= 0, never beside splits, for Aᵀ·B in a residue form; the rule takes a range
    longer than k as k itself, and lengths past the definition's MAX_K to the fma chain; refusals leave C alone."""
    a, b, c = device.put(np.ones((1024, 512), np.float32)), device.put(np.ones((1024, 512), np.float32)), \
        device.put(np.full((512, 512), 7.0, np.float32))
    for bad, message in ((True, "k_range must be an int >= 0, got True"), (2.5, "k_range must be an int >= 0"),
                         (-1, "k_range must be an int >= 0, got -1")):
        with pytest.raises(ValueError, match=message):
            K.gemm_exact(c, a, b, 512, 512, 1024, transpose_a=True, residues=True, k_range=bad)
    with pytest.raises(ValueError, match="splits and k_range exclude each other"):
        K.gemm_exact(c, a, b, 512, 512, 1024, transpose_a=True, residues="fused", k_range=512, splits=2)
    with pytest.raises(ValueError, match="k up to"):
        K.gemm_exact(c, a, b, 512, 512, K.EXACT_GEMM_MAX_K + 1, transpose_a=True, residues=True,
                     k_range=K.EXACT_GEMM_MAX_K + 1)
    assert (c.numpy() == 7.0).all()
    assert not K.gemm_is_exact(512, 512, 300, 512) and K.gemm_is_exact(512, 512, 600, 1024)
    assert not K.gemm_is_exact(512, 512, K.EXACT_GEMM_MAX_K + 1) and K.gemm_is_exact(512, 512, 4 << 20, 1 << 20)


@pytest.mark.parametrize("m,n", [(513, 513), (515, 519)])
def test_exact_k_ranges_of_an_odd_output_count(device, m, n):
    """k ranges whose partials take a byte count that is no multiple of 16 (m·n odd): the planes after them keep
    their alignment, and the product the reference's bits (rows of 512 run together on a Hopper GPU)."""
    from uform.reference import exact_gemm
    from uform.training.world import row_tree

    rng = np.random.default_rng(m * n)
    a = rng.standard_normal((1024, m)).astype(np.float32)
    b = rng.standard_normal((1024, n)).astype(np.float32)
    c = device.empty((m, n))
    K.gemm(c, device.put(a), device.put(b), m, n, 1024, transpose_a=True, k_range=512)
    expected = row_tree([exact_gemm.exact_gemm(np.ascontiguousarray(a[r:r + 512].T), b[r:r + 512]) for r in (0, 512)])
    assert np.array_equal(c.numpy().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("product", [K.gemm, K.gemm_fma])
def test_gemm_refuses_k_ranges_it_does_not_define(device, product):
    """k ranges of a named length are for Aᵀ·B products (the weight gradients) alone, and never negative."""
    a, b, c = device.empty((8, 4)), device.empty((8, 4)), device.empty((4, 4))
    with pytest.raises(ValueError, match="k_range must be 0, or positive for an Aᵀ·B product, got 4"):
        product(c, a, b, 4, 4, 8, k_range=4)
    with pytest.raises(ValueError, match="got -1"):
        product(c, a, b, 4, 4, 8, transpose_a=True, k_range=-1)
    with pytest.raises(ValueError, match="sizes must be positive"):
        product(c, a, b, 4, 0, 8)
