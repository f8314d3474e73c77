"""Every kernel against its float64 numpy reference, on the CPU (and a GPU when one is there)."""

import zlib

import numpy as np
import pytest

from kernel_cases import all_cases


@pytest.mark.parametrize("name,case,kwargs", all_cases(), ids=[c[0] for c in all_cases()])
def test_kernel_matches_float64_reference(device, name, case, kwargs):
    outputs = case(device, seed=zlib.crc32(name.encode()), **kwargs)
    for output_name, (out, ref, tolerance, *magnitude) in outputs.items():
        assert out.shape == ref.shape, output_name
        assert np.all(np.isfinite(out)), f"{name}/{output_name}: non-finite output"
        error = np.max(np.abs(out - ref)) / ((magnitude[0] if magnitude else np.max(np.abs(ref))) + 1e-30)
        assert error <= tolerance, f"{name}/{output_name}: relative error {error:.3g} > {tolerance:.3g}"
