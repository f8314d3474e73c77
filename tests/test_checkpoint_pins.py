"""Pins of both trainers' numerics: a fixed small CPU run of each, and the SHA-256 of what it saves.

The digests were first recorded on the code of 6fd5b48, before the resident-state refactor (issue 17), on the
CPU engine, and re-recorded when attention took its block-canonical order (issue 13: blocks of 64 keys
from each span's start, an online softmax per block) and when the encoder's sums over tokens took one partial
per packed row combined by the row tree (issue 15: split-independent reductions; the LM's unchanged), and when
text corruption's draws became Philox words for every segment at once (issue 13: the host's step time; the
encoder's only, as the run masks text). They must
never change without a numerics change: a
refactor that moves a launch, splits an AdamW run differently or reorders a reduction shows up here as a
different digest. The LM digests
cover the whole files, so a change of either checkpoint format shows up too.
"""

import hashlib

import numpy as np

import uform
from uform.lm import LanguageModelConfig, LanguageModelTrainer

ENCODER_TENSORS_SHA256 = "1092edc3e11c4afc4effecb195ec3b93bf62cb8ca11aacf6cf81a17312b8109b"
LM_JSON_SHA256 = "bb610ae455d87e83770cdf4816403f43ef95d6110f08c63c858af0246906ceee"
LM_BINARY_SHA256 = "c2279c926dfda26efcc39ba9cd03b86add99dcb9bdea5d8707e5163b5d188b62"

TEXTS = ["a small red panda", "red pandas eat bamboo shoots", "the capital of france", "paris is in france",
         "water boils at one hundred degrees", "steam rises from the kettle", "cats chase mice", "a mouse ran"]


def tensors_sha256(path) -> str:
    """SHA-256 over every tensor of a safetensors file: its name, then its bytes, in name order."""
    from safetensors.numpy import load_file

    digest = hashlib.sha256()
    for name, tensor in sorted(load_file(path).items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(tensor).tobytes())
    return digest.hexdigest()


def test_encoder_joint_run_checkpoint_is_pinned(tmp_path):
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=3, max_segments_per_device=8, max_columns_per_row=48),
        contrastive=uform.Contrastive(matryoshka_dimensions=(64, 128), temperature_groups=2),
        schedule=uform.Schedule(steps=20, learning_rate=2e-3, warmup_steps=1), seed=7)
    for step in range(4):
        order = np.roll(np.arange(8), step)
        position = np.argsort(order)
        trainer.step([uform.Modality.TEXT] * 8, [TEXTS[i] for i in order], temperature_groups=[0, 1] * 4,
                     relations=uform.Relations(attract=(np.arange(9), [int(position[i ^ 1]) for i in order])))
    trainer.save(tmp_path / "encoder.safetensors")
    assert tensors_sha256(tmp_path / "encoder.safetensors") == ENCODER_TENSORS_SHA256


def test_language_model_run_checkpoints_are_pinned(tmp_path):
    shape = LanguageModelConfig(batch=2, length=16, width=32, heads=4, kv_heads=2, mlp=64, layers=2)
    rng = np.random.default_rng(11)
    weights = (rng.standard_normal(shape.n_total) * 0.05).astype(np.float32)
    trainer = LanguageModelTrainer(weights, data_schedule={"corpus": "pin"}, lr=3e-3, shape=shape, executor="cpu",
                                   resident=True)
    for _ in range(5):
        trainer.train_step(rng.integers(0, shape.vocab_size, (shape.batch, shape.length + 1), dtype=np.int32))
    trainer.export_checkpoint(tmp_path / "lm.json")
    binary_sha256 = trainer.export_checkpoint_binary(tmp_path / "lm.uformlm")
    assert hashlib.sha256((tmp_path / "lm.json").read_bytes()).hexdigest() == LM_JSON_SHA256
    assert binary_sha256 == LM_BINARY_SHA256
