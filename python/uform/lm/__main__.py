"""Train the byte language model on text every Python install has, then sample from it.

    python -m uform.lm                      # the standard library's own sources, on the default device
    python -m uform.lm --corpus notes.txt --steps 2000 --device gpu:0 --checkpoint lm.uformlm

Shows a progress bar with the loss, saves a binary checkpoint, and prints the
greedy continuation of a prompt (``next_bytes``, one byte at a time).
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..executor import default_executor, executor_from
from .config import LanguageModelConfig, parameter_registry
from .corpus import TokenBatches
from .trainer import LanguageModelTrainer

DEMO_SHAPE = LanguageModelConfig(batch=8, length=64, width=64, heads=4, kv_heads=2, mlp=128, layers=2)
STDLIB_MODULES = ("argparse.py", "json/decoder.py", "textwrap.py", "functools.py", "pathlib.py", "dataclasses.py")


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


def sample(trainer: LanguageModelTrainer, prompt: bytes, count: int) -> bytes:
    window = trainer.run_metadata()["config"]["length"]
    text = bytearray(prompt)
    for _ in range(count):
        ids = np.frombuffer(bytes(text[-window:]), np.uint8).astype(np.int32)[None, :]
        text.append(trainer.next_bytes(ids)[0])
    return bytes(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, help="a text file (default: standard-library sources)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="cpu or gpu:N (default: the first GPU, else the CPU)")
    parser.add_argument("--checkpoint", type=Path, default=Path("lm-demo.uformlm"))
    parser.add_argument("--prompt", default="def ")
    args = parser.parse_args(argv)

    if args.corpus:
        data, name = args.corpus.read_bytes(), args.corpus.name
    else:
        data, name = standard_library_corpus()
    batches = TokenBatches(data, batch=DEMO_SHAPE.batch, length=DEMO_SHAPE.length, seed=args.seed, name=name,
                           steps=args.steps)
    executor = executor_from(args.device) if args.device else default_executor()
    trainer = LanguageModelTrainer(initial_parameters(DEMO_SHAPE, args.seed), data_schedule=batches.data_schedule(),
                                   lr=args.lr, shape=DEMO_SHAPE, executor=executor)
    print(f"training {DEMO_SHAPE.n_total:,} parameters on {len(data):,} bytes of {name} ({executor})")
    progress = tqdm(range(args.steps), unit="step")
    for step in progress:
        loss = trainer.train_step(batches.batch(step))["loss"]
        progress.set_postfix(loss=f"{loss:.3f}", bits_per_byte=f"{loss / np.log(2):.2f}")
    digest = trainer.export_checkpoint_binary(args.checkpoint)
    print(f"saved {args.checkpoint} (sha256 {digest[:16]}…)")
    print("sample:", sample(trainer, args.prompt.encode(), 120).decode("utf-8", "replace"))


if __name__ == "__main__":
    main()
