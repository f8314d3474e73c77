"""One image or video item's whole host path: decoded, then cut into patches or tubes for the run's shape.

:func:`prepare_image` and :func:`prepare_video` take an item as ``Trainer.step``
gets it and the run's ``BatchShape.image`` / ``BatchShape.video``, and answer its
:class:`.patches.Patches`; ``max_patches`` / ``max_tubes`` is the room it may take
(a row's ``max_columns_per_row`` positions). Their signature, ``(content, item=0, *,
shape, room)``, is every modality's (``media.audio.prepare_audio`` too), so a
:class:`.pool.DecodePool` runs any of them once the keywords are bound.

A run whose shape is missing or has ``patch_side`` 0 leaves that modality out;
an item of it is refused, naming the item.
"""

from __future__ import annotations

from .config import ImageShape, VideoShape
from ..errors import ErrorCode, UFormError
from .images import decode_image
from .items import item_error
from .patches import Patches, frames_kept, image_patches, video_tubes
from .video import decode_clip


def _require(shape, field: str, modality: str, item: int):
    """``shape`` derived; refused for item ``item`` when it leaves ``modality`` out (``field`` names it)."""
    if shape is None or shape.patch_side == 0:
        held = f"no {field}" if shape is None else f"{field}.patch_side 0"
        raise item_error(item, f"{modality} items need a {field} with a positive patch_side; "
                               f"the run has {held}")
    shape = shape.derived()
    for name, value in vars(shape).items():
        if value < 0:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{field}.{name}: must be positive, got {value}")
    return shape


def prepare_image(content, item: int = 0, *, shape: ImageShape | None, max_patches: int) -> Patches:
    """One IMAGE item decoded and cut into at most ``max_patches`` patches of ``shape``."""
    shape = _require(shape, "batch.image", "IMAGE", item)
    return image_patches(decode_image(content, item, channels=shape.channels), shape.patch_side, max_patches)


def prepare_video(content, item: int = 0, *, shape: VideoShape | None, max_tubes: int) -> Patches:
    """One VIDEO item decoded, sampled and cut into at most ``max_tubes`` tubes of ``shape``."""
    shape = _require(shape, "batch.video", "VIDEO", item)
    frames, count = decode_clip(content, item, frame_stride=shape.frame_stride, channels=shape.channels,
                                frames_kept=lambda height, width: frames_kept(height, width, shape.patch_side,
                                                                              shape.tube_frames, max_tubes))
    return video_tubes(frames, shape.patch_side, shape.tube_frames, max_tubes, source_frames=count)
