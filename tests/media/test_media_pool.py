"""DecodePool on threads and on processes: order kept, work overlapping the caller, errors naming the lowest failing
item, a dead worker refused and replaced."""

import functools
import os
import threading
import time

import numpy as np
import pytest
from media_files import encode_image, moving_frames

from uform.media import DecodePool, decode_image, prepare_image
from uform.training.config import ImageShape
from uform.errors import ErrorCode, UFormError


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


def exits(content, item):
    if content == "exit":
        os._exit(3)  # the worker process dies mid-task, as one killed or crashed in a decoder would
    return item


def raises_key_error(content, item):
    raise KeyError(content)


def test_processes_decode_in_order_as_threads_do():
    files = [encode_image(frame, "PNG") for frame in moving_frames(9, 17, 23)]
    decode = functools.partial(prepare_image, shape=ImageShape(patch_side=8), max_patches=6)
    with DecodePool(workers=2, processes=True) as processes, DecodePool(workers=2) as threads:
        assert processes.workers == 2 and processes.map(slow_echo, [0.02, 0.0, 0.01], items=[5, 6, 7]) == [5, 6, 7]
        for a, b in zip(processes.map(decode, files), threads.map(decode, files)):
            np.testing.assert_array_equal(a.blocks, b.blocks)
            np.testing.assert_array_equal(a.positions, b.positions)


def test_a_refusal_crosses_from_a_process_as_it_was_raised():
    files = [encode_image(frame, "PNG") for frame in moving_frames(6, 8, 8)]
    files[4], files[2] = b"not an image", b"nor this"
    with DecodePool(workers=3, processes=True) as pool:
        with pytest.raises(UFormError) as refusal:
            pool.map(decode_image, files, items=[20, 21, 22, 23, 24, 25])
        assert refusal.value.code == ErrorCode.INVALID_ARGUMENT and refusal.value.message.startswith("item 22: ")
        with pytest.raises(UFormError, match=r"item 7: could not decode: KeyError: 'x'"):
            pool.map(raises_key_error, ["x"], items=[7])


def test_a_dead_worker_is_a_refusal_and_the_shared_pool_starts_afresh(monkeypatch):
    from uform.media import pool as pool_module

    dying = DecodePool(workers=1, processes=True)
    monkeypatch.setattr(pool_module, "_shared", dying)
    with pytest.raises(UFormError, match=r"items 0–1: a decoding process died") as refusal:
        pool_module.shared_pool().map(exits, ["ok", "exit"])
    assert refusal.value.code == ErrorCode.INVALID_ARGUMENT and dying.broken
    fresh = pool_module.shared_pool()
    assert fresh is not dying and fresh.map(exits, ["a", "b"], items=[3, 4]) == [3, 4]


def test_a_refusal_pickles_with_its_code_and_message_whatever_its_class():
    import pickle

    from uform.pairs.jsonl import PairFormatError
    from uform.errors import UFormOSError

    for error in (UFormError(ErrorCode.CORRUPTED, "a"), UFormOSError(ErrorCode.INVALID_ARGUMENT, "b"),
                  PairFormatError("line 3: c")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and copy.code == error.code and copy.message == error.message
        assert str(copy) == str(error)


def decode_in_a_forked_child(answers):
    from uform.media import shared_pool

    answers.put(shared_pool().map(exits, ["a", "b", "c"], items=[7, 8, 9]))


def test_a_forked_child_decodes_on_a_pool_of_its_own():
    import multiprocessing

    from uform.media import shared_pool

    parent = shared_pool()
    assert parent.map(exits, ["a"], items=[1]) == [1]  # the parent's workers are running
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=decode_in_a_forked_child, args=(answers,))
    child.start()
    assert answers.get(timeout=60) == [7, 8, 9]
    child.join(60)
    assert child.exitcode == 0
    assert shared_pool() is parent and parent.map(exits, ["b"], items=[2]) == [2]  # the parent's pool still serves
