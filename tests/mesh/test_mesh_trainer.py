"""Trainers of several devices in this process: a world of one trains as no mesh does, and 1, 2 and 4 devices
sharing the same items write the same checkpoint; what such worlds do not cover yet is refused."""

import re

import numpy as np
import pytest

import uform
from items import ROWS, train, trainer
from uform.training.world import row_tree

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


@pytest.mark.parametrize("devices", [2, 4])
def test_devices_of_one_process_train_to_the_checkpoint_of_one_device(tmp_path, devices):
    """Must-show 1 of the mesh, in one process: 10 JOINT steps on 1, 2 and 4 CPU devices sharing the same items
    (8 rows in all) give the same checkpoint file, byte for byte (the run it records is the world's)."""
    files = []
    for count in (1, devices):
        run = trainer(uform.Executor.for_ram(device_count=count))
        stats = train(run, 0, 1, range(10))
        files.append(tmp_path / f"{count}.safetensors")
        run.save(files[-1])
        run.close()
    assert stats.masked_text_loss > 0 and stats.contrastive_loss > 0
    assert files[0].read_bytes() == files[1].read_bytes()


def test_devices_split_exact_weight_gradients_by_blocks_of_rows(tmp_path):
    """A model whose weight gradients run the exact GEMM (hidden 512, rows of 512 tokens: an exact product a block
    of 8 rows, then the row tree over the blocks), items of 180–240 bytes filling both blocks: 1 CPU device holding
    the world's 16 rows (two blocks) and 2 holding a block each write the same checkpoint file after 2 steps."""
    from uform import kernels as K
    from uform.nn.transformer import weight_gradient_range
    from uform.training.step_inputs import check_step_inputs

    assert weight_gradient_range(512, 512, 16 * 512, 512) == 8 * 512 and K.gemm_is_exact(512, 512, 16 * 512, 8 * 512)
    rng = np.random.default_rng(2)
    steps = [[bytes(rng.integers(97, 123, int(rng.integers(180, 241))).astype(np.uint8)) for _ in range(32)]
             for _ in range(2)]
    pairs = uform.Relations(attract=(np.arange(33), np.arange(32) ^ 1))
    files = []
    for count in (1, 2):
        run = trainer(uform.Executor.for_ram(device_count=count), hidden=512, rows=16, columns=512, items=32)
        _, packed = run.step_batch(check_step_inputs([uform.Modality.TEXT] * 32, steps[0], relations=pairs), True, 1,
                                   devices=count)
        assert packed.segment_row.min() < 8 <= packed.segment_row.max()  # segments in both blocks
        for texts in steps:
            run.step([uform.Modality.TEXT] * 32, texts, relations=pairs)
        files.append(tmp_path / f"{count}.safetensors")
        run.save(files[-1])
        run.close()
    assert files[0].read_bytes() == files[1].read_bytes()


def test_a_world_refuses_devices_holding_less_than_a_block_of_rows():
    """Exact weight gradients over blocks of 8 rows of 512 tokens: 4 devices of 2 rows each would split a block."""
    message = ("batch.max_rows_per_device: a world of 4 devices needs at least 8 (hidden 512: the weight gradients "
               "are exact products over blocks of 8 rows of 512 tokens, which a device holds whole), got 2")
    with pytest.raises(uform.UFormError, match=re.escape(message)) as error:
        trainer(uform.Executor.for_ram(device_count=4), hidden=512, rows=8, columns=512)
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT
    trainer(uform.Executor.for_ram(device_count=4), hidden=256, rows=8, columns=512).close()  # below the rule: rows


def test_a_checkpoint_resumes_on_another_split(tmp_path):
    """Five steps on four devices, resumed on one device for five more: the file of ten steps on two."""
    first = trainer(uform.Executor.for_ram(device_count=4))
    train(first, 0, 1, range(5))
    first.save(tmp_path / "five.safetensors")
    resumed = uform.Trainer.init_vram(uform.Executor.for_ram(), resume=tmp_path / "five.safetensors", depth=1,
                                      hidden=128, objective=uform.Objective.JOINT,
                                      batch=uform.BatchShape(max_rows_per_device=ROWS, max_segments_per_device=16,
                                                             max_columns_per_row=32),
                                      schedule=uform.Schedule(steps=20, learning_rate=2e-3), seed=5)
    train(resumed, 0, 1, range(5, 10))
    resumed.save(tmp_path / "resumed.safetensors")
    straight = trainer(uform.Executor.for_ram(device_count=2))
    train(straight, 0, 1, range(10))
    straight.save(tmp_path / "straight.safetensors")
    assert (tmp_path / "resumed.safetensors").read_bytes() == (tmp_path / "straight.safetensors").read_bytes()


def test_replicas_stay_identical_and_a_bag_stays_on_one_device():
    run = trainer(uform.Executor.for_ram(device_count=2))
    # Rows of 32 positions, 4 per device. Bag 3's two items fill a row each: rows 3 (first device) and 4 (second)
    # would split it, so it goes whole to the second device's block; the next item lands first-fit in row 3.
    texts = [b"a" * 20, b"b" * 20, b"c" * 20, b"e" * 30, b"f" * 30, b"g" * 20]
    bags = [0, 1, 2, 3, 3, 4]
    inputs = uform.training.step_inputs.check_step_inputs([uform.Modality.TEXT] * 6, texts, bags=bags)
    _, packed = run.step_batch(inputs, True, 1, devices=2)
    assert packed.segment_row.tolist() == [0, 1, 2, 4, 5, 3]
    run.step([uform.Modality.TEXT] * 6, texts, bags=bags)
    replicas = [replica.download_state() for replica in run._replicas]
    assert all(np.array_equal(getattr(replicas[0], name), getattr(replicas[1], name)) for name in ("parameters", "m", "v"))


def test_the_host_row_tree_is_the_engines():
    """The devices' gradients combine on the host in the order the engine's tree_sum combines rows."""
    rng = np.random.default_rng(3)
    device = uform.Device.cpu()
    for count in (1, 2, 3, 5, 8, 12, 16, 17, 31, 64, 100):
        parts = (rng.standard_normal((count, 500)) * np.exp(3 * rng.standard_normal((count, 500)))).astype(np.float32)
        out = device.empty(500)
        uform.kernels.tree_sum(out, device.put(parts), count)
        assert np.array_equal(out.numpy().view(np.uint32), row_tree(list(parts)).view(np.uint32)), count


@pytest.mark.parametrize("settings, named", [
    (dict(late_interaction=uform.LateInteraction(weight=1.0)), "late_interaction.weight"),
    (dict(choices=uform.Choices(weight=1.0), batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4,
                                                                    max_columns_per_row=32, max_choices_per_item=4)),
     "choices.weight, batch.max_choices_per_item"),
    (dict(batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4, max_columns_per_row=256,
                                 image=(16, 3))), "batch.image"),
    (dict(numerics="fast"), "numerics: fast mode"),
])
def test_a_world_of_several_devices_refuses_what_it_does_not_cover(settings, named):
    options = dict(depth=1, hidden=128, objective=uform.Objective.JOINT, schedule=uform.Schedule(steps=5),
                   batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4,
                                          max_columns_per_row=32)) | settings
    with pytest.raises(uform.UFormError, match=named) as error:
        uform.Trainer.init_vram(uform.Executor.for_ram(device_count=2), **options)
    assert error.value.code == uform.ErrorCode.UNSUPPORTED


def test_a_world_of_several_devices_needs_rows_in_a_power_of_two():
    with pytest.raises(uform.UFormError, match="batch.max_rows_per_device: a world of 2 devices needs a power of "
                                               "two") as error:
        uform.Trainer.init_vram(uform.Executor.for_ram(device_count=2), depth=1, hidden=128, schedule=uform.Schedule(steps=5),
                                batch=uform.BatchShape(max_rows_per_device=3, max_segments_per_device=4,
                                                       max_columns_per_row=32))
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT


def test_processes_items_concatenate_into_the_worlds():
    """Two processes' items (bags, groups, weighted edges, one process without relations) read as one step of
    the world's items: bags stay apart, edges shift by the items before them, weights kept."""
    from uform.training.relations import pair_targets
    from uform.training.step_inputs import check_step_inputs
    from uform.training.world import concatenate_inputs, decode_inputs, encode_inputs

    first = check_step_inputs([uform.Modality.TEXT] * 3, [b"ab", b"cde", b"f"], bags=[7, 7, 2],
                              temperature_groups=[0, 1, 0], temperature_group_count=2,
                              relations=uform.Relations(attract=([0, 1, 2, 2], [1, 0], [0.5, 2.0])))
    second = check_step_inputs([uform.Modality.TEXT] * 2, [b"gh", b"ijk"], bags=[7, 1])
    world = concatenate_inputs([decode_inputs(encode_inputs(part))[0] for part in (first, second)],
                               uform.Scalar.F32)
    assert world.contents == [b"ab", b"cde", b"f", b"gh", b"ijk"]
    assert len(set(world.bags[:2])) == 1 and len(set(world.bags.tolist())) == 4
    assert world.temperature_groups.tolist() == [0, 1, 0, 0, 0]
    sign, weight = pair_targets(world.relations, 5, uform.Negatives.AMBIENT, 0.0)
    alone, alone_weight = pair_targets(first.relations, 3, uform.Negatives.AMBIENT, 0.0)
    assert np.array_equal(sign[:3, :3], alone) and np.array_equal(weight[:3, :3], alone_weight)
    assert np.all(sign[3:, :] <= 0) and np.all(sign[:, 3:] <= 0)


def test_a_refusal_crosses_the_exchange():
    from uform.training.world import decode_inputs, encode_inputs

    arrays, refusal = decode_inputs(encode_inputs(uform.UFormError(uform.ErrorCode.SHAPE_MISMATCH, "bags: 2 for 3")))
    assert refusal == "SHAPE_MISMATCH: bags: 2 for 3"
