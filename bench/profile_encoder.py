"""Where one step of bench_encoder's model goes: the device's kernels (CUPTI through torch.profiler: each kernel's
own device time, grouped by name), the device's idle time inside the step (the step's wall time minus the union of
its kernels' intervals), the host's time by function (cProfile of the same step, cumulative), and the device's
idle time over four steps of bench_encoder's pipelined loop (two deferred steps in flight) with its longest gaps
between kernels. Run on the GPU machine; --numerics picks the mode. Writes bench/out/profile_encoder.json and
prints the top rows. Figure: bench/RESULTS.md."""

import cProfile
import pstats
import time

import numpy as np

import uform
from bench_encoder import bench_run
from common import arguments, write_results


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs in, seconds out)."""
    total, reach = 0.0, -np.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total * 1e-6


def main():
    args = arguments(__doc__, numerics=True)
    import torch
    from torch.profiler import ProfilerActivity, profile

    g, executor, trainer, items, relations, modalities = bench_run(args.numerics, args.quick)
    device = executor.devices[0]

    def step():
        trainer.step(modalities, items, relations=relations)
        device.synchronize()

    for _ in range(2):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if uform.gpu_count() else [])
    with profile(activities=activities) as trace:
        start = time.perf_counter()
        step()
        wall = time.perf_counter() - start
    kernels: dict[str, list[float]] = {}
    intervals = []
    for event in trace.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            entry = kernels.setdefault(event.name, [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time * 1e-6
            intervals.append((event.time_range.start, event.time_range.end))
    host = cProfile.Profile()
    host.enable()
    step()
    host.disable()
    stats = pstats.Stats(host)
    functions = sorted(((f"{path.split('python/')[-1]}:{line} {name}", entry[3]) for (path, line, name), entry
                        in stats.stats.items()), key=lambda r: -r[1])
    busy = busy_seconds(intervals)
    receiver = trainer.deferred(executor)
    submit = lambda: receiver.step(modalities, items, relations=relations)  # noqa: E731
    in_flight = [submit(), submit()]
    with profile(activities=activities) as trace:
        start = time.perf_counter()
        for _ in range(4):
            in_flight.pop(0).result()
            in_flight.append(submit())
        pipelined_wall = time.perf_counter() - start
    for handle in in_flight:
        handle.result()
    kernels_in_order = sorted((e.time_range.start, e.time_range.end, e.name) for e in trace.events()
                              if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0)
    gaps = sorted(((after[0] - before[1]) * 1e-6, before[2][:60], after[2][:60])
                  for before, after in zip(kernels_in_order, kernels_in_order[1:]))[::-1][:12]
    pipelined_busy = busy_seconds([(start, end) for start, end, _ in kernels_in_order])
    row = {"geometry": g, "numerics": args.numerics, "step_seconds": round(wall, 4),
           "device_busy_seconds": round(busy, 4), "device_idle_seconds": round(wall - busy, 4),
           "pipelined_seconds_per_step": round(pipelined_wall / 4, 4),
           "pipelined_device_idle_seconds_per_step": round((pipelined_wall - pipelined_busy) / 4, 4),
           "pipelined_longest_gaps": [[round(gap, 5), before, after] for gap, before, after in gaps],
           "kernel_seconds": {name: [int(calls), round(seconds, 5)] for name, (calls, seconds)
                              in sorted(kernels.items(), key=lambda r: -r[1][1])},
           "host_cumulative_seconds": {name: round(seconds, 4) for name, seconds in functions[:40]}}
    write_results(args.out, "profile_encoder", [row])


if __name__ == "__main__":
    main()
