"""Fine-tuning's pieces without a model: held-out split, batches, the training hash, the serving record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import StoreError
from knowledge_store.learning.finetune import Decision, batches, training_hash
from knowledge_store.learning.pairs import PairSet, TrainingPair, held_out, normalised
from knowledge_store.models.embeddings import model_id_for
from knowledge_store.models.serving import (
    EmbedderRecord,
    adopted_model,
    load_record,
    model_path_for,
    record_path,
    save_record,
    serving_model_path,
)


def pair(i: int, group: int | None = None) -> TrainingPair:
    return TrainingPair(f"query {i}", f"target {i}", "heading", doc=i % 7, group=i if group is None else group)


def test_held_out_is_a_stable_share_by_text_whatever_the_spelling():
    texts = [f"how do I configure widget number {i}" for i in range(4000)]
    share = sum(held_out(t) for t in texts) / len(texts)
    assert 0.17 < share < 0.23
    assert all(held_out(t) == held_out(t.upper().replace(" ", "  ")) for t in texts[:200])
    assert normalised("  Install  THE Package ") == "install the package"


def test_batches_never_hold_two_pairs_of_one_section_and_are_seeded():
    pairs = [pair(i, group=i % 40) for i in range(300)]
    made = batches(pairs, 32, seed=13)
    assert made == batches(pairs, 32, seed=13)
    assert made != batches(pairs, 32, seed=14)
    for batch in made:
        groups = [p.group for p in batch]
        assert len(groups) == len(set(groups)) and 2 <= len(batch) <= 32
    assert sum(len(b) for b in made) == 300  # every pair once


def test_batches_stop_when_only_one_section_is_left():
    made = batches([pair(i, group=0) for i in range(5)], 32, seed=1)
    assert made == []


def test_training_hash_follows_base_pairs_and_corpus():
    pairs = PairSet(train=[pair(i) for i in range(10)], held_out=[], counts={}, candidates=10, held_out_feedback=0)
    other = PairSet(train=[pair(i) for i in range(11)], held_out=[], counts={}, candidates=11, held_out_feedback=0)
    base = training_hash("m:1", pairs, "c1")
    assert base == training_hash("m:1", pairs, "c1")
    assert len({base, training_hash("m:2", pairs, "c1"), training_hash("m:1", other, "c1"),
                training_hash("m:1", pairs, "c2")}) == 4


def _fake_model(folder: Path, weights: bytes = b"x" * 10) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": 384}))
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_the_adopted_model_serves_only_while_it_fits_the_settings(tmp_path):
    base = _fake_model(tmp_path / "base")
    settings = Settings(data_dir=tmp_path / "data", model_path=base, embedding_dim=384)
    assert serving_model_path(settings) == base and load_record(settings.index_dir) is None
    tuned = _fake_model(settings.finetuned_models_dir / "base-ft-abc-123", b"y" * 11)
    save_record(settings.index_dir, EmbedderRecord(base_model_id=model_id_for(base), model_path=str(tuned),
                                                   model_id=model_id_for(tuned)))
    assert serving_model_path(settings) == tuned
    assert adopted_model(settings.model_copy(update={"finetune_embedder": False})) is None  # the switch
    other_base = _fake_model(tmp_path / "other", b"z" * 12)
    assert adopted_model(settings.model_copy(update={"model_path": other_base})) is None  # another base model
    (tuned / "config.json").unlink()
    assert serving_model_path(settings) == base  # the folder is gone


def test_a_damaged_record_is_named_and_the_base_model_serves(tmp_path):
    base = _fake_model(tmp_path / "base")
    settings = Settings(data_dir=tmp_path / "data", model_path=base, embedding_dim=384)
    record_path(settings.index_dir).parent.mkdir(parents=True)
    record_path(settings.index_dir).write_text("{not json")
    with pytest.raises(StoreError, match="embedder.json"):
        load_record(settings.index_dir)
    assert serving_model_path(settings) == base


def test_model_ids_lead_back_to_their_folders(tmp_path):
    base = _fake_model(tmp_path / "base")
    settings = Settings(data_dir=tmp_path / "data", model_path=base, embedding_dim=384)
    tuned = _fake_model(settings.finetuned_models_dir / "base-ft-abc-123", b"y" * 11)
    assert model_path_for(settings, model_id_for(base)) == base
    assert model_path_for(settings, model_id_for(base) + "+int8+bare0.5") == base
    assert model_path_for(settings, model_id_for(tuned)) == tuned
    assert model_path_for(settings, "base-ft-abc-123:000000000000") is None  # same name, other weights
    assert model_path_for(settings, "unknown:1") is None


def test_a_decision_round_trips_through_its_dict():
    decision = Decision(decision="declined", reason="declined: too few pairs", pairs=12, pair_kinds={"heading": 12})
    assert Decision(**decision.to_dict()) == decision
