"""What an image tower learns: a small image-caption task (uform.datasets.blocks, a coloured block in one of four
corners) that a mean over patches can only solve knowing where each patch lies. uform's Trainer must reach the
accuracy of an independent PyTorch CLIP-style tower of the same size and budget (uform.reference.clip_torch).

Before media tokens carried their absolute position and a media segment pooled its shown tokens alone, the same
runs reached 0.56 (CONTRASTIVE) and 0.04 (JOINT) after 600 steps: the images' embeddings nearly one vector."""

import numpy as np
import pytest

import uform
from uform.datasets.blocks import CAPTIONS, block_images
from uform.pairs import pair_relations

M = uform.Modality
PAIRS = 16
TRAINING = block_images(2000, seed=1)
HELD_OUT = block_images(300, seed=2)


def step_pairs(step: int) -> tuple[list[bytes], list[int]]:
    picked = np.random.default_rng([7, step]).choice(len(TRAINING[0]), PAIRS, replace=False)
    return [TRAINING[0][i] for i in picked], [int(TRAINING[1][i]) for i in picked]


def accuracy(images: np.ndarray, captions: np.ndarray) -> float:
    """Held-out zero-shot accuracy: each image's most similar of the 32 captions is its own."""
    return float(np.mean(np.argmax(images @ captions.T, axis=1) == HELD_OUT[1]))


def uform_accuracy(objective, steps: int, masking=None) -> tuple[float, float]:
    """(accuracy, the mean cosine between different held-out images) after `steps` steps."""
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=2, hidden=128, objective=objective, masking=masking,
        batch=uform.BatchShape(max_rows_per_device=PAIRS, max_segments_per_device=2 * PAIRS, max_columns_per_row=64,
                               image=uform.ImageShape(patch_side=8)),
        contrastive=uform.Contrastive(max_edges_per_device=4 * PAIRS * PAIRS),
        schedule=uform.Schedule(steps=steps), seed=0)
    for step in range(1, steps + 1):
        images, labels = step_pairs(step)
        trainer.step([M.IMAGE] * PAIRS + [M.TEXT] * PAIRS, images + [CAPTIONS[label] for label in labels],
                     relations=pair_relations(labels))
    images = trainer.encode([M.IMAGE] * len(HELD_OUT[0]), HELD_OUT[0])
    similar = images @ images.T
    spread = (similar.sum() - np.trace(similar)) / (len(images) * (len(images) - 1))
    return accuracy(images, trainer.encode([M.TEXT] * len(CAPTIONS), list(CAPTIONS))), float(spread)


def test_the_pytorch_peer_learns_the_task():
    torch = pytest.importorskip("torch")
    from uform.reference.clip_torch import PairTrainer, TowerShape

    torch.set_num_threads(1)
    peer = PairTrainer(torch, TowerShape(depth=2, width=128, max_bytes=64, patch_side=8, max_patches=16), "image",
                       steps=400)
    for step in range(1, 401):
        images, labels = step_pairs(step)
        labels = np.asarray(labels)
        peer.step(images, [CAPTIONS[label] for label in labels], same=labels[:, None] == labels[None, :])
    assert accuracy(peer.encode(HELD_OUT[0], "query"), peer.encode(list(CAPTIONS), "document")) >= 0.9


def test_a_contrastive_image_tower_learns_where_and_what():
    score, spread = uform_accuracy(uform.Objective.CONTRASTIVE, steps=300)
    assert score >= 0.9 and spread < 0.2


def test_a_joint_image_tower_learns_through_its_masks():
    score, spread = uform_accuracy(uform.Objective.JOINT, steps=400, masking=uform.Masking(image_mask_ratio=0.5))
    assert score >= 0.9 and spread < 0.5
