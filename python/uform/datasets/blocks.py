"""A tiny image-caption task for tests and ablations: a coloured block in one corner of a noisy image.

Each image is ``side`` × ``side`` RGB, every pixel of its background drawn uniformly from 100..199 in
each channel, with a ``block`` × ``block`` square of one of eight colours in one of four corners (set
in from the edge by 0, 1 or 2 pixels on each axis). Its caption names both, "a red block in the top
left": 32 captions (:data:`CAPTIONS`), one per label ``4 · colour + corner``.

The task needs what a mean over the patches' states hides unless the model knows where each patch
lies: the corner. A model that reads colour alone tops out at one in four. :func:`block_images` draws
``count`` (PNG bytes, label) pairs from a seed with numpy's default generator; the same seed, count and
sizes give the same bytes (with the same Pillow and numpy).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

COLOURS = {
    "red": (220, 40, 40), "orange": (245, 140, 30), "yellow": (235, 205, 30), "green": (40, 160, 60),
    "blue": (40, 80, 220), "purple": (130, 60, 180), "pink": (240, 120, 180), "black": (20, 20, 20),
}
CORNERS = ("top left", "top right", "bottom left", "bottom right")
CAPTIONS = tuple(f"a {colour} block in the {corner}" for colour in COLOURS for corner in CORNERS)
"""The caption of each label, ``4 · colour + corner``."""


def render(label: int, rng: np.random.Generator, side: int = 32, block: int = 12) -> bytes:
    """PNG bytes of one image of ``label`` (module doc), its noise and inset drawn from ``rng``."""
    colour, corner = divmod(label, len(CORNERS))
    pixels = rng.integers(100, 200, size=(side, side, 3)).astype(np.uint8)
    inset = rng.integers(0, 3, size=2)
    top = inset[0] if corner < 2 else side - block - inset[0]
    left = inset[1] if corner % 2 == 0 else side - block - inset[1]
    pixels[top:top + block, left:left + block] = list(COLOURS.values())[colour]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def block_images(count: int, seed: int, side: int = 32, block: int = 12) -> tuple[list[bytes], np.ndarray]:
    """``count`` images and their labels (int64), drawn from ``seed``: each label uniform over the 32."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CAPTIONS), count)
    return [render(int(label), rng, side, block) for label in labels], labels
