"""Fine-tuning's pieces without a model: held-out split, batches, the training hash, the serving record."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import StoreError
from knowledge_store.learning.finetune import DIFF_SD_PER_BASE_SD, Decision, batches, detectable_gain, training_hash
from knowledge_store.learning.pairs import (
    HELD_OUT_SHARES,
    WANTED_HELD_OUT,
    PairSet,
    TrainingPair,
    held_out,
    held_out_share_for,
    normalised,
)
from knowledge_store.learning.recipe import (
    MEMORY_PLANS,
    ContrastiveRecipe,
    fit_memory,
    smallest_plan,
    training_added_bytes,
    training_memory_bytes,
)
from knowledge_store.learning.tuning import PseudoQuery
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


def _config_model(folder: Path, layers: int, hidden: int, heads: int, weight_bytes: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": hidden,
                                                    "num_attention_heads": heads}))
    with open(folder / "model.safetensors", "wb") as handle:  # a sparse file: its size is what counts
        handle.truncate(weight_bytes)
    return folder


def test_the_memory_plan_is_the_fastest_that_fits_and_none_when_nothing_does(tmp_path):
    mpnet = _config_model(tmp_path / "mpnet", 12, 768, 12, 438_000_000)
    recipe = ContrastiveRecipe()
    resident = 1 * 2**30
    estimates = {(m, c): training_memory_bytes(mpnet, replace(recipe, mini_batch_size=m, gradient_checkpointing=c),
                                               resident)
                 for m, c in MEMORY_PLANS}
    # memory grows with the mini-batch and checkpointing makes a mini-batch cheaper
    assert estimates[(8, False)] < estimates[(16, False)] < estimates[(32, False)]
    assert estimates[(8, True)] < estimates[(8, False)]
    plan = fit_memory(mpnet, recipe, 4 * 2**30, resident)
    assert plan is not None and training_memory_bytes(mpnet, plan, resident) <= 4 * 2**30
    assert plan.batch_size == 32  # the effective batch is the recipe's whatever the plan
    assert (plan.mini_batch_size, plan.gradient_checkpointing) == next(
        p for p in MEMORY_PLANS if estimates[p] <= 4 * 2**30)
    assert fit_memory(mpnet, recipe, 12 * 2**30, resident).gradient_checkpointing is False  # room: no recomputation
    smallest = smallest_plan(mpnet, recipe)
    assert training_memory_bytes(mpnet, smallest, resident) == min(estimates.values())
    assert fit_memory(mpnet, recipe, training_memory_bytes(mpnet, smallest, resident), resident) is not None
    assert fit_memory(mpnet, recipe, 1 * 2**30, resident) is None
    assert fit_memory(mpnet, replace(recipe, batch_size=8), 64 * 2**30, resident).mini_batch_size == 8  # never above


def test_the_memory_plan_counts_what_the_process_already_holds_and_what_the_machine_has_free(tmp_path):
    mpnet = _config_model(tmp_path / "mpnet", 12, 768, 12, 438_000_000)
    recipe = ContrastiveRecipe()
    budget = Settings.model_fields["finetune_memory_gb"].default * 2**30
    # the shipped budget, for a process holding a small corpus: small mini-batches without recomputation
    small = fit_memory(mpnet, recipe, budget, 1 * 2**30)
    assert (small.mini_batch_size, small.gradient_checkpointing) == (2, False)
    # a process that holds more (a larger corpus's snapshot) gets a plan that adds less, or none
    holds_more = int(budget) - training_added_bytes(mpnet, small) + 1
    larger = fit_memory(mpnet, recipe, budget, holds_more)
    assert larger is None or training_added_bytes(mpnet, larger) < training_added_bytes(mpnet, small)
    assert larger is not None and larger.gradient_checkpointing  # here: checkpointing makes room
    assert fit_memory(mpnet, recipe, budget, budget) is None
    # what training adds must also be free on the machine, whatever the budget
    added = training_added_bytes(mpnet, small)
    assert fit_memory(mpnet, recipe, 64 * 2**30, 2**30, free_bytes=added - 1) != small
    assert fit_memory(mpnet, recipe, 64 * 2**30, 2**30, free_bytes=training_added_bytes(mpnet, smallest_plan(
        mpnet, recipe)) - 1) is None
    assert training_memory_bytes(mpnet, small, 3 * 2**30) - training_memory_bytes(mpnet, small, 2**30) == 2 * 2**30


def test_the_memory_plan_is_not_part_of_the_training_hash_but_the_recipe_is():
    pairs = PairSet(train=[pair(i) for i in range(10)], held_out=[], counts={}, candidates=10, held_out_feedback=0)
    recipe = ContrastiveRecipe()
    same = training_hash("m:1", pairs, "c", recipe)
    assert same == training_hash("m:1", pairs, "c", replace(recipe, mini_batch_size=4, gradient_checkpointing=True))
    assert same != training_hash("m:1", pairs, "c", replace(recipe, batch_size=64))
    assert same != training_hash("m:1", pairs, "c", replace(recipe, hard_negatives=1))
    with_negative = PairSet(train=[replace(pair(i), negatives=("other",)) for i in range(10)], held_out=[],
                            counts={}, candidates=10, held_out_feedback=0)
    assert with_negative.digest() != pairs.digest()


def test_batches_keep_a_pairs_hard_negative_away_from_the_section_it_was_mined_from():
    pairs = [replace(pair(i), negatives=("n",), negative_groups=((i + 1) % 60,)) for i in range(60)]
    for batch in batches(pairs, 16, seed=3):
        targets = {p.group for p in batch}
        assert len(targets) == len(batch)
        assert not targets & {g for p in batch for g in p.negative_groups}


def test_the_held_out_share_grows_until_the_set_can_show_a_gain():
    many = [PseudoQuery(f"configure widget number {i}", "heading", "section", frozenset({i})) for i in range(3000)]
    few = many[:500]
    assert held_out_share_for(many) == HELD_OUT_SHARES[0]  # a fifth of 3,000 is plenty
    share = held_out_share_for(few)
    assert share > HELD_OUT_SHARES[0] and sum(held_out(q.query, share) for q in few) >= WANTED_HELD_OUT
    assert held_out_share_for(many[:50]) == HELD_OUT_SHARES[-1]  # never more than half
    # nested: a text held out at a fifth stays held out at a larger share
    assert all(held_out(q.query, 0.5) for q in few if held_out(q.query, 0.2))


def test_the_detectable_gain_follows_the_spread_and_the_number_of_held_out_queries():
    rng = np.random.default_rng(1)
    spread = rng.uniform(0, 1, 400)
    small, _ = detectable_gain(spread[:40])
    large, se = detectable_gain(spread)
    assert large < small and large == pytest.approx(2 * DIFF_SD_PER_BASE_SD * spread.std(ddof=1) / 20)
    assert se == pytest.approx(large / 2)
    assert detectable_gain(np.full(400, 0.5))[0] == 0.005  # no spread: the rule's floor
    assert detectable_gain(np.array([0.3]))[0] == float("inf")


def test_adapt_embedder_says_the_memory_training_reached_beside_its_estimate(monkeypatch, tmp_path, capsys):
    from knowledge_store import cli

    decided = Decision(decision="declined", reason="declined: +0.0010 nDCG@10 on 62 held-out pseudo-queries",
                       pairs=115, peak_rss_mb=4012.0,
                       memory={"budget_mb": 4096, "resident_mb_at_plan": 509, "resident_mb_before_training": 560,
                               "estimate_mb": 3650, "peak_mb_after_training": 3580.5,
                               "peak_mb_after_reembedding": 3790.0, "peak_mb_after_decision": 4012.0})
    monkeypatch.setattr(cli, "finetune_corpus", lambda settings, **kwargs: decided)
    assert cli.main(["adapt", "--embedder", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "this process peaked at 3.50 GB while training (estimated 3.56 GB, GROUNDWORK_FINETUNE_MEMORY_GB 4;" in out
    assert "3.92 GB over the whole run" in out
    assert "the peak so far was 3.70 GB after re-embedding, 3.92 GB after the decision" in out
