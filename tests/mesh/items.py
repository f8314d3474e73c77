"""The items the training tests' meshes step over: the world's step, and one process's share of it."""

import numpy as np

import uform

ITEMS = 16   # a step's items in the whole world
ROWS = 8     # the world's rows: one device of 8, two of 4, four of 2
COLUMNS = 32


def world_step(step: int) -> list[bytes]:
    """Step `step`'s texts, the same on every process: lowercase words of 5 to 29 bytes."""
    rng = np.random.default_rng([11, step])
    return [bytes(rng.integers(97, 123, int(rng.integers(5, 30))).astype(np.uint8)) for _ in range(ITEMS)]


def share(step: int, index: int, count: int) -> tuple[list[bytes], uform.Relations]:
    """Process `index` of `count`'s share of step `step`'s items, in order, with its pairs: items 2i and 2i+1
    attract each other (a share always holds whole pairs)."""
    per = ITEMS // count
    texts = world_step(step)[index * per:(index + 1) * per]
    partners = np.arange(per) ^ 1
    return texts, uform.Relations(attract=(np.arange(per + 1), partners))


def trainer(executor, mesh=None, seed: int = 5, hidden: int = 128, rows: int = ROWS,
            columns: int = COLUMNS, items: int = ITEMS) -> uform.Trainer:
    """A tiny JOINT trainer whose world holds `rows` rows and `items` segments however many devices share them."""
    devices = mesh.describe().world_size if mesh is not None else len(executor.devices)
    return uform.Trainer.init_vram(executor, mesh=mesh, depth=1, hidden=hidden, objective=uform.Objective.JOINT,
                                   batch=uform.BatchShape(max_rows_per_device=rows // devices,
                                                          max_segments_per_device=items // devices,
                                                          max_columns_per_row=columns),
                                   schedule=uform.Schedule(steps=20, learning_rate=2e-3), seed=seed)


def train(trainer: uform.Trainer, index: int, count: int, steps: range) -> uform.TrainerStepStats:
    """The given steps over process `index` of `count`'s shares; answers the last step's stats."""
    stats = uform.TrainerStepStats()
    for step in steps:
        texts, pairs = share(step, index, count)
        trainer.step([uform.Modality.TEXT] * len(texts), texts, relations=pairs, stats=stats)
    return stats
