"""Training steps replayed from plans (uform.lm.model, Device.record): the same bits as the steps launched
from Python, step after step, around evaluations, checkpoints and refused steps."""

import threading
import time

import numpy as np
import pytest

import uform
from uform import kernels as K
from uform.lm import LanguageModelConfig, LanguageModelTrainer, state_sha256

MULTI = LanguageModelConfig(batch=3, length=12, width=64, heads=8, kv_heads=2, mlp=96, layers=3, vocab_size=256)


def run(shape, plans, monkeypatch, steps=12):
    """Losses, gradients and states of `steps` steps with evaluations and logits of other geometries between
    them (enough to drop the step's stack buffers from the stack's cache) and a state reload half way."""
    monkeypatch.setenv("UFORM_STEP_PLANS", plans)
    rng = np.random.default_rng(3)
    weights = (rng.standard_normal(shape.n_total) * 0.05).astype(np.float32)
    data = [rng.integers(0, shape.vocab_size, (shape.batch, shape.length + 1), dtype=np.int32) for _ in range(steps)]
    trainer = LanguageModelTrainer(weights, data_schedule={}, shape=shape, executor="cpu", resident=True)
    seen = []
    for i, ids in enumerate(data):
        result = trainer.train_step(ids)
        seen.append((result["loss"], trainer.export_gradients()["flat_gradients"].tobytes()))
        if i == 3:
            for length in range(1, 6):
                seen.append(trainer.logits(ids[:, :length]).tobytes())
            seen.append(trainer.evaluate(ids))
        if i == 6:
            state = trainer.export_state()
            seen.append(state_sha256(state))
            trainer.load_state_dict(state)
    seen.append(state_sha256(trainer.export_state()))
    return seen


@pytest.mark.parametrize("shape", [LanguageModelConfig(), MULTI], ids=["default", "multi"])
def test_planned_steps_are_the_launched_steps(shape, monkeypatch):
    launched = run(shape, "off", monkeypatch)
    assert run(shape, "loop", monkeypatch) == launched
    assert run(shape, "graph", monkeypatch) == launched  # on the CPU, the loop too


def test_a_refused_step_changes_nothing_with_plans(monkeypatch):
    monkeypatch.setenv("UFORM_STEP_PLANS", "loop")
    shape = LanguageModelConfig()
    rng = np.random.default_rng(4)
    trainer = LanguageModelTrainer((rng.standard_normal(shape.n_total) * 0.05).astype(np.float32),
                                   data_schedule={}, executor="cpu", resident=True)
    ids = rng.integers(0, 256, (shape.batch, shape.length + 1), dtype=np.int32)
    trainer.train_step(ids)
    state = trainer.export_state()
    state["parameters"][-shape.width * shape.vocab_size:] = 3e38  # every logit overflows float32
    trainer.load_state_dict(state)
    before = state_sha256(trainer.export_state())
    with pytest.raises(RuntimeError, match="rolled back"):
        trainer.train_step(ids)
    assert trainer.step_ == 1 and state_sha256(trainer.export_state()) == before


def test_a_plan_replays_its_launches_on_what_the_buffers_hold():
    device = uform.Device.cpu()
    a, b, y = device.put(np.arange(8, dtype=np.float32)), device.put(np.ones(8, np.float32)), device.empty(8)
    y.write(np.zeros(8, np.float32))
    plan = device.record(lambda: K.add(y, a, b))
    assert not y.numpy().any()  # recorded, not run
    a.write(np.full(8, 5, np.float32))
    plan.run()
    assert np.array_equal(y.numpy(), np.full(8, 6, np.float32))


def test_copies_are_refused_while_recording_and_the_recording_is_dropped():
    device = uform.Device.cpu()
    x = device.empty(4)
    with pytest.raises(Exception, match="upload while a plan is being recorded"):
        device.record(lambda: x.write(np.zeros(4, np.float32)))
    with pytest.raises(Exception, match="download while a plan is being recorded"):
        device.record(x.numpy)
    plan = device.record(lambda: K.fill(x, 2.0))  # no recording was left open
    plan.run()
    assert np.array_equal(x.numpy(), np.full(4, 2, np.float32))


def test_adamw_reads_the_step_scalars_of_a_buffer_with_the_same_bits():
    device = uform.Device.cpu()
    rng = np.random.default_rng(6)
    start = [rng.standard_normal(37).astype(np.float32) for _ in range(4)]
    start[3] = np.abs(start[3])
    hyper = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    results = []
    for planned in (False, True):
        params, grads, m, v = (device.put(array) for array in start)
        scalars = device.empty(3)
        for step, lr in ((1, 1e-3), (2, 3e-4), (7, 2e-2)):
            if planned:
                scalars.write(K.adamw_step_scalars(step=step, lr=lr, betas=hyper["betas"],
                                                   weight_decay=hyper["weight_decay"]))
            # planned: the scalars of step 1 and lr 0.5 are ignored for the buffer's
            K.adamw(params, grads, m, v, step=1 if planned else step, lr=0.5 if planned else lr,
                    step_scalars=scalars if planned else None, **hyper)
        results.append([buffer.numpy().tobytes() for buffer in (params, m, v)])
    assert results[0] == results[1]


@pytest.mark.parametrize("where", ["losses", "sums"])
def test_the_device_verdict_is_the_host_verdict(where):
    """step_verdict refuses exactly the values the host refuses (the losses' mean not finite; a check sum not finite
    or past LARGEST_SQUARABLE), so a replayed update skips itself exactly on the steps the trainer refuses."""
    device = uform.Device.cpu()
    limit = np.float32(K.LARGEST_SQUARABLE)
    edge = [np.nextafter(limit, np.float32(0)), limit, np.nextafter(limit, np.float32(np.inf))]
    values = [np.float32(v) for v in (1.0, -2.5, np.inf, -np.inf, np.nan, 3e38, -3e38, 0.0)] + edge + [-v for v in edge]
    verdict = device.empty(1)
    for value in values:
        losses = np.ones(5, np.float32)
        sums = np.ones(9, np.float32)
        (losses if where == "losses" else sums)[3] = value
        K.step_verdict(verdict, device.put(losses), device.put(sums))
        host_ok = np.isfinite(np.sum(losses, dtype=np.float64)) and np.all(np.isfinite(sums)) and \
            float(np.max(np.abs(sums))) <= K.LARGEST_SQUARABLE
        assert verdict.numpy()[0] == (1.0 if host_ok else 0.0), value
    assert K.LARGEST_SQUARABLE == float(np.sqrt(np.finfo(np.float32).max))


def test_launches_from_another_thread_wait_for_a_recording():
    device = uform.Device.cpu()
    x, y = device.empty(4), device.empty(4)
    y.write(np.zeros(4, np.float32))
    recording, launched = threading.Event(), []

    def other_thread():
        recording.wait()
        K.fill(y, 3.0)  # waits for the recording to end, then runs: it is not recorded into the plan
        launched.append(y.numpy())

    def launches():
        K.fill(x, 1.0)
        recording.set()
        time.sleep(0.2)
        K.fill(x, 2.0)

    thread = threading.Thread(target=other_thread)
    thread.start()
    plan = device.record(launches)
    thread.join()
    assert np.array_equal(launched[0], np.full(4, 3, np.float32))
    plan.run()
    assert np.array_equal(x.numpy(), np.full(4, 2, np.float32))


def test_an_unknown_step_plan_mode_is_refused_and_changes_nothing(monkeypatch):
    """UFORM_STEP_PLANS naming no mode: the step is refused with a UFormError that names the variable, the trainer
    stays at step 0 with its parameters, and trains once the variable names a mode."""
    shape = LanguageModelConfig()
    rng = np.random.default_rng(5)
    trainer = LanguageModelTrainer((rng.standard_normal(shape.n_total) * 0.05).astype(np.float32),
                                   data_schedule={}, executor="cpu", resident=True)
    ids = rng.integers(0, 256, (shape.batch, shape.length + 1), dtype=np.int32)
    before = state_sha256(trainer.export_state())
    monkeypatch.setenv("UFORM_STEP_PLANS", "bogus")
    with pytest.raises(uform.UFormError, match="UFORM_STEP_PLANS must be one of"):
        trainer.train_step(ids)
    assert trainer.step_ == 0 and state_sha256(trainer.export_state()) == before
    monkeypatch.setenv("UFORM_STEP_PLANS", "loop")
    assert trainer.train_step(ids)["step"] == 1
