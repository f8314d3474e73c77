"""The media slices of a run's ``BatchShape``: how images, video and audio are cut, beside the code that cuts them.

Like every config of the run (``uform.training.config``), each is a keyword-built frozen structure whose zero
fields derive (``derived()``): ``ImageShape.channels`` 4 (RGBA end to end); ``VideoShape.tube_frames`` 2,
``frame_stride`` 1, ``channels`` 3; ``AudioShape.sample_rate`` 16000. A zero ``patch_side`` (images, video) or
``chunk_samples`` (audio) leaves that modality out of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class ImageShape:
    """The image slice of a :class:`BatchShape`; a zero ``patch_side`` leaves images out of the run."""

    patch_side: int = 0
    """The square patch side images tile into, in pixels."""
    channels: int = 0
    """Channels every pixel carries; zero derives 4."""

    def derived(self) -> ImageShape:
        return replace(self, channels=self.channels or 4)


@dataclass(frozen=True, kw_only=True)
class VideoShape:
    """The video slice of a :class:`BatchShape`; a zero ``patch_side`` leaves video out of the run."""

    patch_side: int = 0
    """The square patch side one tube tiles into, in pixels."""
    tube_frames: int = 0
    """Frames one tube folds ahead of its patch; zero derives 2."""
    frame_stride: int = 0
    """Source frames between sampled ones; zero derives 1, every frame."""
    channels: int = 0
    """Channels every pixel carries; zero derives 3."""

    def derived(self) -> VideoShape:
        return replace(self, tube_frames=self.tube_frames or 2, frame_stride=self.frame_stride or 1,
                       channels=self.channels or 3)


@dataclass(frozen=True, kw_only=True)
class AudioShape:
    """The audio slice of a :class:`BatchShape`; a zero ``chunk_samples`` leaves audio out of the run."""

    chunk_samples: int = 0
    """Raw samples per frame, the fan-in of the learned frontend."""
    sample_rate: int = 0
    """The mono rate every recording is resampled to; zero derives 16000."""

    def derived(self) -> AudioShape:
        return replace(self, sample_rate=self.sample_rate or 16000)
