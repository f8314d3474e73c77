"""The host side of image and video items: decoding, patches and tubes, masks, a decoding pool.

Read in this order (``docs/media.md`` holds every rule in one place):

- :mod:`.formats` -- :func:`sniff_format`, a file's format from its signature.
- :mod:`.items` -- what a media item may be; every refusal names the item.
- :mod:`.images` -- :func:`decode_image`, an IMAGE item to RGBA uint8 pixels.
- :mod:`.video` -- :func:`decode_video`, a VIDEO item to RGB uint8 frames.
- :mod:`.patches` -- :func:`image_patches` and :func:`video_tubes`: pixels to
  :class:`Patches` (pixels, inputs, MAE targets, positions), downscaled or truncated to fit.
- :mod:`.prepare` -- :func:`prepare_image` and :func:`prepare_video`: one item's whole
  host path, decoding then patches, for the run's shape.
- :mod:`.masking` -- :func:`mask_patches`, the keyed choice of masked patches.
- :mod:`.batch` -- :func:`batch_patches`, a step's items back to back as a :class:`PatchBatch`.
- :mod:`.pool` -- :class:`DecodePool`, decoding on threads or processes while the device works, and
  :func:`shared_pool`, the processes every trainer decodes on.

Audio items have their own module beside these: :mod:`.audio`. The demo data sets are in :mod:`uform.datasets`.
"""

from .batch import PatchBatch, batch_patches
from .formats import IMAGE_FORMATS, VIDEO_FORMATS, sniff_format
from .images import MAX_IMAGE_PIXELS, decode_image
from .masking import mask_patches, masked_count
from .patches import Patches, fitted_size, image_patches, video_tubes
from .pool import DecodeJob, DecodePool, shared_pool
from .prepare import prepare_image, prepare_video
from .video import MAX_VIDEO_PIXELS, VIDEO_CODECS, decode_video

__all__ = [
    "IMAGE_FORMATS", "MAX_IMAGE_PIXELS", "MAX_VIDEO_PIXELS", "VIDEO_CODECS", "VIDEO_FORMATS", "DecodeJob",
    "DecodePool", "PatchBatch", "Patches", "batch_patches", "decode_image",
    "decode_video", "fitted_size", "image_patches", "mask_patches", "masked_count", "prepare_image",
    "prepare_video", "shared_pool", "sniff_format", "video_tubes",
]
