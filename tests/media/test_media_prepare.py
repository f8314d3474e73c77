"""prepare_image and prepare_video: decoding then patches, for a run's shape."""

import numpy as np
import pytest
from media_files import encode_image, moving_frames

from uform.media import decode_image, decode_video, image_patches, prepare_image, prepare_video, video_tubes
from uform.training.config import ImageShape, VideoShape
from uform.training.errors import ErrorCode, UFormError

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
