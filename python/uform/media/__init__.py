"""The host side of image and video items: decoding them to pixels.

Read in this order:

- :mod:`.formats` -- :func:`sniff_format`, a file's format from its signature.
- :mod:`.items` -- what a media item may be; every refusal names the item.
- :mod:`.images` -- :func:`decode_image`, an IMAGE item to RGBA uint8 pixels.
- :mod:`.video` -- :func:`decode_video`, a VIDEO item to RGB uint8 frames.
"""

from .formats import IMAGE_FORMATS, VIDEO_FORMATS, sniff_format
from .images import MAX_IMAGE_PIXELS, decode_image
from .video import MAX_VIDEO_PIXELS, VIDEO_CODECS, decode_video

__all__ = ["IMAGE_FORMATS", "MAX_IMAGE_PIXELS", "MAX_VIDEO_PIXELS", "VIDEO_CODECS", "VIDEO_FORMATS", "decode_image",
           "decode_video", "sniff_format"]
