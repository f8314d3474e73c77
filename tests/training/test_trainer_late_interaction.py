"""Late interaction in the trainer: the token head, hard MaxSim and the pair loss over each query's row,
against the float64 torch reference for every pair-loss form and side combination; capacities and sides
refused before anything runs; token vectors for retrieval."""

import numpy as np
import pytest

import uform
from trainer_cases import TEXTS, assert_gradients_match, engine_and_reference, tiny

Q, D, B, N = (uform.LateInteractionSide.QUERY, uform.LateInteractionSide.DOCUMENT,
              uform.LateInteractionSide.QUERY_AND_DOCUMENT, uform.LateInteractionSide.NONE)
SIDES = {"query-document": [Q, D] * 4, "both": [B] * 8, "mixed": [B, D, Q, N, Q, D, N, B]}
RELATIONS = uform.Relations(attract=(np.arange(9), [1, 0, 3, 2, 5, 4, 7, 6]),
                            repel=([0, 1, 1, 1, 1, 1, 1, 1, 1], [2]), ignore=([0, 0, 0, 1, 1, 1, 1, 1, 1], [7]))


def late_trainer(form, objective=uform.Objective.JOINT, **late):
    return tiny(objective, uform.Contrastive(temperature_groups=2),
                late_interaction=uform.LateInteraction(weight=0.7, width=16, max_query_span=5, pair_loss=form,
                                                       inverse_temperature=2.0, bias=-0.5, **late))


@pytest.mark.parametrize("sides", list(SIDES))
@pytest.mark.parametrize("form", [uform.PairLossForm.SIGMOID, uform.PairLossForm.BALANCED, uform.PairLossForm.RANKED])
def test_late_interaction_gradients_match_float64_reference(form, sides):
    trainer = late_trainer(form)
    losses, gradient, reference, expected = engine_and_reference(trainer, RELATIONS, groups=[0, 1] * 4,
                                                                 sides=SIDES[sides])
    assert losses.late_interaction > 0
    assert losses.late_interaction == pytest.approx(float(reference["late_interaction"]), rel=2e-5)
    assert losses.total == pytest.approx(float(reference["loss"]), rel=2e-5)
    assert_gradients_match(trainer, gradient, expected)


def test_late_interaction_alone_with_a_contrastive_objective():
    trainer = late_trainer(uform.PairLossForm.RANKED, uform.Objective.CONTRASTIVE)
    losses, gradient, reference, expected = engine_and_reference(trainer, RELATIONS, sides=SIDES["mixed"])
    assert losses.late_interaction == pytest.approx(float(reference["late_interaction"]), rel=2e-5)
    assert_gradients_match(trainer, gradient, expected)


@pytest.mark.parametrize("sides", [[D] * 8, [Q] * 8, [N] * 8])
def test_no_query_or_no_document_adds_no_token_head_gradient(sides):
    trainer = late_trainer(uform.PairLossForm.RANKED)
    losses, gradient, reference, expected = engine_and_reference(trainer, RELATIONS, sides=sides)
    assert losses.late_interaction == 0.0 and losses.total > 0
    for name in ("late_interaction.token_head", "late_interaction.log_scale", "late_interaction.bias"):
        entry = next(e for e in trainer.model.registry if e["name"] == name)
        assert not gradient[entry["offset"]:entry["offset"] + entry["size"]].any(), name
    assert_gradients_match(trainer, gradient, expected)


def test_the_token_head_is_in_the_checkpoint_and_resumes_exactly(tmp_path):
    def run(steps, resume=None):
        trainer = uform.Trainer.init_vram(
            uform.Executor.for_ram(), resume=resume, depth=1, hidden=128, objective=uform.Objective.JOINT,
            batch=uform.BatchShape(max_rows_per_device=3, max_segments_per_device=8, max_columns_per_row=48),
            late_interaction=uform.LateInteraction(weight=1.0, width=32), schedule=uform.Schedule(steps=6), seed=4)
        for _ in range(trainer.completed_steps, steps):
            trainer.step([uform.Modality.TEXT] * 8, TEXTS, relations=RELATIONS, sides=SIDES["mixed"])
        trainer.save(tmp_path / f"{steps}-{resume is not None}.safetensors")
        return trainer.parameters()

    whole = run(6)
    assert whole["late_interaction.token_head"].shape == (128, 32)
    assert whole["late_interaction.log_scale"].shape == (1,)
    run(3)
    resumed = run(6, resume=tmp_path / "3-False.safetensors")
    for name in whole:
        assert np.array_equal(whole[name], resumed[name]), name


def refused(trainer, message, **arguments):
    before, steps = trainer.model.parameters.numpy(), trainer.completed_steps
    with pytest.raises(uform.UFormError) as error:
        trainer.step([uform.Modality.TEXT] * 8, TEXTS, relations=RELATIONS, **arguments)
    assert message in str(error.value), str(error.value)
    assert trainer.completed_steps == steps and np.array_equal(trainer.model.parameters.numpy(), before)
    return error.value


def test_sides_and_capacities_are_refused_naming_the_item():
    # The packing keeps items 0-4 and 7 (5 and 6 find no room), 17, 28, 21, 18, 34 and 11 bytes long.
    trainer = late_trainer(uform.PairLossForm.RANKED, max_query_tokens_per_device=12, max_documents_per_device=3,
                           max_document_tokens_per_device=60)
    error = refused(trainer, "sides: item 4 is 7, not a LateInteractionSide", sides=[Q, D, Q, D, 7, D, Q, D])
    assert error.code == uform.ErrorCode.INVALID_ARGUMENT
    refused(trainer, "sides: 3 entries for 8 items", sides=[Q, D, Q])
    # Three queries of at most 5 tokens each pass 12 query tokens at the third, item 4.
    refused(trainer, "sides: item 4 brings the step's query tokens to 15, past "
            "late_interaction.max_query_tokens_per_device 12", sides=[Q, N, Q, N, Q, N, N, N])
    refused(trainer, "sides: item 7 brings the step's documents to 4, past late_interaction.max_documents_per_device 3",
            sides=[D, D, N, D, N, N, N, D])
    refused(trainer, "sides: item 4 brings the step's document tokens to 80, past "
            "late_interaction.max_document_tokens_per_device 60", sides=[N, D, N, D, D, N, N, N])
    trainer.step([uform.Modality.TEXT] * 8, TEXTS, relations=RELATIONS, sides=[Q, D, Q, D, N, D, N, N])
    assert trainer.completed_steps == 1


def test_a_masked_objective_refuses_late_interaction():
    with pytest.raises(uform.UFormError, match="late_interaction.weight: late interaction scores the relations"):
        late_trainer(uform.PairLossForm.RANKED, uform.Objective.MASKED)


def test_token_vectors_are_unit_rows_independent_of_their_neighbours():
    trainer = late_trainer(uform.PairLossForm.RANKED)
    trainer.step([uform.Modality.TEXT] * 8, TEXTS, relations=RELATIONS, sides=SIDES["mixed"])
    documents = trainer.encode_tokens([uform.Modality.TEXT] * 8, TEXTS)
    assert [v.shape for v in documents] == [(len(t), 16) for t in TEXTS]
    assert np.allclose(np.linalg.norm(np.concatenate(documents), axis=1), 1, atol=1e-5)
    queries = trainer.encode_tokens([uform.Modality.TEXT] * 2, TEXTS[3:5], side=Q)
    assert [v.shape for v in queries] == [(5, 16), (5, 16)]
    alone = trainer.encode_tokens([uform.Modality.TEXT], TEXTS[3:4])
    assert np.array_equal(alone[0], documents[3])
    assert np.array_equal(queries[0], documents[3][:5])
    scores = uform.maxsim(queries, documents)
    expected = [[(q @ d.T).max(1).sum() for d in documents] for q in queries]
    np.testing.assert_allclose(scores, expected, rtol=1e-5)
    with_empty = uform.maxsim(queries + [np.zeros((0, 16))], [np.zeros((0, 16))] + documents)
    assert not with_empty[:, 0].any() and not with_empty[-1].any()
    assert np.array_equal(with_empty[:-1, 1:], scores)
    with pytest.raises(uform.UFormError, match="maxsim: documents must be a sequence"):
        uform.maxsim(queries, documents[0])


def test_a_loaded_encoder_answers_the_trainers_token_vectors(tmp_path):
    trainer = late_trainer(uform.PairLossForm.RANKED)
    trainer.step([uform.Modality.TEXT] * 8, TEXTS, relations=RELATIONS, sides=SIDES["mixed"])
    trainer.save(tmp_path / "late.safetensors")
    encoder = uform.Encoder.load(tmp_path / "late.safetensors", executor="cpu")
    for side in (Q, D):
        ours = encoder.encode_tokens(uform.Modality.TEXT, TEXTS, side=side)
        theirs = trainer.encode_tokens([uform.Modality.TEXT] * 8, TEXTS, side=side)
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_late_interaction_finds_the_one_token_detail_that_pooling_averages_away():
    """Every document is forty random digits and spaces with one capital letter somewhere in it, and its query
    is that letter: the documents share their pooled meaning (a run of digits) and differ in one token. After
    150 steps on fresh documents, MaxSim retrieval over 16 held-out documents finds the letter; the pooled
    embeddings of the same model stay near chance."""
    rng = np.random.default_rng(0)
    digits, capitals = np.frombuffer(b"0123456789 ", np.uint8), np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", np.uint8)

    def documents(count):
        pairs = []
        for letter in rng.choice(capitals, count, replace=False):
            body, cut = bytes(rng.choice(digits, 40)), int(rng.integers(0, 40))
            pairs.append((bytes([letter]), body[:cut] + bytes([letter]) + body[cut:]))
        return pairs

    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.CONTRASTIVE,
        batch=uform.BatchShape(max_rows_per_device=4, max_segments_per_device=16, max_columns_per_row=64),
        late_interaction=uform.LateInteraction(weight=1.0, width=32, max_query_span=8),
        schedule=uform.Schedule(steps=150, learning_rate=1e-3, warmup_steps=10), seed=1)
    held_out = documents(16)

    def recall():
        queries, texts = [q for q, _ in held_out], [d for _, d in held_out]
        pooled = trainer.encode([uform.Modality.TEXT] * 16, queries) @ trainer.encode([uform.Modality.TEXT] * 16, texts).T
        late = uform.maxsim(trainer.encode_tokens([uform.Modality.TEXT] * 16, queries, side=Q),
                            trainer.encode_tokens([uform.Modality.TEXT] * 16, texts))
        return [float(np.mean(np.argmax(scores, 1) == np.arange(16))) for scores in (pooled, late)]

    before = recall()
    pairs = uform.Relations(attract=(np.arange(17), [i ^ 1 for i in range(16)]))
    for _ in range(150):
        items = [text for pair in documents(8) for text in pair]
        trainer.step([uform.Modality.TEXT] * 16, items, relations=pairs, sides=[Q, D] * 8)
    pooled, late = recall()
    print(f"held-out recall@1 over 16 documents (chance 0.0625): pooled {before[0]:.3f} → {pooled:.3f}, "
          f"MaxSim {before[1]:.3f} → {late:.3f}")
    assert late >= 0.8 and late > pooled + 0.5
