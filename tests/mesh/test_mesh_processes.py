"""Meshes of several processes joined through a temporary directory: gloo collectives, agreement, faults."""

import signal

import pytest

import uform
from items import train, trainer
from processes import answers, launch, next_line

pytest.importorskip("torch.distributed")


@pytest.mark.parametrize("count", [2, 4])
def test_processes_join_gather_and_make_a_trainer_of_several_devices(tmp_path, count):
    found = answers(launch(tmp_path, count, 30, "gather", devices=2), 60)
    assert all("gathered" in answer for answer in found), found
    assert [answer["gathered"] for answer in found] == [list(range(count))] * count
    assert [answer["said"] for answer in found] == ["from 1"] * count
    assert [answer["first_rank"] for answer in found] == [2 * index for index in range(count)]
    assert {answer["world_size"] for answer in found} == {2 * count}
    assert {answer["backend"] for answer in found} == {"gloo"}
    assert len({answer["attempt"] for answer in found}) == 1
    assert {answer["trainer"] for answer in found} == {"made"}


@pytest.fixture(scope="module")
def one_device_checkpoint(tmp_path_factory):
    """10 steps of the tiny trainer on one device over every item: the file every split must write."""
    path = tmp_path_factory.mktemp("alone") / "alone.safetensors"
    run = trainer(uform.Executor.for_ram())
    train(run, 0, 1, range(10))
    run.save(path)
    run.close()
    return path.read_bytes()


@pytest.mark.parametrize("count, devices", [(2, 1), (4, 1), (2, 2)])
def test_processes_train_to_the_checkpoint_of_one_device(tmp_path, one_device_checkpoint, count, devices):
    """Must-show 1 of the mesh: worlds of 2 and 4 devices across processes (each process stepping over its own
    share of the items) write the checkpoint one device writes over all of them, byte for byte."""
    checkpoint = tmp_path / "world.safetensors"
    found = answers(launch(tmp_path, count, 60, "train", devices=devices, checkpoint=str(checkpoint)), 240)
    assert all("loss" in answer for answer in found), found
    assert len({(answer["loss"], answer["masked"], answer["contrastive"]) for answer in found}) == 1
    assert checkpoint.read_bytes() == one_device_checkpoint


def test_a_step_refused_by_one_process_is_refused_by_all_and_changes_nothing(tmp_path, one_device_checkpoint):
    """Host domain 1's bad item (an image, in a run of text) at the fourth step: it raises its own error, host domain
    0 INVALID_ARGUMENT naming it, and the run goes on to the checkpoint of ten good steps."""
    checkpoint = tmp_path / "world.safetensors"
    found = answers(launch(tmp_path, 2, 60, "train", checkpoint=str(checkpoint), refuse_at=3), 240)
    assert all("loss" in answer for answer in found), found
    assert found[0]["refused"]["code"] == "INVALID_ARGUMENT"
    assert "host domain 1 refused its step's items" in found[0]["refused"]["message"]
    assert found[1]["refused"]["code"] == "INVALID_ARGUMENT" and "host domain" not in found[1]["refused"]["message"]
    assert checkpoint.read_bytes() == one_device_checkpoint


def survivor_of(tmp_path, timeout: float, fault: signal.Signals) -> dict:
    """The answer of host domain 0 of 2 whose peer gets `fault` while both wait in a collective."""
    survivor, victim = launch(tmp_path, 2, timeout, ["barrier", "hang"])
    try:
        assert next_line(survivor, 30) == {"ready": True} and next_line(victim, 30) == {"ready": True}
        victim.send_signal(fault)
        answer, = answers([survivor], 30)
    finally:
        victim.kill()
        victim.wait()
    return answer


def test_a_killed_peer_fails_the_others_collective_at_once(tmp_path):
    answer = survivor_of(tmp_path, 20, signal.SIGKILL)
    assert answer["code"] == "PEER_LOST", answer
    assert "barrier" not in answer and "all_gather failed on host domain 0 of 2" in answer["message"]
    assert answer["seconds"] < 20 and answer["returncode"] == 0


def test_a_silent_peer_fails_the_others_collective_at_the_timeout(tmp_path):
    answer = survivor_of(tmp_path, 3, signal.SIGSTOP)
    assert answer["code"] == "PEER_LOST" and "within 3 s" in answer["message"], answer
    assert 2.5 <= answer["seconds"] < 10 and answer["returncode"] == 0


@pytest.mark.parametrize("settings, codes, named", [
    (dict(seed=[1, 2], depth=[1, 2]), ["CONFIG_MISMATCH"] * 2,
     ["depth (host domain 0: 1, host domain 1: 2)", "seed (host domain 0: 1, host domain 1: 2)"]),
    (dict(seed=1, depth=[1, -1]), ["CONFIG_MISMATCH", "INVALID_ARGUMENT"], ["depth"]),
])
def test_trainers_agree_on_their_settings_across_processes(tmp_path, settings, codes, named):
    found = answers(launch(tmp_path, 2, 30, "trainer", **settings), 60)
    assert [answer.get("code") for answer in found] == codes, found
    assert all(name in answer["message"] for answer in found for name in named), found
    if codes[1] == "INVALID_ARGUMENT":
        assert "host domain 1 refused its own: INVALID_ARGUMENT" in found[0]["message"]
