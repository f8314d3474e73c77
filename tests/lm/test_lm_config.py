"""LanguageModelConfig validation and the flat parameter layout."""

import numpy as np
import pytest

from uform.lm import LanguageModelConfig, flatten_parameters, parameter_registry, split_parameters

MULTI_LAYER = LanguageModelConfig(batch=3, length=7, width=48, heads=6, kv_heads=3, mlp=80, vocab_size=19, layers=4)


def expected_n_total(c):
    hd = c.head_dim
    per_layer = 2 * c.width + c.width * c.heads * hd * 2 + c.width * c.kv_heads * hd * 2 + 2 * c.width * c.mlp
    return 2 * c.vocab_size * c.width + c.layers * per_layer


@pytest.mark.parametrize("shape", [None, MULTI_LAYER], ids=["default", "multi_layer"])
def test_registry_is_contiguous_and_sums_to_n_total(shape):
    c = shape or LanguageModelConfig()
    registry = parameter_registry(shape)
    assert [r["offset"] for r in registry] == list(np.cumsum([0] + [r["size"] for r in registry])[:-1])
    assert all(r["size"] == np.prod(r["shape"]) for r in registry)
    assert sum(r["size"] for r in registry) == c.n_total == expected_n_total(c)
    assert len(registry) == 2 + 8 * c.layers
    assert registry[0]["name"] == "embedding" and registry[-1]["name"] == "head"
    assert registry[1]["name"] == "layers.0.attention_norm" and registry[-2]["name"] == f"layers.{c.layers - 1}.w_down"


def test_default_dimensions():
    c = LanguageModelConfig()
    dims = (c.batch, c.length, c.width, c.heads, c.kv_heads, c.mlp, c.vocab_size, c.layers)
    assert dims == (2, 32, 32, 4, 2, 64, 256, 2)
    assert (c.rope_base, c.norm_eps, c.head_dim, c.n_total) == (10000.0, 1e-5, 8, 30848)
    wk = {r["name"]: r for r in parameter_registry()}["layers.1.wk"]
    assert wk["shape"] == (32, 16)
    assert LanguageModelConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("fields, named", [
    ({"width": 30}, "width"),
    ({"heads": 4, "kv_heads": 3}, "kv_heads"),
    ({"width": 12, "heads": 4}, "head_dim"),
    ({"layers": 0}, "layers"),
    ({"batch": -1}, "batch"),
    ({"mlp": 2.5}, "mlp"),
    ({"norm_eps": 0.0}, "norm_eps"),
    ({"rope_base": float("inf")}, "rope_base"),
    ({"rope_base": 1e39}, "rope_base"),   # finite in float64, infinite in the engine's float32
    ({"norm_eps": 1e39}, "norm_eps"),
    ({"norm_eps": 1e-50}, "norm_eps"),    # zero in float32
])
def test_invalid_config_names_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        LanguageModelConfig(**fields)


def test_config_is_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        LanguageModelConfig(2, 32)
    with pytest.raises(AttributeError):
        LanguageModelConfig().width = 64


def test_split_and_flatten_round_trip():
    flat = np.arange(MULTI_LAYER.n_total, dtype=np.float32)
    named = split_parameters(flat, MULTI_LAYER)
    assert named["layers.2.wo"].shape == (48, 48) and np.shares_memory(named["head"], flat)
    np.testing.assert_array_equal(flatten_parameters(named, MULTI_LAYER), flat)
    assert flatten_parameters(named, MULTI_LAYER).dtype == np.float32


def test_flatten_and_split_errors():
    named = split_parameters(np.zeros(LanguageModelConfig().n_total, np.float32))
    with pytest.raises(ValueError, match=r"missing \['head'\]"):
        flatten_parameters({k: v for k, v in named.items() if k != "head"})
    with pytest.raises(ValueError, match=r"unknown \['bias'\]"):
        flatten_parameters({**named, "bias": np.zeros(3)})
    with pytest.raises(ValueError, match="layers.0.wq.*shape"):
        flatten_parameters({**named, "layers.0.wq": np.zeros((8, 32))})
    with pytest.raises(ValueError, match="shape"):
        split_parameters(np.zeros(10))
