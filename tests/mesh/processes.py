"""Running a test mesh's processes: each a `mesh_worker.py` subprocess, answering JSON lines."""

import json
import os
import select
import subprocess
import sys
import time

WORKER = os.path.join(os.path.dirname(__file__), "mesh_worker.py")


def launch(directory, count: int, timeout: float, actions, **settings) -> list[subprocess.Popen]:
    """`count` workers joining one job in `directory`; `actions` is one action for all or one per process;
    `settings` (seed, depth, devices) likewise one value or a list of one per process."""
    processes = []
    for index in range(count):
        spec = {"index": index, "count": count, "directory": str(directory), "timeout": timeout,
                "action": actions if isinstance(actions, str) else actions[index]}
        spec |= {name: value[index] if isinstance(value, list) else value for name, value in settings.items()}
        processes.append(subprocess.Popen([sys.executable, WORKER, json.dumps(spec)], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    return processes


def next_line(process: subprocess.Popen, timeout: float) -> dict:
    """The worker's next JSON line, waiting at most `timeout` seconds; lines a library prints to stdout (NCCL's
    version, with NCCL_DEBUG set) are passed over."""
    deadline = time.monotonic() + timeout
    while True:
        readable, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert readable, f"worker {process.args[-1]} said nothing within {timeout} s"
        line = process.stdout.readline()
        assert line, f"worker {process.args[-1]} ended without answering: {process.stderr.read()[-2000:]}"
        if line.startswith("{"):
            return json.loads(line)


def answers(processes, timeout: float) -> list[dict]:
    """Every worker's last line with its exit status ("returncode"), each within `timeout` seconds; the workers
    are ended either way."""
    try:
        found = []
        for process in processes:
            output, errors = process.communicate(timeout=timeout)
            lines = [line for line in output.strip().splitlines() if line.startswith("{")]
            assert lines, f"worker {process.args[-1]} ended without answering: {errors[-2000:]}"
            found.append(json.loads(lines[-1]) | {"returncode": process.returncode})
        return found
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
