"""The built-in data sets of ``python -m uform train``, its demos and its tests: offline, from this package or
from packages that ship their data, each with a held-out split that shares no item with training.

- :mod:`.names` -- :func:`name_pairs`: names of countries, currencies and languages in about 160 languages and
  scripts → English, from pycountry's translation catalogs.
- :mod:`.stdlib` -- :func:`mine_standard_library_pairs`: docstring-summary → signature pairs parsed (never
  imported) from this Python's standard library.
- :mod:`.digits` -- scikit-learn's handwritten digits as zero-shot classification, with a pixel baseline.
- :mod:`.shapes` -- :func:`shape_pairs`: captioned shapes drawn with Pillow.
- :mod:`.blocks` -- coloured blocks in corners of noisy images: the image quality test's task.
- :mod:`.sounds` -- captioned tones, chords, sweeps and noise bursts.
- :mod:`.spoken` -- espeak-ng's recordings of the number words, where it is installed.
"""

from .names import name_pairs
from .shapes import ShapeScene, all_scenes, shape_pairs
from .stdlib import MAX_QUERY_BYTES, MIN_QUERY_BYTES, mine_standard_library_pairs, standard_library_files

__all__ = ["MAX_QUERY_BYTES", "MIN_QUERY_BYTES", "ShapeScene", "all_scenes", "mine_standard_library_pairs",
           "name_pairs", "shape_pairs", "standard_library_files"]
