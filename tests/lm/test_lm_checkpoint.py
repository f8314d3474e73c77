"""State validation and the JSON and binary checkpoint formats."""

import copy
import hashlib
import json
import os

import numpy as np
import pytest

from uform.lm import (FORMAT, LanguageModelConfig, encode_json_checkpoint, read_binary_checkpoint,
                      read_json_checkpoint, read_json_checkpoint_bytes, validate_state, write_binary_checkpoint,
                      write_json_checkpoint)

SPECIAL_BITS = np.array([0x80000000, 0x7F7FFFFF, 0x00000001, 0x007FFFFF],
                        dtype=np.uint32)        # -0.0, the largest float32, subnormals (a NaN is refused)


def make_state(shape=None, seed=0):
    c = shape or LanguageModelConfig()
    rng = np.random.default_rng(seed)
    arrays = {name: rng.standard_normal(c.n_total).astype(np.float32) for name in ("parameters", "m", "v")}
    arrays["v"] = np.abs(arrays["v"])  # second moments are never negative
    for array in arrays.values():
        array[:SPECIAL_BITS.size] = SPECIAL_BITS.view(np.float32)
    return {"format": FORMAT, "config": c.to_dict(),
            "hyperparameters": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
            "step": 17, **arrays,
            "data_schedule": {"corpus": "demo-corpus", "n_vocab": c.vocab_size, "seed": 3, "planned_steps": 100},
            "metadata": {"note": "test", "losses": [5.5, 5.25]}}


def assert_same_state(a, b):
    for name in ("parameters", "m", "v"):
        assert a[name].dtype == b[name].dtype == np.float32
        np.testing.assert_array_equal(a[name].view(np.uint32), b[name].view(np.uint32))
    assert {k: v for k, v in a.items() if k not in ("parameters", "m", "v")} == \
           {k: v for k, v in b.items() if k not in ("parameters", "m", "v")}


def test_validate_state_normalises_and_copies():
    state = make_state()
    checked = validate_state(state, LanguageModelConfig())
    assert_same_state(checked, state)
    assert not np.shares_memory(checked["parameters"], state["parameters"])
    checked["data_schedule"]["corpus"] = "changed"
    assert state["data_schedule"]["corpus"] == "demo-corpus"


def _break(state, change):
    state = copy.deepcopy(state)
    change(state)
    return state


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(format="uform.lm/0"), "format"),
    (lambda s: s.pop("metadata"), r"missing \['metadata'\]"),
    (lambda s: s.update(extra=1), r"unknown \['extra'\]"),
    (lambda s: s["config"].update(heads=3), "invalid config"),
    (lambda s: s["config"].pop("rope_base"), "rope_base"),
    (lambda s: s.update(step=-1), "step"),
    (lambda s: s.update(step=2.0), "step"),
    (lambda s: s["hyperparameters"].update(lr=float("nan")), "lr must be finite"),
    (lambda s: s["hyperparameters"].update(betas=(0.9, 1.0)), "betas"),
    (lambda s: s["hyperparameters"].pop("eps"), "hyperparameters"),
    (lambda s: s.update(m=s["m"][:-1]), "m must have shape"),
    (lambda s: s.update(v=np.zeros(s["v"].size)), "v must be a float32"),
    (lambda s: s.update(parameters=list(s["parameters"])), "parameters must be a float32"),
    (lambda s: s["data_schedule"].update(n_vocab=128), "n_vocab"),
    (lambda s: s["data_schedule"].update(order=(1, 2)), "round trip"),
    (lambda s: s["metadata"].update(x=float("inf")), "metadata is not JSON"),
    (lambda s: s["metadata"].update(x="y" * 70000), "metadata is .* bytes"),
])
def test_validate_state_refusals(change, message):
    state = make_state(LanguageModelConfig(layers=1))
    with pytest.raises(ValueError, match=message):
        validate_state(_break(state, change))


def test_validate_state_checks_the_expected_shape():
    with pytest.raises(ValueError, match="does not match the model shape"):
        validate_state(make_state(), LanguageModelConfig(layers=3))


def test_json_round_trip_is_bit_exact(tmp_path):
    state = make_state()
    path = tmp_path / "ckpt.json"
    write_json_checkpoint(path, state)
    assert os.listdir(tmp_path) == ["ckpt.json"]
    assert_same_state(read_json_checkpoint(path), state)
    assert_same_state(read_json_checkpoint_bytes(path.read_bytes()), state)
    document = json.loads(path.read_bytes())
    assert document["parameters"]["count"] == LanguageModelConfig().n_total
    assert path.read_bytes() == encode_json_checkpoint(state)


def _swap_char(encoded, position):
    replacement = b"B" if encoded[position:position + 1] != b"B" else b"C"
    return encoded[:position] + replacement + encoded[position + 1:]


def test_json_tampering_is_detected():
    encoded = encode_json_checkpoint(make_state())
    weights = encoded.index(b'"parameters":{"base64":"') + 40
    with pytest.raises(ValueError, match="digest mismatch: the file was modified"):
        read_json_checkpoint_bytes(_swap_char(encoded, weights))
    with pytest.raises(ValueError, match="digest mismatch"):
        read_json_checkpoint_bytes(encoded.replace(b"demo-corpus", b"demo-corpuz"))
    with pytest.raises(ValueError, match="digest mismatch"):
        read_json_checkpoint_bytes(encoded.replace(b'"step":17', b'"step":18'))
    with pytest.raises(ValueError, match="truncated"):
        read_json_checkpoint_bytes(encoded[:-100])
    with pytest.raises(ValueError, match="sha256"):
        read_json_checkpoint_bytes(b"{}")
    with pytest.raises(TypeError, match="bytes"):
        read_json_checkpoint_bytes(bytearray(encoded))


def test_json_checkpoint_refuses_large_models(tmp_path):
    large = LanguageModelConfig(width=64, heads=4, kv_heads=4, mlp=256, layers=2)
    path = tmp_path / "big.json"
    with pytest.raises(ValueError, match="2 MiB.*write_binary_checkpoint"):
        write_json_checkpoint(path, make_state(large))
    assert os.listdir(tmp_path) == []


def test_binary_round_trip_is_bit_exact(tmp_path):
    shape = LanguageModelConfig(layers=3, width=64, mlp=128)
    state = make_state(shape, seed=1)
    path = tmp_path / "ckpt.bin"
    digest = write_binary_checkpoint(path, state)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert path.read_bytes()[:8] == b"UFORMLM1"
    assert os.listdir(tmp_path) == ["ckpt.bin"]
    assert_same_state(read_binary_checkpoint(path), state)
    write_binary_checkpoint(path, make_state(seed=2))          # atomically replaces the old file
    assert_same_state(read_binary_checkpoint(path), make_state(seed=2))


@pytest.fixture
def binary_file(tmp_path):
    path = tmp_path / "ckpt.bin"
    write_binary_checkpoint(path, make_state())
    return path


def _rewrite(path, change):
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(change(data)))


@pytest.mark.parametrize("change, message", [
    (lambda d: d[:-1], "truncated"),
    (lambda d: d[:100], "truncated"),
    (lambda d: d[:10], "magic"),
    (lambda d: d + b"\0", "trailing data"),
    (lambda d: d[:-5] + bytes([d[-5] ^ 1]) + d[-4:], "array 'v' digest mismatch"),
    (lambda d: d.replace(b"demo-corpus", b"demo-corpuz"), "header digest mismatch"),
    (lambda d: b"UFORMLM2" + d[8:], "magic"),
    (lambda d: d[:8] + (2**40).to_bytes(8, "little") + d[16:], "header length"),
])
def test_binary_tampering_is_detected(binary_file, change, message):
    _rewrite(binary_file, change)
    with pytest.raises(ValueError, match=message):
        read_binary_checkpoint(binary_file)


def test_binary_write_refuses_invalid_state(tmp_path):
    state = make_state()
    state["step"] = -3
    with pytest.raises(ValueError, match="step"):
        write_binary_checkpoint(tmp_path / "x.bin", state)
    assert os.listdir(tmp_path) == []
