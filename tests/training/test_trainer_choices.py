"""Calibrated choices in the trainer: the masked head's softmax over each item's legal bytes at an appended
MASK, trained with soft targets, against the float64 torch reference; text_choose reading it back;
one model's probabilities training another; bad choices refused naming the item."""

import numpy as np
import pytest

import uform
from trainer_cases import PAIRS, TEXTS, assert_gradients_match, engine_and_reference, tiny

LONG = "a state longer than one row of forty-eight positions, so its head is cut off"
CONTENTS = [TEXTS[0], LONG, *TEXTS[2:]]
CHOICES = ["yn", "abc", "", "0123", "", "xy", "", "q"]
TARGETS = [[0.75, 0.25], [0.2, 0.3, 0.5], [], [0.1, 0.2, 0.3, 0.4], [], [0.5, 0.5], [], [1.0]]


def choosing_trainer(objective=uform.Objective.JOINT, seed=3):
    return tiny(objective, choices=uform.Choices(weight=0.5), max_choices_per_item=4, seed=seed)


@pytest.mark.parametrize("objective", [uform.Objective.JOINT, uform.Objective.MASKED])
def test_choice_gradients_match_float64_reference(objective):
    trainer = choosing_trainer(objective)
    losses, gradient, reference, expected = engine_and_reference(
        trainer, PAIRS, contents=CONTENTS, choices=CHOICES, choice_targets=[np.float32(t) for t in TARGETS])
    assert losses.choices > 0
    assert losses.choices == pytest.approx(float(reference["choices"]), rel=2e-5)
    assert losses.total == pytest.approx(float(reference["loss"]), rel=2e-5)
    assert_gradients_match(trainer, gradient, expected)


def test_choosing_items_are_packed_uncorrupted_with_the_mask_appended():
    trainer = choosing_trainer()
    inputs = uform.training.check_step_inputs(
        [uform.Modality.TEXT] * 8, CONTENTS, choices=CHOICES, choice_targets=[np.float32(t) for t in TARGETS],
        max_choices_per_item=4)
    batch, packed = trainer.step_batch(inputs, False, step=1)
    tokens, targets = batch.tokens.reshape(-1), batch.targets.reshape(-1)
    for segment, item in enumerate(packed.item_of_segment):
        begin = int(packed.segment_row[segment]) * 48 + int(packed.segment_start[segment])
        shown = tokens[begin:begin + int(packed.segment_length[segment])]
        text = np.frombuffer(CONTENTS[item].encode(), np.uint8)
        if CHOICES[item]:
            assert shown.tolist() == text[-47:].tolist() + [uform.training.MASK]
            assert (targets[begin:begin + shown.size] == -1).all()
        else:
            assert (targets[begin:begin + shown.size] >= 0).any()  # the others are corrupted as usual
    assert batch.choices.positions.tolist() == [
        int(packed.segment_row[s]) * 48 + int(packed.segment_start[s]) + int(packed.segment_length[s]) - 1
        for s, item in enumerate(packed.item_of_segment) if CHOICES[item]]


def test_a_step_reports_the_unweighted_term_and_cuts_long_states_at_the_head():
    trainer = choosing_trainer()
    stats = uform.TrainerStepStats()
    targets = [np.float32(t) for t in TARGETS]
    before = trainer.text_choose(CONTENTS, CHOICES)
    trainer.step([uform.Modality.TEXT] * 8, CONTENTS, relations=PAIRS, choices=CHOICES, choice_targets=targets,
                 stats=stats)
    # The packing keeps items 0-3 and 5 (the cut state fills a row of its own); those choosing: 0, 1, 3, 5.
    kept = [0, 1, 3, 5]
    expected = np.mean([-(np.float64(TARGETS[i]) * np.log(before.entry(i))).sum() for i in kept])
    assert stats.choices_loss == pytest.approx(expected, rel=1e-5)
    assert stats.truncated == 1  # LONG, cut at its head
    tail = trainer.text_choose([LONG[-47:]], ["abc"])
    assert np.array_equal(tail, trainer.text_choose([LONG], ["abc"]))


def test_text_choose_answers_a_tape_that_trains_another_model(tmp_path):
    trainer = choosing_trainer()
    trainer.step([uform.Modality.TEXT] * 8, CONTENTS, relations=PAIRS, choices=CHOICES,
                 choice_targets=[np.float32(t) for t in TARGETS])
    probabilities = trainer.text_choose(CONTENTS, CHOICES)
    assert isinstance(probabilities, uform.RowsTape) and probabilities.dtype == np.float32
    assert probabilities.offsets.tolist() == np.cumsum([0] + [len(c) for c in CHOICES]).tolist()
    for item, legal in enumerate(CHOICES):
        entry = probabilities.entry(item)
        assert entry.size == len(legal) and (not legal or abs(entry.sum(dtype=np.float64) - 1) < 1e-6)
    crowd = [f"another state number {i}" for i in range(30)]
    among = trainer.text_choose(crowd[:11] + CONTENTS[3:4] + crowd[11:], [""] * 11 + ["0123"] + ["yn"] * 19)
    assert np.array_equal(among.entry(11), probabilities.entry(3))
    assert np.array_equal(trainer.text_choose(iter(CONTENTS), iter(CHOICES)), probabilities)
    empty = trainer.text_choose([b""], ["yn"])
    assert empty.shape == (2,) and abs(float(empty.sum()) - 1) < 1e-6
    copied = probabilities.copy()
    assert np.array_equal(copied.offsets, probabilities.offsets)
    assert type(probabilities[1:3]) is np.ndarray
    trainer.save(tmp_path / "teacher.safetensors")
    loaded = uform.Encoder.load(tmp_path / "teacher.safetensors", executor="cpu")
    assert np.array_equal(loaded.text_choose(CONTENTS, CHOICES), probabilities)
    student = choosing_trainer(seed=9)
    student.step([uform.Modality.TEXT] * 8, CONTENTS, relations=PAIRS, choices=CHOICES,
                 choice_targets=(probabilities, probabilities.offsets))
    student.step([uform.Modality.TEXT] * 8, CONTENTS, relations=PAIRS, choices=CHOICES, choice_targets=probabilities)
    assert student.completed_steps == 2


def test_distillation_brings_the_student_to_the_teacher():
    """A teacher learns which of two bytes follows a state from its first letter; a fresh student trained on
    the teacher's text_choose probabilities over other texts ends close to the teacher on them."""
    rng = np.random.default_rng(5)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)

    def states(count):
        return [bytes([ord("pq"[i % 2])]) + bytes(rng.choice(letters, 10)) for i in range(count)]

    def train(trainer, texts, targets, steps):
        for step in range(steps):
            batch = [(step * 8 + k) % len(texts) for k in range(8)]
            trainer.step([uform.Modality.TEXT] * 8, [texts[i] for i in batch], choices=["yn"] * 8,
                         choice_targets=[targets[i] for i in batch])

    def kl(p, q):
        p, q = np.float64(p).reshape(-1, 2), np.float64(q).reshape(-1, 2)
        return float(np.mean((p * np.log(p / q)).sum(1)))

    def choosing(seed):
        return uform.Trainer.init_vram(
            uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.MASKED,
            batch=uform.BatchShape(max_rows_per_device=1, max_segments_per_device=8, max_columns_per_row=96,
                                   max_choices_per_item=2),
            choices=uform.Choices(weight=1.0), masking=uform.Masking(text_weight=0.1),
            schedule=uform.Schedule(steps=60, learning_rate=3e-3, warmup_steps=5), seed=seed)

    taught, held_out, unseen = states(32), states(16), states(16)
    teacher = choosing(1)
    train(teacher, taught, [np.float32([0.9, 0.1] if t[0] == ord("p") else [0.2, 0.8]) for t in taught], 60)
    answers = teacher.text_choose(held_out, ["yn"] * 16)
    assert np.mean(answers.reshape(-1, 2)[0::2, 0]) > np.mean(answers.reshape(-1, 2)[1::2, 0]) + 0.3
    student = choosing(2)
    before = [kl(teacher.text_choose(texts, ["yn"] * 16), student.text_choose(texts, ["yn"] * 16))
              for texts in (held_out, unseen)]
    train(student, held_out, [answers.entry(i) for i in range(16)], 60)
    after = [kl(teacher.text_choose(texts, ["yn"] * 16), student.text_choose(texts, ["yn"] * 16))
             for texts in (held_out, unseen)]
    print(f"KL(teacher ‖ student): on the distilled texts {before[0]:.4f} before, {after[0]:.5f} after; "
          f"on texts neither saw {before[1]:.4f} before, {after[1]:.5f} after")
    assert after[0] < before[0] / 10 and after[1] < before[1] / 2


def refused(trainer, message, code=uform.ErrorCode.INVALID_ARGUMENT, modalities=None, **arguments):
    before, steps = trainer.model.parameters.numpy(), trainer.completed_steps
    with pytest.raises(uform.UFormError) as error:
        trainer.step(modalities or [uform.Modality.TEXT] * 8, CONTENTS, relations=PAIRS, **arguments)
    assert error.value.code == code and str(error.value) == message
    assert trainer.completed_steps == steps and np.array_equal(trainer.model.parameters.numpy(), before)


def test_bad_choices_are_refused_naming_the_item_and_change_nothing():
    trainer = choosing_trainer()
    targets = [np.float32(t) for t in TARGETS]
    refused(trainer, "choice_targets: item 3 has 3 targets for 4 choices", uform.ErrorCode.SHAPE_MISMATCH,
            choices=CHOICES, choice_targets=targets[:3] + [np.float32([0.2, 0.3, 0.5])] + targets[4:])
    refused(trainer, "choices: 7 entries for 8 items", uform.ErrorCode.SHAPE_MISMATCH, choices=CHOICES[:7],
            choice_targets=targets)
    refused(trainer, "choice_targets: 8 tape offsets for 8 items, expected 9", uform.ErrorCode.SHAPE_MISMATCH,
            choices=CHOICES, choice_targets=(np.concatenate(targets), np.array([0, 2, 5, 5, 9, 9, 11, 11])))
    refused(trainer, "choice_targets: item 1 sums to 1.0001, not 1", choices=CHOICES,
            choice_targets=targets[:1] + [np.float32([0.2, 0.3, 0.5001])] + targets[2:])
    refused(trainer, "choices: item 3 offers 5 choices, past batch.max_choices_per_item 4",
            choices=CHOICES[:3] + ["01234"] + CHOICES[4:], choice_targets=targets[:3] + [np.float32([0.2] * 5)]
            + targets[4:])
    refused(trainer, "choices: item 5 offers byte 0x78 twice", choices=CHOICES[:5] + ["xx"] + CHOICES[6:],
            choice_targets=targets)
    refused(trainer, "choice_targets: required with choices", choices=CHOICES)
    image_run = tiny(choices=uform.Choices(weight=0.5), max_choices_per_item=4, image=uform.ImageShape(patch_side=8))
    refused(image_run, "choices: item 2 is IMAGE; only text items make choices",
            modalities=[uform.Modality.TEXT] * 2 + [uform.Modality.IMAGE] + [uform.Modality.TEXT] * 5,
            choices=CHOICES[:2] + ["ab"] + CHOICES[3:], choice_targets=targets[:2] + [np.float32([0.5, 0.5])] + targets[3:])


def test_choices_need_the_masked_head():
    with pytest.raises(uform.UFormError, match="choices.weight: choices are read by the masked head"):
        choosing_trainer(uform.Objective.CONTRASTIVE)
    with pytest.raises(uform.UFormError, match="text_choose: a CONTRASTIVE run has no masked head"):
        tiny(uform.Objective.CONTRASTIVE).text_choose(["a"], ["ab"])


def test_evaluate_reports_the_step_losses_of_both_terms():
    trainer = tiny(choices=uform.Choices(weight=0.5), max_choices_per_item=4,
                   late_interaction=uform.LateInteraction(weight=0.7, width=16))
    Q, D = uform.LateInteractionSide.QUERY, uform.LateInteractionSide.DOCUMENT
    arguments = dict(relations=PAIRS, sides=[Q, D] * 4, choices=CHOICES, choice_targets=[np.float32(t) for t in TARGETS])
    evaluated = trainer.evaluate([uform.Modality.TEXT] * 8, CONTENTS, **arguments)
    stats = uform.TrainerStepStats()
    trainer.step([uform.Modality.TEXT] * 8, CONTENTS, stats=stats, **arguments)
    assert evaluated["late_interaction_loss"] > 0 and evaluated["choices_loss"] > 0
    assert (evaluated["loss"], evaluated["late_interaction_loss"], evaluated["choices_loss"]) == \
        (stats.loss, stats.late_interaction_loss, stats.choices_loss)


def test_text_choose_and_encode_tokens_refuse_bad_input_naming_it():
    trainer = choosing_trainer()
    before = trainer.model.parameters.numpy()
    for arguments, code, message in [
        ((["a", "b"], ["yn"]), uform.ErrorCode.SHAPE_MISMATCH, "choices: 1 entries for 2 items"),
        ((["a", "b"], ["yn", "qq"]), uform.ErrorCode.INVALID_ARGUMENT, "choices: item 1 offers byte 0x71 twice"),
        ((["a", 7], ["yn", "ab"]), uform.ErrorCode.INVALID_ARGUMENT, "texts: item 1 is int, not bytes"),
    ]:
        with pytest.raises(uform.UFormError) as error:
            trainer.text_choose(*arguments)
        assert error.value.code == code and str(error.value).startswith(message), str(error.value)
    with pytest.raises(uform.UFormError, match="encode_tokens: the run trains no token head") as error:
        trainer.encode_tokens([uform.Modality.TEXT], ["a"])
    assert error.value.code == uform.ErrorCode.UNSUPPORTED
    late = tiny(late_interaction=uform.LateInteraction(weight=1.0, width=16))
    with pytest.raises(uform.UFormError, match="side: QUERY or DOCUMENT") as error:
        late.encode_tokens([uform.Modality.TEXT], ["a"], side=uform.LateInteractionSide.NONE)
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT
    assert np.array_equal(trainer.model.parameters.numpy(), before) and trainer.completed_steps == 0
