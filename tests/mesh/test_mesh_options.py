"""MeshOptions at its one door, executors of several devices, and a process alone."""

import os

import pytest

import uform
from uform.mesh.options import DEFAULT_TIMEOUT_SECONDS, checked_options


def test_zero_fields_derive():
    options = checked_options(uform.MeshOptions())
    assert (options.host_domain_index, options.host_domain_count) == (0, 1)
    assert options.timeout_seconds == DEFAULT_TIMEOUT_SECONDS == 300
    assert options.directory == b"" and options.job == ""


def test_the_directory_crosses_as_bytes(tmp_path):
    options = checked_options(uform.MeshOptions(host_domain_index=1, host_domain_count=2, directory=tmp_path,
                                                job="run-17", timeout_seconds=2.5))
    assert options.directory == os.fsencode(tmp_path) and options.timeout_seconds == 2.5


@pytest.mark.parametrize("fields, named", [
    (dict(host_domain_index=2, host_domain_count=2), "MeshOptions.host_domain_index: 2 is not below"),
    (dict(host_domain_index=-1), "MeshOptions.host_domain_index: must be a non-negative integer"),
    (dict(host_domain_count=1.5), "MeshOptions.host_domain_count: must be a non-negative integer"),
    (dict(host_domain_count=True), "MeshOptions.host_domain_count: must be a non-negative integer"),
    (dict(timeout_seconds=-1), "MeshOptions.timeout_seconds"),
    (dict(timeout_seconds=float("inf")), "MeshOptions.timeout_seconds"),
    (dict(timeout_seconds=1e12), "MeshOptions.timeout_seconds: 1000000000000.0 passes the longest wait"),
    (dict(host_domain_count=10**9), "MeshOptions.host_domain_count: 1000000000 passes the 65536"),
    (dict(directory=3), "MeshOptions.directory: must be a path"),
    (dict(job=b"run"), "MeshOptions.job: must be a str"),
    (dict(job="../escape"), "MeshOptions.job: '../escape' is not a job name"),
    (dict(job=".hidden"), "MeshOptions.job: '.hidden' is not a job name"),
    (dict(host_domain_count=2, job="run"), "MeshOptions.directory: a mesh of 2 host domains"),
    (dict(host_domain_count=2, directory="{tmp}"), "MeshOptions.job: a mesh of 2 host domains needs a job name"),
    (dict(host_domain_count=2, directory="{tmp}/absent", job="run"), "MeshOptions.directory: .*absent is not a dir"),
])
def test_bad_fields_are_named(tmp_path, fields, named):
    fields = {name: value.format(tmp=tmp_path) if isinstance(value, str) else value for name, value in fields.items()}
    with pytest.raises(uform.UFormError, match=named) as error:
        uform.Mesh.bootstrap(uform.Executor.for_ram(), uform.MeshOptions(**fields))
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT


def test_bootstrap_takes_an_executor_and_options():
    with pytest.raises(uform.UFormError, match="executor: expected uform.Executor"):
        uform.Mesh.bootstrap("cpu", uform.MeshOptions())
    with pytest.raises(uform.UFormError, match="options: expected uform.MeshOptions"):
        uform.Mesh.bootstrap(uform.Executor.for_ram(), {"host_domain_count": 1})


def test_executor_for_ram_takes_a_device_count():
    assert len(uform.Executor.for_ram(device_count=3).devices) == 3
    for bad in (0, -2, 1.0, True):
        with pytest.raises(uform.UFormError, match="device_count"):
            uform.Executor.for_ram(device_count=bad)


@pytest.mark.parametrize("devices", [1, 4])
def test_a_process_alone_writes_nothing(tmp_path, devices):
    mesh = uform.Mesh.bootstrap(uform.Executor.for_ram(device_count=devices),
                                uform.MeshOptions(directory=tmp_path, job="alone"))
    description = mesh.describe()
    assert isinstance(description, uform.MeshDescription)
    assert (description.host_domain_count, description.devices_per_host_domain, description.world_size) == \
        (1, devices, devices)
    assert (description.backend, description.job, description.first_rank) == ("none", "", 0)
    assert description.multimem_tier == uform.MultimemTier.NONE and description.gpu_class == uform.GPUClass.NONE
    assert list(tmp_path.iterdir()) == []
    assert mesh.collectives.all_gather_bytes(b"abc") == [b"abc"]
    assert mesh.collectives.broadcast_bytes(b"xyz") == b"xyz"
    mesh.close()
    with pytest.raises(uform.UFormError, match="closed") as error:
        mesh.collectives.barrier()
    assert error.value.code == uform.ErrorCode.PEER_LOST


def test_a_directory_that_is_not_utf8_is_refused_before_any_file(tmp_path):
    directory = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(directory)
    with pytest.raises(uform.UFormError, match=r"MeshOptions.directory: .*caf\\xe9 is not UTF-8") as refused:
        checked_options(uform.MeshOptions(host_domain_index=0, host_domain_count=2, directory=directory, job="j"))
    assert refused.value.code == uform.ErrorCode.INVALID_ARGUMENT and os.listdir(directory) == []


@pytest.mark.parametrize("environ, place, job", [
    ({}, (0, 1), ""),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "abc"}, (3, 8), "torchrun-abc"),
    ({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}, (0, 2), ""),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_JOB_ID": "4242"}, (5, 6), "slurm-4242"),
    ({"RANK": "1", "WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"},
     (1, 4), "slurm-7"),
])
def test_options_from_a_launchers_environment(environ, place, job):
    options = uform.MeshOptions.from_environment(environ=environ)
    assert (options.host_domain_index, options.host_domain_count, options.job) == (*place, job)


def test_options_from_the_environment_keep_what_is_passed(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    options = checked_options(uform.MeshOptions.from_environment(tmp_path, job="mine", timeout_seconds=5))
    assert (options.host_domain_index, options.host_domain_count, options.job) == (1, 2, "mine")
    assert options.directory == os.fsencode(tmp_path) and options.timeout_seconds == 5


@pytest.mark.parametrize("environ, named", [
    ({"RANK": "1"}, "RANK is set without WORLD_SIZE"),
    ({"SLURM_NTASKS": "2"}, "SLURM_NTASKS is set without SLURM_PROCID"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not a non-negative integer"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is not a non-negative integer"),
])
def test_a_malformed_launcher_environment_is_named(environ, named):
    with pytest.raises(uform.UFormError, match=named) as error:
        uform.MeshOptions.from_environment(environ=environ)
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT


def test_a_rank_past_the_count_is_refused_at_the_door():
    with pytest.raises(uform.UFormError, match="host_domain_index: 4 is not below host_domain_count 4"):
        checked_options(uform.MeshOptions.from_environment(environ={"RANK": "4", "WORLD_SIZE": "4"}))


@pytest.mark.parametrize("environ, index", [
    ({}, 0), ({"LOCAL_RANK": "3", "SLURM_LOCALID": "1"}, 3), ({"SLURM_LOCALID": "2"}, 2)])
def test_the_local_index_from_the_environment(environ, index):
    assert uform.MeshOptions.local_index_from_environment(environ) == index
