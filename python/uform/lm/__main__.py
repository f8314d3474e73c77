"""Train the byte language model on text every Python install has, then sample from it.

    python -m uform.lm                      # the standard library's own sources, on the default device
    python -m uform.lm --corpus notes.txt --steps 2000 --device gpu:0 --temperature 0.8
    python -m uform.lm --resume runs/lm-20261129-170000

The last --held-out-fraction of the corpus is held out: its mean loss is measured every --eval-every
steps. The run directory holds config.toml, metrics.csv (one row per step), loss.png, checkpoints/
(binary checkpoints every --save-every steps, the last --keep kept) and model.uformlm (the final
one). Ctrl-C or SIGTERM finishes the step, saves and exits with 128 + the signal's number;
--resume RUN_DIR continues to the same bits (batch i is a pure function of the seed and i). At the
end it prints a continuation of --prompt, sampled at --temperature (0: greedy).
"""

from __future__ import annotations

import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from ..errors import UFormError
from ..runs import (CHECKPOINTS, CONFIG, METRICS, PLOT, GracefulStop, Metrics, Parser, UsageError, add_run_flags,
                    checkpoint_path, device_executor, falls_on, newest_checkpoint, no_steps_left, non_negative_float,
                    non_negative_int, parse_run_flags, plot, positive_float, positive_int, prepare_run_dir,
                    prune_checkpoints, run_command, write_config, save_when_due, saved_once, close_run, step_progress,
                    stopped_early)
from .config import LanguageModelConfig, parameter_registry
from .corpus import TokenBatches
from .trainer import LanguageModelTrainer

DEMO_SHAPE = LanguageModelConfig(batch=8, length=64, width=64, heads=4, kv_heads=2, mlp=128, layers=2)
STDLIB_MODULES = ("argparse.py", "json/decoder.py", "textwrap.py", "functools.py", "pathlib.py", "dataclasses.py")
EXTENSION = ".uformlm"
COLUMNS = ["step", "loss", "bits_per_byte", "learning_rate", "step_seconds", "bytes_per_second", "held_out_loss"]


def standard_library_corpus() -> tuple[bytes, str]:
    """A few well-known modules of this Python's standard library, concatenated."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_bytes() for name in STDLIB_MODULES if (root / name).exists()]
    return b"\n".join(parts), f"python{sysconfig.get_python_version()}-stdlib:{','.join(STDLIB_MODULES)}"


def initial_parameters(shape: LanguageModelConfig, seed: int) -> np.ndarray:
    """Normal(0, 0.02) weights, gains of one: the caller's initialisation, since the trainer has none."""
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal(shape.n_total) * 0.02).astype(np.float32)
    for entry in parameter_registry(shape):
        if entry["name"].endswith("norm"):
            weights[entry["offset"]:entry["offset"] + entry["size"]] = 1.0
    return weights


def sample(trainer: LanguageModelTrainer, prompt: bytes, count: int, temperature: float, seed: int) -> bytes:
    """`count` bytes after `prompt`: each drawn from softmax(logits / temperature) by a Philox stream keyed by
    `seed`, or the most likely one at temperature 0."""
    window = DEMO_SHAPE.length
    rng = np.random.Generator(np.random.Philox(key=seed))
    text = bytearray(prompt)
    for _ in range(count):
        ids = np.frombuffer(bytes(text[-window:]), np.uint8).astype(np.int32)[None, :]
        logits = trainer.logits(ids)[0, -1].astype(np.float64)
        if temperature == 0:
            text.append(int(np.argmax(logits)))
            continue
        weights = np.exp((logits - logits.max()) / temperature)
        text.append(int(rng.choice(len(weights), p=weights / weights.sum())))
    return bytes(text)


def held_out_loss(trainer: LanguageModelTrainer, held_out: TokenBatches, batches: int) -> float:
    """Mean loss over the first `batches` batches of the held-out text."""
    return float(np.mean([trainer.evaluate(held_out.batch(i)) for i in range(batches)]))


def parser() -> Parser:
    parser = Parser(prog="python -m uform.lm", description=__doc__)
    parser.add_argument("--corpus", type=Path, help="a text file (default: a few standard-library sources)")
    parser.add_argument("--held-out-fraction", type=non_negative_float, default=0.1, metavar="F",
                        help="the corpus' last fraction F is held out for evaluation (0: no evaluation)")
    parser.add_argument("--eval-batches", type=positive_int, default=4, metavar="N",
                        help="held-out batches of each evaluation")
    parser.add_argument("--steps", type=positive_int, default=400, help="optimizer steps of the whole run")
    parser.add_argument("--learning-rate", type=positive_float, default=3e-3, metavar="LR", help="AdamW's rate")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="initialisation, batch order, sampling")
    parser.add_argument("--device", help="cpu or gpu:N (default: the first GPU, else the CPU)")
    parser.add_argument("--numerics", choices=("identical", "fast"), default="identical",
                        help="identical: the same bits on every device; fast: bf16 tensor cores on a GPU (docs/numerics.md)")
    parser.add_argument("--prompt", default="def ", help="the text the sample continues (default: %(default)r)")
    parser.add_argument("--sample-bytes", type=non_negative_int, default=120, metavar="N", help="bytes sampled")
    parser.add_argument("--temperature", type=non_negative_float, default=0.8,
                        help="sampling temperature (0: greedy)")
    add_run_flags(parser, save_every=100, eval_every=50)
    return parser


def corpus_split(args) -> tuple[TokenBatches, TokenBatches | None, str]:
    """(training batches, held-out batches or None, corpus name); refuses a corpus too short for a window."""
    if args.corpus:
        try:
            data, name = args.corpus.read_bytes(), args.corpus.name
        except OSError as error:
            raise UsageError(f"--corpus: cannot read {args.corpus}: {error.strerror}") from None
    else:
        data, name = standard_library_corpus()
    if args.held_out_fraction >= 1:
        raise UsageError(f"--held-out-fraction: must be below 1, got {args.held_out_fraction}")
    cut = len(data) - round(args.held_out_fraction * len(data))
    window = DEMO_SHAPE.length + 1
    if cut < window or (cut < len(data) and len(data) - cut < window):
        raise UsageError(f"--corpus: {name} has {len(data)} bytes, {cut} for training and {len(data) - cut} held out; "
                         f"each part needs a window of {window} bytes (a longer corpus, or --held-out-fraction 0)")
    shape = dict(batch=DEMO_SHAPE.batch, length=DEMO_SHAPE.length, seed=args.seed)
    training = TokenBatches(data[:cut], name=name, steps=args.steps, **shape)
    held_out = TokenBatches(data[cut:], name=f"{name}:held-out", **shape) if cut < len(data) else None
    return training, held_out, name


def train(argv: list[str]) -> int:
    options = parser()
    args, run_dir, resuming = parse_run_flags(options, argv, resumable=("device", "steps", "prompt", "sample_bytes",
                                                                         "temperature"))
    if not args.prompt:
        raise UsageError("--prompt: the sample continues a text; give it at least one character")
    if args.corpus is not None:
        args.corpus = args.corpus.resolve()  # the config names it wherever the run resumes from
    batches, held_out, name = corpus_split(args)
    prepare_run_dir(run_dir, resuming, "--resume" if resuming else "--run-dir")
    executor = device_executor(args)
    resume_from = newest_checkpoint(run_dir, EXTENSION)[1] if resuming else None
    try:
        if resuming:
            trainer = LanguageModelTrainer.from_checkpoint_binary(resume_from, executor=executor)
        else:
            trainer = LanguageModelTrainer(initial_parameters(DEMO_SHAPE, args.seed), lr=args.learning_rate,
                                           data_schedule=batches.data_schedule(), shape=DEMO_SHAPE,
                                           executor=executor, numerics=args.numerics)
    except UFormError as error:
        raise UsageError(f"--resume: {error.message}" if resuming else error.message) from None
    if resuming and trainer.data_schedule["corpus_sha256"] != batches.data_schedule()["corpus_sha256"]:
        raise UsageError(f"--resume: the corpus differs from the one the run in {run_dir} trained on")
    start = trainer.step_
    if no_steps_left(run_dir, start, args.steps, resume_from, run_dir / f"model{EXTENSION}"):
        return 0
    write_config(run_dir / CONFIG, options, args)
    metrics = Metrics(run_dir / METRICS, COLUMNS, resumed_at=start if resuming else None)
    print(f"training {DEMO_SHAPE.n_total:,} parameters on {batches.n_windows + DEMO_SHAPE.length:,} bytes of {name} "
          f"({executor}); {'resuming at step ' + str(start) if resuming else 'new run'} in {run_dir}", file=sys.stderr)

    @saved_once
    def save(step: int) -> Path:
        path = checkpoint_path(run_dir, step, EXTENSION)
        trainer.export_checkpoint_binary(path)
        prune_checkpoints(run_dir, EXTENSION, args.keep)
        plot(metrics, run_dir / PLOT, ["loss", "held_out_loss"], None, f"byte language model, {run_dir.name}")
        return path

    began = time.perf_counter()
    tokens = DEMO_SHAPE.batch * DEMO_SHAPE.length
    progress = step_progress(args.steps, start)
    with GracefulStop() as stop:
        step = start
        while step < args.steps and stop.signal is None:
            tick = time.perf_counter()
            loss = trainer.train_step(batches.batch(step))["loss"]
            seconds = time.perf_counter() - tick
            step += 1
            evaluate = held_out is not None and (step == args.steps or falls_on(step, args.eval_every))
            held = held_out_loss(trainer, held_out, args.eval_batches) if evaluate else None
            metrics.add(step=step, loss=loss, bits_per_byte=loss / np.log(2), learning_rate=args.learning_rate,
                        step_seconds=seconds, bytes_per_second=tokens / seconds, held_out_loss=held)
            progress.update()
            progress.set_postfix(loss=f"{loss:.3f}", bits_per_byte=f"{loss / np.log(2):.2f}")
            if held is not None:
                progress.write(f"step {step}: held-out loss {held:.3f} ({held / np.log(2):.2f} bits per byte)",
                               file=sys.stderr)
            save_when_due(progress, step, args, save)
        last, elapsed = close_run(progress, metrics, save, step, began,
                                  run_dir / f"model{EXTENSION}" if step >= args.steps else None)
    status = stopped_early(stop, step, args, last, f"python -m uform.lm --resume {run_dir}")
    if status is not None:
        return status
    lowest = metrics.best("held_out_loss", lowest=True)
    outcome = f"lowest held-out loss {lowest[0]:.3f} at step {lowest[1]}" if lowest else "nothing held out"
    print(f"trained steps {start + 1}–{step} in {elapsed:.1f} s ({(step - start) / elapsed:.2f} steps/s) on "
          f"{executor}; final training loss {metrics.latest('loss'):.3f}, {outcome}")
    print(f"run directory {run_dir}: {CONFIG}, {METRICS}, {PLOT}, model{EXTENSION}, {CHECKPOINTS}/ (the last "
          f"{args.keep} step checkpoints)")
    text = sample(trainer, args.prompt.encode(), args.sample_bytes, args.temperature, args.seed)
    print(f"sample at temperature {args.temperature}:", text.decode("utf-8", "replace"))
    return 0


def main(argv=None) -> None:
    run_command(train, sys.argv[1:] if argv is None else argv, "python -m uform.lm")


if __name__ == "__main__":
    main()
