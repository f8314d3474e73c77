"""What several trainer tests share: a tiny run, its texts, and one step through the engine beside the
float64 torch reimplementation (uform.reference.encoder_torch)."""

import numpy as np
import pytest

import uform
from uform.reference import encoder_torch as torch_reference
from uform.training import check_step_inputs, pair_targets
from uform.training.vocabulary import MASK

TEXTS = ["a small red panda", "red pandas eat bamboo shoots", "the capital of france", "paris is in france",
         "water boils at one hundred degrees", "steam rises from the kettle", "cats chase mice", "a mouse ran"]
PAIRS = uform.Relations(attract=(np.arange(9), [1, 0, 3, 2, 5, 4, 7, 6]))


def tiny(objective=uform.Objective.JOINT, contrastive=None, steps=100, seed=3, executor=None, late_interaction=None,
         choices=None, hidden=128, **batch):
    shape = dict(max_rows_per_device=3, max_segments_per_device=8, max_columns_per_row=48) | batch
    return uform.Trainer.init_vram(executor or uform.Executor.for_ram(), depth=1, hidden=hidden, objective=objective,
                                   batch=uform.BatchShape(**shape), contrastive=contrastive,
                                   late_interaction=late_interaction, choices=choices,
                                   schedule=uform.Schedule(steps=steps, learning_rate=2e-3), seed=seed)


def segment_rows(packed, segment, first=None):
    """The flat token indices of a packed segment's positions (its first `first` of them)."""
    begin = int(packed.segment_row[segment]) * packed.tokens.shape[1] + int(packed.segment_start[segment])
    length = int(packed.segment_length[segment])
    return list(range(begin, begin + (length if first is None else min(first, length))))


def engine_and_reference(trainer, relations, groups=None, contents=TEXTS, modalities=None, sides=None, choices=None,
                         choice_targets=None):
    """The engine's loss and flat gradient of one step, and the torch float64 ones, on the same batch."""
    torch = pytest.importorskip("torch")
    run = trainer.run
    modalities = [uform.Modality.TEXT] * len(contents) if modalities is None else modalities
    inputs = check_step_inputs(modalities, contents, relations=relations, temperature_groups=groups, sides=sides,
                               choices=choices, choice_targets=choice_targets,
                               temperature_group_count=run.contrastive.temperature_groups,
                               max_choices_per_item=run.batch.max_choices_per_item,
                               modalities_enabled=trainer._modalities_enabled())
    batch, packed = trainer.step_batch(inputs, False, 1)
    model = trainer.model
    media_weights = trainer._media_weights()
    losses = model.step_losses(batch, text_weight=run.masking.text_weight, with_gradient=True,
                               media_weights=media_weights, late_weight=run.late_interaction.weight,
                               choices_weight=run.choices.weight)
    gradient = model.gradients.numpy()
    items = packed.item_of_segment
    sign, weight = pair_targets(inputs.relations, len(contents), run.contrastive.negatives,
                                run.contrastive.ambient_repulsion_weight)
    late = None
    if run.late_interaction.weight > 0:
        side = inputs.sides[items]
        late = dict(query_rows=[segment_rows(packed, s, run.late_interaction.max_query_span) if side[s] & 1 else []
                                for s in range(len(items))],
                    document_rows=[segment_rows(packed, s) if side[s] & 2 else [] for s in range(len(items))],
                    sign=sign[np.ix_(items, items)], weight=weight[np.ix_(items, items)].astype(np.float64),
                    form=run.late_interaction.pair_loss, loss_weight=run.late_interaction.weight)
    chosen = None
    if run.choices.weight > 0:
        offsets = inputs.choice_offsets.astype(np.int64)
        choosing = [s for s, item in enumerate(items) if offsets[item + 1] > offsets[item]]
        positions = [segment_rows(packed, s)[-1] for s in choosing]
        assert all(batch.tokens.reshape(-1)[p] == MASK for p in positions)
        ranges = [range(offsets[items[s]], offsets[items[s] + 1]) for s in choosing]
        chosen = dict(positions=positions, offsets=np.concatenate([[0], np.cumsum([len(r) for r in ranges])]),
                      legal=np.concatenate([inputs.choice_bytes[list(r)] for r in ranges]) if ranges else [],
                      targets=np.concatenate([inputs.choice_targets[list(r)] for r in ranges]) if ranges else [],
                      loss_weight=run.choices.weight)
    flat = torch.tensor(model.parameters.numpy().astype(np.float64), requires_grad=True)
    as_tensor = lambda a: torch.tensor(np.asarray(a))  # noqa: E731
    reference = torch_reference.step_loss(
        torch, flat, model.registry, hidden=run.hidden, depth=run.depth, tokens=as_tensor(batch.tokens),
        segments=as_tensor(batch.token_segments), positions=as_tensor(batch.positions),
        targets=as_tensor(batch.targets).long(), groups=as_tensor(batch.groups).long(),
        sign=as_tensor(sign[np.ix_(items, items)]).double(), weight=as_tensor(weight[np.ix_(items, items)]).double(),
        widths=run.contrastive.matryoshka_dimensions, form=run.contrastive.pair_loss, objective=run.objective.name,
        text_weight=run.masking.text_weight, media=batch.media, media_weights=media_weights, late=late, choices=chosen)
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
