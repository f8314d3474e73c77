"""``python -m uform``: train an encoder on pairs into a run directory, and embed with a trained one.

    python -m uform train                               # pairs mined from this Python's standard library
    python -m uform train --pairs my-pairs.jsonl --steps 2000 --device gpu:0
    python -m uform train --config run.toml             # the same settings, named as the flags
    python -m uform train --resume runs/train-20261129-170000
    python -m uform embed runs/train-20261129-170000/model.safetensors texts.jsonl -o texts.npy
    python -m uform choose runs/train-20261129-170000/model.safetensors states.jsonl

Progress goes to stderr, results to stdout. A refused setting is one line naming its flag.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import uform
from uform.files import bounded_lines, write_atomically
from uform.inference import DEFAULT_BATCH_SIZE, Encoder
from uform.datasets import mine_standard_library_pairs, name_pairs
from uform.pairs.jsonl import MAX_LINE_BYTES
from uform.pairs import (bag_of_bytes_embeddings, bm25_scores, distinct, pair_relations, read_pairs, retrieval_metrics,
                         split_by_document, split_pairs)
from uform.runs import (CHECKPOINTS, CONFIG, METRICS, PLOT, SUMMARY, GracefulStop, Metrics, Parser, UsageError,
                        add_run_flags, check_writable, checkpoint_path, close_run, device_executor, falls_on, fraction,
                        newest_checkpoint, non_negative_float, non_negative_int, parse_run_flags, plot, positive_float,
                        no_steps_left, positive_int, prepare_run_dir, prune_checkpoints, run_command, save_when_due,
                        saved_once, step_progress, stopped_early, write_config, write_summary)

TRAIN_DESCRIPTION = """\
Train a small encoder on (query, document) pairs and measure held-out retrieval.

With no --pairs, --data picks the pairs: names (the default) reads the names of countries,
currencies and languages in about 160 languages and scripts → their English names from
pycountry's catalogs (held out by English name: no held-out name trains); stdlib mines
docstring-summary → signature pairs from the standard library's sources; digits reads
scikit-learn's handwritten digits as images captioned "a handwritten seven" (zero-shot
classification among ten captions, beside a logistic regression on the pixels); shapes renders
captioned shapes (a PNG image → its caption); sounds synthesises captioned sounds (a WAV
recording → its caption); spoken has espeak-ng, where it is installed, say the numbers zero to
ninety-nine in seven voices (the held-out recordings are an unheard voice's). A pairs file is
JSONL, one {"query": ..., "document": ..., "weight"?: ..., "group"?: ...} per line. Each step
draws --pairs-per-step pairs (a pure function of the seed and the step), attracts each query to
its document (every other pair repels) and masks bytes, patches or frames for the masked
objective. Held-out recall@1 of the uncorrupted embeddings is measured every --eval-every
steps, with recall@10 and MRR, beside baselines: for text, the same recall of a bag-of-bytes
embedding (hashed byte bigrams) and of BM25; for media, chance (1/n) and, for digits, the pixels.

The run directory holds config.toml (every setting, resolved), metrics.csv (one row per step),
loss.png (redrawn at each save and evaluation), summary.json (the closing lines' figures: steps,
time, held-out metrics, best, baselines), checkpoints/ (every --save-every steps, the last
--keep kept) and model.safetensors (the final checkpoint, for `python -m uform embed` or
uform.Encoder.load). Steps run deferred, two in flight, so that the next batch is packed while the
device runs one. Ctrl-C or SIGTERM finishes the steps in flight, saves and exits with 128 + the
signal's number; --resume RUN_DIR then continues to the same bits as an uninterrupted run.
"""

SOUND_RATE = 8000  # the sounds reach 3.5 kHz, under this rate's Nyquist frequency
SOUND_CHUNK = 400  # 50 ms frames: the longest sound (three long bursts) fits a row of 160
MEDIA_MASK_RATIO = 0.5
"""The patches or frames a media step hides: FLIP's half rather than MAE's derived three quarters, since JOINT
scores its contrastive term on the masked forward (docs/encoder.md, "What the image tower needs")."""
DATA_STREAM = 2**32
"""Added to the step in the Philox key of a step's pair draw, [seed, DATA_STREAM + step], so that it never
repeats the key [seed, n] of tensor n's initialisation."""
EXTENSION = ".safetensors"
METRIC = "held_out_recall_at_1"
HELD_OUT = {"recall_at_1": METRIC, "recall_at_5": "held_out_recall_at_5", "recall_at_10": "held_out_recall_at_10",
            "mrr": "held_out_mrr", "ndcg_at_10": "held_out_ndcg_at_10"}
"""Each of retrieval_metrics' figures and its metrics.csv column."""
COLUMNS = ["step", "loss", "masked_text_loss", "contrastive_loss", "reconstruction_loss", "learning_rate",
           "step_seconds", "pairs_per_second", *HELD_OUT.values()]


@dataclass(frozen=True)
class Job:
    """What a run trains on: pairs whose queries are of one modality and documents are text, and the
    media geometry the batch needs."""

    pairs: list
    query_modality: uform.Modality
    image: uform.ImageShape | None = None
    audio: uform.AudioShape | None = None
    split_by_document: bool = False
    """Hold out whole documents (every pair of each), not pairs: a document may have many pairs."""
    pixel_baseline: object = None
    """For images with a supervised reference: (training, held-out pairs) → its held-out accuracy."""
    apart: list[bool] | None = None
    """Per pair, whether it is kept apart from training: the held-out pairs are drawn from those (an unheard
    voice's recordings); None: the split draws from every pair."""


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


def first_examples(pairs: list, args) -> list:
    """The first --examples of a built-in set's pairs (0: all of them)."""
    return pairs[:args.examples] if args.examples else pairs


def pairs_file(path: Path, flag: str) -> list:
    """The pairs of a JSONL file a flag names, or a usage error naming the flag, the file and what is wrong."""
    try:
        pairs = read_pairs(path)
    except OSError as error:
        raise UsageError(f"{flag}: cannot read {path}: {error.strerror}") from None
    except uform.UFormError as error:
        raise UsageError(f"{flag}: {error.message}") from None
    if not pairs:
        raise UsageError(f"{flag}: {path} holds no pairs")
    return pairs


def load_job(args) -> Job:
    if args.pairs:
        return Job(pairs_file(args.pairs, "--pairs"), uform.Modality.TEXT)
    if args.data == "names":
        return Job(first_examples(name_pairs(), args), uform.Modality.TEXT, split_by_document=True)
    if args.data == "digits":
        from uform.datasets.digits import digit_pairs, digit_pixels, pixel_baseline

        return Job(media_pairs(first_examples(digit_pairs(), args)), uform.Modality.IMAGE,
                   image=uform.ImageShape(patch_side=8),
                   pixel_baseline=lambda training, held: pixel_baseline(
                       digit_pixels([p.query for p in training]), [p.document for p in training],
                       digit_pixels([p.query for p in held]), [p.document for p in held]))
    if args.data == "spoken":
        from uform.datasets.spoken import HELD_OUT_VOICE, spoken_pairs

        recordings = first_examples(spoken_pairs(), args)
        return Job(media_pairs((r.audio, r.caption) for r in recordings), uform.Modality.AUDIO,
                   audio=uform.AudioShape(chunk_samples=SOUND_CHUNK, sample_rate=SOUND_RATE),
                   apart=[r.voice == HELD_OUT_VOICE for r in recordings])
    if args.data == "shapes":
        from uform.datasets.shapes import all_scenes, shape_pairs

        pairs = shape_pairs(args.examples or len(all_scenes()), seed=args.seed)
        return Job(media_pairs(pairs), uform.Modality.IMAGE, image=uform.ImageShape(patch_side=8))
    if args.data == "sounds":
        from uform.datasets.sounds import CAPTION_COUNT, sound_pairs

        pairs = sound_pairs(args.examples or CAPTION_COUNT, seed=args.seed, sample_rate=SOUND_RATE)
        return Job(media_pairs((pair.audio, pair.caption) for pair in pairs), uform.Modality.AUDIO,
                   audio=uform.AudioShape(chunk_samples=SOUND_CHUNK, sample_rate=SOUND_RATE))
    return Job(first_examples(mine_standard_library_pairs(seed=args.seed), args), uform.Modality.TEXT)


def split(job: Job, args) -> tuple[list, list]:
    """(training, held out) pairs: --held-out of them, at most half, kept out; or with --eval-pairs that file's
    pairs, the training pairs that share a query or a document with them left out. Refuses a split that leaves
    fewer training pairs than a step draws."""
    count = len(job.pairs)
    if args.eval_pairs is not None:
        if job.query_modality != uform.Modality.TEXT:
            raise UsageError("--eval-pairs: a JSONL file holds text pairs; media runs hold out their own")
        held_out = pairs_file(args.eval_pairs, "--eval-pairs")
        seen = {p.query for p in held_out} | {p.document for p in held_out}
        training = [p for p in job.pairs if p.query not in seen and p.document not in seen]
        held = args.held_out
        if len(training) < count:
            print(f"--eval-pairs: {count - len(training)} of the {count} training pairs share a query or a document "
                  f"with {args.eval_pairs} and are left out", file=sys.stderr)
    elif job.apart is not None:  # the held-out pairs come from those kept apart, none of which trains
        apart = [p for p, kept in zip(job.pairs, job.apart) if kept]
        held, limit = min(args.held_out, len(apart)), f"all {len(apart)} pairs kept apart from training"
        training = [p for p, kept in zip(job.pairs, job.apart) if not kept]
        held_out = split_pairs(apart, held / len(apart), seed=args.seed)[1] if apart else []
    else:
        units = len({p.document for p in job.pairs}) if job.split_by_document else count
        held = min(args.held_out, units // 2)
        limit = f"half of the {units} {'distinct documents' if job.split_by_document else 'pairs'}"
        training, held_out = (split_by_document(job.pairs, held, seed=args.seed) if job.split_by_document
                              else split_pairs(job.pairs, held / count, seed=args.seed))
    if held < args.held_out:  # (--eval-pairs holds out its file whole)
        print(f"--held-out {args.held_out}: holding out {held}, {limit}", file=sys.stderr)
    if len(training) < args.pairs_per_step:
        raise UsageError(f"--pairs-per-step: a step draws {args.pairs_per_step} distinct pairs but only "
                         f"{len(training)} of the {count} are left for training ({len(held_out)} held out); pass "
                         f"--pairs-per-step {len(training)} or fewer, or more pairs")
    return training, held_out


def step_pairs(training: list, seed: int, step: int, count: int) -> list:
    """Step `step`'s pairs: `count` distinct ones drawn by Philox keyed [seed, DATA_STREAM + step], so that a
    resumed run draws what an uninterrupted one would."""
    rng = np.random.Generator(np.random.Philox(key=[seed, DATA_STREAM + step]))
    return [training[i] for i in rng.choice(len(training), count, replace=False)]


def step_items(job: Job, pairs) -> tuple[list, list, uform.Relations, list[int]]:
    """Queries then documents as items, each attracting its partner with the pair's weight; pairs of one
    document ignore each other (``uform.pairs.pair_relations``)."""
    n = len(pairs)
    modalities = [job.query_modality] * n + [uform.Modality.TEXT] * n
    contents = [p.query for p in pairs] + [p.document for p in pairs]
    groups = [p.group for p in pairs] * 2
    return modalities, contents, pair_relations([p.document for p in pairs], [p.weight for p in pairs]), groups


def held_out_documents(held_out: list) -> tuple[list, np.ndarray]:
    """The held-out pairs' distinct documents, in order of first appearance, and each pair's index among them: a
    caption several held-out queries share (a digit's) is one document, so that the rank of each is its class's."""
    return distinct([p.document for p in held_out])


def held_out_metrics(trainer: uform.Trainer, job: Job, held_out: list) -> dict[str, float]:
    """Recall@1, recall@10 and MRR of the held-out queries among the held-out documents, embedded uncorrupted."""
    queries = [p.query for p in held_out]
    documents, truth = held_out_documents(held_out)
    return retrieval_metrics(trainer.encode([job.query_modality] * len(queries), queries),
                             trainer.encode([uform.Modality.TEXT] * len(documents), documents), truth=truth)


def baseline(job: Job, training: list, held_out: list) -> tuple[tuple[str, float], dict[str, float]]:
    """The recall@1 to beat, as (name, value), and every baseline's by name: for text queries the better of a
    bag-of-bytes embedding and BM25, for digits a logistic regression on the pixels, else chance."""
    queries = [p.query for p in held_out]
    documents, truth = held_out_documents(held_out)
    if job.query_modality == uform.Modality.TEXT:
        found = {"bag-of-bytes": retrieval_metrics(bag_of_bytes_embeddings(queries), bag_of_bytes_embeddings(documents),
                                                   truth=truth)["recall_at_1"],
                 "BM25": retrieval_metrics(scores=bm25_scores(queries, documents), truth=truth)["recall_at_1"]}
    else:
        found = {"chance": 1 / len(documents)}
        if job.pixel_baseline is not None:
            found["pixel logistic regression"] = job.pixel_baseline(training, held_out)
    best = max(found, key=found.get)
    return (f"{best} baseline", found[best]), found


def objective(args, job: Job) -> str:
    """--objective, or the one that trains the job best: joint for text queries, contrastive for media ones
    (docs/encoder.md, "What the image tower needs": JOINT's masked captions and patches cost image→text recall)."""
    if args.objective is not None:
        return args.objective
    return "joint" if job.query_modality == uform.Modality.TEXT else "contrastive"


def gradient_clip_norm(args, job: Job) -> float:
    """--gradient-clip-norm, or what trains the job best: 1 for media queries (on the H200, --data shapes 0.55 ->
    0.65 at step 1000, sounds 0.59 -> 0.67), none for text (the CPU names demo: 0.334 unclipped, 0.312 at 1)."""
    if args.gradient_clip_norm is not None:
        return args.gradient_clip_norm
    return 0.0 if job.query_modality == uform.Modality.TEXT else 1.0


def job_trainer(args, job: Job, executor, resume_from=None) -> uform.Trainer:
    """The trainer the flags describe for the job: a row per pair and two items, SigLIP over every pair of the
    step's items (same-document pairs ignored), and half of a media query's tokens hidden under JOINT."""
    columns = args.columns or (160 if job.audio else 128)
    devices = len(executor.devices)
    if args.pairs_per_step % devices:
        raise UsageError(f"--pairs-per-step: {args.pairs_per_step} pairs do not split evenly over {devices} devices")
    rows = args.pairs_per_step // devices  # a row per pair, each device an equal share
    items = 2 * args.pairs_per_step
    return uform.Trainer.init_vram(
        executor, resume=resume_from, depth=args.depth, hidden=args.hidden,
        objective=uform.Objective[args.objective.upper()],
        batch=uform.BatchShape(max_rows_per_device=rows, max_segments_per_device=2 * rows,
                               max_columns_per_row=columns, image=job.image, audio=job.audio),
        masking=uform.Masking(image_mask_ratio=args.mask_ratio, audio_mask_ratio=args.mask_ratio)
        if job.query_modality != uform.Modality.TEXT else None,
        contrastive=uform.Contrastive(temperature_groups=max(p.group for p in job.pairs) + 1,
                                      max_edges_per_device=items * items // devices),
        schedule=uform.Schedule(steps=args.steps, learning_rate=args.learning_rate, warmup_steps=args.warmup_steps,
                                gradient_clip_norm=args.gradient_clip_norm), seed=args.seed,
        numerics=args.numerics)


def train_parser() -> Parser:
    parser = Parser(prog="python -m uform train", description=TRAIN_DESCRIPTION)
    data = parser.add_argument_group("data")
    data.add_argument("--pairs", type=Path, metavar="JSONL",
                      help="a JSONL pairs file (default: the pairs --data names)")
    data.add_argument("--data", choices=("names", "stdlib", "digits", "shapes", "sounds", "spoken"), default="names",
                      help="built-in pairs: names across languages and scripts, text from the standard library, "
                           "handwritten digits, image or audio captions, spoken number words")
    data.add_argument("--examples", type=non_negative_int, default=0, metavar="N",
                      help="use the first N pairs of the built-in data (0: all of them)")
    data.add_argument("--held-out", type=non_negative_int, default=500, metavar="N",
                      help="pairs kept out of training for recall@1, at most half of them (0: no evaluation)")
    data.add_argument("--eval-pairs", type=Path, metavar="JSONL",
                      help="a JSONL pairs file to evaluate on instead of pairs split off training (its queries and "
                           "documents then never train; default: none)")
    model = parser.add_argument_group("model and optimisation")
    model.add_argument("--depth", type=positive_int, default=4, help="transformer blocks")
    model.add_argument("--hidden", type=positive_int, default=256, help="width, a multiple of 128")
    model.add_argument("--columns", type=non_negative_int, default=0,
                       help="positions per packed row, longer items are cut (0: 128, or 160 for sounds)")
    model.add_argument("--steps", type=positive_int, default=4000, help="optimizer steps of the whole run")
    model.add_argument("--pairs-per-step", type=positive_int, default=128, metavar="N", help="pairs each step draws")
    model.add_argument("--learning-rate", type=positive_float, default=1e-3, metavar="LR",
                       help="peak learning rate (warmup, then cosine)")
    model.add_argument("--warmup-steps", type=non_negative_int, default=0, metavar="N",
                       help="steps of the linear warmup to the peak (0: a tenth of --steps, at most 400)")
    model.add_argument("--objective", choices=("joint", "contrastive"),
                       help="joint: the contrastive and masked terms on one masked forward; contrastive: nothing "
                            "hidden (default: joint for text queries, contrastive for images and sounds)")
    model.add_argument("--mask-ratio", type=fraction, default=MEDIA_MASK_RATIO, metavar="R",
                       help="the fraction of an image's patches or a recording's frames a joint step hides")
    model.add_argument("--gradient-clip-norm", type=non_negative_float, metavar="NORM",
                       help="scale a gradient whose global L2 norm passes NORM down to it, 0 clips nothing (default: "
                            "1 for images and sounds, 0 for text)")
    model.add_argument("--seed", type=non_negative_int, default=0, help="initialisation, split, draws and masking")
    model.add_argument("--device", help="cpu or gpu:N (default: the first GPU, else the CPU)")
    model.add_argument("--devices", metavar="LIST",
                       help="several devices as one world, the same bits as one device: gpu:0,gpu:1, all (every "
                            "GPU) or cpu:N; each takes an equal share of a step's pairs (default: --device's one)")
    model.add_argument("--numerics", choices=("identical", "fast"), default="identical",
                       help="identical: the same bits on every device; fast: bf16 tensor cores on a GPU (docs/numerics.md)")
    add_run_flags(parser, save_every=100, eval_every=100)
    return parser


def train(argv: list[str]) -> int:
    parser = train_parser()
    args, run_dir, resuming = parse_run_flags(parser, argv, resumable=("device", "devices", "steps"))
    if args.hidden % 128:
        raise UsageError(f"--hidden: must be a multiple of 128 (whole attention heads of 64), got {args.hidden}")
    if args.pairs is not None:
        args.pairs = args.pairs.resolve()  # the config names it wherever the run resumes from
    try:
        job = load_job(args)
    except uform.UFormError as error:  # a built-in set whose package or program this machine lacks
        raise UsageError(f"--data {args.data}: {error.message}") from None
    # resolved, so that config.toml holds what the run trains with and a resume reads it back
    args.objective, args.gradient_clip_norm = objective(args, job), gradient_clip_norm(args, job)
    training, held_out = split(job, args)
    prepare_run_dir(run_dir, resuming, "--resume" if resuming else "--run-dir")
    executor = device_executor(args)
    resume_from = newest_checkpoint(run_dir, EXTENSION)[1] if resuming else None
    try:
        trainer = job_trainer(args, job, executor, resume_from)
    except uform.UFormError as error:
        raise UsageError(error.message) from None
    start = trainer.completed_steps
    if no_steps_left(run_dir, start, args.steps, resume_from, run_dir / f"model{EXTENSION}"):
        return 0
    write_config(run_dir / CONFIG, parser, args)
    metrics = Metrics(run_dir / METRICS, COLUMNS, resumed_at=start if resuming else None)

    kind = job.query_modality.name.lower()
    print(f"{len(training)} training pairs, {len(held_out)} held out; depth {args.depth}, hidden {args.hidden}, on "
          f"{executor}; {'resuming at step ' + str(start) if resuming else 'new run'} in {run_dir}", file=sys.stderr)
    reference, baselines = baseline(job, training, held_out) if held_out else (None, {})
    against = " · ".join(f"{name} {value:.3f}" for name, value in baselines.items())

    @saved_once
    def save(step: int) -> Path:
        path = checkpoint_path(run_dir, step, EXTENSION)
        trainer.save(path)
        prune_checkpoints(run_dir, EXTENSION, args.keep)
        plot(metrics, run_dir / PLOT, COLUMNS[1:5], METRIC, f"{kind}→text, {run_dir.name}", reference)
        return path

    def pauses_after(step: int) -> bool:
        """Whether the loop reads or saves the trainer as `step` leaves it: no later step may be in flight then."""
        return step == args.steps or falls_on(step, args.save_every) or (
            bool(held_out) and falls_on(step, args.eval_every))

    # Two deferred steps in flight, so that the host packs and corrupts the next batch while the device runs this
    # one (docs/training-api.md); none past a step whose trainer the loop reads (an evaluation) or saves.
    receiver = trainer.deferred(executor)
    in_flight: deque = deque()  # (step, its Deferred, its stats), oldest first
    began = time.perf_counter()
    finished_at = began
    progress = step_progress(args.steps, start)
    with GracefulStop() as stop:
        step = submitted = start
        try:
            while in_flight or (step < args.steps and stop.signal is None):
                while (len(in_flight) < 2 and submitted < args.steps and stop.signal is None
                       and not (in_flight and pauses_after(in_flight[-1][0]))):
                    submitted += 1
                    modalities, contents, relations, groups = step_items(
                        job, step_pairs(training, args.seed, submitted, args.pairs_per_step))
                    submitted_stats = uform.TrainerStepStats()
                    in_flight.append((submitted, receiver.step(modalities, contents, relations=relations,
                                                               temperature_groups=groups, stats=submitted_stats),
                                      submitted_stats))
                if not in_flight:  # a signal came between the loop's check and the submissions'
                    break
                step, handle, stats = in_flight.popleft()
                handle.result()
                now = time.perf_counter()
                seconds, finished_at = now - finished_at, now  # between finishes: a step's time in a full pipeline
                evaluate = bool(held_out) and (step == args.steps or falls_on(step, args.eval_every))
                scores = held_out_metrics(trainer, job, held_out) if evaluate else {}
                reconstruction = stats.masked_image_loss + stats.masked_video_loss + stats.masked_audio_loss
                metrics.add(step=step, loss=stats.loss, masked_text_loss=stats.masked_text_loss,
                            contrastive_loss=stats.contrastive_loss,
                            reconstruction_loss=reconstruction if job.query_modality != uform.Modality.TEXT else None,
                            learning_rate=stats.learning_rate, step_seconds=seconds,
                            pairs_per_second=args.pairs_per_step / seconds,
                            **{column: scores.get(name) for name, column in HELD_OUT.items()})
                progress.update()
                progress.set_postfix(loss=f"{stats.loss:.3f}", contrastive=f"{stats.contrastive_loss:.3f}")
                if scores:
                    progress.write(f"step {step}: held-out recall@1 {scores['recall_at_1']:.3f}, recall@10 "
                                   f"{scores['recall_at_10']:.3f}, MRR {scores['mrr']:.3f} (recall@1 of {against})",
                                   file=sys.stderr)
                save_when_due(progress, step, args, save)
                if pauses_after(step):
                    finished_at = time.perf_counter()  # the next step was submitted only now
        except BaseException:  # a refused step or a second signal: the steps not yet started never run
            for _, queued, _ in in_flight:
                queued.cancel()
            raise
        last, elapsed = close_run(progress, metrics, save, step, began,
                                  run_dir / f"model{EXTENSION}" if step >= args.steps else None)
    rate = (step - start) / elapsed
    status = stopped_early(stop, step, args, last, f"python -m uform train --resume {run_dir}")
    if status is not None:
        return status
    if held_out:
        print(f"held-out {kind}→text recall@1 over {len(held_out)} pairs: uform {metrics.latest(METRIC):.3f} · "
              f"{against} (recall@10 {metrics.latest(HELD_OUT['recall_at_10']):.3f}, MRR "
              f"{metrics.latest(HELD_OUT['mrr']):.3f})")
        best, best_step = metrics.best(METRIC)
        outcome = f"best held-out recall@1 {best:.3f} at step {best_step}"
    else:
        outcome = "no held-out pairs, so no recall (--held-out 0)"
    write_summary(run_dir / SUMMARY, {
        "first_step": start + 1, "steps": step, "seconds": elapsed, "steps_per_second": rate,
        "executor": str(executor), "query_modality": kind,
        "held_out": {"pairs": len(held_out), **{name: metrics.latest(column) for name, column in HELD_OUT.items()},
                     "best_recall_at_1": best, "best_step": best_step, "baselines": baselines} if held_out else None})
    print(f"trained steps {start + 1}–{step} in {elapsed:.1f} s ({rate:.2f} steps/s) on {executor}; {outcome}")
    print(f"run directory {run_dir}: {CONFIG}, {METRICS}, {PLOT}, {SUMMARY}, model{EXTENSION}, {CHECKPOINTS}/ (the "
          f"last {args.keep} step checkpoints)")
    return 0


def embed_parser() -> Parser:
    parser = Parser(prog="python -m uform embed", description="""\
Embed items with a trained encoder: one float32 row of unit length per item, in input order, saved
as a .npy array of shape (items, width).

INPUT is a .jsonl file (each line a JSON string, or an object whose --field key holds the item:
"text" by default, "query" or "document" for a pairs file) or a text file (each non-blank line an
item). For --modality image, video or audio, each item is the path of a media file.""")
    parser.add_argument("checkpoint", type=Path, help="a checkpoint of python -m uform train (model.safetensors)")
    parser.add_argument("input", type=Path, help="a .jsonl or text file of items")
    parser.add_argument("-o", "--output", type=Path, help="the .npy file to write (default: INPUT's name, .npy)")
    parser.add_argument("--field", default="text", help="the key of a JSONL object that holds the item")
    parser.add_argument("--modality", choices=("text", "image", "video", "audio"), default="text",
                        help="what the items are")
    parser.add_argument("--width", type=positive_int, help="a Matryoshka prefix of the embedding the run trained "
                                                           "(default: all of it)")
    parser.add_argument("--any-width", action="store_true", help="take a --width the run never trained (any prefix of "
                                                                 "the hidden width; default: only those it trained)")
    parser.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, metavar="N",
                        help="items handed to the model at once (the embeddings do not depend on it)")
    parser.add_argument("--device", help="cpu or gpu:N (default: the first GPU, else the CPU)")
    return parser


def input_lines(path: Path) -> list[str]:
    """The lines of INPUT (at most MAX_LINE_BYTES bytes each, a CRLF's CR dropped), refused in one line when it
    cannot be read."""
    try:
        with open(path, "rb") as file:
            return [line.decode("utf-8").removesuffix("\r")
                    for line in bounded_lines(file, MAX_LINE_BYTES, lambda message: UsageError(f"INPUT: {message}"))]
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"INPUT: cannot read {path}: {getattr(error, 'strerror', None) or error}") from None


def json_lines(path: Path, lines: list[str]):
    """(line number, value) of every non-blank line of a JSONL file; a bad line is refused naming it."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"INPUT: {path}:{number}: bad JSON: {error.msg}") from None


def read_items(path: Path, field: str) -> list[str]:
    """The items of a .jsonl or text file, in order; a bad line is refused naming it."""
    lines = input_lines(path)
    if path.suffix != ".jsonl":
        return [line for line in lines if line.strip()]
    items = []
    for number, value in json_lines(path, lines):
        if isinstance(value, dict):
            if field not in value:
                raise UsageError(f"INPUT: {path}:{number}: no {field!r} key (name the item's key with --field)")
            value = value[field]
        if not isinstance(value, str) or not value:
            raise UsageError(f"INPUT: {path}:{number}: the item must be a non-empty string")
        items.append(value)
    return items


def output_and_input(args, suffix: str, read, what: str) -> tuple[Path, list]:
    """(OUTPUT, INPUT's entries) of a command that turns a file into another: the output (default: INPUT's
    name with `suffix`) checked writable first, then the entries `read` answers, refused when there are none."""
    output = args.output or Path(args.input.name).with_suffix(suffix)
    check_writable(output, "--output")
    entries = read(args.input)
    if not entries:
        raise UsageError(f"INPUT: {args.input} holds no {what}")
    return output, entries


def embed(argv: list[str]) -> int:
    args = embed_parser().parse_args(argv)
    output, items = output_and_input(args, ".npy", lambda path: read_items(path, args.field), "items")
    modality = uform.Modality[args.modality.upper()]
    if modality != uform.Modality.TEXT:
        try:
            items = [Path(item).read_bytes() for item in items]
        except OSError as error:
            raise UsageError(f"INPUT: cannot read the media file {error.filename}: {error.strerror}") from None
    try:
        encoder = Encoder.load(args.checkpoint, device_executor(args))
        embeddings = encoder.encode(modality, items, width=args.width, batch_size=args.batch_size,
                                    any_width=args.any_width)
    except uform.UFormError as error:
        raise UsageError(error.message) from None
    array = io.BytesIO()
    np.save(array, embeddings)
    write_atomically(output, [array.getvalue()])
    print(f"wrote {output}: {embeddings.shape[0]} embeddings of width {embeddings.shape[1]} (float32)")
    return 0


def choose_parser() -> Parser:
    parser = Parser(prog="python -m uform choose", description="""\
Read a trained model's calibrated choices (uform.Trainer.text_choose): for each state, the
probability of each of its legal bytes at the position after it.

INPUT is a .jsonl file, each line an object {"text": STATE, "choices": LEGAL}: LEGAL a string of
distinct characters, each one byte (ASCII). OUTPUT gets one line per input line, the object with
"probabilities" added: a list as long as its choices, summing to one, which a step takes back as
that item's choice_targets.""")
    parser.add_argument("checkpoint", type=Path, help="a checkpoint of a run with a masked head (model.safetensors)")
    parser.add_argument("input", type=Path, help="a .jsonl file of {\"text\", \"choices\"} objects")
    parser.add_argument("-o", "--output", type=Path,
                        help="the .jsonl file to write (default: INPUT's name with .choices.jsonl)")
    parser.add_argument("--device", help="cpu or gpu:N (default: the first GPU, else the CPU)")
    return parser


def read_states(path: Path) -> list[dict]:
    """The {"text", "choices"} objects of a .jsonl file; a bad line is refused naming it."""
    states = []
    for number, value in json_lines(path, input_lines(path)):
        if not isinstance(value, dict) or not isinstance(value.get("text"), str) \
                or not isinstance(value.get("choices"), str):
            raise UsageError(f"INPUT: {path}:{number}: expected an object with string \"text\" and \"choices\"")
        if not value["choices"].isascii():
            raise UsageError(f"INPUT: {path}:{number}: every choice must be one byte (an ASCII character)")
        states.append(value)
    return states


def choose(argv: list[str]) -> int:
    args = choose_parser().parse_args(argv)
    output, states = output_and_input(args, ".choices.jsonl", read_states, "states")
    try:
        encoder = Encoder.load(args.checkpoint, device_executor(args))
        probabilities = encoder.text_choose([s["text"] for s in states], [s["choices"] for s in states])
    except uform.UFormError as error:
        raise UsageError(error.message) from None
    lines = [json.dumps(dict(state, probabilities=[float(p) for p in probabilities.entry(item)])) + "\n"
             for item, state in enumerate(states)]
    write_atomically(output, [line.encode() for line in lines])
    print(f"wrote {output}: the probabilities of {len(states)} states")
    return 0


COMMANDS = {"train": (train, "train an encoder on pairs into a run directory (metrics, plot, checkpoints)"),
            "embed": (embed, "embed the items of a JSONL or text file with a trained encoder, into a .npy file"),
            "choose": (choose, "read a trained model's probabilities over each state's legal bytes, into a JSONL")}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        listing = "\n".join(f"  {name:6} {summary}" for name, (_, summary) in COMMANDS.items())
        text = f"{__doc__}\ncommands:\n{listing}\n\n`python -m uform COMMAND --help` tells each command's flags."
        if argv and argv[0] not in ("-h", "--help"):
            raise SystemExit(f"python -m uform: error: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}")
        print(text, file=sys.stdout if argv else sys.stderr)
        raise SystemExit(0 if argv else 2)
    command, _ = COMMANDS[argv[0]]
    run_command(command, argv[1:], f"python -m uform {argv[0]}")


if __name__ == "__main__":
    main()
