"""Derived defaults of every config and every refusal of validate_run."""

import math

import pytest

from uform.training import (AudioShape, BatchShape, Choices, Contrastive, ErrorCode, ImageShape, LateInteraction,
                            Masking, Negatives, Objective, PairLossForm, Schedule, UFormError, VideoShape,
                            validate_run)

BATCH = BatchShape(max_rows_per_device=4, max_segments_per_device=16, max_columns_per_row=256)


def run(**overrides):
    arguments = dict(depth=2, hidden=256, batch=BATCH, objective=Objective.JOINT, schedule=Schedule(steps=1000))
    arguments.update(overrides)
    return validate_run(**arguments)


def test_shapes_derive_their_defaults():
    assert ImageShape(patch_side=16).derived() == ImageShape(patch_side=16, channels=4)
    assert ImageShape(channels=3).derived().channels == 3
    assert VideoShape(patch_side=8).derived() == VideoShape(patch_side=8, tube_frames=2, frame_stride=1, channels=3)
    assert VideoShape(tube_frames=4, frame_stride=2, channels=1).derived() == VideoShape(
        tube_frames=4, frame_stride=2, channels=1)
    assert AudioShape(chunk_samples=400).derived() == AudioShape(chunk_samples=400, sample_rate=16000)
    assert AudioShape(sample_rate=8000).derived().sample_rate == 8000


def test_batch_shape_takes_nested_tuples_and_derives_missing_shapes_to_zero():
    batch = BatchShape(image=(16,), video=(8, 4, 2, 1), audio=(400, 8000))
    assert batch.image == ImageShape(patch_side=16)
    assert batch.video == VideoShape(patch_side=8, tube_frames=4, frame_stride=2, channels=1)
    assert batch.audio == AudioShape(chunk_samples=400, sample_rate=8000)
    derived = BatchShape().derived()
    assert derived.image == ImageShape(channels=4)
    assert derived.video == VideoShape(tube_frames=2, frame_stride=1, channels=3)
    assert derived.audio == AudioShape(sample_rate=16000)
    assert BatchShape().image is None


def test_batch_shape_refuses_an_overlong_tuple():
    with pytest.raises(UFormError) as error:
        BatchShape(image=(16, 3, 1))
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert str(error.value).startswith("BatchShape.image:")


def test_configs_are_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        Masking(0.2)
    with pytest.raises(AttributeError):
        Schedule(steps=1).steps = 2


def test_masking_derives_every_default():
    assert Masking().derived() == Masking(
        token_mask_probability=0.15, token_mean_span=16, replace_fraction=0.8, random_fraction=0.1,
        image_mask_ratio=0.75, video_mask_ratio=0.75, audio_mask_ratio=0.75,
        text_weight=1, image_weight=1, video_weight=1, audio_weight=1)
    assert Masking(token_mean_span=4, text_weight=2).derived().token_mean_span == 4
    assert Masking(token_mean_span=4, text_weight=2).derived().text_weight == 2


def test_contrastive_derives_sigmoid_defaults():
    derived = Contrastive().derived(BATCH)
    assert derived == Contrastive(matryoshka_dimensions=(), temperature_groups=1, inverse_temperature=10, bias=-10,
                                  negatives=Negatives.AMBIENT, ambient_repulsion_weight=1, max_edges_per_device=16,
                                  pair_loss=PairLossForm.SIGMOID)
    assert Contrastive(pair_loss=PairLossForm.SIGMOID).derived(BATCH) == derived


@pytest.mark.parametrize("form", [PairLossForm.BALANCED, PairLossForm.RANKED])
def test_contrastive_derives_unit_temperature_outside_the_sigmoid_form(form):
    derived = Contrastive(pair_loss=form).derived(BATCH)
    assert (derived.inverse_temperature, derived.bias, derived.pair_loss) == (1, 0, form)


def test_contrastive_keeps_what_it_is_given():
    given = Contrastive(matryoshka_dimensions=[64, 128], temperature_groups=3, inverse_temperature=5, bias=-2,
                        negatives=Negatives.NAMED, ambient_repulsion_weight=0.5, max_edges_per_device=7)
    derived = given.derived(BATCH)
    assert derived.matryoshka_dimensions == (64, 128)
    assert (derived.temperature_groups, derived.inverse_temperature, derived.bias) == (3, 5, -2)
    assert (derived.negatives, derived.ambient_repulsion_weight, derived.max_edges_per_device) == (
        Negatives.NAMED, 0.5, 7)


def test_late_interaction_derives_from_the_batch():
    derived = LateInteraction().derived(BATCH)
    assert derived == LateInteraction(weight=0, width=128, inverse_temperature=1, bias=0, max_query_span=64,
                                      max_query_tokens_per_device=64 * 16, max_documents_per_device=16,
                                      max_document_tokens_per_device=4 * 256, pair_loss=PairLossForm.RANKED)
    assert LateInteraction(max_query_span=32).derived(BATCH).max_query_tokens_per_device == 32 * 16
    assert LateInteraction(pair_loss=PairLossForm.SIGMOID).derived(BATCH).pair_loss == PairLossForm.SIGMOID


def test_schedule_derives_its_rates_and_warmup():
    assert Schedule(steps=1000).derived() == Schedule(learning_rate=5e-4, min_learning_rate=1e-5, warmup_steps=100,
                                                      steps=1000)
    assert Schedule(steps=100_000).derived().warmup_steps == 400
    assert Schedule(steps=5).derived().warmup_steps == 0
    assert Schedule(steps=10, warmup_steps=3, learning_rate=1e-3).derived().warmup_steps == 3


def test_choices_derive_nothing():
    assert Choices(weight=0.5).derived() == Choices(weight=0.5)


def test_validate_run_answers_every_config_derived():
    derived = run(late_interaction=LateInteraction(weight=1), choices=Choices(weight=1),
                  batch=BatchShape(max_rows_per_device=4, max_segments_per_device=16, max_columns_per_row=256,
                                   max_choices_per_item=4, image=(16,)))
    assert derived.depth == 2 and derived.hidden == 256 and derived.objective == Objective.JOINT
    assert derived.batch.image == ImageShape(patch_side=16, channels=4)
    assert derived.masking == Masking().derived()
    assert derived.contrastive.max_edges_per_device == 16
    assert derived.late_interaction.width == 128
    assert derived.schedule.warmup_steps == 100


def _refused(field, **overrides):
    with pytest.raises(UFormError) as error:
        run(**overrides)
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert str(error.value).startswith(f"{field}:"), str(error.value)
    return str(error.value)


def _batch(**fields):
    return BatchShape(**{**dict(max_rows_per_device=4, max_segments_per_device=16, max_columns_per_row=256), **fields})


@pytest.mark.parametrize("field, overrides", [
    ("depth", dict(depth=0)),
    ("depth", dict(depth=1.5)),
    ("depth", dict(depth=True)),
    ("hidden", dict(hidden=0)),
    ("hidden", dict(hidden=200)),
    ("objective", dict(objective=7)),
    ("batch", dict(batch=Masking())),
    ("batch.max_rows_per_device", dict(batch=None)),
    ("batch.max_rows_per_device", dict(batch=_batch(max_rows_per_device=0))),
    ("batch.max_segments_per_device", dict(batch=_batch(max_segments_per_device=0))),
    ("batch.max_columns_per_row", dict(batch=_batch(max_columns_per_row=0))),
    ("batch.max_bags_per_device", dict(batch=_batch(max_bags_per_device=-1))),
    ("batch.image.channels", dict(batch=_batch(image=(16, -1)))),
    ("batch.video.tube_frames", dict(batch=_batch(video=(8, 2.5)))),
    ("masking", dict(masking=Schedule())),
    ("masking.token_mask_probability", dict(masking=Masking(token_mask_probability=1.5))),
    ("masking.token_mask_probability", dict(masking=Masking(token_mask_probability=-0.1))),
    ("masking.token_mask_probability", dict(masking=Masking(token_mask_probability=math.nan))),
    ("masking.replace_fraction", dict(masking=Masking(replace_fraction=2))),
    ("masking.random_fraction", dict(masking=Masking(replace_fraction=0.95))),
    ("masking.random_fraction", dict(masking=Masking(replace_fraction=0.5, random_fraction=0.6))),
    ("masking.image_mask_ratio", dict(masking=Masking(image_mask_ratio=1.2))),
    ("masking.token_mean_span", dict(masking=Masking(token_mean_span=0.5))),
    ("masking.text_weight", dict(masking=Masking(text_weight=-1))),
    ("masking.audio_weight", dict(masking=Masking(audio_weight=math.inf))),
    ("contrastive.matryoshka_dimensions", dict(contrastive=Contrastive(matryoshka_dimensions=(64, 32)))),
    ("contrastive.matryoshka_dimensions", dict(contrastive=Contrastive(matryoshka_dimensions=(64, 64)))),
    ("contrastive.matryoshka_dimensions", dict(contrastive=Contrastive(matryoshka_dimensions=(60,)))),
    ("contrastive.matryoshka_dimensions", dict(contrastive=Contrastive(matryoshka_dimensions=(0, 8)))),
    ("contrastive.matryoshka_dimensions", dict(contrastive=Contrastive(matryoshka_dimensions=range(8, 80, 8)))),
    ("contrastive.matryoshka_dimensions", dict(contrastive=Contrastive(matryoshka_dimensions=(128, 512)))),
    ("contrastive.temperature_groups", dict(contrastive=Contrastive(temperature_groups=-1))),
    ("contrastive.inverse_temperature", dict(contrastive=Contrastive(inverse_temperature=-1))),
    ("contrastive.ambient_repulsion_weight", dict(contrastive=Contrastive(ambient_repulsion_weight=-0.5))),
    ("contrastive.max_edges_per_device", dict(contrastive=Contrastive(max_edges_per_device=-3))),
    ("late_interaction.weight", dict(late_interaction=LateInteraction(weight=-1))),
    ("late_interaction.width", dict(late_interaction=LateInteraction(width=100))),
    ("late_interaction.inverse_temperature", dict(late_interaction=LateInteraction(inverse_temperature=-2))),
    ("late_interaction.max_query_span", dict(late_interaction=LateInteraction(max_query_span=-1))),
    ("choices.weight", dict(choices=Choices(weight=1))),
    ("choices.weight", dict(choices=Choices(weight=-1))),
    ("schedule.steps", dict(schedule=None)),
    ("schedule.steps", dict(schedule=Schedule(steps=0))),
    ("schedule.learning_rate", dict(schedule=Schedule(steps=10, learning_rate=-1e-3))),
    ("schedule.min_learning_rate", dict(schedule=Schedule(steps=10, learning_rate=1e-6))),
    ("schedule.min_learning_rate", dict(schedule=Schedule(steps=10, min_learning_rate=-1e-6))),
    ("schedule.warmup_steps", dict(schedule=Schedule(steps=10, warmup_steps=20))),
])
def test_validate_run_refuses_naming_the_field(field, overrides):
    _refused(field, **overrides)


def test_matryoshka_messages_say_what_is_wrong():
    assert _refused("contrastive.matryoshka_dimensions",
                    contrastive=Contrastive(matryoshka_dimensions=(64, 32))).endswith(
        "must be strictly ascending, got (64, 32)")
    assert "at most 8" in _refused("contrastive.matryoshka_dimensions",
                                   contrastive=Contrastive(matryoshka_dimensions=range(8, 80, 8)))
    assert "exceeds hidden 256" in _refused("contrastive.matryoshka_dimensions",
                                            contrastive=Contrastive(matryoshka_dimensions=(128, 512)))


@pytest.mark.parametrize("build, field", [
    (lambda: Contrastive(matryoshka_dimensions=(8.5,)), "Contrastive.matryoshka_dimensions"),
    (lambda: Contrastive(matryoshka_dimensions="64"), "Contrastive.matryoshka_dimensions"),
    (lambda: Contrastive(negatives=5), "Contrastive.negatives"),
    (lambda: Contrastive(pair_loss=9), "Contrastive.pair_loss"),
    (lambda: LateInteraction(pair_loss=-1), "LateInteraction.pair_loss"),
])
def test_constructors_refuse_what_cannot_be_held(build, field):
    with pytest.raises(UFormError) as error:
        build()
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert str(error.value).startswith(f"{field}:")


def test_enum_fields_take_their_integer_values():
    assert Contrastive(negatives=1, pair_loss=2).negatives is Negatives.NAMED
    assert Contrastive(negatives=1, pair_loss=2).pair_loss is PairLossForm.RANKED
