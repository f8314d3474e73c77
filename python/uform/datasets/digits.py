"""Real images, offline: scikit-learn's bundled handwritten digits as zero-shot classification.

``sklearn.datasets.load_digits`` ships 1,797 scans of handwritten digits (the UCI "Optical Recognition of
Handwritten Digits" test set: 8 × 8 pixels of 0..16, written by 43 people). Each becomes a 32 × 32
grayscale PNG (every pixel a 4 × 4 block, ink dark on white) captioned "a handwritten seven". With
ten captions, the held-out task is zero-shot classification: each held-out image's most similar of
the ten captions must be its own. Same-caption pairs of a step are ``ignore`` edges, not negatives
(``uform.pairs.pair_relations``).

The reference the trained model is held to is a logistic regression on the raw 64 pixels, fitted on
the training images (:func:`pixel_baseline`): what a supervised classifier on pixels reaches.

Licence: the UCI data set is CC BY 4.0 (Alpaydin and Kaynak, 1998); it is read from the installed
scikit-learn (BSD-3-Clause), nothing of it is copied into this repository.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
CAPTIONS = tuple(f"a handwritten {word}" for word in WORDS)
SCALE = 4
"""Each of a scan's 8 × 8 pixels becomes SCALE × SCALE pixels of its PNG."""


def _digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        from ..errors import ErrorCode, UFormError

        raise UFormError(ErrorCode.UNSUPPORTED, "the digits data set needs scikit-learn "
                                                "(pip install scikit-learn)") from None
    return load_digits()


def digit_png(scan: np.ndarray) -> bytes:
    """A scan (8 × 8 of 0..16) as PNG bytes: 32 × 32 grayscale, ink dark on white."""
    pixels = (255 - np.round(scan * (255 / 16))).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(np.kron(pixels, np.ones((SCALE, SCALE), np.uint8))).save(out, "PNG")
    return out.getvalue()


def digit_pairs() -> list[tuple[bytes, str]]:
    """Every scan as (PNG bytes, caption), in the data set's order."""
    digits = _digits()
    return [(digit_png(scan), CAPTIONS[label]) for scan, label in zip(digits.images, digits.target)]


def digit_pixels(pngs) -> np.ndarray:
    """(n, 64) float64 in [0, 1]: the scans back from :func:`digit_png`'s PNGs, ink 1."""
    return np.stack([1 - np.asarray(Image.open(io.BytesIO(png)), np.float64)[::SCALE, ::SCALE].reshape(-1) / 255
                     for png in pngs])


def pixel_baseline(train_pixels: np.ndarray, train_captions, held_pixels: np.ndarray, held_captions) -> float:
    """The held-out accuracy of a logistic regression on the raw pixels fitted on the training scans."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=2000).fit(train_pixels, list(train_captions))
    return float(np.mean(model.predict(held_pixels) == np.asarray(held_captions)))
