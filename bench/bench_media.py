"""Image-caption training throughput: uform.Trainer (JOINT) on 224×224 JPEG images cut into 16-pixel
patches (196 a picture) beside their captions, 64 rows × 1024 positions, depth 12, hidden 768; and the
host's decode throughput (JPEG bytes → patches and targets) on one thread and on the trainer's decode
pool. Each step's time includes decoding its images. Figure: bench/RESULTS.md."""

import io
import os
import time

import numpy as np
from PIL import Image

import uform
from common import arguments, median_seconds, write_results
from uform.media import DecodePool
from uform.media.shapes import all_scenes
from uform.training.media_step import prepare_items

GEOMETRY = dict(depth=12, hidden=768, rows=64, columns=1024, side=224, patch=16, pairs=256)
QUICK = dict(depth=2, hidden=128, rows=8, columns=256, side=64, patch=16, pairs=16)


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


def main():
    args = arguments(__doc__)
    g = QUICK if args.quick or not uform.gpu_count() else GEOMETRY
    executor = uform.Executor.for_vram([0]) if uform.gpu_count() else uform.Executor.for_ram()
    device = executor.devices[0]
    batch = uform.BatchShape(max_rows_per_device=g["rows"], max_segments_per_device=2 * g["pairs"],
                             max_columns_per_row=g["columns"], image=uform.ImageShape(patch_side=g["patch"]))
    trainer = uform.Trainer.init_vram(executor, depth=g["depth"], hidden=g["hidden"],
                                      objective=uform.Objective.JOINT, batch=batch,
                                      schedule=uform.Schedule(steps=1000), seed=0)
    images, captions = captioned_jpegs(g["pairs"], g["side"])
    n = len(images)
    modalities = [uform.Modality.IMAGE] * n + [uform.Modality.TEXT] * n
    contents = images + captions
    relations = uform.Relations(attract=(np.arange(2 * n + 1), list(range(n, 2 * n)) + list(range(n))))
    stats = uform.TrainerStepStats()

    def step():
        trainer.step(modalities, contents, relations=relations, stats=stats)

    median = median_seconds(step, device.synchronize, warmup=1, repeats=3)  # buffers are made on the first step

    derived = trainer.run.batch
    image_kinds = np.full(n, uform.Modality.IMAGE)
    decode = {}
    for workers in (1, min(4, os.cpu_count() or 1)):
        with DecodePool(workers) as pool:
            prepare_items(image_kinds, images, derived, pool)
            start = time.perf_counter()
            for _ in range(3):
                prepare_items(image_kinds, images, derived, pool)
            decode[workers] = 3 * n / (time.perf_counter() - start)

    positions = g["rows"] * g["columns"]
    write_results(args.out, "media", [{
        "geometry": g, "images_per_step": n, "dropped": stats.dropped, "seconds_per_step": round(median, 3),
        "positions_per_s": round(positions / median, 1), "images_per_s": round(n / median, 1),
        "decode_images_per_s": {f"{workers} threads": round(rate, 1) for workers, rate in decode.items()},
        "loss": round(stats.loss, 4), "masked_image_loss": round(stats.masked_image_loss, 4),
    }])


if __name__ == "__main__":
    main()
