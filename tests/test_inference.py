"""uform.Encoder: a checkpoint alone gives back the saving trainer's embeddings, bit for bit."""

import numpy as np
import pytest

import uform

TEXTS = ["a small red panda", "red pandas eat bamboo", "the capital of france", "paris is in france",
         "x" * 100]


def test_loaded_encoder_embeds_as_the_trainer_that_saved_it(tmp_path):
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4, max_columns_per_row=48),
        contrastive=uform.Contrastive(matryoshka_dimensions=(64, 128)), schedule=uform.Schedule(steps=10), seed=7)
    trainer.step([uform.Modality.TEXT] * 4, TEXTS[:4], relations=uform.Relations(attract=(np.arange(5), [1, 0, 3, 2])))
    trainer.save(tmp_path / "model.safetensors")

    encoder = uform.Encoder.load(tmp_path / "model.safetensors", executor="cpu")
    assert (encoder.hidden, encoder.widths, encoder.max_columns, encoder.steps) == (128, (64, 128), 48, 1)
    with pytest.warns(UserWarning, match="1 of 5 text items are longer than a row"):
        ours = encoder.encode(uform.Modality.TEXT, TEXTS, batch_size=2)
    assert ours.dtype == np.float32 and ours.shape == (5, 128)
    assert np.array_equal(ours, trainer.encode([uform.Modality.TEXT] * 5, TEXTS))
    prefix = encoder.encode([uform.Modality.TEXT] * 2, TEXTS[:2], width=64)
    assert np.array_equal(prefix, trainer.encode([uform.Modality.TEXT] * 2, TEXTS[:2], width=64))
    assert encoder.encode(uform.Modality.TEXT, []).shape == (0, 128)
    assert np.array_equal(encoder.encode("text", TEXTS[:2]), ours[:2])  # a modality's name, for every item
    assert np.array_equal(encoder.encode(["TEXT", uform.Modality.TEXT], TEXTS[:2]), ours[:2])
    with pytest.raises(uform.UFormError, match=r"contents: a sequence of items, got one str; pass \[item\]"):
        encoder.encode(uform.Modality.TEXT, "a string")
    with pytest.raises(uform.UFormError, match=r"'pixels' names no modality"):
        encoder.encode("pixels", TEXTS[:2])
    with pytest.raises(uform.UFormError, match=r"width: the run trained the widths \[64, 128\], not 32"):
        encoder.encode(uform.Modality.TEXT, TEXTS[:2], width=32)
    assert np.array_equal(encoder.encode(uform.Modality.TEXT, TEXTS[:2], width=32, any_width=True),
                          trainer.encode([uform.Modality.TEXT] * 2, TEXTS[:2], width=32))
    on_two = uform.Encoder.load(tmp_path / "model.safetensors", executor=uform.Executor.for_ram(2))
    assert np.array_equal(on_two.encode(uform.Modality.TEXT, TEXTS[:4]), ours[:4])

    crowd = [f"item number {i} of the crowd" for i in range(100)]
    alone = encoder.encode(uform.Modality.TEXT, TEXTS[1:2])
    among = encoder.encode(uform.Modality.TEXT, crowd[:37] + TEXTS[1:2] + crowd[37:], batch_size=16)
    assert np.array_equal(among[37:38], alone)


def test_a_worlds_checkpoint_loads_on_one_device(tmp_path):
    """A checkpoint of a world of two devices records the world's whole batch: it loads on one device, and the
    encoder embeds as the world's trainer did."""
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(2), depth=1, hidden=128, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4, max_columns_per_row=48),
        schedule=uform.Schedule(steps=10), seed=7)
    trainer.step([uform.Modality.TEXT] * 4, TEXTS[:4], relations=uform.Relations(attract=(np.arange(5), [1, 0, 3, 2])))
    trainer.save(tmp_path / "world.safetensors")
    encoder = uform.Encoder.load(tmp_path / "world.safetensors", executor="cpu")
    assert encoder.trainer.run.batch.max_rows_per_device == 4
    assert np.array_equal(encoder.encode(uform.Modality.TEXT, TEXTS[:4]),
                          trainer.encode([uform.Modality.TEXT] * 4, TEXTS[:4]))


def test_a_loaded_encoder_keeps_the_parameters_alone_and_refuses_to_train(tmp_path):
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4, max_columns_per_row=48),
        schedule=uform.Schedule(steps=10), seed=7)
    trainer.save(tmp_path / "model.safetensors")
    replica = uform.Trainer.init_vram(
        uform.Executor.for_ram(), resume=tmp_path / "model.safetensors", depth=1, hidden=128,
        objective=uform.Objective.JOINT, seed=7, training=False,
        batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4, max_columns_per_row=48),
        schedule=uform.Schedule(steps=10))
    model = replica.model
    assert not model.training and not hasattr(model, "m") and not hasattr(model, "gradients")
    assert np.array_equal(replica.encode([uform.Modality.TEXT] * 2, TEXTS[:2]),
                          trainer.encode([uform.Modality.TEXT] * 2, TEXTS[:2]))
    for verb, call in (("step", lambda: replica.step([uform.Modality.TEXT], ["a"])),
                       ("save", lambda: replica.save(tmp_path / "again.safetensors"))):
        with pytest.raises(uform.UFormError, match=f"{verb}: this replica was made with training=False") as error:
            call()
        assert error.value.code == uform.ErrorCode.UNSUPPORTED


@pytest.mark.parametrize("content,problem", [(b"not a checkpoint", "is not a safetensors file"),
                                             (None, "no checkpoint at")])
def test_a_file_that_is_not_a_checkpoint_is_refused_naming_it(tmp_path, content, problem):
    path = tmp_path / "weights.bin"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(uform.UFormError, match=f"{problem} .*weights.bin|weights.bin {problem}"):
        uform.Encoder.load(path, executor="cpu")


def test_a_safetensors_file_of_another_program_is_refused(tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(3, np.float32)}, tmp_path / "other.safetensors")
    with pytest.raises(uform.UFormError, match="other.safetensors: not a uform.trainer/2 checkpoint"):
        uform.Encoder.load(tmp_path / "other.safetensors", executor="cpu")
