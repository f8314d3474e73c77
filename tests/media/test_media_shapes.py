"""The captioned shapes set: deterministic, varied, and drawn where its captions say."""

import io

from PIL import Image

from uform.datasets import all_scenes, shape_pairs
from uform.media import decode_image
from uform.datasets.shapes import COLOURS, PLACES, ShapeScene


def test_the_same_seed_gives_the_same_pairs_and_another_seed_others():
    assert shape_pairs(20, seed=3) == shape_pairs(20, seed=3)
    assert shape_pairs(20, seed=3) != shape_pairs(20, seed=4)


def test_over_a_thousand_distinct_pairs():
    scenes = all_scenes()
    assert len({scene.caption for scene in scenes}) == len(scenes) == 1296
    pairs = shape_pairs(1296, seed=0, side=32)
    assert len({caption for _, caption in pairs}) == 1296 and len({png for png, _ in pairs}) == 1296


def test_captions_are_words_and_images_are_pngs():
    png, caption = shape_pairs(1, seed=1)[0]
    assert caption.startswith("a ") and len(caption.split()) >= 5
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.size == (64, 64)


def test_the_shape_is_drawn_in_its_colour_at_its_place():
    for place, (x, y) in PLACES.items():
        scene = ShapeScene("square", "blue", "medium", place)
        pixels = decode_image(scene.render(side=64))
        assert scene.caption == f"a medium blue square {place}"
        assert tuple(pixels[int(y * 64), int(x * 64), :3]) == COLOURS["blue"]
        assert tuple(pixels[0 if y > 0.5 else 63, 0 if x > 0.5 else 63, :3]) == (255, 255, 255)
    assert (decode_image(ShapeScene("star", "red", "small", "in the center").render())[..., 3] == 255).all()
