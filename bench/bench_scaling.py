"""Weak scaling of the encoder's training step across devices: bench_encoder's geometry per device (depth 12,
hidden 768, 64 rows × 1024 positions, JOINT; --quick or no GPU: a tiny one on CPU devices), one process per
GPU joined as a mesh (NCCL; gloo for CPU processes), every process stepping its own items, so each device's
batch stays the same as the world grows. For 1, 2, 4, … processes up to the GPUs present (--max-devices caps
it): the median step time of host domain 0 and the efficiency t(1) / t(n). A world of one runs through a mesh
too, so every figure pays the same exchanges (of items, pooled states, losses and the gradient). Figure:
bench/RESULTS.md."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import uform
from bench_encoder import GEOMETRY, QUICK, corpus_items
from common import parser, write_results


def worker(index: int, count: int, directory: str, quick: bool, repeats: int) -> dict:
    """Host domain `index` of `count`: joins the mesh, trains, answers its step times."""
    gpu = uform.gpu_count() > 0
    g = QUICK if quick or not gpu else GEOMETRY
    executor = uform.Executor.for_vram([index]) if gpu else uform.Executor.for_ram()
    mesh = uform.Mesh.bootstrap(executor, uform.MeshOptions(host_domain_index=index, host_domain_count=count,
                                                            directory=directory, job=f"scaling-{count}",
                                                            timeout_seconds=600))
    trainer = uform.Trainer.init_vram(
        executor, mesh=mesh, depth=g["depth"], hidden=g["hidden"], objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=g["rows"], max_segments_per_device=g["segments"],
                               max_columns_per_row=g["columns"]),
        schedule=uform.Schedule(steps=1000), seed=0)
    items = corpus_items(g["segments"], seed=1 + index)
    relations = uform.Relations(attract=(np.arange(len(items) + 1), np.arange(len(items)) ^ 1))
    modalities = [uform.Modality.TEXT] * len(items)
    times = []
    for _ in range(1 + repeats):  # the first step makes the buffers
        start = time.perf_counter()
        trainer.step(modalities, items, relations=relations)  # ends with the loss read: the device is idle
        times.append(time.perf_counter() - start)
    return {"index": index, "seconds": times[1:], "backend": mesh.describe().backend}


def world(count: int, quick: bool, repeats: int) -> dict:
    """One world of `count` processes; answers host domain 0's median step time."""
    with tempfile.TemporaryDirectory() as directory:
        processes = [subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(
            {"index": index, "count": count, "directory": directory, "quick": quick, "repeats": repeats})],
            stdout=subprocess.PIPE, text=True, env=os.environ | {"NCCL_NVLS_ENABLE": "0"}) for index in range(count)]
        answers = [json.loads(process.communicate()[0].strip().splitlines()[-1]) for process in processes]
    first = answers[0]
    return {"devices": count, "backend": first["backend"],
            "seconds_per_step": round(float(np.median(first["seconds"])), 4),
            "every_step": [round(s, 4) for s in first["seconds"]]}


def main():
    options = parser(__doc__)
    options.add_argument("--max-devices", type=int, default=0, help="largest world measured (0: every GPU)")
    options.add_argument("--repeats", type=int, default=5, help="timed steps per world")
    options.add_argument("--worker", help=argparse.SUPPRESS)  # one process of a world: its settings, JSON
    args = options.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(worker(spec["index"], spec["count"], spec["directory"], spec["quick"], spec["repeats"])))
        return
    available = uform.gpu_count() or 2
    limit = min(available, args.max_devices or available)
    rows, count = [], 1
    while count <= limit:
        rows.append(world(count, args.quick, args.repeats))
        count *= 2
    for row in rows:
        row["efficiency"] = round(rows[0]["seconds_per_step"] / row["seconds_per_step"], 3)
    write_results(args.out, "scaling", rows)


if __name__ == "__main__":
    main()
