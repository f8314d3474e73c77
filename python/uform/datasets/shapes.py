"""A small captioned image set for demos and tests: one coloured shape on white, and words saying which.

Every scene is one shape, colour, size and place, drawn with Pillow on a white
square canvas and captioned in words, "a small red circle in the top left":

- shapes: circle, square, triangle, diamond, star, hexagon;
- colours: red, orange, yellow, green, blue, purple, pink, black;
- sizes: small, medium, large (a shape spans 0.18, 0.28 or 0.40 of the canvas side);
- places: the nine cells of a 3 × 3 grid (the shape centred at 0.25, 0.5 or 0.75
  of the side on each axis), "in the top left", "at the top", ..., "in the center".

That is 6 × 8 × 3 × 9 = 1296 distinct captions (:func:`all_scenes`).
:func:`shape_pairs` draws ``count`` (PNG bytes, caption) pairs from a seed: the
scenes in a random order (a fresh permutation of all 1296 for every further
1296 pairs), each nudged by a random offset of up to 0.04 of the side on each
axis, so repeats of a caption differ in their pixels. The same seed, count and
side give the same bytes (with the same Pillow).
"""

from __future__ import annotations

import io
import itertools
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "diamond", "star", "hexagon")
COLOURS = {
    "red": (220, 40, 40), "orange": (245, 140, 30), "yellow": (235, 205, 30), "green": (40, 160, 60),
    "blue": (40, 80, 220), "purple": (130, 60, 180), "pink": (240, 120, 180), "black": (20, 20, 20),
}
SIZES = {"small": 0.18, "medium": 0.28, "large": 0.40}
"""Each size's span (the diameter of the shape's bounding circle) as a fraction of the canvas side."""
PLACES = {
    "in the top left": (0.25, 0.25), "at the top": (0.5, 0.25), "in the top right": (0.75, 0.25),
    "on the left": (0.25, 0.5), "in the center": (0.5, 0.5), "on the right": (0.75, 0.5),
    "in the bottom left": (0.25, 0.75), "at the bottom": (0.5, 0.75), "in the bottom right": (0.75, 0.75),
}
"""Each place's phrase and the shape's centre there, ``(x, y)`` as fractions of the side from the top left."""
NUDGE = 0.04
"""The largest random offset of a shape's centre on each axis, as a fraction of the side."""


def _star(x: float, y: float, radius: float) -> list[tuple[float, float]]:
    """A five-pointed star's ten corners, pointing up, its inner radius 0.45 of the outer."""
    angles = -math.pi / 2 + np.arange(10) * math.pi / 5
    radii = np.where(np.arange(10) % 2 == 0, radius, 0.45 * radius)
    return list(zip(x + radii * np.cos(angles), y + radii * np.sin(angles)))


@dataclass(frozen=True)
class ShapeScene:
    """One shape, colour, size and place; :meth:`render` draws it, :attr:`caption` says it."""

    shape: str
    colour: str
    size: str
    place: str

    @property
    def caption(self) -> str:
        return f"a {self.size} {self.colour} {self.shape} {self.place}"

    def render(self, side: int = 64, nudge: tuple[float, float] = (0.0, 0.0)) -> bytes:
        """PNG bytes of a ``side`` × ``side`` RGB canvas, the centre moved by ``nudge`` (fractions of the side)."""
        image = Image.new("RGB", (side, side), "white")
        draw = ImageDraw.Draw(image)
        x, y = ((centre + offset) * side for centre, offset in zip(PLACES[self.place], nudge))
        radius = SIZES[self.size] * side / 2
        fill = COLOURS[self.colour]
        if self.shape == "circle":
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=fill)
        elif self.shape == "square":
            half = radius / math.sqrt(2)
            draw.rectangle((x - half, y - half, x + half, y + half), fill=fill)
        elif self.shape == "star":
            draw.polygon(_star(x, y, radius), fill=fill)
        else:
            sides, rotation = {"triangle": (3, 0), "diamond": (4, 45), "hexagon": (6, 0)}[self.shape]
            draw.regular_polygon((x, y, radius), sides, rotation=rotation, fill=fill)
        out = io.BytesIO()
        image.save(out, "PNG")
        return out.getvalue()


def all_scenes() -> list[ShapeScene]:
    """Every scene once, shapes outermost, then colours, sizes and places, in the module doc's orders."""
    return [ShapeScene(*combination) for combination in itertools.product(SHAPES, COLOURS, SIZES, PLACES)]


def shape_pairs(count: int, seed: int, side: int = 64) -> list[tuple[bytes, str]]:
    """``count`` (PNG bytes, caption) pairs drawn from ``seed``; see the module doc."""
    scenes = all_scenes()
    rng = np.random.Generator(np.random.Philox(key=seed))
    rounds = -(-count // len(scenes))
    order = np.concatenate([rng.permutation(len(scenes)) for _ in range(rounds)])[:count]
    nudges = rng.uniform(-NUDGE, NUDGE, size=(count, 2))
    return [(scenes[k].render(side, tuple(nudge)), scenes[k].caption) for k, nudge in zip(order, nudges)]
