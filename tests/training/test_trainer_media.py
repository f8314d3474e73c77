"""uform.Trainer with image, video and audio items: whole-step gradients against the float64 torch
reimplementation, the mixed step's bookkeeping (masks, truncation, packing), exact resume, and refusals
that change nothing."""

import numpy as np
import pytest

import uform
from media_files import MEDIA_SHAPES, encode_image, mixed_items, png_header, sample_files
from trainer_cases import assert_gradients_match, engine_and_reference
from uform.media import masked_count
from uform.training import check_step_inputs
from uform.training.vocabulary import AUDIO_MASK, AUDIO_TOKEN, IMAGE_MASK, IMAGE_TOKEN, VIDEO_MASK, VIDEO_TOKEN

M = uform.Modality


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return sample_files()


def media_trainer(objective=uform.Objective.JOINT, steps=20, executor=None, **batch):
    shape = dict(max_rows_per_device=4, max_segments_per_device=14, max_columns_per_row=48, **MEDIA_SHAPES) | batch
    return uform.Trainer.init_vram(executor or uform.Executor.for_ram(), depth=1, hidden=128, objective=objective,
                                   batch=uform.BatchShape(**shape),
                                   schedule=uform.Schedule(steps=steps, learning_rate=2e-3, warmup_steps=1), seed=9)


@pytest.mark.parametrize("objective", [uform.Objective.JOINT, uform.Objective.MASKED, uform.Objective.CONTRASTIVE])
def test_media_step_gradients_match_float64_reference(files, objective):
    trainer = media_trainer(objective)
    modalities, contents, relations = mixed_items(files)
    losses, gradient, reference, expected = engine_and_reference(trainer, relations, contents=contents,
                                                                 modalities=modalities)
    assert losses.total == pytest.approx(float(reference["loss"]), rel=2e-5)
    if objective != uform.Objective.CONTRASTIVE:
        assert set(losses.reconstruction) == {"image", "video", "audio"}
        for name, value in losses.reconstruction.items():
            assert value == pytest.approx(float(reference["reconstruction"][name]), rel=2e-5)
    names = {entry["name"] for entry in trainer.model.registry}
    assert {"image.patch_embedding", "video.patch_embedding", "audio.patch_embedding"} <= names
    assert ("image.reconstruction" in names) == (objective != uform.Objective.CONTRASTIVE)
    assert_gradients_match(trainer, gradient, expected)


def test_mixed_step_masks_each_item_exactly_and_places_its_tokens(files):
    trainer = media_trainer()
    modalities, contents, relations = mixed_items(files)
    inputs = check_step_inputs(modalities, contents, modalities_enabled=trainer._modalities_enabled())
    batch, packed = trainer.step_batch(inputs, False, step=4)
    tokens = batch.tokens.reshape(-1)
    positions = batch.positions.reshape(-1, 3)
    ends = np.cumsum(packed.segment_length)
    for segment, item in enumerate(packed.item_of_segment):
        flat = packed.flat[ends[segment] - packed.segment_length[segment]:ends[segment]]
        shown, hidden = {M.IMAGE: (IMAGE_TOKEN, IMAGE_MASK), M.VIDEO: (VIDEO_TOKEN, VIDEO_MASK),
                         M.AUDIO: (AUDIO_TOKEN, AUDIO_MASK)}.get(modalities[item], (None, None))
        if shown is None:
            assert np.all(tokens[flat] < 258) and np.all(positions[flat] == np.arange(flat.size)[:, None])
            continue
        count = masked_count(flat.size, 0.75)  # the shown tokens first, the hidden ones last, pooled apart
        assert np.all(tokens[flat[:flat.size - count]] == shown) and np.all(tokens[flat[flat.size - count:]] == hidden)
        assert batch.segment_lengths[segment] == flat.size - count
        assert np.all(batch.pooled_segments.reshape(-1)[flat[flat.size - count:]] == -1)
        if modalities[item] == M.IMAGE:
            assert np.all(positions[flat][:, 0] == 0)
            assert len({tuple(p) for p in positions[flat]}) == flat.size  # each patch once, wherever it was packed
    image = batch.media.modalities["image"]
    assert np.all(batch.media.row_of[image.tokens] >= 0)  # hidden tokens too: their position features
    assert image.inputs.shape == (image.tokens.size, 4 * 4 * 4 + 32)  # RGBA patches of side 4, (row, column)
    assert np.all(image.inputs[np.isin(image.tokens, image.hidden), :64] == 0)
    assert batch.media.modalities["video"].inputs.shape[1] == 2 * 8 * 8 * 3 + 48  # two RGB frames, three axes


def test_mixed_steps_report_every_head_and_learn(files):
    trainer = media_trainer(steps=30)
    modalities, contents, relations = mixed_items(files)
    stats = uform.TrainerStepStats()
    trainer.step(modalities, contents, relations=relations, stats=stats)
    first = (stats.masked_image_loss, stats.masked_video_loss, stats.masked_audio_loss, stats.contrastive_loss)
    assert all(value > 0 for value in first) and stats.truncated == 0 and stats.dropped == 0
    for _ in range(25):
        trainer.step(modalities, contents, relations=relations, stats=stats)
    assert stats.contrastive_loss < 0.5 * first[3]
    assert stats.masked_image_loss < first[0]


def test_long_clips_are_cut_and_counted_and_items_that_do_not_fit_are_dropped(files):
    trainer = media_trainer(max_rows_per_device=1, max_columns_per_row=8, max_segments_per_device=4)
    stats = uform.TrainerStepStats()
    # The mp4's 5 frames make 3 time slices of 2×2 tubes: 12 tubes, past a row of 8, so its first 2 slices stay.
    trainer.step([M.VIDEO, M.TEXT], [files["mp4"], "no room left"], stats=stats)
    assert stats.truncated == 1 and stats.dropped == 1


def checkpoint_tensors(path) -> dict:
    from safetensors.numpy import load_file

    return load_file(path)


def test_media_resume_continues_exactly(files, tmp_path):
    modalities, contents, relations = mixed_items(files)
    straight = media_trainer(steps=6)
    for _ in range(6):
        straight.step(modalities, contents, relations=relations)
    straight.save(tmp_path / "straight.safetensors")
    first = media_trainer(steps=6)
    for _ in range(3):
        first.step(modalities, contents, relations=relations)
    first.save(tmp_path / "half.safetensors")
    resumed = uform.Trainer.init_vram(uform.Executor.for_ram(), resume=tmp_path / "half.safetensors", depth=1,
                                      hidden=128, objective=uform.Objective.JOINT,
                                      batch=uform.BatchShape(max_rows_per_device=4, max_segments_per_device=14,
                                                             max_columns_per_row=48, **MEDIA_SHAPES),
                                      schedule=uform.Schedule(steps=6, learning_rate=2e-3, warmup_steps=1), seed=9)
    for _ in range(3):
        resumed.step(modalities, contents, relations=relations)
    resumed.save(tmp_path / "resumed.safetensors")
    a, b = checkpoint_tensors(tmp_path / "straight.safetensors"), checkpoint_tensors(tmp_path / "resumed.safetensors")
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)) for name in a)


def bad_items(files):
    """(modality, content) of items no step may take: corrupt, truncated or empty files, a file of another
    modality, a decompression bomb, an unsupported format, arrays of the wrong dtype, rank or size, bad
    samples and rates."""
    return [
        (M.IMAGE, files["png"][: len(files["png"]) // 2]), (M.IMAGE, b""), (M.IMAGE, png_header(8193, 4096)),
        (M.IMAGE, encode_image(np.zeros((4, 4, 3), np.uint8), "GIF")), (M.IMAGE, files["mp4"]),
        (M.IMAGE, np.zeros((4, 4, 3), np.float32)), (M.IMAGE, np.zeros((4, 4, 3, 1), np.uint8)),
        (M.IMAGE, np.zeros((0, 4, 3), np.uint8)),
        (M.VIDEO, files["png"]), (M.VIDEO, files["mp4"][:300]), (M.VIDEO, b"\x1aE\xdf\xa3 not a webm"),
        (M.AUDIO, b""), (M.AUDIO, files["wav"][:60]), (M.AUDIO, files["png"]),
        (M.AUDIO, (np.zeros(0, np.float32), 8000)), (M.AUDIO, (np.array([0.0, np.nan], np.float32), 8000)),
        (M.AUDIO, (np.zeros(10, np.float32), 0)), (M.AUDIO, (np.zeros(10, np.int16), 8000)),
    ]


def test_bad_media_items_are_refused_by_index_and_change_nothing(files):
    trainer = media_trainer()
    before = trainer.model.parameters.numpy()
    for modality, content in bad_items(files):
        with pytest.raises(uform.UFormError, match="^item 1: ") as error:
            trainer.step([M.TEXT, modality], ["a caption", content])
        assert error.value.code in (uform.ErrorCode.INVALID_ARGUMENT, uform.ErrorCode.UNSUPPORTED), str(error.value)
    assert trainer.completed_steps == 0
    assert np.array_equal(trainer.model.parameters.numpy(), before)


@pytest.mark.parametrize("modality,name", [(M.IMAGE, "png"), (M.VIDEO, "mp4"), (M.AUDIO, "wav")])
def test_media_of_a_modality_the_run_leaves_out_is_refused(files, modality, name):
    trainer = media_trainer(**{modality.name.lower(): None})
    with pytest.raises(uform.UFormError, match=f"item 1: {modality.name} items need batch.{modality.name.lower()}") \
            as error:
        trainer.step([M.TEXT, modality], ["a caption", files[name]])
    assert error.value.code == uform.ErrorCode.INVALID_ARGUMENT and trainer.completed_steps == 0


def test_encode_embeds_each_item_alone_whatever_else_is_in_the_call(files):
    trainer = media_trainer()
    modalities, contents, relations = mixed_items(files)
    for _ in range(2):
        trainer.step(modalities, contents, relations=relations)
    many = [M.TEXT] * 30 + modalities
    texts = [f"filler text number {i}" for i in range(30)]
    together = trainer.encode(many, texts + contents)  # more than one batch: packed a batch at a time
    assert together.shape == (44, 128) and np.allclose(np.linalg.norm(together, axis=1), 1, atol=1e-5)
    for k in (0, 1, 7, 11):
        alone = trainer.encode([modalities[k]], [contents[k]])
        assert np.array_equal(alone[0].view(np.uint32), together[30 + k].view(np.uint32))
    prefix = trainer.encode(modalities[:2], contents[:2], width=64)
    full = trainer.encode(modalities[:2], contents[:2])
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    assert np.allclose(prefix, expected, atol=1e-6)
    with pytest.raises(uform.UFormError, match="width"):
        trainer.encode(modalities[:1], contents[:1], width=129)


def test_deferred_steps_decode_ahead_and_end_as_blocking_steps_do(files):
    modalities, contents, relations = mixed_items(files)
    blocking, deferred = media_trainer(), media_trainer()
    for _ in range(3):
        blocking.step(modalities, contents, relations=relations)
    receiver = deferred.deferred(deferred._executor)
    _, _, pending = deferred._prefetch.decode(modalities, contents)
    assert sorted(pending.result()) == [i for i, m in enumerate(modalities) if m != M.TEXT]
    calls = [receiver.step(modalities, contents, relations=relations) for _ in range(3)]
    for call in calls:
        call.result()
    assert np.array_equal(blocking.model.parameters.numpy().view(np.uint32),
                          deferred.model.parameters.numpy().view(np.uint32))


def test_deferred_steps_read_their_inputs_once_and_refuse_what_a_blocking_step_refuses(files):
    modalities, contents, relations = mixed_items(files)
    blocking, deferred = media_trainer(), media_trainer()
    blocking.step(modalities, contents, relations=relations)
    receiver = deferred.deferred(deferred._executor)
    receiver.step(iter(modalities), (c for c in contents), relations=relations).result()  # one-shot iterables
    assert np.array_equal(blocking.model.parameters.numpy(), deferred.model.parameters.numpy())
    with pytest.raises(uform.UFormError, match="modalities"):
        receiver.step([2**70], ["a caption"]).result()
    deferred.close()


def test_encode_decodes_each_media_item_once(files, monkeypatch):
    from uform.media import DecodePool
    from uform.training import batch as batch_module, media_step

    calls = []
    prepare = media_step.prepare_item
    monkeypatch.setattr(media_step, "prepare_item", lambda *a, **k: calls.append(a[2]) or prepare(*a, **k))
    threads = DecodePool()  # the decoding in this process, where the calls are counted
    monkeypatch.setattr(batch_module, "shared_pool", lambda: threads)
    trainer = media_trainer(max_rows_per_device=1, max_segments_per_device=2)
    images = [files["png"], files["jpeg"], files["webp"]] * 4
    embeddings = trainer.encode([M.IMAGE] * len(images), images)  # a row holds two images: six batches
    threads.close()
    assert sorted(calls) == list(range(len(images)))
    assert np.array_equal(embeddings[0], embeddings[3]) and np.array_equal(embeddings[1], embeddings[10])


def test_close_waits_for_the_queued_deferred_steps(files):
    modalities, contents, relations = mixed_items(files)
    trainer = media_trainer()
    receiver = trainer.deferred(trainer._executor)
    calls = [receiver.step(modalities, contents, relations=relations) for _ in range(3)]
    trainer.close()  # the queued steps take the trainer's lock: close must not hold it while it waits
    assert all(call.done() for call in calls) and trainer.completed_steps == 3


def test_late_interaction_over_media_items_matches_the_float64_reference(files):
    """Media items as late-interaction queries and documents (their patch, tube and frame rows scored by
    MaxSim like text bytes), against the torch reference; and their token vectors read back."""
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=4, max_segments_per_device=14, max_columns_per_row=48,
                               **MEDIA_SHAPES),
        late_interaction=uform.LateInteraction(weight=0.5, width=16, max_query_span=6),
        schedule=uform.Schedule(steps=20, learning_rate=2e-3, warmup_steps=1), seed=9)
    modalities, contents, relations = mixed_items(files)
    sides = [uform.LateInteractionSide.QUERY if m != M.TEXT else uform.LateInteractionSide.DOCUMENT
             for m in modalities]
    losses, gradient, reference, expected = engine_and_reference(trainer, relations, contents=contents,
                                                                 modalities=modalities, sides=sides)
    assert losses.late_interaction > 0
    assert losses.late_interaction == pytest.approx(float(reference["late_interaction"]), rel=2e-5)
    assert_gradients_match(trainer, gradient, expected)
    media = [i for i, m in enumerate(modalities) if m != M.TEXT]
    vectors = trainer.encode_tokens([modalities[i] for i in media], [contents[i] for i in media],
                                    side=uform.LateInteractionSide.QUERY)
    assert all(0 < len(v) <= 6 and v.shape[1] == 16 for v in vectors)
