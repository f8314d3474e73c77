"""The directory protocol, with each host domain a thread of this process (the rendezvous is files alone)."""

import json
import os
import threading
import time

import pytest

import uform
from uform.mesh.options import checked_options
from uform.mesh.rendezvous import declaration, rendezvous


def options(directory, index, count, timeout=10.0, job="job"):
    return checked_options(uform.MeshOptions(host_domain_index=index, host_domain_count=count, directory=directory,
                                             job=job, timeout_seconds=timeout))


def meet(directory, count, timeout=10.0, devices=None, counts=None):
    """Every host domain's rendezvous, run together: a Roster or the UFormError it raised, with the seconds."""
    results = [None] * count

    def run(index):
        started = time.monotonic()
        mine = options(directory, index, counts[index] if counts else count, timeout)
        try:
            answer = rendezvous(mine, declaration(mine, executor="cpu", devices=devices[index] if devices else 1,
                                                  gpu_class="NONE"))
        except uform.UFormError as error:
            answer = error
        results[index] = (answer, time.monotonic() - started)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 10)
    return results


def test_every_host_domain_is_admitted_to_one_attempt(tmp_path):
    results = meet(tmp_path, 4)
    rosters = [roster for roster, _ in results]
    assert len({roster.attempt for roster in rosters}) == 1
    assert [member["host_domain_index"] for member in rosters[0].members] == [0, 1, 2, 3]
    job = tmp_path / "job"
    assert json.loads((job / "open.json").read_text())["attempt"] == rosters[0].attempt
    processes = [member["process"] for member in rosters[0].members]
    assert sorted(os.listdir(job / rosters[0].attempt)) == sorted(
        [f"host-{i}-{process}.json" for i, process in enumerate(processes)] + ["roster.json"])


def test_a_peer_that_never_arrives_times_out_on_every_host_domain_that_did(tmp_path):
    for error, seconds in meet(tmp_path, 2, timeout=1.0, counts=[3, 3]):
        assert isinstance(error, uform.UFormError) and error.code == uform.ErrorCode.PEER_LOST
        assert "host domains [2] of 3 never arrived in job 'job' within 1 s" in error.message
        assert 1.0 <= seconds < 5


def test_two_processes_claiming_host_domain_0_are_refused(tmp_path):
    first = options(tmp_path, 0, 2, timeout=1.0)
    results = []
    thread = threading.Thread(target=lambda: results.append(pytest.raises(uform.UFormError, rendezvous, first,
                                                                          declaration(first, executor="cpu", devices=1,
                                                                                      gpu_class="NONE"))))
    thread.start()
    while not list((tmp_path / "job").glob("*/host-0-*.json")):  # the first has opened its attempt and declared
        time.sleep(0.01)
    with pytest.raises(uform.UFormError, match="never arrived"):
        rendezvous(first, declaration(first, executor="cpu", devices=1, gpu_class="NONE"))
    thread.join()
    assert results[0].value.code == uform.ErrorCode.CONFIG_MISMATCH
    assert "two processes claim host_domain_index 0" in results[0].value.message


def test_a_missing_host_domain_0_times_out_on_the_others(tmp_path):
    started = time.monotonic()
    with pytest.raises(uform.UFormError, match="host domain 0 never opened job 'job'") as error:
        rendezvous(options(tmp_path, 1, 2, timeout=1.0), declaration(options(tmp_path, 1, 2), executor="cpu",
                                                                     devices=1, gpu_class="NONE"))
    assert error.value.code == uform.ErrorCode.PEER_LOST and time.monotonic() - started < 5


def test_a_stale_attempt_is_never_joined_and_is_cleaned(tmp_path):
    old = meet(tmp_path, 2)[0][0]
    alone = options(tmp_path, 1, 2, timeout=1.0)
    with pytest.raises(uform.UFormError, match=f"joined attempt {old.attempt} .* never admitted it") as error:
        rendezvous(alone, declaration(alone, executor="cpu", devices=1, gpu_class="NONE"))
    assert error.value.code == uform.ErrorCode.PEER_LOST
    new = meet(tmp_path, 2)
    assert new[0][0].attempt == new[1][0].attempt != old.attempt
    assert not (tmp_path / "job" / old.attempt).exists(), list((tmp_path / "job" / old.attempt).iterdir())


def test_mismatched_declarations_are_refused_on_every_host_domain(tmp_path):
    results = meet(tmp_path, 2, devices=[1, 2])
    for error, seconds in results:
        assert isinstance(error, uform.UFormError) and error.code == uform.ErrorCode.CONFIG_MISMATCH
        assert "devices (host domain 0: 1, host domain 1: 2)" in error.message
        assert seconds < 5


def test_a_mismatched_world_size_is_refused_before_the_timeout(tmp_path):
    results = meet(tmp_path, 2, counts=[3, 2], timeout=30.0)
    for error, seconds in results:
        assert isinstance(error, uform.UFormError) and error.code == uform.ErrorCode.CONFIG_MISMATCH
        assert "host_domain_count (host domain 0: 3, host domain 1: 2)" in error.message
        assert seconds < 5


def test_host_domain_0_claimed_by_processes_started_together_names_the_claim(tmp_path):
    """The common launch mistake, every process left at index 0: each that loses the job to another raises
    CONFIG_MISMATCH at once; the one open.json names goes on and times out waiting for host domain 1."""
    results = []

    def claim():
        mine = options(tmp_path, 0, 2, timeout=2.0)
        try:
            results.append(rendezvous(mine, declaration(mine, executor="cpu", devices=1, gpu_class="NONE")))
        except uform.UFormError as error:
            results.append(error)

    threads = [threading.Thread(target=claim) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    codes = sorted(error.code.name for error in results)
    assert codes.count("CONFIG_MISMATCH") >= 2 and set(codes) <= {"CONFIG_MISMATCH", "PEER_LOST"}
    assert all("two processes claim host_domain_index 0" in error.message for error in results
               if error.code == uform.ErrorCode.CONFIG_MISMATCH)


def test_two_processes_claiming_one_host_domain_are_refused_naming_both(tmp_path):
    """A leftover of an older launch, or a mistaken index: two processes declare host domain 1 of 2."""
    results = [None] * 3

    def run(slot, index):
        mine = options(tmp_path, index, 2, timeout=10.0)
        try:
            results[slot] = rendezvous(mine, declaration(mine, executor="cpu", devices=1, gpu_class="NONE"))
        except uform.UFormError as error:
            results[slot] = error

    threads = [threading.Thread(target=run, args=(1, 1)), threading.Thread(target=run, args=(2, 1))]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # both joiners wait before host domain 0 opens the job
    run(0, 0)
    for thread in threads:
        thread.join(20)
    for error in results:
        assert isinstance(error, uform.UFormError) and error.code == uform.ErrorCode.CONFIG_MISMATCH, error
        assert "host domain 1 is claimed by pid" in error.message


def test_a_host_domain_past_the_count_is_refused(tmp_path):
    results = meet(tmp_path, 3, counts=[2, 2, 3], timeout=10.0)
    for error, seconds in results:
        assert isinstance(error, uform.UFormError) and error.code == uform.ErrorCode.CONFIG_MISMATCH, error
        assert seconds < 5


def test_a_link_left_in_the_job_directory_is_cleaned(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "job" / "old-attempt").symlink_to(tmp_path / "elsewhere")
    rosters = meet(tmp_path, 2)
    assert all(not isinstance(roster, uform.UFormError) for roster, _ in rosters)
    assert not (tmp_path / "job" / "old-attempt").exists() and (tmp_path / "elsewhere").is_dir()
