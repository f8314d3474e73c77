"""uform.Trainer on the engine: the seed's example, whole-step gradients against the float64 torch
reimplementation, learning, exact resume, and the refusal semantics."""

import hashlib
import itertools
import threading

import numpy as np
import pytest

import uform
from trainer_cases import PAIRS, TEXTS, assert_gradients_match, engine_and_reference, tiny
from uform import kernels as K


def test_seed_example_runs_with_text_items(tmp_path):
    executor = uform.Executor.for_ram()
    trainer = uform.Trainer.init_vram(executor, depth=2, hidden=128, objective=uform.Objective.JOINT,
                                      batch=uform.BatchShape(max_rows_per_device=4, max_segments_per_device=16,
                                                             max_columns_per_row=64, max_bags_per_device=8,
                                                             image=uform.ImageShape(patch_side=16)),
                                      schedule=uform.Schedule(steps=100_000), seed=42)
    stats = uform.TrainerStepStats()
    modalities = [uform.Modality.TEXT] * 4
    contents = TEXTS[:4]
    offsets, ids = np.array([0, 1, 2, 3, 4], np.uint64), np.array([1, 0, 3, 2], np.uint32)
    trainer.step(modalities, contents, bags=[0, 0, 1, 1], relations=uform.Relations(attract=(offsets, ids)),
                 stats=stats)
    assert stats.step == 1 and stats.loss > 0 and stats.contrastive_loss > 0 and stats.masked_text_loss > 0
    assert stats.learning_rate == pytest.approx(5e-4 / 400)
    trainer.save(tmp_path / "checkpoint.safetensors")
    assert (tmp_path / "checkpoint.safetensors").stat().st_size > 0


@pytest.mark.parametrize("form", [uform.PairLossForm.SIGMOID, uform.PairLossForm.BALANCED, uform.PairLossForm.RANKED])
@pytest.mark.parametrize("objective", [uform.Objective.JOINT, uform.Objective.CONTRASTIVE, uform.Objective.MASKED])
def test_whole_step_gradients_match_float64_reference(form, objective):
    contrastive = uform.Contrastive(pair_loss=form, matryoshka_dimensions=(64, 128), temperature_groups=2)
    trainer = tiny(objective, contrastive)
    relations = uform.Relations(attract=(np.arange(9), [1, 0, 3, 2, 5, 4, 7, 6]),
                                repel=([0, 1, 1, 1, 1, 1, 1, 1, 1], [2]), ignore=([0, 0, 0, 1, 1, 1, 1, 1, 1], [7]))
    losses, gradient, reference, expected = engine_and_reference(trainer, relations, groups=[0, 1] * 4)
    assert losses.total == pytest.approx(float(reference["loss"]), rel=2e-5)
    assert losses.masked == pytest.approx(float(reference["masked"]), rel=2e-5, abs=1e-7)
    assert losses.contrastive == pytest.approx(float(reference["contrastive"]), rel=2e-5, abs=1e-7)
    assert_gradients_match(trainer, gradient, expected)


def test_whole_step_gradients_match_float64_reference_through_the_exact_gemm():
    """A model whose products the canonical shape rule takes (hidden 512, an MLP of 2048, 16 packed rows of 512
    tokens, items of ~450 bytes filling both blocks of 8 rows): the blocks' products and every weight gradient (an
    exact product a block of rows, the two blocks added in the row tree) run the exact GEMM; the step stays within
    the float64 tolerances."""
    from uform.nn.transformer import weight_gradient_range

    trainer = tiny(uform.Objective.JOINT, uform.Contrastive(temperature_groups=2), hidden=512, max_rows_per_device=16,
                   max_segments_per_device=16, max_columns_per_row=512)
    geometry = trainer.model.stack.geometry
    tokens = 16 * 512
    assert K.gemm_is_exact(tokens, geometry.width, geometry.mlp)
    assert weight_gradient_range(geometry.width, geometry.mlp, tokens, 512) == 8 * 512  # two blocks, two products
    contents = [((text + ". ") * 40)[:450 - 7 * i] for i, text in enumerate(TEXTS + TEXTS[::-1])]
    relations = uform.Relations(attract=(np.arange(17), np.arange(16) ^ 1))
    with K.profile() as products:
        losses, gradient, reference, expected = engine_and_reference(trainer, relations, groups=[0, 1] * 8,
                                                                     contents=contents)
    assert {"gemm_exact", "gemm_bt_exact", "gemm_at_exact_rows"} <= set(products)  # the exact GEMM ran
    assert losses.total == pytest.approx(float(reference["loss"]), rel=2e-5)
    assert_gradients_match(trainer, gradient, expected)


def test_named_negatives_skip_unnamed_pairs():
    contrastive = uform.Contrastive(negatives=uform.Negatives.NAMED)
    trainer = tiny(uform.Objective.CONTRASTIVE, contrastive)
    losses, gradient, reference, expected = engine_and_reference(trainer, PAIRS)
    assert losses.contrastive == pytest.approx(float(reference["contrastive"]), rel=2e-5)
    assert np.abs(gradient - expected).max() < 2e-4 * np.abs(expected).max()


def checkpoint_tensors_sha(path) -> str:
    from safetensors.numpy import load_file

    tensors = load_file(path)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].tobytes())
    return digest.hexdigest()


def train(trainer, steps, start=0):
    stats = uform.TrainerStepStats()
    for step in range(start, start + steps):
        order = np.roll(np.arange(8), step)  # a different mix every step, so the corruption keys vary
        contents = [TEXTS[i] for i in order]
        position = np.argsort(order)
        partners = [int(position[i ^ 1]) for i in order]
        trainer.step([uform.Modality.TEXT] * 8, contents, stats=stats,
                     relations=uform.Relations(attract=(np.arange(9), partners)))
    return stats


def test_resume_continues_exactly(tmp_path):
    straight = tiny(steps=20)
    train(straight, 20)
    straight.save(tmp_path / "straight.safetensors")
    first = tiny(steps=20)
    train(first, 10)
    first.save(tmp_path / "half.safetensors")
    resumed = uform.Trainer.init_vram(uform.Executor.for_ram(), resume=tmp_path / "half.safetensors", depth=1,
                                      hidden=128, objective=uform.Objective.JOINT,
                                      batch=uform.BatchShape(max_rows_per_device=3, max_segments_per_device=8,
                                                             max_columns_per_row=48),
                                      schedule=uform.Schedule(steps=20, learning_rate=2e-3), seed=3)
    assert resumed.completed_steps == 10
    stats = train(resumed, 10, start=10)
    assert stats.step == 20
    resumed.save(tmp_path / "resumed.safetensors")
    assert checkpoint_tensors_sha(tmp_path / "resumed.safetensors") == \
        checkpoint_tensors_sha(tmp_path / "straight.safetensors")
    # the same state, the same bytes: the header's keys are sorted (checkpoint.canonical)
    assert (tmp_path / "resumed.safetensors").read_bytes() == (tmp_path / "straight.safetensors").read_bytes()


def test_a_checkpoint_header_is_canonical_whatever_order_safetensors_writes(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import save

    from uform.training.checkpoint import canonical

    tensors = {"w": np.arange(6, dtype=np.float32), "b": np.ones(3, np.float32)}
    fields = [("step", "7"), ("seed", "3"), ("run", "{}"), ("format", "x"), ("numerics", "fast")]
    blobs = {b"".join(canonical(save(tensors, metadata=dict(order))))
             for order in (fields, fields[::-1], fields[2:] + fields[:2])}
    assert len(blobs) == 1
    blob = blobs.pop()
    header_length = int.from_bytes(blob[:8], "little")
    assert header_length % 8 == 0 and blob[8:8 + header_length].startswith(b'{"__metadata__":{"format":"x"')
    (tmp_path / "c.safetensors").write_bytes(blob)
    with safe_open(tmp_path / "c.safetensors", "numpy") as file:
        assert file.metadata() == dict(fields)
        assert np.array_equal(file.get_tensor("w"), tensors["w"]) and np.array_equal(file.get_tensor("b"), tensors["b"])


def test_resume_of_another_geometry_is_a_config_mismatch(tmp_path):
    trainer = tiny()
    trainer.save(tmp_path / "c.safetensors")
    with pytest.raises(uform.UFormError, match="geometry") as error:
        uform.Trainer.init_vram(uform.Executor.for_ram(), resume=tmp_path / "c.safetensors", depth=2, hidden=128,
                                objective=uform.Objective.JOINT,
                                batch=uform.BatchShape(max_rows_per_device=3, max_segments_per_device=8,
                                                       max_columns_per_row=48),
                                schedule=uform.Schedule(steps=100), seed=3)
    assert error.value.code == uform.ErrorCode.CONFIG_MISMATCH


def test_refused_steps_change_nothing():
    trainer = tiny()
    before = trainer.model.parameters.numpy()
    with pytest.raises(uform.UFormError) as error:
        trainer.step([uform.Modality.TEXT, uform.Modality.IMAGE], ["text", b"\x89PNG"])
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT and "item 1: IMAGE" in str(error.value)
    with pytest.raises(uform.UFormError) as error:
        trainer.step([uform.Modality.TEXT] * 2, ["a", "b"], relations=uform.Relations(attract=([0, 1, 1], [5])))
    assert "attract" in str(error.value)
    with pytest.raises(uform.UFormError) as error:
        trainer.step([uform.Modality.TEXT] * 3, ["a", "b"])
    assert error.value.code == uform.ErrorCode.SHAPE_MISMATCH
    assert trainer.completed_steps == 0
    assert np.array_equal(trainer.model.parameters.numpy(), before)


def test_unsupported_run_options_are_named():
    executor = uform.Executor.for_ram()
    batch = uform.BatchShape(max_rows_per_device=1, max_segments_per_device=1, max_columns_per_row=8)
    with pytest.raises(uform.UFormError, match="mesh") as error:
        uform.Trainer.init_vram(executor, mesh=object(), depth=1, hidden=128, schedule=uform.Schedule(steps=1),
                                batch=batch)
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(uform.UFormError, match="late_interaction.weight: a world of 2 devices") as error:
        uform.Trainer.init_vram(uform.Executor.for_ram(device_count=2), depth=1, hidden=128, batch=batch,
                                schedule=uform.Schedule(steps=1), objective=uform.Objective.JOINT,
                                late_interaction=uform.LateInteraction(weight=1.0))
    assert error.value.code == uform.ErrorCode.UNSUPPORTED
    with pytest.raises(uform.UFormError, match="hidden"):
        uform.Trainer.init_vram(executor, depth=1, hidden=100, schedule=uform.Schedule(steps=1))


def test_receivers_arena_and_progress(tmp_path):
    executor = uform.Executor.for_ram()
    trainer = tiny(executor=executor, max_rows_per_device=8)
    arena = uform.Arena()
    rows = trainer.on(executor).step([uform.Modality.TEXT] * 8, TEXTS, relations=PAIRS, arena=arena,
                                     outputs_scalar=uform.Scalar.F16)
    assert rows.dtype == np.float16 and rows.shape == (8, 128)
    assert np.allclose(np.linalg.norm(rows.astype(np.float32), axis=1), 1, atol=2e-3)
    deferred = trainer.deferred(executor).step([uform.Modality.TEXT] * 8, TEXTS, relations=PAIRS)
    assert deferred.wait(60) and deferred.done() and deferred.exception() is None and deferred.result() is None
    assert trainer.completed_steps == 2
    failing = trainer.deferred(executor).step([uform.Modality.TEXT], ["a", "b"])
    assert isinstance(failing.exception(60), uform.UFormError)
    reports = []
    stop = lambda done, total: reports.append((done, total)) or len(reports) < 2  # noqa: E731
    trainer.save(tmp_path / "stopped.safetensors", progress=stop, progress_steps=4)
    assert not (tmp_path / "stopped.safetensors").exists() and len(reports) == 2
    reports.clear()
    trainer.save(tmp_path / "whole.safetensors", progress=lambda d, t: reports.append((d, t)), progress_steps=4)
    assert len(reports) <= 4 and reports[-1][0] == reports[-1][1]
    with pytest.raises(uform.UFormError, match="executor"):
        trainer.on(uform.Executor.for_ram())


def test_joint_training_learns_pairs_and_bytes():
    """Learning on the CPU: recall@1 between the trained pairs, and masked bytes well above the unigram guess."""
    from uform.pairs import recall_at_1

    combos = list(itertools.product(["red", "green", "blue", "yellow"], ["panda", "tiger", "rabbit"],
                                    ["bamboo", "carrots"]))
    queries = [f"the {color} {animal} eats {food}" for color, animal, food in combos]
    documents = [f"a {animal} that is {color} likes {food}" for color, animal, food in combos]
    contents = queries + documents
    n = len(queries)
    relations = uform.Relations(attract=(np.arange(2 * n + 1), list(range(n, 2 * n)) + list(range(n))))
    trainer = uform.Trainer.init_vram(uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.JOINT,
                                      batch=uform.BatchShape(max_rows_per_device=2 * n, max_segments_per_device=2 * n,
                                                             max_columns_per_row=32),
                                      masking=uform.Masking(token_mean_span=2),
                                      schedule=uform.Schedule(steps=200, learning_rate=5e-3), seed=0)
    modalities = [uform.Modality.TEXT] * (2 * n)
    for _ in range(200):
        trainer.step(modalities, contents, relations=relations)
    result = trainer.evaluate(modalities, contents, relations=relations)
    embeddings = result["embeddings"]
    assert recall_at_1(embeddings[:n], embeddings[n:]) >= 0.9
    accuracy = np.mean([trainer.evaluate(modalities, contents, corrupt_as_step=10**6 + k)["masked_accuracy"]
                        for k in range(4)])  # four fresh corruptions of the trained texts
    text = np.frombuffer("".join(contents).encode(), np.uint8)
    unigram = np.bincount(text).max() / text.size
    assert accuracy > 2 * unigram


@pytest.mark.parametrize("on_gpu", [False] + ([True] if uform.gpu_count() else []), ids=lambda gpu: "gpu" if gpu
                         else "cpu")
def test_deferred_steps_prepared_ahead_train_as_blocking_steps(tmp_path, on_gpu):
    """Deferred steps pack and corrupt their batches while earlier steps run (on the CPU and on a GPU); a refused
    step among them (an image in a text run) leaves the batches
    prepared after it keyed to the wrong step number, which their steps notice and prepare again: the checkpoint is
    the blocking steps' all the same."""
    orders = [np.roll(np.arange(8), step) for step in range(5)]
    executor = uform.Executor.for_vram([0]) if on_gpu else uform.Executor.for_ram()
    blocking = tiny(executor=executor)
    for order in orders:
        blocking.step([uform.Modality.TEXT] * 8, [TEXTS[i] for i in order])
    blocking.save(tmp_path / "blocking.safetensors")
    deferred = tiny(executor=executor)
    receiver = deferred.deferred(executor)
    handles = [receiver.step([uform.Modality.TEXT] * 8, [TEXTS[i] for i in order]) for order in orders[:2]]
    handles.append(receiver.step([uform.Modality.IMAGE], [b"not an image"]))
    handles += [receiver.step([uform.Modality.TEXT] * 8, [TEXTS[i] for i in order]) for order in orders[2:]]
    assert [handle.wait(120) for handle in handles] == [True] * 6
    assert isinstance(handles[2].exception(), uform.UFormError)
    assert all(handle.exception() is None for handle in handles[:2] + handles[3:])
    deferred.save(tmp_path / "deferred.safetensors")
    deferred.close()
    assert (tmp_path / "blocking.safetensors").read_bytes() == (tmp_path / "deferred.safetensors").read_bytes()


def test_deferred_steps_that_fail_before_their_batch_leave_nothing_queued(monkeypatch):
    """A deferred step that fails before it needs its batch (here: the device is lost) takes its queued preparation
    with it, so nothing it holds stays queued for a later step to pack."""

    executor = uform.Executor.for_ram()
    trainer = tiny(executor=executor)

    def failing(*args, **kwargs):
        raise K.EngineError("cpu: kernel adamw failed: simulated")

    monkeypatch.setattr(K, "adamw", failing)
    with pytest.raises(uform.UFormError, match="simulated"):
        trainer.step([uform.Modality.TEXT] * 8, TEXTS)
    receiver = trainer.deferred(executor)
    handles = [receiver.step([uform.Modality.TEXT] * 8, TEXTS) for _ in range(2)]
    assert [handle.wait(60) for handle in handles] == [True, True]
    assert all(handle.exception().code == uform.ErrorCode.DEVICE_LOST for handle in handles)
    assert not trainer._prefetch.queue and trainer._prefetch.in_flight == 0


def test_deferred_steps_pack_the_next_batch_between_queueing_and_reading_back(monkeypatch):
    """A deferred step packs the next one's batch in its queued phase: after its backward is queued (the final
    norm's backward, the first kernel of the backward proper) and before it reads any loss back."""
    from uform import engine

    executor = uform.Executor.for_ram()
    trainer = tiny(executor=executor)
    events = []
    backward_kernel = K.rmsnorm_backward
    monkeypatch.setattr(K, "rmsnorm_backward", lambda *a, **k: (events.append("backward"), backward_kernel(*a, **k))[1])
    read = engine.Buffer.numpy
    monkeypatch.setattr(engine.Buffer, "numpy", lambda self: (events.append("read"), read(self))[1])
    run_queued = trainer._prefetch.run_queued
    monkeypatch.setattr(trainer._prefetch, "run_queued",
                        lambda until=None: (events.append("pack" if until is None else "wait"), run_queued(until))[1])
    receiver = trainer.deferred(executor)
    handles = [receiver.step([uform.Modality.TEXT] * 8, TEXTS) for _ in range(2)]
    assert [handle.wait(60) for handle in handles] == [True, True]
    assert all(handle.exception() is None for handle in handles)
    first_step = events[:events.index("wait", 1)]  # the second step's own wait for its batch ends the first's
    backward, pack = first_step.index("backward"), first_step.index("pack")
    assert backward < pack and "read" not in first_step[backward:pack] and "read" in first_step[pack:]
    trainer.close()


def test_gradient_clipping_scales_the_update_as_clip_grad_norm_does():
    """Schedule(gradient_clip_norm=c): the first update is AdamW's on the gradient scaled by c / (‖g‖ + 1e-6), as
    torch.nn.utils.clip_grad_norm_ scales it, from the same gradient (float64 reference)."""
    torch = pytest.importorskip("torch")
    from uform.training.encoder import ADAMW
    from uform.training.schedule import learning_rate

    probe = tiny()
    _, gradient, _, _ = engine_and_reference(probe, PAIRS)
    norm = np.linalg.norm(gradient.astype(np.float64))
    clip = 1e-3 * norm  # entries near AdamW's epsilon, so the clipped update differs from the plain one
    schedule = uform.Schedule(steps=100, learning_rate=2e-3, gradient_clip_norm=clip)
    trainer = uform.Trainer.init_vram(uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.JOINT,
                                      batch=probe.run.batch, schedule=schedule, seed=3)
    before = trainer.model.parameters.numpy().astype(np.float64)
    trainer.step([uform.Modality.TEXT] * len(TEXTS), TEXTS, relations=PAIRS)
    after = trainer.model.parameters.numpy().astype(np.float64)

    clipped = torch.tensor(gradient.astype(np.float64))
    parameter = torch.nn.Parameter(torch.zeros_like(clipped))
    parameter.grad = clipped
    assert torch.nn.utils.clip_grad_norm_([parameter], clip).item() == pytest.approx(norm, rel=1e-6)
    g = parameter.grad.numpy()
    decay = np.zeros_like(before)
    for entry in trainer.model.registry:
        decay[entry["offset"]:entry["offset"] + entry["size"]] = ADAMW.weight_decay * ADAMW.decays(entry["name"])
    lr = learning_rate(trainer.run.schedule, 1)
    expected = before * (1 - lr * decay) - lr * g / (np.abs(g) + ADAMW.eps)  # step 1: m̂ = g, v̂ = g²
    np.testing.assert_allclose(after, expected, rtol=2e-7, atol=5e-9)  # float32 parameters, float64 reference
    plain = before * (1 - lr * decay) - lr * gradient / (np.abs(gradient) + ADAMW.eps)
    assert np.abs(plain - expected).max() > 100 * np.abs(after - expected).max()


def test_a_negative_clip_norm_is_refused():
    with pytest.raises(uform.UFormError, match="schedule.gradient_clip_norm"):
        tiny(steps=10).__class__.init_vram(uform.Executor.for_ram(), depth=1, hidden=128,
                                           batch=uform.BatchShape(max_rows_per_device=1, max_segments_per_device=1,
                                                                  max_columns_per_row=8),
                                           schedule=uform.Schedule(steps=10, gradient_clip_norm=-1.0))


def test_a_seed_is_any_u64(tmp_path):
    """The seeds type a run's seed u64: 2**64 - 1 trains, saves and resumes to the same step; 2**64 and -1 are
    refused naming the field."""
    trainer = tiny(seed=2**64 - 1)
    trainer.step([uform.Modality.TEXT] * 8, TEXTS)
    trainer.save(tmp_path / "top.safetensors")
    resumed = uform.Trainer.init_vram(uform.Executor.for_ram(), resume=tmp_path / "top.safetensors", depth=1,
                                      hidden=128, objective=uform.Objective.JOINT, batch=trainer.run.batch,
                                      schedule=trainer.run.schedule, seed=2**64 - 1)
    assert resumed.completed_steps == 1
    np.testing.assert_array_equal(resumed.parameters()["embedding"], trainer.parameters()["embedding"])
    for seed in (2**64, -1):
        with pytest.raises(uform.UFormError, match=r"seed: must be an integer in \[0, 2\*\*64\)"):
            tiny(seed=seed)


def test_a_cancelled_deferred_step_leaves_nothing_in_flight():
    """Deferred steps withdrawn before they start give back what they held: the in-flight count (which the next
    steps' prepared batches assume) and the decoding slots; the steps after them train as if they were never
    submitted (to the bits of blocking steps)."""
    executor = uform.Executor.for_ram()
    blocking, deferred = tiny(executor=executor), tiny(executor=executor)
    for _ in range(2):
        blocking.step([uform.Modality.TEXT] * 8, TEXTS)
    receiver = deferred.deferred(executor)
    gate = threading.Event()
    deferred._worker.submit(gate.wait)  # holds the worker, so the steps below wait their turn
    withdrawn = [receiver.step([uform.Modality.TEXT] * 8, TEXTS) for _ in range(2)]
    assert [handle.cancel() for handle in withdrawn] == [True, True]
    assert deferred._prefetch.in_flight == 0 and not deferred._prefetch.queue
    gate.set()
    handles = [receiver.step([uform.Modality.TEXT] * 8, TEXTS) for _ in range(2)]
    assert [handle.wait(60) for handle in handles] == [True, True]
    assert all(handle.exception() is None for handle in handles)
    assert deferred.completed_steps == 2 and deferred._prefetch.in_flight == 0
    np.testing.assert_array_equal(deferred.parameters()["embedding"], blocking.parameters()["embedding"])
    deferred.close()
