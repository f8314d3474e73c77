"""``python -m uform train``: train a small JOINT text encoder on pairs and measure retrieval.

    python -m uform train                               # pairs mined from this Python's standard library
    python -m uform train --pairs my-pairs.jsonl --steps 2000 --device gpu:0

With no ``--pairs``, the data are docstring-summary → signature pairs parsed from the standard
library's sources (``uform.pairs.stdlib``), which every Python install has. A pairs file is JSONL,
one ``{"query": ..., "document": ..., "weight"?: ..., "group"?: ...}`` per line (``uform.pairs.jsonl``).
Each step draws pairs, packs both sides as items, attracts each query to its document (every
other pair repels at the ambient weight) and corrupts the bytes for the masked objective. At the
end it saves a safetensors checkpoint and reports recall@1 on held-out pairs, beside the same
recall of a bag-of-bytes baseline (hashed byte bigrams).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

import uform
from uform.executor import default_executor, executor_from
from uform.pairs import bag_of_bytes_embeddings, mine_standard_library_pairs, read_pairs, recall_at_1, split_pairs


def step_items(pairs) -> tuple[list[str], uform.Relations, list[int], list[float]]:
    """Queries then documents as items, each attracting its partner with the pair's weight."""
    n = len(pairs)
    contents = [p.query for p in pairs] + [p.document for p in pairs]
    partners = list(range(n, 2 * n)) + list(range(n))
    weights = [p.weight for p in pairs] * 2
    groups = [p.group for p in pairs] * 2
    return contents, uform.Relations(attract=(np.arange(2 * n + 1), partners, weights)), groups, weights


def embed(trainer: uform.Trainer, texts: list[str], chunk: int) -> np.ndarray:
    """Unit-norm embeddings of texts, a batch's worth at a time (texts that do not fit stay zero rows)."""
    parts = []
    for start in range(0, len(texts), chunk):
        part = texts[start:start + chunk]
        parts.append(trainer.evaluate([uform.Modality.TEXT] * len(part), part)["embeddings"])
    return np.concatenate(parts)


def train(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m uform train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=Path, help="a JSONL pairs file (default: standard-library pairs)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs-per-step", type=int, default=32)
    parser.add_argument("--held-out", type=int, default=500, help="pairs kept out of training for recall@1")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--columns", type=int, default=128, help="positions per packed row")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="cpu or gpu:N (default: the first GPU, else the CPU)")
    parser.add_argument("--checkpoint", type=Path, default=Path("uform-text.safetensors"))
    args = parser.parse_args(argv)

    pairs = read_pairs(args.pairs) if args.pairs else mine_standard_library_pairs(seed=args.seed)
    held_out_fraction = min(args.held_out, len(pairs) // 2) / len(pairs)
    training, held_out = split_pairs(pairs, held_out_fraction, seed=args.seed)
    groups = max(p.group for p in pairs) + 1
    executor = executor_from(args.device) if args.device else default_executor()
    items = 2 * args.pairs_per_step
    trainer = uform.Trainer.init_vram(
        executor, depth=args.depth, hidden=args.hidden, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=args.pairs_per_step, max_segments_per_device=items,
                               max_columns_per_row=args.columns),
        contrastive=uform.Contrastive(temperature_groups=groups),
        schedule=uform.Schedule(steps=args.steps, learning_rate=args.learning_rate), seed=args.seed)
    print(f"{len(training)} training pairs, {len(held_out)} held out; depth {args.depth}, hidden {args.hidden}, "
          f"on {executor}")
    rng = np.random.Generator(np.random.Philox(key=args.seed))
    stats = uform.TrainerStepStats()
    progress = tqdm(range(args.steps), unit="step", file=sys.stdout)
    for _ in progress:
        chosen = [training[i] for i in rng.choice(len(training), args.pairs_per_step, replace=False)]
        contents, relations, item_groups, _ = step_items(chosen)
        trainer.step([uform.Modality.TEXT] * len(contents), contents, relations=relations,
                     temperature_groups=item_groups, stats=stats)
        progress.set_postfix(loss=f"{stats.loss:.3f}", masked=f"{stats.masked_text_loss:.3f}",
                             contrastive=f"{stats.contrastive_loss:.3f}")
    trainer.save(args.checkpoint)
    print(f"saved {args.checkpoint}")
    queries = [p.query for p in held_out]
    documents = [p.document for p in held_out]
    ours = recall_at_1(embed(trainer, queries, items), embed(trainer, documents, items))
    baseline = recall_at_1(bag_of_bytes_embeddings(queries), bag_of_bytes_embeddings(documents))
    print(f"held-out recall@1 over {len(held_out)} pairs: uform {ours:.3f} · bag-of-bytes baseline {baseline:.3f}")


COMMANDS = {"train": train}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and not argv[0].startswith("-") else "train"
    if command not in COMMANDS:
        raise SystemExit(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    COMMANDS[command](argv[1:] if argv and argv[0] == command else argv)


if __name__ == "__main__":
    main()
