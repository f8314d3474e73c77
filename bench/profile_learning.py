"""How a run learns, beside its held-out recall: the learning profiled, not the kernels.

The train program's job (its flags, its defaults but fewer steps; `python -m uform train`'s trainer,
`uform.__main__.job_trainer`) stepped blocking, and every --every steps:

- the gradient's share of its squared norm by part of the model: the media input maps
  (`image.*`, `audio.*`, `video.*`: patch and position embeddings), the token embedding (bytes,
  modality and mask rows), the transformer blocks, the final norm and heads, the temperature;
- its global norm after any clipping, and the patch embedding's weight scale (RMS);
- the learned temperature, exp(log_scale) and bias;
- the spread of the held-out embeddings: the mean cosine between different queries and between
  different documents (1: collapsed to one vector), and held-out recall@1.

Each --warmup-steps value given is one run (0: the derived warmup). Rows: bench/RESULTS.md.

    python bench/profile_learning.py --data shapes --steps 1000 --warmup-steps 0,25,400
    python bench/profile_learning.py --quick        # CPU: shapes, depth 2, hidden 128, 32 pairs, 300 steps
"""

from __future__ import annotations

import argparse

import numpy as np

import uform
from common import parser, write_results
from uform.__main__ import (gradient_clip_norm, held_out_documents, job_trainer, load_job, objective, split,
                            step_items, step_pairs, train_parser)
from uform.pairs import retrieval_metrics
from uform.runs import device_executor

PARTS = ("media inputs", "token embedding", "blocks", "final norm and heads", "temperature")


def part_of(name: str) -> str:
    """The part of the model a tensor belongs to, one of PARTS."""
    if name.split(".")[0] in ("image", "video", "audio"):
        return "media inputs"
    if name == "embedding":
        return "token embedding"
    if name.startswith("layers."):
        return "blocks"
    if name.startswith("temperature."):
        return "temperature"
    return "final norm and heads"


def gradient_profile(model) -> dict:
    """Each part's share of the gradient's squared norm, the norm, and the patch embedding's RMS."""
    squares = dict.fromkeys(PARTS, 0.0)
    for name, gradient in model.weight_grads.items():
        squares[part_of(name)] += float(np.sum(gradient.numpy().astype(np.float64) ** 2))
    total = sum(squares.values())
    profile = {f"gradient share, {part}": round(value / total, 4) for part, value in squares.items() if value}
    profile["gradient norm"] = round(total ** 0.5, 4)
    for name in ("image.patch_embedding", "audio.patch_embedding"):
        if name in model.weights:
            profile[f"{name} rms"] = round(float(np.sqrt(np.mean(model.weights[name].numpy() ** 2))), 5)
    return profile


def spread(embeddings: np.ndarray) -> float:
    """The mean cosine between different rows of unit-norm `embeddings`."""
    n = len(embeddings)
    cosines = embeddings @ embeddings.T
    return float((cosines.sum() - np.trace(cosines)) / (n * (n - 1)))


def profile_run(args, warmup: int) -> dict:
    args.warmup_steps = warmup
    job = load_job(args)
    args.objective, args.gradient_clip_norm = objective(args, job), gradient_clip_norm(args, job)
    training, held_out = split(job, args)
    trainer = job_trainer(args, job, device_executor(args))
    documents, truth = held_out_documents(held_out)
    curve, stats = {}, uform.TrainerStepStats()
    for step in range(1, args.steps + 1):
        modalities, contents, relations, groups = step_items(job, step_pairs(training, args.seed, step,
                                                                            args.pairs_per_step))
        trainer.step(modalities, contents, relations=relations, temperature_groups=groups, stats=stats)
        if step % args.every == 0 or step == args.steps:
            point = {"loss": round(stats.loss, 4), **gradient_profile(trainer.model)}
            temperature = trainer.parameters()
            point["temperature scale"] = round(float(np.exp(temperature["temperature.log_scale"][0])), 3)
            point["temperature bias"] = round(float(temperature["temperature.bias"][0]), 3)
            queries = trainer.encode([job.query_modality] * len(held_out), [p.query for p in held_out])
            texts = trainer.encode([uform.Modality.TEXT] * len(documents), documents)
            point["query spread"], point["document spread"] = round(spread(queries), 4), round(spread(texts), 4)
            point["recall@1"] = round(retrieval_metrics(queries, texts, truth=truth)["recall_at_1"], 4)
            curve[step] = point
            print(f"warmup {warmup or 'derived'}, step {step}: {point}", flush=True)
    trainer.close()
    return {"data": args.data, "warmup_steps": warmup or "derived", "steps": args.steps, "depth": args.depth,
            "hidden": args.hidden, "pairs_per_step": args.pairs_per_step, "curve": curve}


def main():
    options: argparse.ArgumentParser = parser(__doc__)
    options.add_argument("--every", type=int, default=100, help="steps between profiles")
    options.add_argument("--warmup-steps", default="0", help="comma-separated warmups, one run each (0: derived)")
    known, rest = options.parse_known_args()
    quick = ["--data", "shapes", "--depth", "2", "--hidden", "128", "--pairs-per-step", "32", "--steps", "300",
             "--held-out", "200"] if known.quick else []
    args = train_parser().parse_args(quick + rest)  # flags given after --quick override its sizes
    args.every = known.every
    rows = [profile_run(args, int(warmup)) for warmup in known.warmup_steps.split(",")]
    write_results(known.out, f"learning_{args.data}", rows)


if __name__ == "__main__":
    main()
