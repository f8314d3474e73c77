"""A trainer over a mesh in this process: a world of one trains as no mesh does; larger worlds are refused."""

import numpy as np
import pytest

import uform

TEXTS = ["a small red panda", "red pandas eat bamboo shoots", "the capital of france", "paris is in france"]
PAIRS = uform.Relations(attract=(np.arange(5), [1, 0, 3, 2]))


def tiny(executor, mesh=None):
    return uform.Trainer.init_vram(executor, mesh=mesh, depth=1, hidden=128, objective=uform.Objective.JOINT,
                                   batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4,
                                                          max_columns_per_row=48),
                                   schedule=uform.Schedule(steps=10, learning_rate=2e-3), seed=7)


def test_a_world_of_one_gives_the_bits_of_no_mesh(tmp_path):
    """The same checkpoint file, byte for byte: every tensor (weights and AdamW moments) and the metadata."""
    checkpoints = []
    for name, use_mesh in (("alone", False), ("mesh", True)):
        executor = uform.Executor.for_ram()
        mesh = uform.Mesh.bootstrap(executor, uform.MeshOptions()) if use_mesh else None
        trainer = tiny(executor, mesh)
        assert trainer.mesh is mesh
        stats = uform.TrainerStepStats()
        for _ in range(3):
            trainer.step([uform.Modality.TEXT] * 4, TEXTS, relations=PAIRS, stats=stats)
        checkpoints.append(tmp_path / f"{name}.safetensors")
        trainer.save(checkpoints[-1])
        trainer.close()
    assert stats.masked_text_loss > 0 and stats.contrastive_loss > 0
    assert checkpoints[0].read_bytes() == checkpoints[1].read_bytes()


def test_a_mesh_over_another_executor_is_refused():
    mesh = uform.Mesh.bootstrap(uform.Executor.for_ram(), uform.MeshOptions())
    with pytest.raises(uform.UFormError, match="mesh: it was made over another executor") as error:
        tiny(uform.Executor.for_ram(), mesh)
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT


def test_a_world_of_several_devices_is_refused_naming_what_is_missing():
    executor = uform.Executor.for_ram(device_count=2)
    mesh = uform.Mesh.bootstrap(executor, uform.MeshOptions())
    with pytest.raises(uform.UFormError, match="mesh: a world of 2 devices needs reductions whose result does not "
                                               "depend on how the devices share the batch") as error:
        tiny(executor, mesh)
    assert error.value.code == uform.ErrorCode.UNSUPPORTED
