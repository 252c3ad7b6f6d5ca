"""Per-corpus fine-tuning of the embedding model on a real index (the sample corpus and this project's docs),
with small budgets: the CLI's decision fields, adoption and rollback (identical rankings back), servers following
the adopted model, kill -9 during training and during re-embedding, the Dagster sensor, and `groundwork eval`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.sample_corpus import write_sample_corpus
from knowledge_store.learning import finetune
from knowledge_store.models.embeddings import model_id_for
from knowledge_store.models.serving import load_record
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.index import read_pointer
from knowledge_store.storage.store import store_connection
from tests.helpers import copy_project_docs, this_cpu_check

pytestmark = pytest.mark.slow
QUERIES = ["how do I reset the Aurora to factory settings", "which origin may call the API",
           "how is the admin token stored", "what does the ingestion pipeline do with a corrupt PDF",
           "SOP-42 annual inspection"]
# a target gain the small held-out set can always see: these tests are about training, deciding and serving
SMALL = {"finetune_min_pairs": 20, "finetune_budget_s": 6.0, "finetune_target_gain": 1.0}
ENV = {"GROUNDWORK_FINETUNE_MIN_PAIRS": "20", "GROUNDWORK_TORCH_THREADS": "2", "HF_HUB_OFFLINE": "1",
       "GROUNDWORK_FINETUNE_TARGET_GAIN": "1.0"}


@pytest.fixture(scope="module")
def base_index(tmp_path_factory, embedder):
    """The sample corpus and a bounded copy of this project's docs (enough headings for a few hundred pairs, a size
    that does not grow with the docs), indexed with the base model, once per module; each test works on its own
    copy."""
    root = tmp_path_factory.mktemp("finetune")
    write_sample_corpus(root / "sample")
    copy_project_docs(root / "project-docs")
    settings = Settings(data_dir=root / "data", sources=[root / "sample", root / "project-docs"], **SMALL)
    run_sync(settings, embedder)
    return root


@pytest.fixture()
def corpus(base_index, tmp_path):
    shutil.copytree(base_index / "data", tmp_path / "data")
    return Settings(data_dir=tmp_path / "data", sources=[base_index / "sample", base_index / "project-docs"], **SMALL)


def rankings(settings: Settings, embedder=None) -> list[list[tuple[str, float]]]:
    engine = RetrievalEngine(settings, embedder=embedder)
    return [[(h.chunk_id, h.score) for h in engine.search(q, k=5, log=False, min_relevance=0.0).hits] for q in QUERIES]


def same_rankings(a: list, b: list) -> bool:
    """The same chunks in the same order, with the same fused scores (to float32 rounding)."""
    return all([c for c, _ in x] == [c for c, _ in y] and np.allclose([s for _, s in x], [s for _, s in y], atol=1e-5)
               for x, y in zip(a, b, strict=True))


def cli(settings: Settings, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "knowledge_store.cli", "adapt", "--embedder", *args, "--data-dir",
                           str(settings.data_dir)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **ENV}, cwd=settings.data_dir.parent)


def test_adapt_embedder_json_reports_its_decision_within_its_budget(corpus):
    served_before = read_pointer(corpus.index_dir)
    run = cli(corpus, "--json", "--budget", "6")
    assert run.returncode == 0, run.stderr[-3000:]
    decision = json.loads(run.stdout)
    for field in ("decision", "gain", "standard_error", "pairs", "seconds", "reason"):
        assert field in decision, field
    assert decision["decision"] in ("adopted", "declined") and decision["reason"].startswith(decision["decision"])
    # the held-out pseudo-queries are sized for the decision first; training keeps at least the minimum pairs
    assert decision["pairs"] >= SMALL["finetune_min_pairs"] and decision["held_out"] >= 20
    assert decision["detectable_gain"] <= 1.0 and decision["peak_rss_mb"] > 0
    # the memory plan's estimate of this process's peak starts from what it held when training was planned
    memory = decision["memory"]
    assert memory["resident_mb_at_plan"] > 0 and 0 < memory["resident_mb_before_training"] < memory["estimate_mb"]
    # the peak after each later stage, so a run that passes its budget says which stage took it there
    assert (0 < memory["peak_mb_after_training"] <= memory["peak_mb_after_reembedding"]
            <= memory["peak_mb_after_decision"] <= decision["peak_rss_mb"])
    assert set(decision["pair_kinds"]) >= {"heading", "first_sentence"}
    training = decision["training"]
    assert 1 <= training["steps"] <= training["planned_steps"]
    # it stops at the first step that starts past the budget, or after one pass over the pairs (how long a step
    # takes depends on the machine's load, so the step count, not the wall time, is what is checked)
    assert training["stopped_by"] in ("budget", "epoch")  # the first run on this corpus: nothing to reuse
    assert (training["steps"] < training["planned_steps"]) == (training["stopped_by"] == "budget")
    record = load_record(corpus.index_dir)
    assert record.decision["training_hash"] == decision["training_hash"]
    served = read_pointer(corpus.index_dir)
    with store_connection(corpus.store_path, read_only=True) as conn:
        candidate_vectors = conn.execute("SELECT count(*) FROM embeddings WHERE model_id = ?",
                                         [decision["candidate_model_id"]]).fetchone()[0]
    if decision["decision"] == "adopted":
        assert served.model_id == decision["candidate_model_id"] and served.snapshot_version > served_before.snapshot_version
    else:
        assert served == served_before and candidate_vectors == 0  # the declined candidate left nothing behind
        assert not Path(decision["model_path"]).exists()  # nor its weights
    # the same pairs again: the recorded decision, no second training
    again = json.loads(cli(corpus, "--json").stdout)
    assert again["training_hash"] == decision["training_hash"] and again["created_at"] == decision["created_at"]


def test_adopt_then_rollback_restores_the_base_rankings_and_engines_follow_the_model(corpus, monkeypatch, embedder):
    before = rankings(corpus, embedder)
    base_id = model_id_for(corpus.model_path)
    running = RetrievalEngine(corpus, embedder=embedder)  # a server started before the adoption
    running.search(QUERIES[0], log=False)
    monkeypatch.setattr(finetune, "paired_gain", lambda best, base, *a, **k: {
        "gain": 0.05, "standard_error": 0.01, "required": 0.02, "adopted": True, "changed": True})
    decision = finetune.finetune_corpus(corpus, feedback=[], budget_s=4)
    assert decision.decision == "adopted" and decision.snapshot_version is not None
    served = read_pointer(corpus.index_dir)
    assert served.model_id == decision.candidate_model_id and served.model_path == decision.model_path
    record = load_record(corpus.index_dir)
    assert record.model_path == decision.model_path and record.base_model_id == base_id

    running.snapshots.refresh()
    snapshot = running.snapshots.current()
    assert running.embedder_for(snapshot).model_id == served.model_id.split("+")[0] != base_id
    assert running.search(QUERIES[0], log=False).hits  # its queries now go through the fine-tuned model
    assert not same_rankings(rankings(corpus), before)

    result = finetune.rollback(corpus)
    assert result["rolled_back_from"] == record.model_id and result["model_id"] == base_id
    assert read_pointer(corpus.index_dir).model_id == base_id
    assert same_rankings(rankings(corpus, embedder), before)  # the base model's vectors were kept: the same rankings
    assert load_record(corpus.index_dir).decision["decision"] == "rolled_back"


def _kill_when(settings: Settings, marker: str, *args: str, timeout_s: float = 600) -> str:
    """Run `groundwork adapt --embedder ARGS` and kill -9 it as soon as its stderr shows ``marker``."""
    log_path = settings.data_dir.parent / f"adapt-{int(time.monotonic() * 1000)}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "knowledge_store.cli", "adapt", "--embedder", *args,
                                 "--data-dir", str(settings.data_dir)], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **ENV}, cwd=settings.data_dir.parent)
    deadline = time.monotonic() + timeout_s
    try:
        while marker not in log_path.read_text():
            assert proc.poll() is None, f"finished before {marker!r}:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return log_path.read_text()


def test_kill_during_training_or_reembedding_leaves_the_served_snapshot_and_the_next_run_completes(corpus, embedder):
    served = read_pointer(corpus.index_dir)
    before = rankings(corpus, embedder)
    _kill_when(corpus, "fine-tune step 1/", "--budget", "60")
    assert read_pointer(corpus.index_dir) == served
    finetuned = corpus.finetuned_models_dir
    assert not any(p.is_dir() and not p.name.startswith(".") for p in finetuned.glob("*"))  # no half model
    assert same_rankings(rankings(corpus, embedder), before)
    assert load_record(corpus.index_dir) is None  # nothing decided

    first = cli(corpus, "--json", "--budget", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    decided = json.loads(first.stdout)
    # the same training again (reused from disk), killed while the corpus is re-embedded with it
    served = read_pointer(corpus.index_dir)
    output = _kill_when(corpus, "embed: ", "--force")
    assert "reused" in output or "re-embedding" in output
    assert read_pointer(corpus.index_dir) == served
    again = cli(corpus, "--json", "--force")
    assert again.returncode == 0, again.stderr[-3000:]
    completed = json.loads(again.stdout)
    assert completed["training_hash"] == decided["training_hash"] and completed["decision"] in ("adopted", "declined")
    assert completed["training"]["stopped_by"] == "reused"


def test_sensor_requests_a_run_for_a_corpus_never_fine_tuned_and_not_again_until_it_changes(corpus, monkeypatch):
    from pipelines.definitions import finetune_job
    from pipelines.finetuning import build_finetune_sensor
    from pipelines.resources import RetrievalResource

    monkeypatch.setenv("GROUNDWORK_FINETUNE_MIN_PAIRS", "20")
    sensor = build_finetune_sensor(finetune_job)
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING  # on by default
    resources = {"retrieval": RetrievalResource(data_dir=str(corpus.data_dir))}
    with dg.instance_for_test() as instance:
        def tick():
            return sensor(dg.build_sensor_context(instance=instance, resources=resources))

        request = tick()
        assert isinstance(request, dg.RunRequest)
        assert request.run_key == f"finetune-{read_pointer(corpus.index_dir).snapshot_version}"
        assert request.tags["groundwork/trigger"] == "corpus-changed"
        finetune.finetune_corpus(corpus, feedback=[], budget_s=3)
        skipped = tick()
        assert isinstance(skipped, dg.SkipReason) and "new since the last fine-tuning decision" in skipped.skip_message
        monkeypatch.setenv("GROUNDWORK_FINETUNE_EMBEDDER", "false")
        assert "FINETUNE_EMBEDDER is false" in tick().skip_message


def test_finetuned_embedder_asset_materialises_with_its_decision_in_metadata(corpus, monkeypatch):
    from pipelines.finetuning import FinetuneConfig, finetuned_embedder
    from pipelines.resources import RetrievalResource

    monkeypatch.setenv("GROUNDWORK_FINETUNE_MIN_PAIRS", "20")
    result = dg.materialize([finetuned_embedder], resources={"retrieval": RetrievalResource(data_dir=str(corpus.data_dir))},
                            run_config={"ops": {"finetuned_embedder": {"config": FinetuneConfig(budget_s=3).model_dump()}}},
                            raise_on_error=True, selection=[finetuned_embedder])
    metadata = result.asset_materializations_for_node("finetuned_embedder")[0].metadata
    assert metadata["decision"].value in ("adopted", "declined")
    for key in ("gain", "standard_error", "pairs", "held_out_queries", "training_steps", "pairs_per_s", "duration_s"):
        assert key in metadata, key
    assert np.isfinite(metadata["gain"].value)


def test_a_machine_without_the_memory_to_train_declines_before_training_and_tries_again_next_time(corpus, monkeypatch):
    from knowledge_store.learning.recipe import smallest_plan, training_added_bytes
    from knowledge_store.models.serving import finetuned_dir

    adds = training_added_bytes(corpus.model_path, smallest_plan(corpus.model_path, finetune.RECIPE))
    assert adds < 2 * 2**30  # MiniLM in its smallest plan
    budget = corpus.finetune_memory_gb * 2**30
    monkeypatch.setattr(finetune, "resident_bytes", lambda: 256 * 2**20)
    monkeypatch.setattr(finetune, "available_memory_bytes", lambda: adds // 2)  # the machine has too little free
    decision = finetune.finetune_corpus(corpus)
    assert decision.decision == "declined" and "GB free" in decision.reason and decision.training is None
    assert not finetuned_dir(corpus).exists() or not any(finetuned_dir(corpus).iterdir())  # nothing trained
    assert load_record(corpus.index_dir).decision["training_hash"] is None  # not remembered as decided
    # free memory enough, but this process already holds the budget: the estimate of its peak counts what it holds
    monkeypatch.setattr(finetune, "available_memory_bytes", lambda: adds * 2)
    monkeypatch.setattr(finetune, "resident_bytes", lambda: int(budget))
    held = finetune.finetune_corpus(corpus)
    assert held.decision == "declined" and "GROUNDWORK_FINETUNE_MEMORY_GB" in held.reason and held.training is None
    assert held.memory["resident_mb_at_plan"] == round(budget / 2**20)
    monkeypatch.setattr(finetune, "resident_bytes", lambda: 256 * 2**20)
    trained = finetune.finetune_corpus(corpus, budget_s=2.0)  # with the memory, the same pairs train
    assert trained.training is not None and trained.training["recipe"]["mini_batch_size"] <= 32
    assert trained.peak_rss_mb is not None and trained.peak_rss_mb > 0
    assert trained.memory["estimate_mb"] <= corpus.finetune_memory_gb * 1024


def test_where_this_cpu_embeds_documents_faster_in_fp32_the_candidate_is_judged_on_its_fp32_vectors(corpus, monkeypatch):
    from knowledge_store.models.embeddings import OnnxEmbedder

    # int8 documents asked for; this CPU's check of the candidate's int8 graph passes, and fp32 embeds batches faster
    # (blockwise int8 without VNNI), so the candidate's documents are embedded in fp32, under the fp32 id
    monkeypatch.setattr(OnnxEmbedder, "_check", lambda self, tag: this_cpu_check({"fp32": 262.0, "quantised": 482.0}))
    int8 = Settings(data_dir=corpus.data_dir, sources=corpus.sources, document_quantization="int8", **SMALL)
    decision = finetune.finetune_corpus(int8, feedback=[], budget_s=3)
    assert decision.decision in ("adopted", "declined"), decision.reason
    assert decision.candidate_model_id and "+onnx-int8" not in decision.candidate_model_id
    assert decision.candidate_model_id.startswith(Path(decision.model_path).name)


def test_a_held_out_set_too_small_to_show_the_target_gain_declines_before_training(corpus):
    strict = corpus.model_copy(update={"finetune_target_gain": 0.001})  # below the rule's own floor of 0.005
    decision = finetune.finetune_corpus(strict, feedback=[])
    assert decision.decision == "declined" and decision.reason.startswith("declined before training")
    assert decision.training is None and decision.detectable_gain > 0.001 and decision.before
    assert "GROUNDWORK_FINETUNE_TARGET_GAIN" in decision.reason


def test_hard_negatives_come_from_other_sections_are_not_copies_of_the_target_and_are_stripped(corpus, embedder):
    from knowledge_store.learning.pairs import NEAR_DUPLICATE_COSINE, build_pairs, mine_hard_negatives
    from knowledge_store.retrieval.snapshot_reader import load_snapshot

    snapshot = load_snapshot(corpus.index_dir)
    try:
        pairs = build_pairs(snapshot, [], max_pairs=60).train
        mined = mine_hard_negatives(snapshot, pairs, embedder.embed([p.query for p in pairs]))
        with_negative = [p for p in mined if p.negatives]
        assert len(with_negative) >= len(pairs) // 2
        texts = snapshot.records.column("text").to_pylist()
        for pair in with_negative:
            (group,) = pair.negative_groups
            assert group != pair.group  # never the target's own section
            if pair.kind == "title":  # nor, for a title, any section of its document: each answers it
                assert int(snapshot.doc_index[snapshot.sections.lead_row[group]]) != pair.doc
            rows = np.flatnonzero(snapshot.sections.group == group)
            lead = snapshot.sections.lead_row[pair.group]
            # no row of the negative's section is a copy of the target: such a section answers too
            assert max(float(snapshot.embeddings[r] @ snapshot.embeddings[lead]) for r in rows) < NEAR_DUPLICATE_COSINE
            assert not any(texts[r] == texts[lead] for r in rows)
            # stripped of the query as the target is: no line of it is the query (a longer heading that contains
            # it, "GET /api/sources/{name}" for "GET /api/sources", is what makes a negative hard)
            assert pair.query.strip().lower() not in {line.strip(" #`").lower() for line in pair.negatives[0].splitlines()}
            assert pair.negatives[0] != pair.target
    finally:
        snapshot.close()
