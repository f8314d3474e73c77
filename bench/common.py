"""Shared timing helpers for the benchmark scripts: medians of repeated, synchronised runs."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path


def median_seconds(run, synchronize, *, warmup: int = 2, repeats: int = 7, clock=time.perf_counter) -> float:
    """Median time of run() over `repeats`, each closed by synchronize(), after `warmup` runs: wall time, or by
    another `clock` (time.process_time: the CPU time of every thread of this process, none of a worker's)."""
    for _ in range(warmup):
        run()
    synchronize()
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        synchronize()
        times.append(clock() - start)
    return statistics.median(times)


def sustained_seconds(run, synchronize, *, seconds: float = 1.5, batch: int = 10) -> float:
    """Wall time a call of run() over back-to-back calls for at least `seconds` (synchronised every `batch` calls), after
    a second of the same: the rate a training loop sees once the board's power limit holds its clock, where a
    median of single calls (median_seconds) starts each call from an idle device."""
    for limit in (1.0, seconds):
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < limit:
            for _ in range(batch):
                run()
            synchronize()
            calls += batch
    return (time.perf_counter() - start) / calls


def parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes (--out, --quick), for a script to add its own to."""
    options = argparse.ArgumentParser(description=description)
    options.add_argument("--out", default="bench/out", help="folder for the JSON results")
    options.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    return options


def arguments(description: str, *, numerics: bool = False,
              flags: tuple[tuple[str, str], ...] = ()) -> argparse.Namespace:
    """The bench options: --out, --quick, with `numerics` --numerics (the run's numeric mode), and the script's own
    on/off flags as (name, help)."""
    options = parser(description)
    for name, text in flags:
        options.add_argument(name, action="store_true", help=text)
    if numerics:
        options.add_argument("--numerics", choices=("identical", "fast"), default="identical",
                             help="uform's numeric mode; fast measures PyTorch under bf16 autocast")
    return options.parse_args()


def machine() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        gpu = []
    return f"{platform.node()} · {platform.processor() or platform.machine()} · GPU: {', '.join(gpu) or 'none'}"


def write_results(out: str, name: str, rows: list[dict]) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    record = {"benchmark": name, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "rows": rows}
    (Path(out) / f"{name}.json").write_text(json.dumps(record, indent=2))
    for row in rows:
        print(name, json.dumps(row))
