"""DecodePool: order kept, work overlapping the caller, errors naming the lowest failing item."""

import functools
import threading
import time

import numpy as np
import pytest
from media_files import encode_image, moving_frames

from uform.media import DecodePool, decode_image, prepare_image
from uform.training.config import ImageShape
from uform.training.errors import ErrorCode, UFormError


def slow_echo(content, item):
    time.sleep(content)
    return item


def test_results_keep_the_submitted_order_whatever_finishes_first():
    with DecodePool(workers=4) as pool:
        assert pool.map(slow_echo, [0.03, 0.0, 0.02, 0.0, 0.01], items=[10, 11, 12, 13, 14]) == [10, 11, 12, 13, 14]


def test_submit_returns_while_the_items_are_still_decoding():
    release = threading.Event()

    def gated(content, item):
        assert release.wait(5)
        return content * 2

    with DecodePool(workers=2) as pool:
        job = pool.submit(gated, [1, 2, 3])
        assert not job.done()
        release.set()
        assert job.result() == [2, 4, 6] and job.done()


def test_images_decode_on_the_pool_as_they_do_one_by_one():
    files = [encode_image(frame, "PNG") for frame in moving_frames(6, 17, 23)]
    decode = functools.partial(prepare_image, shape=ImageShape(patch_side=8), max_patches=6)
    with DecodePool() as pool:
        pooled = pool.map(decode, files)
    for item, (content, patches) in enumerate(zip(files, pooled)):
        np.testing.assert_array_equal(patches.inputs, decode(content, item).inputs)
    np.testing.assert_array_equal(DecodePool(1).map(decode_image, files[:1])[0], decode_image(files[0]))


def test_the_lowest_failing_item_is_the_one_reported():
    files = [encode_image(frame, "PNG") for frame in moving_frames(5, 8, 8)]
    files[3], files[1] = b"not an image", b"nor this"
    with DecodePool(workers=3) as pool, pytest.raises(UFormError) as refusal:
        pool.map(decode_image, files, items=[20, 21, 22, 23, 24])
    assert refusal.value.code == ErrorCode.INVALID_ARGUMENT and refusal.value.message.startswith("item 21: ")


def test_any_other_exception_becomes_a_refusal_naming_the_item():
    def broken(content, item):
        raise KeyError(content)

    with DecodePool() as pool, pytest.raises(UFormError, match=r"item 7: could not decode: KeyError: 'x'") as refusal:
        pool.map(broken, ["x"], items=[7])
    assert isinstance(refusal.value.__cause__, KeyError)


def test_items_must_match_the_contents():
    with DecodePool() as pool, pytest.raises(UFormError) as refusal:
        pool.submit(slow_echo, [0, 0], items=[1])
    assert refusal.value.code == ErrorCode.SHAPE_MISMATCH
