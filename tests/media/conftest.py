"""The clips several media tests decode, written once per session."""

import pytest
from media_files import encode_video, moving_frames


@pytest.fixture(scope="session")
def clips() -> dict[str, bytes]:
    """Seven frames of 64 × 48 as H.264 and MPEG-4 Part 2 in MP4, and VP8 in WebM."""
    frames = moving_frames(7)
    return {"mp4-h264": encode_video(frames, "mp4", "libx264"), "mp4-mpeg4": encode_video(frames, "mp4", "mpeg4"),
            "webm-vp8": encode_video(frames, "webm", "libvpx")}
