"""Text-encoder training throughput: uform.Trainer (JOINT) against the same tower and losses in PyTorch
(SDPA with the segment mask, autograd, AdamW), measured in the same run on the GPU, with each side's peak
device memory. --numerics identical (default): PyTorch in fp32 with TF32 off. --numerics fast: uform's fast
mode against PyTorch under torch.autocast(bfloat16), eager and with its loss under torch.compile (default
mode; a compile that fails is recorded with its error), with the model FLOP utilisation of each (the FLOPs of
the blocks' GEMMs and of attention over the packed spans, forward and backward: 3× the forward's, against
the H200's 790 TFLOP/s dense bf16). uform's step is timed twice: blocking (the host packs and corrupts the
batch, then the device runs it) and pipelined (two deferred steps in flight, so the next batch is prepared while
the device runs: ``pipelined_seconds``). Figure: bench/RESULTS.md."""

import sysconfig
import time
from pathlib import Path

import numpy as np

import uform
from common import arguments, median_seconds, write_results
from uform.reference import encoder_torch
from uform.training import check_step_inputs

GEOMETRY = dict(depth=12, hidden=768, rows=64, columns=1024, segments=256)
QUICK = dict(depth=2, hidden=128, rows=8, columns=256, segments=32)


def corpus_items(count: int, seed: int) -> list[bytes]:
    """Slices of 64–512 bytes of the standard library's sources: real text of varied lengths."""
    root = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join((root / name).read_bytes() for name in ("argparse.py", "textwrap.py", "functools.py"))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(64, 513, count)
    starts = rng.integers(0, len(data) - 513, count)
    return [data[s:s + n] for s, n in zip(starts, lengths)]


H200_BF16_FLOPS = 790e12  # dense bf16 ceiling measured on the H200 (8192³ products through PyTorch)


def step_flops(run, segment_lengths: np.ndarray, tokens: int) -> float:
    """Useful FLOPs of one training step of the tower: per layer 12·hidden² multiply-adds a token in the GEMMs
    (q, k, v, o and the 4× MLP), and 2·hidden per (query, key) pair of a span in attention; ×2 for FLOPs,
    ×3 for forward and backward."""
    h, layers = run.hidden, run.depth
    pairs = float(np.sum(segment_lengths.astype(np.float64) ** 2))
    return 3 * 2 * layers * (12 * h * h * tokens + 2 * h * pairs)


def bench_run(numerics: str, quick: bool):
    """The benchmarked run: its geometry, executor, trainer, and one step's items, relations and modalities (each
    item attracted to its neighbour)."""
    g = QUICK if quick or not uform.gpu_count() else GEOMETRY
    executor = uform.Executor.for_vram([0]) if uform.gpu_count() else uform.Executor.for_ram()
    trainer = uform.Trainer.init_vram(
        executor, depth=g["depth"], hidden=g["hidden"], objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=g["rows"], max_segments_per_device=g["segments"],
                               max_columns_per_row=g["columns"]),
        schedule=uform.Schedule(steps=1000), seed=0, numerics=numerics)
    items = corpus_items(g["segments"], seed=1)
    relations = uform.Relations(attract=(np.arange(len(items) + 1), np.arange(len(items)) ^ 1))
    return g, executor, trainer, items, relations, [uform.Modality.TEXT] * len(items)


def main():
    args = arguments(__doc__, numerics=True,
                     flags=(("--no-compile", "skip the torch.compile peer (a minute of compiling)"),))
    g, executor, trainer, items, relations, modalities = bench_run(args.numerics, args.quick)
    device = executor.devices[0]
    stats = uform.TrainerStepStats()

    def ours():
        trainer.step(modalities, items, relations=relations, stats=stats)

    seconds = median_seconds(ours, device.synchronize, warmup=1, repeats=3)  # buffers are made on the first step
    pipelined = pipelined_seconds(trainer, executor, modalities, items, relations, stats)
    with uform.kernels.profile() as kernels:
        ours()
    breakdown = sorted(((name, calls, seconds) for name, (calls, seconds) in kernels.items()), key=lambda r: -r[2])
    positions = g["rows"] * g["columns"]
    packed = trainer.step_batch(check_step_inputs(modalities, items, relations=relations), False, 1)[1]
    flops = step_flops(trainer.run, packed.segment_length, int(np.count_nonzero(packed.segment_ids >= 0)))
    row = {"geometry": g, "numerics": args.numerics, "packed_tokens": int(np.count_nonzero(packed.segment_ids >= 0)),
        "model_tflop_per_step": round(flops / 1e12, 2),
        "uform_seconds_per_step": round(seconds, 3), "uform_pipelined_seconds_per_step": round(pipelined, 3),
        "uform_mfu": round(flops / seconds / H200_BF16_FLOPS, 3),
        "uform_positions_per_s": round(positions / seconds, 1),
        "uform_peak_bytes": device.peak_bytes,
        "uform_kernel_seconds": {name: [calls, round(seconds, 4)] for name, calls, seconds in breakdown}}
    if uform.gpu_count():
        fast = args.numerics == "fast"
        row.update(torch_peer(trainer, items, relations, g, positions, autocast=fast))
        row["torch_mfu"] = round(flops / row["torch_seconds_per_step"] / H200_BF16_FLOPS, 3)
        row["ratio"] = round(row["torch_seconds_per_step"] / seconds, 3)
        row["pipelined_ratio"] = round(row["torch_seconds_per_step"] / pipelined, 3)
        if fast and not args.no_compile:
            try:
                compiled = torch_peer(trainer, items, relations, g, positions, autocast=True, compile=True)
            except Exception as error:  # the compiler's failure is a result to record, not a reason to stop
                row["torch_compile_error"] = f"{type(error).__name__}: {error}"[:2000]
            else:
                row.update({f"torch_compile_{key[len('torch_'):]}": value for key, value in compiled.items()})
                row["torch_compile_mfu"] = round(flops / compiled["torch_seconds_per_step"] / H200_BF16_FLOPS, 3)
                row["ratio_to_compile"] = round(compiled["torch_seconds_per_step"] / seconds, 3)
                row["pipelined_ratio_to_compile"] = round(compiled["torch_seconds_per_step"] / pipelined, 3)
    write_results(args.out, "encoder", [row])


def pipelined_seconds(trainer, executor, modalities, items, relations, stats, steps: int = 8) -> float:
    """Seconds a step of a training loop that keeps two deferred steps in flight (``trainer.deferred``): each
    step's batch is packed and corrupted on the host while the one before runs on the device, as a PyTorch
    loop's DataLoader workers prepare batches (the PyTorch peer's batch is built once, outside its timing)."""
    receiver = trainer.deferred(executor)

    def submit():
        return receiver.step(modalities, items, relations=relations, stats=stats)

    def run() -> float:
        in_flight = [submit(), submit()]
        start = time.perf_counter()
        for _ in range(steps):
            in_flight.pop(0).result()
            in_flight.append(submit())
        elapsed = time.perf_counter() - start
        for handle in in_flight:
            handle.result()
        return elapsed / steps

    run()
    return float(np.median([run() for _ in range(3)]))


def torch_peer(trainer, items, relations, g, positions, *, autocast: bool, compile: bool = False) -> dict:
    """PyTorch's step time, positions per second and peak memory (compile: the loss under torch.compile, its
    compilation in the first, untimed steps)."""
    import contextlib

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    run = trainer.run
    inputs = check_step_inputs([uform.Modality.TEXT] * len(items), items, relations=relations)
    batch, packed = trainer.step_batch(inputs, False, 1)
    from uform.training import pair_targets

    sign, weight = pair_targets(inputs.relations, len(items), run.contrastive.negatives,
                                run.contrastive.ambient_repulsion_weight)
    chosen = np.ix_(packed.item_of_segment, packed.item_of_segment)
    cuda = lambda a, dtype=None: torch.tensor(np.asarray(a), device="cuda", dtype=dtype)  # noqa: E731
    flat = torch.tensor(trainer.model.parameters.numpy(), device="cuda", requires_grad=True)
    optimizer = torch.optim.AdamW([flat], lr=1e-4)
    tensors = dict(tokens=cuda(batch.tokens, torch.long), segments=cuda(batch.token_segments, torch.long),
                   positions=cuda(batch.positions, torch.long), targets=cuda(batch.targets, torch.long),
                   groups=cuda(batch.groups, torch.long), sign=cuda(sign[chosen], torch.float32),
                   weight=cuda(weight[chosen], torch.float32))

    def loss_of(parameters):
        return encoder_torch.step_loss(torch, parameters, trainer.model.registry, hidden=run.hidden, depth=run.depth,
                                       widths=(), form="sigmoid", objective="joint", text_weight=1.0,
                                       **tensors)["loss"]

    loss_fn = torch.compile(loss_of) if compile else loss_of

    def step():
        optimizer.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            loss = loss_fn(flat)
        loss.backward()
        optimizer.step()
        loss.item()

    for _ in range(3 if compile else 1):
        step()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    return {"torch_seconds_per_step": round(seconds, 3), "torch_positions_per_s": round(positions / seconds, 1),
            "torch_peak_bytes": int(torch.cuda.max_memory_allocated())}


if __name__ == "__main__":
    main()
