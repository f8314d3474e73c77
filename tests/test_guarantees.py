"""The guarantees of docs/guarantees.md, class by class (issue 11), for both trainers on the CPU.

Each test names the class it covers: concurrency, integrity, values, memory, errors, half-applied steps,
environment, files and empty steps.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import uform
from uform import kernels as K
from uform.lm import LanguageModelConfig, LanguageModelTrainer, state_sha256
from uform.nn.cache import GEOMETRIES_KEPT
from uform.nn.resident import GUARD_COLUMNS, ResidentState
from uform.training import checkpoint
from uform.errors import ErrorCode, UFormError

TEXTS = ["a small red panda", "red pandas eat bamboo shoots", "the capital of france", "paris is in france"]
PAIRS = uform.Relations(attract=(np.arange(5), [1, 0, 3, 2]))
LM_SHAPE = LanguageModelConfig(batch=2, length=16, width=32, heads=4, kv_heads=2, mlp=64, layers=1)


def encoder(**overrides):
    settings = dict(depth=1, hidden=128, objective=uform.Objective.JOINT,
                    batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4, max_columns_per_row=48),
                    schedule=uform.Schedule(steps=10, learning_rate=2e-3), seed=5) | overrides
    return uform.Trainer.init_vram(uform.Executor.for_ram(), **settings)


def encoder_step(trainer):
    trainer.step([uform.Modality.TEXT] * len(TEXTS), TEXTS, relations=PAIRS)


def lm(**overrides):
    weights = (np.random.default_rng(0).standard_normal(LM_SHAPE.n_total) * 0.05).astype(np.float32)
    return LanguageModelTrainer(weights, data_schedule={}, shape=LM_SHAPE, executor="cpu", resident=True,
                                **overrides)


LM_IDS = np.random.default_rng(1).integers(0, 256, (LM_SHAPE.batch, LM_SHAPE.length + 1), dtype=np.int32)


def encoder_state(trainer):
    return {name: tensor.copy() for name, tensor in trainer.parameters().items()}


def assert_same_parameters(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def saved_encoder(tmp_path, steps=1):
    trainer = encoder()
    for _ in range(steps):
        encoder_step(trainer)
    path = tmp_path / "run.safetensors"
    assert trainer.save(path) is True
    return trainer, path


def tensor_offset(path, name) -> int:
    """Where tensor `name`'s bytes start in a safetensors file."""
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + length])
    return 8 + length + header[name]["data_offsets"][0]


def raw_metadata(path) -> dict:
    with safe_open(str(path), framework="numpy") as file:
        return file.metadata()


def rewrite(path, tensors, metadata):
    save_file(tensors, str(path), metadata=metadata)


def resigned(metadata: dict) -> dict:
    """Metadata changed on purpose and signed again, so a test reaches the checks behind the digest."""
    return metadata | {"metadata_sha256": checkpoint.metadata_digest(metadata)}


# ---- 1. concurrency ------------------------------------------------------------------------------------------


def run_in_threads(call, threads=3, calls=2):
    results, errors = [], []

    def work():
        try:
            for _ in range(calls):
                results.append(call())
        except BaseException as error:  # noqa: BLE001 - surfaced below
            errors.append(error)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors
    return results


def test_concurrency_lm_threads_lose_no_update():
    shared, alone = lm(), lm()
    results = run_in_threads(lambda: shared.train_step(LM_IDS), threads=4, calls=2)
    assert sorted(result["step"] for result in results) == list(range(1, 9)) and shared.step_ == 8
    for _ in range(8):  # the same ids every step: any order of the calls gives the same state
        alone.train_step(LM_IDS)
    assert state_sha256(shared.export_state()) == state_sha256(alone.export_state())


def test_concurrency_encoder_threads_lose_no_update():
    shared, alone = encoder(), encoder()
    run_in_threads(lambda: encoder_step(shared), threads=3, calls=1)
    for _ in range(3):
        encoder_step(alone)
    assert shared.completed_steps == 3
    assert_same_parameters(shared.parameters(), alone.parameters())


def test_concurrency_every_public_lm_method_holds_the_lock():
    for name, member in vars(LanguageModelTrainer).items():
        if name.startswith("_") or isinstance(member, (classmethod, staticmethod)) or name == "save_checkpoint":
            continue
        function = member.fget if isinstance(member, property) else member
        assert callable(function) and hasattr(function, "__wrapped__"), f"{name} is not serialised"


# ---- 2. integrity --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tensor", ["embedding", "optimizer.v.final_norm"])
def test_integrity_flipped_bit_in_encoder_checkpoint_names_the_tensor(tmp_path, tensor):
    _, path = saved_encoder(tmp_path)
    data = bytearray(path.read_bytes())
    data[tensor_offset(path, tensor) + 1] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(UFormError, match=f"tensor {tensor} does not match its SHA-256") as caught:
        encoder(resume=path)
    assert caught.value.code == ErrorCode.CORRUPTED
    with pytest.raises(UFormError, match=f"tensor {tensor} does not match"):
        checkpoint.read_tensors(path, optimizer=True)


def test_integrity_verifying_reader_serves_the_parameters(tmp_path):
    trainer, path = saved_encoder(tmp_path)
    metadata, tensors = checkpoint.read_tensors(path)
    assert metadata["step"] == 1 and not any(name.startswith("optimizer.") for name in tensors)
    assert_same_parameters(tensors, trainer.parameters())
    resumed = encoder(resume=path)
    assert resumed.completed_steps == 1
    assert_same_parameters(resumed.parameters(), trainer.parameters())


def test_integrity_tampered_digest_list_is_refused(tmp_path):
    _, path = saved_encoder(tmp_path)
    _, tensors = checkpoint.read_tensors(path, optimizer=True)
    raw = raw_metadata(path)
    digests = json.loads(raw["sha256"])
    del digests["embedding"]
    tampered = raw | {"sha256": json.dumps(digests)}
    rewrite(path, tensors, tampered)
    with pytest.raises(UFormError, match="the metadata .* does not match its SHA-256") as error:
        encoder(resume=path)
    assert error.value.code == ErrorCode.CORRUPTED
    rewrite(path, tensors, resigned(tampered))
    with pytest.raises(UFormError, match="sha256 does not list every tensor"):
        encoder(resume=path)


def test_integrity_a_changed_step_or_run_in_the_metadata_is_corrupted(tmp_path):
    _, path = saved_encoder(tmp_path)
    _, tensors = checkpoint.read_tensors(path, optimizer=True)
    raw = raw_metadata(path)
    for changed in ({"step": str(int(raw["step"]) + 2)}, {"run": raw["run"].replace('"JOINT"', '"jOINT"')}):
        rewrite(path, tensors, raw | changed)
        for load in (lambda: encoder(resume=path), lambda: uform.Encoder.load(path, executor="cpu")):
            with pytest.raises(UFormError, match="does not match its SHA-256") as error:
                load()
            assert error.value.code == ErrorCode.CORRUPTED


@pytest.mark.parametrize("writer", ["export_checkpoint", "export_checkpoint_binary"])
def test_integrity_flipped_bit_in_lm_checkpoint_is_corrupted(tmp_path, writer):
    trainer = lm()
    trainer.train_step(LM_IDS)
    path = tmp_path / "lm.ckpt"
    getattr(trainer, writer)(path)
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x01  # inside the last array (binary) or near the end of its base64 (JSON)
    path.write_bytes(bytes(data))
    reader = LanguageModelTrainer.from_checkpoint if writer == "export_checkpoint" else \
        LanguageModelTrainer.from_checkpoint_binary
    with pytest.raises(UFormError, match=str(path)) as caught:
        reader(path, executor="cpu")
    assert caught.value.code == ErrorCode.CORRUPTED and isinstance(caught.value, ValueError)


# ---- 3. values -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, field", [
    (dict(eps=0.0), "eps"),
    (dict(eps=1e-45), "eps"),
    (dict(lr=1e39), "lr"),
    (dict(lr=5.0), "lr"),
    (dict(lr=0.5, weight_decay=10.0), "weight_decay"),
    (dict(betas=(0.9, 1e39)), "betas"),
])
def test_values_lm_settings_that_write_nan_are_refused(settings, field):
    with pytest.raises(UFormError, match=field) as caught:
        lm(**settings)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("change, message", [
    (lambda s: s["v"].__setitem__(3, -1.0), r"v\[3\] \(tensor embedding\) is -1.0"),
    (lambda s: s["parameters"].__setitem__(-1, np.nan), r"parameters\[\d+\] \(tensor head\) is nan"),
    (lambda s: s["m"].__setitem__(0, np.inf), r"m\[0\] \(tensor embedding\) is inf"),
    (lambda s: s.update(step=2**40), "step must be an integer"),
    (lambda s: s.update(step=-3), "step must be an integer"),
])
def test_values_lm_loaded_states_are_checked_for_value(change, message):
    trainer = lm()
    trainer.train_step(LM_IDS)
    before = state_sha256(trainer.export_state())
    state = trainer.export_state()
    change(state)
    with pytest.raises(UFormError, match=message):
        trainer.load_state_dict(state)
    assert state_sha256(trainer.export_state()) == before and trainer.step_ == 1


@pytest.mark.parametrize("settings, field", [
    (dict(schedule=uform.Schedule(steps=10, learning_rate=1e39)), "schedule.learning_rate"),
    (dict(schedule=uform.Schedule(steps=10, learning_rate=3.0)), "schedule.learning_rate"),
    (dict(masking=uform.Masking(text_weight=1e30)), "masking.text_weight"),
    (dict(contrastive=uform.Contrastive(inverse_temperature=1e30)), "contrastive.inverse_temperature"),
    (dict(contrastive=uform.Contrastive(bias=-1e39)), "contrastive.bias"),
    (dict(contrastive=uform.Contrastive(ambient_repulsion_weight=1e20)), "contrastive.ambient_repulsion_weight"),
])
def test_values_encoder_settings_that_overflow_are_refused(settings, field):
    with pytest.raises(UFormError, match=field) as caught:
        encoder(**settings)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT


def test_values_encoder_checkpoint_with_nan_or_negative_moment_is_refused(tmp_path):
    _, path = saved_encoder(tmp_path)
    raw = raw_metadata(path)
    _, tensors = checkpoint.read_tensors(path, optimizer=True)
    for name, value in (("optimizer.v.embedding", -1.0), ("final_norm", np.nan)):
        broken = {key: tensor.copy() for key, tensor in tensors.items()}
        broken[name].reshape(-1)[0] = value
        digests = {key: checkpoint.tensor_sha256(tensor) for key, tensor in broken.items()}
        rewrite(path, broken, resigned(raw | {"sha256": json.dumps(digests)}))
        with pytest.raises(UFormError, match=name.split(".")[-1]) as caught:
            encoder(resume=path)
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT
    rewrite(path, tensors, resigned(raw | {"step": str(2**40)}))
    with pytest.raises(UFormError, match="step"):
        encoder(resume=path)


def test_values_gradient_check_sees_every_value_adamw_cannot_apply():
    model = lm()._open()
    assert LM_SHAPE.n_total % GUARD_COLUMNS  # a tail past the whole rows, checked too
    assert model.gradient_problem() is None
    for value, problem in ((np.nan, "not finite"), (-np.inf, "not finite"), (3e19, "too large to square")):
        for index in (0, LM_SHAPE.n_total // 2, LM_SHAPE.n_total - 1):
            gradient = np.random.default_rng(index).standard_normal(LM_SHAPE.n_total).astype(np.float32)
            gradient[index] = value
            model.gradients.write(gradient)
            assert problem in model.gradient_problem()


def test_values_non_finite_gradient_refuses_step_one(monkeypatch):
    # A NaN reaches the gradient check's sums: the host's check and, in a replayed step, the device's verdict see it.
    monkeypatch.setattr(ResidentState, "sum_gradient", lambda self: K.fill(self._guard_sums, float("nan")))
    trainer = lm()
    before = state_sha256(trainer.export_state())
    with pytest.raises(UFormError, match="a gradient value is not finite"):
        trainer.train_step(LM_IDS)
    assert trainer.step_ == 0 and state_sha256(trainer.export_state()) == before
    encoder_trainer = encoder()
    parameters = encoder_state(encoder_trainer)
    with pytest.raises(UFormError, match="a gradient value is not finite"):
        encoder_step(encoder_trainer)
    assert encoder_trainer.completed_steps == 0
    assert_same_parameters(encoder_trainer.parameters(), parameters)


# ---- 4. memory -----------------------------------------------------------------------------------------------


def test_memory_lm_logits_at_many_batch_sizes_keep_few_buffers():
    trainer = lm()
    trainer.train_step(LM_IDS)
    model = trainer._model
    ids = LM_IDS[:1, :LM_SHAPE.length]
    for batch in range(1, 13):
        trainer.logits(ids.repeat(batch, 0))
    assert len(model._batches.keys()) <= GEOMETRIES_KEPT and len(model.stack.token_counts()) <= GEOMETRIES_KEPT
    largest = model.device.allocated_bytes
    for batch in range(1, GEOMETRIES_KEPT + 1):
        trainer.logits(ids.repeat(batch, 0))
    assert model.device.allocated_bytes < largest  # the large geometries' buffers were freed


def test_memory_encoder_keeps_few_segment_geometries():
    trainer = encoder()
    for count in range(1, 5):
        trainer.encode([uform.Modality.TEXT] * count, TEXTS[:count])
        encoder_step(trainer)
    assert len(trainer.model._buffers.keys()) <= GEOMETRIES_KEPT
    assert len(trainer.model._pooling.keys()) <= GEOMETRIES_KEPT


def test_memory_failed_allocation_is_a_memory_error():
    with pytest.raises(MemoryError, match="cpu: cannot allocate"):
        uform.Device.cpu().empty(2**46)


def test_memory_crafted_checkpoint_is_refused_before_allocation(tmp_path):
    _, path = saved_encoder(tmp_path)
    raw = raw_metadata(path)
    tiny = {"embedding": np.zeros(1, np.float32)}
    rewrite(path, tiny, resigned(raw | {"sha256": json.dumps({"embedding": checkpoint.tensor_sha256(tiny["embedding"])})}))
    with pytest.raises(UFormError, match="cannot hold") as caught:
        encoder(resume=path)
    assert caught.value.code == ErrorCode.CORRUPTED


# ---- 5. errors -----------------------------------------------------------------------------------------------


def test_errors_resume_from_bad_files_names_them(tmp_path):
    with pytest.raises(UFormError, match=f"{tmp_path} is not a file"):
        encoder(resume=tmp_path)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": np.zeros(3, np.float32)}, str(foreign))
    with pytest.raises(UFormError, match="foreign.safetensors: not a uform.trainer/2 checkpoint") as caught:
        encoder(resume=foreign)
    assert caught.value.code == ErrorCode.CONFIG_MISMATCH
    save_file({"weight": np.zeros(3, np.float32)}, str(foreign), metadata={"format": checkpoint.FORMAT})
    with pytest.raises(UFormError, match=r"the metadata lacks \['step', 'seed', 'run', 'sha256', 'metadata_sha256'\]"):
        encoder(resume=foreign)
    save_file({"weight": np.zeros(3, np.float32)}, str(foreign), metadata=resigned({
        "format": checkpoint.FORMAT, "step": "1", "seed": "5", "run": "[]", "sha256": "{}"}))
    with pytest.raises(UFormError, match="the metadata's run is not a JSON object") as caught:
        encoder(resume=foreign)
    assert caught.value.code == ErrorCode.CORRUPTED
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UFormError, match="garbage.safetensors is not a safetensors file") as caught:
        encoder(resume=garbage)
    assert caught.value.code == ErrorCode.CORRUPTED


def test_errors_lone_surrogate_names_the_item():
    trainer = encoder()
    with pytest.raises(UFormError, match="contents: item 1 is not valid text: character 2 is a lone surrogate"):
        trainer.step([uform.Modality.TEXT] * 2, ["fine", "ab\ud800cd"])
    assert trainer.completed_steps == 0


def test_errors_saves_never_name_the_temporary_file(tmp_path):
    trainer = encoder()
    target = tmp_path / "missing" / "run.safetensors"
    with pytest.raises(UFormError, match=f"{target}: cannot write") as caught:
        trainer.save(target)
    assert ".tmp" not in str(caught.value) and isinstance(caught.value, OSError)
    with pytest.raises(UFormError, match="cannot write") as caught:
        lm().export_checkpoint_binary(tmp_path / "missing" / "lm.bin")
    assert ".tmp" not in str(caught.value)


def test_errors_lm_readers_name_the_file():
    with pytest.raises(UFormError, match="cannot read the checkpoint") as caught:
        LanguageModelTrainer.from_checkpoint_binary(os.getcwd(), executor="cpu")
    assert os.getcwd() in str(caught.value) and isinstance(caught.value, OSError)
    with pytest.raises(UFormError, match="data_schedule must be a dict") as caught:
        LanguageModelTrainer(np.zeros(LM_SHAPE.n_total, np.float32), data_schedule=None, shape=LM_SHAPE)
    assert isinstance(caught.value, ValueError)


def test_errors_engine_failure_is_device_lost_until_a_new_start(monkeypatch, tmp_path):
    trainer, path = saved_encoder(tmp_path)
    language_model = lm()

    def failing(*args, **kwargs):
        raise K.EngineError("cpu: kernel adamw failed: simulated")

    monkeypatch.setattr(K, "adamw", failing)
    for call in (lambda: encoder_step(trainer), lambda: language_model.train_step(LM_IDS)):
        with pytest.raises(UFormError, match="simulated") as caught:
            call()
        assert caught.value.code == ErrorCode.DEVICE_LOST and isinstance(caught.value, RuntimeError)
        with pytest.raises(UFormError) as caught:
            call()
        assert caught.value.code == ErrorCode.DEVICE_LOST
    monkeypatch.undo()
    encoder_step(encoder(resume=path))


def test_errors_an_error_that_is_not_the_engines_leaves_the_trainer_usable(tmp_path):
    trainer, _ = saved_encoder(tmp_path)

    def texts():
        yield "a small red panda"
        raise RuntimeError("the caller's own generator failed")

    with pytest.raises(RuntimeError, match="the caller's own generator failed"):
        trainer.step([uform.Modality.TEXT] * 2, texts())
    encoder_step(trainer)


def test_errors_bad_executor_names_are_refused():
    for spec in ("tpu", "gpu:x", 3):
        with pytest.raises(UFormError, match="cannot make an executor") as caught:
            LanguageModelTrainer(np.zeros(LM_SHAPE.n_total, np.float32), data_schedule={}, shape=LM_SHAPE,
                                 executor=spec)
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT and isinstance(caught.value, ValueError)


@pytest.mark.skipif(uform.gpu_count() > 0, reason="this machine has a GPU")
def test_errors_for_vram_without_a_gpu():
    with pytest.raises(UFormError, match="no usable GPU") as caught:
        uform.Executor.for_vram()
    assert caught.value.code == ErrorCode.UNSUPPORTED and isinstance(caught.value, RuntimeError)


def test_devices_names_read_as_executors():
    """The names --devices takes: cpu:N is the CPU as N devices, one name is executor_from's; a list that is not
    of GPUs, or a bad count, is INVALID_ARGUMENT naming the spec."""
    from uform.executor import devices_executor

    assert [d.name for d in devices_executor("cpu:3").devices] == ["cpu"] * 3
    assert [d.name for d in devices_executor(" CPU ").devices] == ["cpu"]
    for spec in ("gpu:0,cpu", "cpu:0", "gpu:x,gpu:1"):
        with pytest.raises(UFormError) as caught:
            devices_executor(spec)
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT


# ---- 6. half-applied steps ----------------------------------------------------------------------------------


def interrupt_first_launch(monkeypatch):
    """Ctrl-C arrives right after the step's first AdamW launch starts."""
    launch = K.adamw

    def interrupted(*args, **kwargs):
        monkeypatch.setattr(K, "adamw", launch)
        signal.raise_signal(signal.SIGINT)
        launch(*args, **kwargs)

    monkeypatch.setattr(K, "adamw", interrupted)


def test_half_applied_encoder_step_is_whole_under_ctrl_c(monkeypatch):
    interrupted, alone = encoder(), encoder()
    assert len(interrupted.model.decay_runs) > 1  # several launches, one step
    encoder_step(alone)
    interrupt_first_launch(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        encoder_step(interrupted)
    assert interrupted.completed_steps == 1
    assert_same_parameters(interrupted.parameters(), alone.parameters())


def test_half_applied_lm_step_is_whole_under_ctrl_c(monkeypatch):
    interrupted, alone = lm(), lm()
    alone.train_step(LM_IDS)
    interrupt_first_launch(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train_step(LM_IDS)
    assert interrupted.step_ == 1
    assert state_sha256(interrupted.export_state()) == state_sha256(alone.export_state())


# ---- 7. environment -----------------------------------------------------------------------------------------


def test_environment_child_processes_inherit_the_environment_unchanged():
    lm().train_step(LM_IDS)  # the runtime has been loaded and used
    child = subprocess.run([sys.executable, "-c", "import os, sys, json; print(json.dumps([sys.executable, "
                            "{k: os.environ.get(k) for k in ('PYTHONPATH', 'PYTHONEXECUTABLE', "
                            "'MOJO_PYTHON_LIBRARY')}]))"], capture_output=True, text=True, check=True)
    executable, variables = json.loads(child.stdout)
    assert executable == sys.executable
    assert variables == {name: os.environ.get(name) for name in variables}


# ---- 8. files -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_checkpoints_follow_the_umask(tmp_path, umask, mode):
    trainer = lm()
    previous = os.umask(umask)
    try:
        trainer.export_checkpoint(tmp_path / "lm.json")
        encoder().save(tmp_path / "run.safetensors")
    finally:
        os.umask(previous)
    for name in ("lm.json", "run.safetensors"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode


def test_files_save_stopped_by_progress_answers_false(tmp_path):
    trainer = encoder()
    path = tmp_path / "run.safetensors"
    assert trainer.save(path, progress=lambda done, total: done < 3) is False
    assert not path.exists() and not list(tmp_path.iterdir())
    calls = []
    assert trainer.save(path, progress=lambda done, total: calls.append((done, total))) is True
    assert path.exists() and calls[-1][0] == calls[-1][1] and len(calls) <= 10


def test_files_killed_saves_leave_no_temporary_file(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    stale = tmp_path / f".run.safetensors.{dead.stdout.strip()}.abc123.tmp"
    living = tmp_path / f".run.safetensors.{os.getppid()}.def456.tmp"  # a save under way in a living process
    other = tmp_path / f".other.safetensors.{dead.stdout.strip()}.ghi789.tmp"
    for path in (stale, living, other):
        path.write_bytes(b"partial")
    encoder().save(tmp_path / "run.safetensors")
    assert not stale.exists() and living.exists() and other.exists()


def test_files_a_save_through_a_symbolic_link_replaces_its_target(tmp_path):
    """Saving to a path that is a symbolic link writes the file it points to; the link stays a link."""
    target, link = tmp_path / "models" / "run.safetensors", tmp_path / "latest.safetensors"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link.symlink_to(target)
    trainer = encoder()
    trainer.save(link)
    assert link.is_symlink() and target.read_bytes() != b"old"
    assert uform.Encoder.load(link, "cpu").steps == trainer.completed_steps


def test_errors_a_save_path_or_stats_of_the_wrong_type_is_one_line():
    trainer = encoder()
    with pytest.raises(uform.UFormError, match="path: a str, bytes or os.PathLike, got int"):
        trainer.save(3)
    with pytest.raises(uform.UFormError, match="stats: a uform.TrainerStepStats or None, got dict"):
        trainer.step([uform.Modality.TEXT], ["a"], stats={})
    assert trainer.completed_steps == 0


# ---- 9. empty steps ------------------------------------------------------------------------------------------


def test_empty_steps_change_nothing():
    trainer = encoder()
    encoder_step(trainer)
    before = encoder_state(trainer)
    with pytest.raises(UFormError, match=r"no item to train on \(0 given, 0 dropped"):
        trainer.step([], [])
    long = ["x" * 40] * 3  # one bag of three rows in a batch of two rows: dropped whole
    with pytest.raises(UFormError, match=r"no item to train on \(3 given, 3 dropped"):
        trainer.step([uform.Modality.TEXT] * 3, long, bags=[0, 0, 0])
    assert trainer.completed_steps == 1
    assert_same_parameters(trainer.parameters(), before)
    with pytest.raises(UFormError, match="batch must be"):
        lm().train_step(LM_IDS[:0])
