"""Media throughput: what the host spends on a step's images, and how busy that leaves the device.

Three parts, each a row of bench/RESULTS.md's media figures:

1. host: for the shapes demo's images (64×64 PNG, 8-pixel patches, 128 pairs a step) and for
   ImageNet-sized ones (224×224 JPEG, 16-pixel patches, 64 pairs), images/s on one host core for
   Pillow's own decode (open, RGBA, to numpy: the floor any decoder in Python meets) beside uform's
   whole item path (decode, patches, positions) on one thread, on a pool of threads and on the
   trainers' pool of processes, with the CPU time each leaves in this process (the interpreter that
   also launches the kernels), and the milliseconds a step's packing takes once its items are
   prepared (masks, position features, pixels converted: ``Trainer.step_batch``). Medians of 5 rounds.
2. demo (a GPU): ``python -m uform train --data shapes`` as it ships (depth 4, hidden 256, 128 pairs a
   step, deferred steps two in flight), 600 steps, 3 runs: steps/s and the device's busy share, nvidia-smi's
   utilization sampled every 100 ms over the run's middle.
3. training (a GPU): one JOINT step of 256 captioned 224×224 JPEGs at depth 12, hidden 768, decoding
   included.
"""

import io
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from PIL import Image

import uform
from common import arguments, median_seconds, write_results
from uform.media import DecodePool, shared_pool
from uform.pairs import pair_relations
from uform.datasets.shapes import all_scenes, shape_pairs
from uform.training.media_step import PreparedMedia, prepare_item, submit_items

TRAINING = dict(depth=12, hidden=768, rows=64, columns=1024, side=224, patch=16, pairs=256)
QUICK_TRAINING = dict(depth=2, hidden=128, rows=8, columns=256, side=64, patch=16, pairs=16)
DEMO_STEPS = 600


def captioned_jpegs(count: int, side: int) -> tuple[list[bytes], list[str]]:
    """`count` shape scenes drawn at `side` pixels, saved as JPEG (quality 90), with their captions."""
    scenes = all_scenes()
    images, captions = [], []
    for k in range(count):
        scene = scenes[k * 7 % len(scenes)]
        out = io.BytesIO()
        Image.open(io.BytesIO(scene.render(side))).convert("RGB").save(out, "JPEG", quality=90)
        images.append(out.getvalue())
        captions.append(scene.caption)
    return images, captions


def rate(run, count: int) -> float:
    """Items per second of run() over `count` items: the median of 5 rounds after one warm-up."""
    return count / median_seconds(run, lambda: None, warmup=1, repeats=5)


def host_row(name: str, images: list[bytes], captions: list[str], patch: int, columns: int) -> dict:
    """Part 1 for one image set."""
    n = len(images)
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.CONTRASTIVE,
        batch=uform.BatchShape(max_rows_per_device=n, max_segments_per_device=2 * n, max_columns_per_row=columns,
                               image=uform.ImageShape(patch_side=patch)),
        contrastive=uform.Contrastive(max_edges_per_device=4 * n * n), schedule=uform.Schedule(steps=10))
    modalities = [uform.Modality.IMAGE] * n + [uform.Modality.TEXT] * n
    inputs = trainer._checked_inputs(modalities, images + captions, relations=pair_relations(captions))
    shape = trainer.run.batch
    kinds = inputs.modalities

    def pillow():
        for data in images:
            np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))

    def one_thread():
        return {i: prepare_item(int(kinds[i]), images[i], i, batch=shape) for i in range(n)}

    row = {"images": name, "pairs_per_step": n, "host_cores": os.cpu_count(),
           "pillow_decode_images_per_s_one_core": round(rate(pillow, n), 1),
           "uform_prepare_images_per_s_one_thread": round(rate(one_thread, n), 1)}
    with DecodePool() as threads:
        for label, pool in ((f"{threads.workers}_threads", threads), (f"{shared_pool().workers}_processes",
                                                                      shared_pool())):
            def decode():
                submit_items(kinds, inputs.contents, shape, pool).result()
            row[f"uform_prepare_images_per_s_{label}"] = round(rate(decode, n), 1)
            seconds = median_seconds(decode, lambda: None, warmup=1, repeats=5, clock=time.process_time)
            row[f"this_process_cpu_ms_per_step_{label}"] = round(1e3 * seconds, 2)
    prepared = PreparedMedia(one_thread())
    row["packing_ms_per_step_items_prepared"] = round(1e3 / rate(
        lambda: trainer.step_batch(inputs, False, 1, decoded=prepared), 1), 2)
    trainer.close()
    return row


def utilization(samples: list[int], stop: threading.Event) -> None:
    """nvidia-smi's utilization.gpu every 100 ms into `samples` until `stop`."""
    with subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                           "-lms", "100", "-i", "0"], stdout=subprocess.PIPE, text=True) as smi:
        for line in smi.stdout:
            if stop.is_set():
                smi.terminate()
                break
            if line.strip().isdigit():
                samples.append(int(line))


def demo_row(runs: int = 3) -> dict:
    """Part 2: the shapes demo as it ships."""
    rates, busy = [], []
    for _ in range(runs):
        samples, stop = [], threading.Event()
        sampler = threading.Thread(target=utilization, args=(samples, stop))
        sampler.start()
        with tempfile.TemporaryDirectory() as run_dir:
            done = subprocess.run([sys.executable, "-m", "uform", "train", "--data", "shapes", "--steps",
                                   str(DEMO_STEPS), "--held-out", "0", "--save-every", "0", "--run-dir",
                                   f"{run_dir}/run"], capture_output=True, text=True, check=True)
        stop.set()
        sampler.join()
        last = done.stdout.strip().splitlines()[-2]  # "trained steps 1–600 in 62.1 s (9.66 steps/s) on ..."
        rates.append(float(last.split("(")[1].split()[0]))
        middle = samples[len(samples) // 5:-len(samples) // 5 or None]  # the model's build and the save left out
        busy.append(statistics.mean(middle) if middle else float("nan"))
    return {"demo": f"python -m uform train --data shapes --steps {DEMO_STEPS} --held-out 0",
            "steps_per_s": round(statistics.median(rates), 2), "steps_per_s_runs": rates,
            "images_per_s": round(128 * statistics.median(rates), 1),
            "device_busy_percent": round(statistics.median(busy), 1), "device_busy_percent_runs": busy}


def training_row(g: dict) -> dict:
    """Part 3: one JOINT step of captioned JPEGs, decoding included."""
    executor = uform.Executor.for_vram([0]) if uform.gpu_count() else uform.Executor.for_ram()
    batch = uform.BatchShape(max_rows_per_device=g["rows"], max_segments_per_device=2 * g["pairs"],
                             max_columns_per_row=g["columns"], image=uform.ImageShape(patch_side=g["patch"]))
    trainer = uform.Trainer.init_vram(executor, depth=g["depth"], hidden=g["hidden"],
                                      objective=uform.Objective.JOINT, batch=batch,
                                      schedule=uform.Schedule(steps=1000), seed=0)
    images, captions = captioned_jpegs(g["pairs"], g["side"])
    n = len(images)
    modalities = [uform.Modality.IMAGE] * n + [uform.Modality.TEXT] * n
    relations = pair_relations(captions)
    stats = uform.TrainerStepStats()
    median = median_seconds(lambda: trainer.step(modalities, images + captions, relations=relations, stats=stats),
                            executor.devices[0].synchronize, warmup=1, repeats=3)  # buffers are made on the first
    trainer.close()
    return {"training": g, "dropped": stats.dropped, "seconds_per_step": round(median, 3),
            "images_per_s": round(n / median, 1), "loss": round(stats.loss, 4),
            "masked_image_loss": round(stats.masked_image_loss, 4)}


def main():
    args = arguments(__doc__)
    shapes = shape_pairs(128, seed=0)
    jpegs = captioned_jpegs(64, 224)
    rows = [host_row("shapes demo: 64×64 PNG, patches of 8", [p[0] for p in shapes], [p[1] for p in shapes], 8, 128),
            host_row("224×224 JPEG, patches of 16", *jpegs, 16, 256)]
    if uform.gpu_count() and not args.quick:
        rows += [demo_row(), training_row(TRAINING)]
    elif args.quick:
        rows.append(training_row(QUICK_TRAINING))
    write_results(args.out, "media", rows)


if __name__ == "__main__":
    main()
