"""Fast mode against identical mode over a training run: the encoder bench's model (depth 12, hidden 768,
64 rows × 1024 tokens, JOINT), the same seed and the same items step by step (fresh slices of the standard
library's sources each step), the loss of every step in each mode, in the same call. Figure: bench/RESULTS.md."""

import json
import time
from pathlib import Path

import numpy as np

import uform
from bench_encoder import GEOMETRY, QUICK, corpus_items
from common import arguments, write_results


def losses(numerics: str, g: dict, steps: int) -> tuple[list[float], float]:
    """Each step's total loss of a run in `numerics`, and its seconds."""
    executor = uform.Executor.for_vram([0]) if uform.gpu_count() else uform.Executor.for_ram()
    trainer = uform.Trainer.init_vram(
        executor, depth=g["depth"], hidden=g["hidden"], objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=g["rows"], max_segments_per_device=g["segments"],
                               max_columns_per_row=g["columns"]),
        schedule=uform.Schedule(steps=steps), seed=0, numerics=numerics)
    stats = uform.TrainerStepStats()
    curve = []
    start = time.perf_counter()
    for step in range(steps):
        items = corpus_items(g["segments"], seed=1 + step)
        trainer.step([uform.Modality.TEXT] * len(items), items, stats=stats,
                     relations=uform.Relations(attract=(np.arange(len(items) + 1), np.arange(len(items)) ^ 1)))
        curve.append(float(stats.loss))
    return curve, time.perf_counter() - start


def main():
    args = arguments(__doc__)
    g = QUICK if args.quick or not uform.gpu_count() else GEOMETRY
    steps = 20 if args.quick else 300
    curves = {mode: losses(mode, g, steps) for mode in ("fast", "identical")}
    (Path(args.out) / "convergence_curves.json").parent.mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "convergence_curves.json").write_text(json.dumps({m: c for m, (c, _) in curves.items()}))
    fast, identical = (np.array(curves[m][0]) for m in ("fast", "identical"))
    windows = [(a, min(a + 25, steps)) for a in range(0, steps, max(steps // 6, 1))]
    rows = [{"steps": f"{a + 1}-{b}", "fast_mean_loss": round(float(fast[a:b].mean()), 4),
             "identical_mean_loss": round(float(identical[a:b].mean()), 4),
             "relative_difference": round(float(fast[a:b].mean() / identical[a:b].mean() - 1), 4)}
            for a, b in windows]
    tail = slice(max(steps - 25, 0), steps)
    rows.append({"geometry": g, "steps": steps, "final_25_fast": round(float(fast[tail].mean()), 4),
                 "final_25_identical": round(float(identical[tail].mean()), 4),
                 "final_relative_difference": round(float(fast[tail].mean() / identical[tail].mean() - 1), 4),
                 "fast_seconds": round(curves["fast"][1], 1), "identical_seconds": round(curves["identical"][1], 1)})
    write_results(args.out, "convergence", rows)


if __name__ == "__main__":
    main()
