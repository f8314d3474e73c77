"""The engine's interface: kernels declare their operands by name in Mojo, Python passes them by name."""

import numpy as np
import pytest

import uform
from uform import kernels as K
from uform import layouts
from uform.engine import _engine


def test_every_interface_names_a_registered_kernel_with_distinct_operands():
    for kernel, (buffers, sizes, scalars) in _engine.KERNEL_INTERFACES.items():
        assert callable(getattr(_engine, kernel)), kernel
        names = buffers.split() + sizes.split() + scalars.split()
        assert len(names) == len(set(names)), f"{kernel}: an operand named twice in {names}"


def test_engine_facts_are_read_from_the_engine():
    facts = _engine.FACTS
    assert list(K.UNARY_OPS) == facts["unary_ops"] and list(K.UNARY_OPS.values()) == list(range(len(K.UNARY_OPS)))
    assert K.ATTENTION_HEAD_DIMS == tuple(facts["attention_head_dims"])
    assert (K.COLUMN_CHUNK, K.FORM_WEIGHTED_SIGMOID, K.FORM_RANKED) == (
        facts["column_chunk"], facts["form_weighted_sigmoid"], facts["form_ranked"])


def test_an_unknown_operand_name_is_refused_before_launch():
    device = uform.Device.cpu()
    y = device.put(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="add\\(\\) got an unexpected keyword argument 'z'"):
        K._launch("add", 4, y=y, a=y, z=y)
    assert np.all(y.numpy() == 0)


def test_attention_refuses_operands_off_a_16_byte_boundary():
    device = uform.Device.cpu()
    rows = device.put(np.zeros((9, 8), np.float32))
    q, shifted = rows.view(0, (8, 8)), rows.view(1, (8, 8))  # the second starts 4 bytes in
    o, lse = device.empty((8, 8)), device.empty((8, 1))
    spans = device.put(layouts.attention_spans(8, 8))
    geometry = dict(spans=spans, heads=1, kv_heads=1, head_dim=8, causal=False)
    with pytest.raises(ValueError, match="attention operands must start on 16 bytes"):
        K.attention_forward(o, lse, q, shifted, q, **geometry)
    K.attention_forward(o, lse, q, rows.view(8, (8, 8)), q, **geometry)  # 32 bytes in: aligned


def test_a_forced_gemm_tiling_is_read_when_a_device_opens(monkeypatch):
    """UFORM_GEMM_TILE names one of the fma chain's GPU tilings (the engine's FACTS), read once as a device opens;
    a name the engine has no tiling of is refused there, naming the ones it has."""
    assert set(_engine.FACTS["gemm_tilings"]) == {"large", "large-k16", "small", "small-8x8", "tiny"}
    monkeypatch.setenv("UFORM_GEMM_TILE", "small")
    uform.Device.cpu()
    monkeypatch.setenv("UFORM_GEMM_TILE", "huge")
    with pytest.raises(uform.UFormError, match=r"UFORM_GEMM_TILE: one of \['large', .*got 'huge'"):
        uform.Device.cpu()
