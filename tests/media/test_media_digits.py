"""The digits data set: PNGs that give their scans back, and captions by label."""

import numpy as np
import pytest

from uform.datasets.digits import CAPTIONS, digit_pairs, digit_pixels

sklearn = pytest.importorskip("sklearn")


def test_digit_pngs_hold_their_scans_and_captions():
    from sklearn.datasets import load_digits

    digits = load_digits()
    pairs = digit_pairs()
    assert len(pairs) == 1797 and [caption for _, caption in pairs[:10]] == list(CAPTIONS)
    pixels = digit_pixels([png for png, _ in pairs[:50]])
    np.testing.assert_allclose(pixels, digits.data[:50] / 16, atol=0.5 / 255)
