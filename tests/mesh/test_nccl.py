"""The NCCL backend: the unique id's exchange, the refusals, and the waiting logic over a fake NCCL on any
machine; on GPUs (skipped without them, as in CI), a process alone, two processes gathering in rank order, and
a killed peer."""

import ctypes
import os
import signal
import threading
import time

import numpy as np
import pytest

import uform
from uform.engine import ENGINE_VARIANT, gpu_count
from uform.mesh import nccl
from uform.mesh.options import checked_options
from uform.mesh.rendezvous import declaration, rendezvous

from items import train, trainer
from processes import answers, launch, next_line


def nccl_gpus() -> int:
    """GPUs an NCCL mesh can use here: none without a GPU engine or without NCCL."""
    if ENGINE_VARIANT == "cpu" or gpu_count() == 0:
        return 0
    try:
        nccl.require(1, "gpu:0")
    except uform.UFormError:
        return 0
    return gpu_count()


GPUS = nccl_gpus()
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a GPU engine and NCCL")
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs and NCCL")


def test_the_unique_id_crosses_the_attempt_directory(tmp_path):
    drawn, read = bytes(range(128)), []
    reader = threading.Thread(target=lambda: read.append(
        nccl.shared_unique_id(bytes(tmp_path), 1, time.monotonic() + 10, 10)))
    reader.start()  # host domain 1 waits for the file host domain 0 writes
    time.sleep(0.2)
    assert nccl.shared_unique_id(bytes(tmp_path), 0, time.monotonic() + 10, 10, draw=lambda: drawn) == drawn
    reader.join(15)
    assert read == [drawn] and (tmp_path / "nccl-id").read_bytes() == drawn


def test_a_unique_id_never_written_times_out(tmp_path):
    started = time.monotonic()
    with pytest.raises(uform.UFormError) as caught:
        nccl.shared_unique_id(bytes(tmp_path), 1, started + 0.3, 0.3)
    assert caught.value.code == uform.ErrorCode.PEER_LOST
    assert "host domain 0 never wrote NCCL's unique id" in caught.value.message
    assert "within 0.3 s" in caught.value.message
    assert time.monotonic() - started < 3


def test_a_unique_id_file_of_another_length_is_corrupted(tmp_path):
    (tmp_path / "nccl-id").write_bytes(b"short")
    with pytest.raises(uform.UFormError) as caught:
        nccl.shared_unique_id(bytes(tmp_path), 1, time.monotonic() + 5, 5)
    assert caught.value.code == uform.ErrorCode.CORRUPTED and "holds 5 bytes" in caught.value.message


def test_a_gpu_process_and_a_cpu_process_are_refused_in_one_mesh(tmp_path):
    """Host domain 0 declares a GPU (as a GPU process would), host domain 1 the CPU: both are refused at once."""
    kinds = [("gpu", "HOPPER"), ("cpu", "NONE")]
    results = [None, None]

    def run(index):
        mine = checked_options(uform.MeshOptions(host_domain_index=index, host_domain_count=2, directory=tmp_path,
                                                 job="mixed", timeout_seconds=20))
        started = time.monotonic()
        try:
            rendezvous(mine, declaration(mine, executor=kinds[index][0], devices=1, gpu_class=kinds[index][1]))
        except uform.UFormError as error:
            results[index] = (error, time.monotonic() - started)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for error, seconds in results:
        assert error.code == uform.ErrorCode.CONFIG_MISMATCH, error
        assert "executor (host domain 0: 'gpu', host domain 1: 'cpu')" in error.message
        assert "gpu_class (host domain 0: 'HOPPER', host domain 1: 'NONE')" in error.message
        assert seconds < 5


def test_a_gpu_process_of_several_gpus_is_refused():
    with pytest.raises(uform.UFormError) as caught:
        nccl.require(2, "gpu:0, gpu:1")
    assert caught.value.code == uform.ErrorCode.UNSUPPORTED
    assert "this executor has 2 (gpu:0, gpu:1)" in caught.value.message


def test_a_missing_nccl_is_unsupported_naming_the_wheel(monkeypatch):
    def missing(name, **_):
        raise OSError(f"{name}: the loader's search path and 0 nvidia wheel copies")

    monkeypatch.setattr(nccl, "nvidia_wheel_library", missing)
    nccl._libraries.cache_clear()
    try:
        with pytest.raises(uform.UFormError) as caught:
            nccl.require(1, "gpu:0")
    finally:
        nccl._libraries.cache_clear()
    assert caught.value.code == uform.ErrorCode.UNSUPPORTED
    assert "libnccl.so.2" in caught.value.message and "pip install nvidia-nccl-cu13" in caught.value.message
    assert os.environ.get("NCCL_NVLS_ENABLE") is not None  # set before NCCL could initialise


@one_gpu
def test_a_gpu_process_alone_makes_a_communicator_of_one():
    executor = uform.Executor.for_vram(devices=[0])
    mesh = uform.Mesh.bootstrap(executor, uform.MeshOptions(timeout_seconds=30))
    description = mesh.describe()
    assert (description.backend, description.world_size, description.attempt) == ("nccl", 1, "")
    collectives = mesh.collectives
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    assert np.array_equal(collectives.all_gather(matrix), matrix[None])
    assert collectives.all_gather(np.array([2**40 + 3], np.int64)).tolist() == [[2**40 + 3]]
    assert collectives.all_gather_bytes(b"alone") == [b"alone"]
    assert collectives.all_gather_bytes(b"") == [b""]
    assert collectives.broadcast_bytes(b"root", 0) == b"root"
    device = executor.devices[0]
    send, recv = device.put(matrix), device.empty((1, 3, 4))
    collectives.all_gather_device(send, recv)
    assert np.array_equal(recv.numpy()[0], matrix)
    with pytest.raises(uform.UFormError) as refused:
        collectives.all_gather_device(send, device.empty(5))
    assert refused.value.code == uform.ErrorCode.INVALID_ARGUMENT
    collectives.barrier()
    mesh.close()
    with pytest.raises(uform.UFormError) as closed:
        collectives.barrier()
    assert closed.value.code == uform.ErrorCode.PEER_LOST


@two_gpus
def test_two_gpu_processes_gather_in_rank_order(tmp_path):
    found = answers(launch(tmp_path, 2, 60, "gather", gpu=[0, 1]), 120)
    assert all("gathered" in answer for answer in found), found
    assert [answer["gathered"] for answer in found] == [[0, 1]] * 2
    assert [answer["said"] for answer in found] == ["from 1"] * 2
    assert [answer["device_gathered"] for answer in found] == [[[0.5] * 3, [1.5] * 3]] * 2
    assert {answer["backend"] for answer in found} == {"nccl"} and {answer["world_size"] for answer in found} == {2}
    assert [answer["first_rank"] for answer in found] == [0, 1]
    assert {answer["trainer"] for answer in found} == {"made"}


@two_gpus
def test_a_killed_gpu_peer_fails_the_survivor_within_the_timeout(tmp_path):
    survivor, victim = launch(tmp_path, 2, 5, ["barrier", "hang"], gpu=[0, 1])
    try:
        assert next_line(survivor, 120) == {"ready": True} and next_line(victim, 120) == {"ready": True}
        victim.send_signal(signal.SIGKILL)
        answer, = answers([survivor], 60)
    finally:
        victim.kill()
        victim.wait()
    assert answer["code"] == "PEER_LOST", answer
    assert "all_gather failed on host domain 0 of 2" in answer["message"]
    assert answer["seconds"] < 5 + 10 and answer["returncode"] == 0


class FakeNccl:
    """NCCL and the CUDA driver for one rank over host memory (the CPU device's buffers), for the waiting logic:
    `async_state` is what ncclCommGetAsyncError answers once the communicator is made, `stream_ready` whether the
    stream ever finishes; every call is recorded."""

    def __init__(self, async_state=0, stream_ready=True, connects=True):
        self.async_state, self.stream_ready, self.connects = async_state, stream_ready, connects
        self.calls = []
        self.nccl, self.cuda = self, self

    def __getattr__(self, name):  # the driver calls the waiting logic does not look at: successful, recorded
        if not name.startswith("cu"):  # but for making the context current and back
            raise AttributeError(name)
        return lambda *arguments: 0 if name.startswith("cuCtx") else self.calls.append(name) or 0

    def ncclCommInitRankConfig(self, comm, size, unique, rank, config):
        comm._obj.value = 1
        return nccl.NCCL_IN_PROGRESS

    def ncclCommGetAsyncError(self, comm, state):
        if not self.connects:
            state._obj.value = nccl.NCCL_IN_PROGRESS
        else:  # connected; a gather then meets `async_state`
            state._obj.value = self.async_state if "ncclAllGather" in self.calls else nccl.NCCL_SUCCESS
        return 0

    def ncclAllGather(self, send, recv, count, dtype, comm, stream):
        self.calls.append("ncclAllGather")
        ctypes.memmove(recv, send, count)
        return nccl.NCCL_IN_PROGRESS

    def ncclBroadcast(self, send, recv, count, dtype, root, comm, stream):
        self.calls.append("ncclBroadcast")
        return 0

    def cuStreamQuery(self, stream):
        return nccl.CUDA_SUCCESS if self.stream_ready else nccl.CUDA_ERROR_NOT_READY

    def ncclCommFinalize(self, comm):
        self.calls.append("ncclCommFinalize")
        return nccl.NCCL_IN_PROGRESS

    def ncclCommDestroy(self, comm):
        self.calls.append("ncclCommDestroy")
        return 0

    def ncclCommAbort(self, comm):
        self.calls.append("ncclCommAbort")
        return 0

    def nccl_error(self, result, comm=None):
        return {6: "remote process exited or there was a network error"}.get(result, f"result {result}")

    def cuda_check(self, what, result):
        pass


def fake_communicator(monkeypatch, fake: FakeNccl, timeout: float = 0.3):
    monkeypatch.setattr(nccl, "_libraries", lambda: fake)
    return nccl.Nccl(uform.Device.cpu(), bytes(128), 0, 1, timeout, time.monotonic() + timeout)


def test_the_waiting_logic_gathers_and_closes_a_healthy_communicator(monkeypatch):
    fake = FakeNccl()
    collectives = fake_communicator(monkeypatch, fake)
    matrix = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert np.array_equal(collectives.all_gather(matrix), matrix[None])
    device = uform.Device.cpu()
    send, recv = device.put(np.array([1.5, 2.5], np.float32)), device.empty((1, 2))
    collectives.all_gather_device(send, recv)
    assert recv.numpy().tolist() == [[1.5, 2.5]]
    collectives.close()
    assert fake.calls[-4:] == ["ncclCommFinalize", "ncclCommDestroy", "cuStreamDestroy_v2",
                               "cuDevicePrimaryCtxRelease_v2"] and "ncclCommAbort" not in fake.calls


def test_a_collective_that_never_finishes_is_aborted_at_the_timeout(monkeypatch):
    fake = FakeNccl(stream_ready=False)
    collectives = fake_communicator(monkeypatch, fake)
    started = time.monotonic()
    with pytest.raises(uform.UFormError) as caught:
        collectives.all_gather(np.zeros(4, np.float32))
    assert caught.value.code == uform.ErrorCode.PEER_LOST
    assert "did not finish within 0.3 s; the communicator was aborted" in caught.value.message
    assert 0.3 <= time.monotonic() - started < 3
    assert fake.calls.count("ncclCommAbort") == 1 and "ncclCommFinalize" not in fake.calls
    assert fake.calls[-2:] == ["cuStreamDestroy_v2", "cuDevicePrimaryCtxRelease_v2"]  # the broken mesh closed
    with pytest.raises(uform.UFormError) as again:
        collectives.barrier()
    assert again.value.code == uform.ErrorCode.PEER_LOST and "broke in an earlier collective" in again.value.message


def test_a_peer_that_nccl_sees_fail_breaks_the_mesh_at_once(monkeypatch):
    fake = FakeNccl(async_state=6)  # ncclRemoteError
    collectives = fake_communicator(monkeypatch, fake, timeout=30)
    started = time.monotonic()
    with pytest.raises(uform.UFormError) as caught:
        collectives.all_gather(np.zeros(4, np.float32))
    assert caught.value.code == uform.ErrorCode.PEER_LOST and "remote process exited" in caught.value.message
    assert time.monotonic() - started < 3 and fake.calls.count("ncclCommAbort") == 1


def test_a_communicator_that_never_connects_is_aborted_at_the_timeout(monkeypatch):
    fake = FakeNccl(connects=False)
    with pytest.raises(uform.UFormError) as caught:
        fake_communicator(monkeypatch, fake)
    assert caught.value.code == uform.ErrorCode.PEER_LOST
    assert "NCCL could not connect host domain 0 of 1 within 0.3 s" in caught.value.message
    assert fake.calls[-3:] == ["ncclCommAbort", "cuStreamDestroy_v2", "cuDevicePrimaryCtxRelease_v2"]


def checkpoint_of(executor, mesh, path) -> bytes:
    """10 steps of the tiny trainer over every item of the tests' world, saved: the file's bytes."""
    run = trainer(executor, mesh)
    train(run, 0, 1, range(10))
    run.save(path)
    run.close()
    return path.read_bytes()


@one_gpu
def test_a_gpu_world_of_one_trains_to_the_bits_of_no_mesh_and_of_the_cpu(tmp_path):
    """Must-show 2 of the mesh: the NCCL path with a world of one (its exchanges and the gradient's gather run
    through a communicator of one rank) writes the checkpoint no mesh writes, which is the CPU's."""
    gpu = uform.Executor.for_vram(devices=[0])
    mesh = uform.Mesh.bootstrap(gpu, uform.MeshOptions())
    assert mesh.describe().backend == "nccl"
    through_nccl = checkpoint_of(gpu, mesh, tmp_path / "nccl.safetensors")
    mesh.close()
    assert through_nccl == checkpoint_of(gpu, None, tmp_path / "alone.safetensors")
    assert through_nccl == checkpoint_of(uform.Executor.for_ram(), None, tmp_path / "cpu.safetensors")


@two_gpus
def test_two_gpu_processes_train_to_the_checkpoint_of_one_device(tmp_path):
    """Must-show 1 of the multi-GPU run: 10 JOINT steps on two GPUs over NCCL, each process stepping its share of
    the items, write the checkpoint one device writes over all of them (the CPU's, which is one GPU's)."""
    checkpoint = tmp_path / "world.safetensors"
    found = answers(launch(tmp_path, 2, 120, "train", gpu=[0, 1], checkpoint=str(checkpoint)), 300)
    assert all("loss" in answer for answer in found), found
    assert checkpoint.read_bytes() == checkpoint_of(uform.Executor.for_ram(), None, tmp_path / "cpu.safetensors")

