"""Where one step of bench_lm's model goes, per shape: the device's kernels over a few replayed steps (CUPTI through
torch.profiler: each kernel's own device time, grouped by name, per step), the device's busy time per step (the
union of its kernels' intervals) against the step's wall time, the step's plan replayed and waited for alone, and
the host's time by function (cProfile of the steps, cumulative). Run on the GPU machine. Writes
bench/out/profile_lm.json and prints the rows. Figure: bench/RESULTS.md."""

import cProfile
import pstats
import time

from bench_lm import benchmarked_shapes, weights_and_batches
from common import arguments, write_results
from profile_encoder import busy_seconds
from uform.lm import LanguageModelTrainer


def main():
    args = arguments(__doc__)
    import torch
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for name, shape in benchmarked_shapes(args.quick):
        weights, batches = weights_and_batches(shape, 20)
        trainer = LanguageModelTrainer(weights, data_schedule={}, shape=shape, executor="gpu:0", resident=True)
        for ids in batches[:5]:
            trainer.train_step(ids)
        steps = 10 if name == "default" else 3
        start = time.perf_counter()
        for ids in batches[:steps]:
            trainer.train_step(ids)
        step_wall = (time.perf_counter() - start) / steps
        model = trainer._model
        plan = model.buffers(shape.batch, shape.length).step
        start = time.perf_counter()
        for _ in range(steps):
            plan.run()
            model.device.synchronize()
        replay_wall = (time.perf_counter() - start) / steps
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
            for ids in batches[:steps]:
                trainer.train_step(ids)
        kernels: dict[str, list[float]] = {}
        intervals = []
        for event in trace.events():
            if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
                entry = kernels.setdefault(event.name[:120], [0, 0.0])
                entry[0] += 1
                entry[1] += event.device_time
                intervals.append((event.time_range.start, event.time_range.end))
        host = cProfile.Profile()
        host.enable()
        for ids in batches[:steps]:
            trainer.train_step(ids)
        host.disable()
        functions = sorted(((f"{path.split('python/')[-1]}:{line} {function}", entry[3] / steps * 1e6)
                            for (path, line, function), entry in pstats.Stats(host).stats.items()),
                           key=lambda r: -r[1])
        rows.append({
            "shape": name, "step_us": round(step_wall * 1e6, 1), "replay_alone_us": round(replay_wall * 1e6, 1),
            "device_busy_us_per_step": round(busy_seconds(intervals) * 1e6 / steps, 1),
            "kernel_launches_per_step": round(sum(c for c, _ in kernels.values()) / steps, 1),
            "kernel_us_per_step": {k: [round(c / steps, 1), round(t / steps, 1)]
                                   for k, (c, t) in sorted(kernels.items(), key=lambda r: -r[1][1])},
            "host_cumulative_us_per_step": {k: round(t, 1) for k, t in functions[:30]},
        })
    write_results(args.out, "profile_lm", rows)
    for row in rows:
        print({k: v for k, v in row.items() if not isinstance(v, dict)})
        for key in ("kernel_us_per_step", "host_cumulative_us_per_step"):
            print(key)
            for k, v in row[key].items():
                print(f"  {v}  {k}")


if __name__ == "__main__":
    main()
