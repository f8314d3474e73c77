"""check_step_inputs, the stats slot and the arena."""

import dataclasses

import numpy as np
import pytest

from uform.training import (Arena, ErrorCode, LateInteractionSide, Modality, Relations, Scalar, TrainerStepStats,
                            UFormError, check_step_inputs)
from uform.training.arena import to_bfloat16_bits

TEXT = Modality.TEXT


def test_defaults_fill_every_per_item_array():
    inputs = check_step_inputs([TEXT] * 3, ["a small red panda", b"bamboo", bytearray(b"\xff")])
    assert inputs.contents == [b"a small red panda", b"bamboo", b"\xff"]
    assert inputs.modalities.tolist() == [0, 0, 0]
    assert inputs.bags.dtype == np.uint32 and inputs.bags.tolist() == [0, 1, 2]
    assert inputs.temperature_groups.tolist() == [0, 0, 0]
    assert inputs.sides.tolist() == [0, 0, 0]
    assert inputs.choice_offsets.tolist() == [0, 0, 0, 0] and inputs.choice_bytes.size == 0
    assert inputs.relations is None and inputs.outputs_scalar == Scalar.F32


def test_given_arrays_are_normalised():
    inputs = check_step_inputs(
        [0, 0], ["yes or no?", "red panda"], bags=[5, 5], temperature_groups=np.array([1, 0], np.int64),
        sides=[LateInteractionSide.QUERY, LateInteractionSide.DOCUMENT], choices=["yn", ""],
        choice_targets=[np.float32([0.9, 0.1]), []], relations=Relations(attract=([0, 1, 2], [1, 0])),
        temperature_group_count=2, max_edges_per_device=4, max_choices_per_item=2, outputs_scalar=Scalar.BF16)
    assert inputs.bags.tolist() == [5, 5] and inputs.temperature_groups.dtype == np.uint32
    assert inputs.sides.tolist() == [1, 2]
    assert inputs.choice_offsets.tolist() == [0, 2, 2]
    assert bytes(inputs.choice_bytes) == b"yn"
    np.testing.assert_allclose(inputs.choice_targets, [0.9, 0.1])
    assert inputs.outputs_scalar == Scalar.BF16


def test_tapes_are_taken_for_contents_and_targets():
    inputs = check_step_inputs([0, 0], (b"abcde", np.array([0, 2, 5], np.uint64)), choices=[b"xyz", b"q"],
                               choice_targets=(np.float32([0.2, 0.3, 0.5, 1.0]), np.array([0, 3, 4])),
                               max_choices_per_item=3)
    assert inputs.contents == [b"ab", b"cde"]
    assert inputs.choice_offsets.tolist() == [0, 3, 4]


def refused(code, message, modalities=(0, 0, 0), contents=("a", "b", "c"), **arguments):
    with pytest.raises(UFormError) as error:
        check_step_inputs(modalities, contents, **arguments)
    assert error.value.code == code
    assert str(error.value) == message


def test_per_item_arrays_must_agree_with_contents():
    refused(ErrorCode.SHAPE_MISMATCH, "modalities: 2 entries for 3 items", modalities=(0, 0))
    refused(ErrorCode.SHAPE_MISMATCH, "modalities: 0 entries for 3 items", modalities=())
    refused(ErrorCode.SHAPE_MISMATCH, "bags: 4 entries for 3 items", bags=[0, 1, 2, 3])
    refused(ErrorCode.SHAPE_MISMATCH, "temperature_groups: 2 entries for 3 items", temperature_groups=[0, 0])
    refused(ErrorCode.SHAPE_MISMATCH, "sides: 1 entries for 3 items", sides=[1])
    refused(ErrorCode.SHAPE_MISMATCH, "choices: 2 entries for 3 items", choices=["y", "n"],
            choice_targets=[[1], [1], [1]], max_choices_per_item=2)
    refused(ErrorCode.SHAPE_MISMATCH, "choice_targets: 2 entries for 3 items", choices=["y", "n", ""],
            choice_targets=[[1], [1]], max_choices_per_item=2)
    refused(ErrorCode.SHAPE_MISMATCH, "relations.attract: 3 offsets for 3 items, expected 4",
            relations=Relations(attract=([0, 1, 2], [1, 0])))
    refused(ErrorCode.SHAPE_MISMATCH, "modalities: 3 entries for 2 items", contents=(b"abc", np.array([0, 1, 3])))
    refused(ErrorCode.SHAPE_MISMATCH, "choice_targets: 3 tape offsets for 3 items, expected 4", choices=["a", "", ""],
            choice_targets=(np.float32([1.0]), np.array([0, 1, 1])), max_choices_per_item=1)
    refused(ErrorCode.INVALID_ARGUMENT, "choice_targets: tape offsets must run non-decreasing from 0 to the data's "
            "1 entries", choices=["a", "", ""], choice_targets=(np.float32([1.0]), np.array([0, 1, 0, 1])),
            max_choices_per_item=1)


def test_media_items_of_a_modality_the_run_leaves_out_are_refused():
    refused(ErrorCode.INVALID_ARGUMENT, "item 2: IMAGE items need batch.image with a positive patch_side; the run "
            "leaves them out", modalities=(0, 0, Modality.IMAGE))
    refused(ErrorCode.INVALID_ARGUMENT, "item 0: AUDIO items need batch.audio with a positive chunk_samples; the run "
            "leaves them out", modalities=(3, 0, 2))


def test_invalid_values_name_the_array_and_item():
    refused(ErrorCode.INVALID_ARGUMENT, "modalities: item 1 is 7, not a Modality", modalities=(0, 7, 0))
    refused(ErrorCode.INVALID_ARGUMENT, "contents: item 1 is int, not bytes, a uint8 array or str",
            contents=["a", 5, "c"])
    refused(ErrorCode.INVALID_ARGUMENT, "contents: item 2 is empty", contents=("a", "b", ""))
    refused(ErrorCode.INVALID_ARGUMENT, "contents: expected one entry per item, got a single text", contents="abc")
    refused(ErrorCode.INVALID_ARGUMENT, "bags: must be non-negative, got -1", bags=[0, -1, 2])
    refused(ErrorCode.INVALID_ARGUMENT,
            "temperature_groups: item 1 selects group 2, but the run has 2 (contrastive.temperature_groups)",
            temperature_groups=[0, 2, 1], temperature_group_count=2)
    refused(ErrorCode.INVALID_ARGUMENT, "sides: item 2 is 4, not a LateInteractionSide", sides=[0, 3, 4])
    refused(ErrorCode.INVALID_ARGUMENT, "relations.repel: item 0 links to itself (the diagonal is always skipped)",
            relations=Relations(repel=([0, 1, 1, 1], [0])))
    refused(ErrorCode.INVALID_ARGUMENT, "relations: expected Relations, got dict", relations={})
    refused(ErrorCode.INVALID_ARGUMENT, "outputs_scalar: 9 is not a Scalar", outputs_scalar=9)


@pytest.mark.parametrize("arguments, code, message", [
    (dict(choices=["yn", "", ""]), ErrorCode.INVALID_ARGUMENT, "choice_targets: required with choices"),
    (dict(choice_targets=[[1], [], []]), ErrorCode.INVALID_ARGUMENT, "choice_targets: given without choices"),
    (dict(choices=["yn", "abc", ""], choice_targets=[[0.5, 0.5], [0.2, 0.3, 0.5], []]),
     ErrorCode.INVALID_ARGUMENT, "choices: item 1 offers 3 choices, past batch.max_choices_per_item 2"),
    (dict(choices=["yn", "aa", ""], choice_targets=[[0.5, 0.5], [0.5, 0.5], []]),
     ErrorCode.INVALID_ARGUMENT, "choices: item 1 offers byte 0x61 twice"),
    (dict(choices=["yn", "a", ""], choice_targets=[[0.5, 0.5], [0.5, 0.5], []]),
     ErrorCode.SHAPE_MISMATCH, "choice_targets: item 1 has 2 targets for 1 choices"),
    (dict(choices=["yn", "a", ""], choice_targets=[[0.5, 0.2], [1.0], []]),
     ErrorCode.INVALID_ARGUMENT, "choice_targets: item 0 sums to 0.7, not 1"),
    (dict(choices=["yn", "a", ""], choice_targets=[[1.5, -0.5], [1.0], []]),
     ErrorCode.INVALID_ARGUMENT, "choice_targets: item 0 has target -0.5, not a finite non-negative number"),
])
def test_choices_are_checked(arguments, code, message):
    refused(code, message, max_choices_per_item=2, **arguments)


def test_stats_start_zeroed_and_reset():
    stats = TrainerStepStats()
    names = [f.name for f in dataclasses.fields(stats)]
    assert names == ["step", "learning_rate", "loss", "contrastive_loss", "masked_text_loss", "masked_image_loss",
                     "masked_video_loss", "masked_audio_loss", "late_interaction_loss", "choices_loss", "truncated",
                     "dropped"]
    assert all(getattr(stats, name) == 0 for name in names)
    stats.step, stats.loss, stats.dropped = 3, 1.5, 2
    stats.reset()
    assert stats == TrainerStepStats()


def test_the_arena_reuses_its_buffer_and_grows_when_needed():
    arena = Arena()
    assert arena.rows is None and arena.capacity == 0
    first = arena.land(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert first.dtype == np.float32 and first.shape == (3, 4) and arena.rows is first
    second = arena.land(np.ones((2, 4)))
    assert np.shares_memory(first, second) and arena.capacity == 48
    third = arena.land(np.ones((8, 4)), Scalar.F16)
    assert third.dtype == np.float16 and arena.capacity == 96 and not np.shares_memory(first, third)


def test_bf16_rows_are_rounded_bit_patterns():
    values = np.float32([1.0, -2.0, 1.00390625, 1.01171875, np.inf, np.nan, 3.0e38])
    assert to_bfloat16_bits(values).tolist() == [0x3F80, 0xC000, 0x3F80, 0x3F82, 0x7F80, 0x7FC0, 0x7F62]
    rows = Arena().land(values.reshape(1, -1), Scalar.BF16)
    assert rows.dtype == np.uint16 and rows[0, 0] == 0x3F80
