"""``python -m uform train``: train a small JOINT encoder on pairs and measure retrieval.

    python -m uform train                               # pairs mined from this Python's standard library
    python -m uform train --pairs my-pairs.jsonl --steps 2000 --device gpu:0
    python -m uform train --data shapes                 # image → caption: coloured shapes drawn with pillow
    python -m uform train --data sounds                 # audio → caption: tones, chords, sweeps, noise

With no ``--pairs``, ``--data`` picks the pairs: ``stdlib`` (the default) mines docstring-summary →
signature pairs from the standard library's sources (``uform.pairs.stdlib``), which every Python
install has; ``shapes`` renders captioned shapes (``uform.media.shapes``: a PNG image → its caption);
``sounds`` synthesises captioned sounds (``uform.media.sounds``: a WAV recording → its caption). A
pairs file is JSONL, one ``{"query": ..., "document": ..., "weight"?: ..., "group"?: ...}`` per line
(``uform.pairs.jsonl``). Each step draws pairs, packs both sides as items, attracts each query to its
document (every other pair repels at the ambient weight) and masks bytes, patches or frames for the
masked objective. At the end it saves a safetensors checkpoint and reports recall@1 of held-out
queries against their documents, embedded uncorrupted (``Trainer.encode``), beside a baseline: for
text, the same recall of a bag-of-bytes embedding (hashed byte bigrams); for media, chance (1/n).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

import uform
from uform.executor import default_executor, executor_from
from uform.pairs import bag_of_bytes_embeddings, mine_standard_library_pairs, read_pairs, recall_at_1, split_pairs


@dataclass(frozen=True)
class Job:
    """What a run trains on: pairs whose queries are of one modality and documents are text, and the
    media geometry the batch needs."""

    pairs: list
    query_modality: uform.Modality
    image: uform.ImageShape | None = None
    audio: uform.AudioShape | None = None


@dataclass(frozen=True)
class MediaPair:
    """A media query (file bytes) and its caption, weighted and grouped as a text :class:`Pair` is."""

    query: bytes
    document: str
    weight: float = 1.0
    group: int = 0


def media_pairs(pairs) -> list[MediaPair]:
    """(media bytes, caption) pairs as :class:`Pair`-like records (the bytes in ``query``)."""
    return [MediaPair(query=media, document=caption) for media, caption in pairs]


def load_job(args) -> Job:
    if args.pairs:
        return Job(read_pairs(args.pairs), uform.Modality.TEXT)
    if args.data == "shapes":
        from uform.media.shapes import all_scenes, shape_pairs

        pairs = shape_pairs(args.examples or len(all_scenes()), seed=args.seed)
        return Job(media_pairs(pairs), uform.Modality.IMAGE, image=uform.ImageShape(patch_side=8))
    if args.data == "sounds":
        from uform.media.sounds import CAPTION_COUNT, sound_pairs

        pairs = sound_pairs(args.examples or CAPTION_COUNT, seed=args.seed, sample_rate=SOUND_RATE)
        return Job(media_pairs((pair.audio, pair.caption) for pair in pairs), uform.Modality.AUDIO,
                   audio=uform.AudioShape(chunk_samples=SOUND_CHUNK, sample_rate=SOUND_RATE))
    pairs = mine_standard_library_pairs(seed=args.seed)
    return Job(pairs[:args.examples] if args.examples else pairs, uform.Modality.TEXT)


SOUND_RATE = 8000  # the sounds reach 3.5 kHz, under this rate's Nyquist frequency
SOUND_CHUNK = 400  # 50 ms frames: the longest sound (three long bursts) fits a row of 160


def step_items(job: Job, pairs) -> tuple[list, list, uform.Relations, list[int]]:
    """Queries then documents as items, each attracting its partner with the pair's weight."""
    n = len(pairs)
    modalities = [job.query_modality] * n + [uform.Modality.TEXT] * n
    contents = [p.query for p in pairs] + [p.document for p in pairs]
    partners = list(range(n, 2 * n)) + list(range(n))
    weights = [p.weight for p in pairs] * 2
    groups = [p.group for p in pairs] * 2
    return modalities, contents, uform.Relations(attract=(np.arange(2 * n + 1), partners, weights)), groups


def train(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m uform train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=Path, help="a JSONL pairs file (default: the pairs --data names)")
    parser.add_argument("--data", choices=("stdlib", "shapes", "sounds"), default="stdlib",
                        help="built-in pairs: text from the standard library, image or audio captions "
                             "(default: %(default)s)")
    parser.add_argument("--examples", type=int, default=0,
                        help="use the first N pairs of the built-in data (default: all of them)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs-per-step", type=int, default=32)
    parser.add_argument("--held-out", type=int, default=500, help="pairs kept out of training for recall@1")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--columns", type=int, default=0,
                        help="positions per packed row (default: 128, or 160 for sounds)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="cpu or gpu:N (default: the first GPU, else the CPU)")
    parser.add_argument("--checkpoint", type=Path, default=Path("uform-text.safetensors"))
    args = parser.parse_args(argv)

    job = load_job(args)
    pairs = job.pairs
    columns = args.columns or (160 if job.audio else 128)
    held_out_fraction = min(args.held_out, len(pairs) // 2) / len(pairs)
    training, held_out = split_pairs(pairs, held_out_fraction, seed=args.seed)
    groups = max(p.group for p in pairs) + 1
    executor = executor_from(args.device) if args.device else default_executor()
    items = 2 * args.pairs_per_step
    trainer = uform.Trainer.init_vram(
        executor, depth=args.depth, hidden=args.hidden, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=args.pairs_per_step, max_segments_per_device=items,
                               max_columns_per_row=columns, image=job.image, audio=job.audio),
        contrastive=uform.Contrastive(temperature_groups=groups),
        schedule=uform.Schedule(steps=args.steps, learning_rate=args.learning_rate), seed=args.seed)
    print(f"{len(training)} training pairs, {len(held_out)} held out; depth {args.depth}, hidden {args.hidden}, "
          f"on {executor}")
    rng = np.random.Generator(np.random.Philox(key=args.seed))
    stats = uform.TrainerStepStats()
    progress = tqdm(range(args.steps), unit="step", file=sys.stdout)
    for _ in progress:
        chosen = [training[i] for i in rng.choice(len(training), args.pairs_per_step, replace=False)]
        modalities, contents, relations, item_groups = step_items(job, chosen)
        trainer.step(modalities, contents, relations=relations, temperature_groups=item_groups, stats=stats)
        media_loss = stats.masked_image_loss + stats.masked_audio_loss
        progress.set_postfix(loss=f"{stats.loss:.3f}", masked=f"{stats.masked_text_loss:.3f}",
                             contrastive=f"{stats.contrastive_loss:.3f}",
                             **({"reconstruction": f"{media_loss:.3f}"} if media_loss else {}))
    trainer.save(args.checkpoint)
    print(f"saved {args.checkpoint}")
    queries = [p.query for p in held_out]
    documents = [p.document for p in held_out]
    ours = recall_at_1(trainer.encode([job.query_modality] * len(queries), queries),
                       trainer.encode([uform.Modality.TEXT] * len(documents), documents))
    if job.query_modality == uform.Modality.TEXT:
        baseline = recall_at_1(bag_of_bytes_embeddings(queries), bag_of_bytes_embeddings(documents))
        versus = f"bag-of-bytes baseline {baseline:.3f}"
    else:
        versus = f"chance {1 / len(held_out):.4f}"
    print(f"held-out {job.query_modality.name.lower()}→text recall@1 over {len(held_out)} pairs: uform {ours:.3f} · "
          f"{versus}")


COMMANDS = {"train": train}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and not argv[0].startswith("-") else "train"
    if command not in COMMANDS:
        raise SystemExit(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    COMMANDS[command](argv[1:] if argv and argv[0] == command else argv)


if __name__ == "__main__":
    main()
