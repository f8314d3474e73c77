"""Language-model training steps per second: the engine's resident session against the same model in
PyTorch (fp32, TF32 off), eager and captured in a CUDA graph, measured in the same run on the GPU.
Every step includes reading the loss back to the host. The engine's figure is its default (steps replayed
from plans: a device graph on a GPU); beside it, its steps replayed as a loop of launches and launched from
Python one by one (UFORM_STEP_PLANS). Figure: bench/RESULTS.md."""

import os
import time

import numpy as np

import uform
from common import arguments, write_results
from uform.lm import LanguageModelConfig, LanguageModelTrainer
from uform.reference.lm_torch import torch_loss

SHAPES = {
    "default": LanguageModelConfig(),
    "large": LanguageModelConfig(batch=32, length=256, width=256, heads=8, kv_heads=4, mlp=512, layers=4),
}


def benchmarked_shapes(quick: bool) -> list:
    """(name, shape) of the benchmarked shapes; --quick leaves the large one out."""
    return [(name, shape) for name, shape in SHAPES.items() if not (quick and name == "large")]


def weights_and_batches(shape, count: int):
    """A run's initial weights and `count` batches of random bytes, from one seed (every script draws the same)."""
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal(shape.n_total) * 0.02).astype(np.float32)
    return weights, [rng.integers(0, 256, (shape.batch, shape.length + 1), dtype=np.int32) for _ in range(count)]


def steps_per_second(step, batches, repeats=3) -> float:
    """Median over `repeats` of len(batches) timed steps, after a warm-up pass."""
    for ids in batches[:3]:
        step(ids)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for ids in batches:
            step(ids)
        rates.append(len(batches) / (time.perf_counter() - start))
    return float(np.median(rates))


def torch_steps(shape, weights, batches, graphed: bool) -> float:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    flat = torch.tensor(weights, device="cuda", requires_grad=True)
    optimizer = torch.optim.AdamW([flat], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                  capturable=graphed)
    device_batches = [torch.from_numpy(ids.astype(np.int64)).cuda() for ids in batches]

    def step_on(ids):
        optimizer.zero_grad(set_to_none=False)
        loss = torch_loss(torch, flat, ids, shape)
        loss.backward()
        optimizer.step()
        return loss

    if not graphed:
        return steps_per_second(lambda ids: step_on(ids).item(), device_batches)
    static_ids = device_batches[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step_on(static_ids)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step_on(static_ids)

    def replay(ids):
        static_ids.copy_(ids)
        graph.replay()
        return static_loss.item()

    return steps_per_second(replay, device_batches)


def main():
    args = arguments(__doc__)
    rows = []
    for name, shape in benchmarked_shapes(args.quick):
        weights, batches = weights_and_batches(shape, 50 if name == "default" else 10)
        # The large shape is a GPU figure; on the CPU it would take minutes.
        executors = (["cpu"] if name == "default" else []) + (["gpu:0"] if uform.gpu_count() else [])
        for executor in executors:
            row = {"shape": name, "device": executor}
            chosen = os.environ.get("UFORM_STEP_PLANS")
            for plans, column in (("graph", "uform_steps_per_s"), ("loop", "uform_loop_steps_per_s"),
                                  ("off", "uform_unplanned_steps_per_s")):
                os.environ["UFORM_STEP_PLANS"] = plans
                trainer = LanguageModelTrainer(weights, data_schedule={}, shape=shape, executor=executor,
                                               resident=True)
                row[column] = round(steps_per_second(lambda ids: trainer.train_step(ids)["loss"], batches), 2)
            if chosen is None:
                os.environ.pop("UFORM_STEP_PLANS")
            else:
                os.environ["UFORM_STEP_PLANS"] = chosen
            if executor != "cpu":
                eager = torch_steps(shape, weights, batches, graphed=False)
                graphed = torch_steps(shape, weights, batches, graphed=True)
                row.update(torch_eager_steps_per_s=round(eager, 2), torch_graph_steps_per_s=round(graphed, 2),
                           ratio_vs_eager=round(row["uform_steps_per_s"] / eager, 3),
                           ratio_vs_graph=round(row["uform_steps_per_s"] / graphed, 3))
            rows.append(row)
    write_results(args.out, "lm", rows)


if __name__ == "__main__":
    main()
