"""prepare_image and prepare_video: decoding then patches, for a run's shape."""

import numpy as np
import pytest
from media_files import encode_image, moving_frames

from uform.media import decode_image, decode_video, image_patches, prepare_image, prepare_video, video_tubes
from uform.training.config import ImageShape, VideoShape
from uform.errors import ErrorCode, UFormError

PNG = encode_image(moving_frames(1, 20, 30)[0], "PNG")


def test_prepare_image_is_decoding_then_patches_with_derived_channels():
    patches = prepare_image(PNG, 1, shape=ImageShape(patch_side=8), max_patches=100)
    expected = image_patches(decode_image(PNG, channels=4), 8, 100)
    np.testing.assert_array_equal(patches.inputs, expected.inputs)
    assert patches.inputs.shape == (3 * 4, 8 * 8 * 4)


def test_prepare_video_samples_with_the_shapes_stride_and_tubes(clips):
    shape = VideoShape(patch_side=16, frame_stride=2)
    tubes = prepare_video(clips["webm-vp8"], 0, shape=shape, max_tubes=1000)
    expected = video_tubes(decode_video(clips["webm-vp8"], frame_stride=2), 16, 2, 1000)
    np.testing.assert_array_equal(tubes.inputs, expected.inputs)
    assert tubes.grid == (2, 3, 4) and tubes.source_frames == 4


@pytest.mark.parametrize("call, words", [
    (lambda: prepare_image(PNG, 6, shape=None, max_patches=4),
     "item 6: IMAGE items need a batch.image with a positive patch_side; the run has no batch.image"),
    (lambda: prepare_image(PNG, 6, shape=ImageShape(), max_patches=4), "the run has batch.image.patch_side 0"),
    (lambda: prepare_video(PNG, 6, shape=None, max_tubes=4), "item 6: VIDEO items need a batch.video"),
])
def test_a_run_without_the_modality_refuses_its_items(call, words):
    with pytest.raises(UFormError) as refusal:
        call()
    assert refusal.value.code == ErrorCode.INVALID_ARGUMENT and words in refusal.value.message


def test_a_long_clip_converts_only_the_frames_its_tubes_use(clips, monkeypatch):
    """A clip longer than its tubes' budget gives the same tubes (and the same truncation report) as one decoded
    whole, while only the frames the tubes use are converted to RGB."""
    from uform.media import video

    converted = []
    original = video._decode_stream

    def counting(container, item, frame_stride, max_pixels, frames_kept):
        frames, sampled = original(container, item, frame_stride, max_pixels, frames_kept)
        converted.append(frames.shape[0])
        return frames, sampled

    whole = video_tubes(decode_video(clips["mp4-h264"]), 16, 2, 12)
    monkeypatch.setattr(video, "_decode_stream", counting)
    capped = prepare_video(clips["mp4-h264"], shape=VideoShape(patch_side=16, tube_frames=2), max_tubes=12)
    np.testing.assert_array_equal(capped.inputs, whole.inputs)
    assert (capped.frames, capped.source_frames, capped.truncated) == (whole.frames, whole.source_frames,
                                                                       whole.truncated)
    assert whole.truncated and converted == [whole.frames]
