"""CPU training steps per second, this engine against a baseline engine, in the same run: the byte LM
trainer's default shape and a small encoder (depth 2, hidden 128, 8 rows × 128 tokens, JOINT).

The baseline is another checkout with its CPU engine built (by default `.baseline/`, made with
`git worktree add --detach .baseline <commit>` and `python python/uform/_build.py --target cpu` there).
Each variant runs in its own subprocess with its own PYTHONPATH; the variants alternate over --rounds
rounds so that a busy machine slows both alike, and each figure is the median of its rounds' medians.
Figure: bench/RESULTS.md."""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from common import median_seconds, parser, write_results

ROOT = Path(__file__).resolve().parents[1]
ENCODER = dict(depth=2, hidden=128, rows=8, columns=128, segments=16)


def lm_step():
    """Twenty LM training steps on the default shape, each reading its loss back."""
    from uform.lm import LanguageModelConfig, LanguageModelTrainer

    shape = LanguageModelConfig()
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal(shape.n_total) * 0.02).astype(np.float32)
    batches = [rng.integers(0, 256, (shape.batch, shape.length + 1), dtype=np.int32) for _ in range(20)]
    trainer = LanguageModelTrainer(weights, data_schedule={}, shape=shape, executor="cpu", resident=True)
    return lambda: [trainer.train_step(ids)["loss"] for ids in batches], len(batches)


def encoder_step():
    """One JOINT encoder step on text pairs cut from the standard library."""
    import uform
    from bench_encoder import corpus_items

    g = ENCODER
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=g["depth"], hidden=g["hidden"], objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=g["rows"], max_segments_per_device=g["segments"],
                               max_columns_per_row=g["columns"]),
        schedule=uform.Schedule(steps=1000), seed=0)
    items = [item[:63] for item in corpus_items(g["segments"], seed=1)]  # two a row: 1008 of the 1024 positions
    relations = uform.Relations(attract=(np.arange(len(items) + 1), np.arange(len(items)) ^ 1))
    modalities = [uform.Modality.TEXT] * len(items)
    stats = uform.TrainerStepStats()
    return lambda: trainer.step(modalities, items, relations=relations, stats=stats), 1


def measure(repeats: int) -> dict:
    """Steps per second of each workload with the uform on this process's path (the subprocess side)."""
    import uform

    rates = {}
    for name, make in (("lm_default", lm_step), ("encoder_small", encoder_step)):
        run, steps = make()
        rates[name] = steps / median_seconds(run, lambda: None, warmup=2, repeats=repeats)
    return {"uform": uform.__file__, "steps_per_s": rates}


def run_variant(root: Path, repeats: int) -> dict:
    """Steps per second of each workload with the uform of checkout `root`, in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(root / "python"), UFORM_DEVICE="cpu")
    done = subprocess.run([sys.executable, __file__, "--measure", "--repeats", str(repeats)], env=env,
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    if not result["uform"].startswith(str(root / "python")):
        raise RuntimeError(f"measured {result['uform']}, not the uform of {root}")
    return result["steps_per_s"]


def main():
    options = parser(__doc__)
    options.add_argument("--baseline", default=str(ROOT / ".baseline"), help="checkout of the baseline engine")
    options.add_argument("--rounds", type=int, default=3, help="alternating rounds of both variants")
    options.add_argument("--repeats", type=int, default=7, help="timed runs per round, after warm-up")
    options.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = options.parse_args()
    if args.measure:
        print(json.dumps(measure(args.repeats)))
        return
    variants = {"baseline": Path(args.baseline).resolve(), "current": ROOT}
    rounds = 1 if args.quick else args.rounds
    rates = {variant: [] for variant in variants}
    for _ in range(rounds):
        for variant, root in variants.items():
            rates[variant].append(run_variant(root, 2 if args.quick else args.repeats))
    commits = {variant: subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip() for variant, root in variants.items()}
    rows = []
    for workload in rates["current"][0]:
        row = {"workload": workload}
        for variant in variants:
            row[f"{variant}_steps_per_s"] = round(statistics.median(r[workload] for r in rates[variant]), 2)
            row[f"{variant}_commit"] = commits[variant]
        row["speedup"] = round(row["current_steps_per_s"] / row["baseline_steps_per_s"], 2)
        rows.append(row)
    write_results(args.out, "cpu", rows)


if __name__ == "__main__":
    main()
