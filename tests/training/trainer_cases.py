"""What several trainer tests share: a tiny run, its texts, and one step through the engine beside the
float64 torch reimplementation (uform.reference.encoder_torch)."""

import numpy as np
import pytest

import uform
from uform.reference import encoder_torch as torch_reference
from uform.training import check_step_inputs, pair_targets

TEXTS = ["a small red panda", "red pandas eat bamboo shoots", "the capital of france", "paris is in france",
         "water boils at one hundred degrees", "steam rises from the kettle", "cats chase mice", "a mouse ran"]
PAIRS = uform.Relations(attract=(np.arange(9), [1, 0, 3, 2, 5, 4, 7, 6]))


def tiny(objective=uform.Objective.JOINT, contrastive=None, steps=100, seed=3, executor=None, **batch):
    shape = dict(max_rows_per_device=3, max_segments_per_device=8, max_columns_per_row=48) | batch
    return uform.Trainer.init_vram(executor or uform.Executor.for_ram(), depth=1, hidden=128, objective=objective,
                                   batch=uform.BatchShape(**shape), contrastive=contrastive,
                                   schedule=uform.Schedule(steps=steps, learning_rate=2e-3), seed=seed)


def engine_and_reference(trainer, relations, groups=None, contents=TEXTS, modalities=None):
    """The engine's loss and flat gradient of one step, and the torch float64 ones, on the same batch."""
    torch = pytest.importorskip("torch")
    run = trainer.run
    modalities = [uform.Modality.TEXT] * len(contents) if modalities is None else modalities
    inputs = check_step_inputs(modalities, contents, relations=relations, temperature_groups=groups,
                               temperature_group_count=run.contrastive.temperature_groups,
                               modalities_enabled=trainer._modalities_enabled())
    batch, packed = trainer.step_batch(inputs, False, 1)
    model = trainer.model
    media_weights = trainer._media_weights()
    losses = model.step_losses(batch, text_weight=run.masking.text_weight, with_gradient=True,
                               media_weights=media_weights)
    gradient = model.gradients.numpy()
    items = packed.item_of_segment
    sign, weight = pair_targets(inputs.relations, len(contents), run.contrastive.negatives,
                                run.contrastive.ambient_repulsion_weight)
    flat = torch.tensor(model.parameters.numpy().astype(np.float64), requires_grad=True)
    as_tensor = lambda a: torch.tensor(np.asarray(a))  # noqa: E731
    reference = torch_reference.step_loss(
        torch, flat, model.registry, hidden=run.hidden, depth=run.depth, tokens=as_tensor(batch.tokens),
        segments=as_tensor(batch.token_segments), positions=as_tensor(batch.positions),
        targets=as_tensor(batch.targets).long(), groups=as_tensor(batch.groups).long(),
        sign=as_tensor(sign[np.ix_(items, items)]).double(), weight=as_tensor(weight[np.ix_(items, items)]).double(),
        widths=run.contrastive.matryoshka_dimensions, form=run.contrastive.pair_loss, objective=run.objective.name,
        text_weight=run.masking.text_weight, media=batch.media, media_weights=media_weights)
    reference["loss"].backward()
    return losses, gradient, reference, flat.grad.numpy()


def assert_gradients_match(trainer, gradient, expected, tolerance=2e-4):
    """Every tensor's engine gradient within `tolerance` of the reference's, relative to its largest entry."""
    floor = 1e-3 * np.abs(expected).max()  # a tensor whose gradient cancels (the bias under RANKED)
    for entry in trainer.model.registry:
        part = slice(entry["offset"], entry["offset"] + entry["size"])
        scale = max(np.abs(expected[part]).max(), floor)
        error = np.abs(gradient[part] - expected[part]).max() / scale
        assert error < tolerance, f"{entry['name']}: relative error {error:.2e}"
