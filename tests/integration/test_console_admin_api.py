"""The console's administration API: corpus ranking settings (GET/PUT/DELETE /api/knowledge/ranking, stored in
tuned.json with `groundwork tune`'s choice), the evaluation summary (GET /api/evaluation/summary, read from what
the evaluation assets write) and a source's detail (documents, pages, passages).

The parts that need no model, store or server are in tests/unit/test_console_admin_api.py.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.app import create_app
from knowledge_store.storage.query_log import QueryLog
from knowledge_store.storage.tuned import tuned_path
from tests.helpers import build_sample_index

RESET = "how do I reset the Aurora to factory settings"


# ------------------------------------------------------------------ over HTTP, on a real index

@pytest.fixture(scope="module")
def env(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("console_admin_api")
    settings = build_sample_index(root, embedder)
    log = QueryLog(settings.logs_path)
    engine = RetrievalEngine(settings, embedder=embedder, query_log=log)
    with TestClient(create_app(settings, engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
        yield {"client": client, "settings": settings, "engine": engine, "log": log, "root": root}
    log.close()


@pytest.fixture()
def clean_ranking(env):
    yield
    env["client"].delete("/api/knowledge/ranking")


@pytest.mark.slow
def test_ranking_starts_at_the_built_in_defaults(env, clean_ranking):
    body = env["client"].get("/api/knowledge/ranking").json()
    settings = env["settings"]
    assert body["alpha"] == {"effective": settings.default_alpha, "source": "default", "stored": None, "tuned": None,
                             "builtin": settings.default_alpha, "pinned_by": None}
    assert body["fusion"]["effective"] == settings.default_fusion and body["reranker"]["effective"] == "none"
    assert body["rerankers"] == env["client"].get("/api/knowledge/config").json()["rerankers"]
    assert "cross-encoder" not in body["rerankers"]
    assert body["stored_in"] == str(tuned_path(settings.index_dir)) and body["updated_at"] is None


@pytest.mark.slow
def test_saved_ranking_is_stored_in_tuned_json_and_used_by_the_next_query_without_restart(env, clean_ranking):
    client = env["client"]
    response = client.put("/api/knowledge/ranking", json={"alpha": 0.3, "fusion": "rrf", "reranker": "mmr"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert {name: (body[name]["effective"], body[name]["source"]) for name in ("alpha", "fusion", "reranker")} == {
        "alpha": (0.3, "console"), "fusion": ("rrf", "console"), "reranker": ("mmr", "console")}
    stored = json.loads(tuned_path(env["settings"].index_dir).read_text())
    assert {k: stored["manual"][k] for k in ("alpha", "fusion", "reranker")} == {"alpha": 0.3, "fusion": "rrf", "reranker": "mmr"}

    config = client.get("/api/knowledge/config").json()
    assert (config["default_alpha"], config["default_fusion"], config["default_reranker"]) == (0.3, "rrf", "mmr")
    assert config["ranking_sources"]["alpha"] == "console" and config["reranker_source"] == "console"
    params = client.post("/api/knowledge/query", json={"query": RESET, "k": 3}).json()["params"]
    assert (params["alpha"], params["fusion"], params["reranker"]) == (0.3, "rrf", "mmr")
    # a query that says what it wants still gets it
    params = client.post("/api/knowledge/query", json={"query": RESET, "k": 3, "alpha": 0.9, "reranker": "none"}).json()["params"]
    assert (params["alpha"], params["reranker"]) == (0.9, "none")

    # null forgets one value: back to the built-in default for that one only
    body = client.put("/api/knowledge/ranking", json={"alpha": None}).json()
    assert body["alpha"]["source"] == "default" and body["fusion"]["source"] == "console"
    body = client.delete("/api/knowledge/ranking").json()
    assert {body[n]["source"] for n in ("alpha", "fusion", "reranker")} == {"default"}
    assert not tuned_path(env["settings"].index_dir).exists()


@pytest.mark.slow
@pytest.mark.parametrize("payload,field", [
    ({}, "body"),
    ({"alpha": 1.5}, "alpha"),
    ({"alpha": "0.5"}, "alpha"),
    ({"alpha": True}, "alpha"),
    ({"fusion": "bogus"}, "fusion"),
    ({"reranker": "magic"}, "reranker"),
    ({"reranker": "cross-encoder"}, "reranker"),  # known, but this server has no GROUNDWORK_CROSS_ENCODER_PATH
    ({"section_weight": 0.2}, "section_weight"),
])
def test_bad_ranking_values_are_a_422_naming_the_field_and_change_nothing(env, payload, field):
    response = env["client"].put("/api/knowledge/ranking", json=payload)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "validation_error" and [e["field"] for e in body["errors"]] == [field]
    if payload.get("reranker") == "cross-encoder":
        assert "GROUNDWORK_CROSS_ENCODER_PATH" in body["message"]
    assert not tuned_path(env["settings"].index_dir).exists()


@pytest.mark.slow
def test_a_value_pinned_by_the_environment_is_reported_and_still_wins(env, embedder, clean_ranking):
    settings = env["settings"].model_copy(update={"default_alpha": 0.65})  # as if GROUNDWORK_DEFAULT_ALPHA=0.65
    engine = RetrievalEngine(settings, embedder=embedder, query_log=env["log"])
    with TestClient(create_app(settings, engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
        body = client.put("/api/knowledge/ranking", json={"alpha": 0.2, "fusion": "dbsf"}).json()
        assert body["alpha"]["effective"] == 0.65 and body["alpha"]["stored"] == 0.2
        assert body["alpha"]["source"] == "setting" and body["alpha"]["pinned_by"] == "GROUNDWORK_DEFAULT_ALPHA"
        assert any("GROUNDWORK_DEFAULT_ALPHA" in note and "wins" in note for note in body["notes"])
        assert body["fusion"] == {**body["fusion"], "effective": "dbsf", "source": "console", "pinned_by": None}
        assert client.get("/api/knowledge/config").json()["default_alpha"] == 0.65
    # the unpinned server uses the stored value
    assert env["client"].get("/api/knowledge/config").json()["default_alpha"] == 0.2


@pytest.mark.slow
def test_source_detail_lists_its_documents_with_pages_and_passages(env):
    body = env["client"].get("/api/sources/docs").json()
    documents = body["documents"]
    assert len(documents) == body["statistics"]["documents"] >= 5
    pdf = next(d for d in documents if d["relative_path"] == "aurora-installation-manual.pdf")
    assert pdf["status"] == "active" and pdf["page_count"] >= 4 and pdf["chunks"] > 0 and pdf["indexed_at"]
    assert sum(d["chunks"] for d in documents) == body["statistics"]["chunks"]
    assert body["last_sync"]["added"] == len(documents)


@pytest.mark.slow
def test_evaluation_summary_is_empty_with_a_hint_before_any_evaluation(env):
    body = env["client"].get("/api/evaluation/summary").json()
    assert body["empty"] is True and body["scorecard"] == [] and body["alpha_sweeps"] == []
    assert body["helpful"] is None and body["drift"] is None
    assert "groundwork eval" in body["hint"] and "Dagster" in body["hint"]


@pytest.mark.slow
def test_evaluation_summary_reads_what_the_feedback_and_drift_assets_wrote(env):
    import dagster as dg

    from knowledge_store.evaluation.feedback_gold import helpful_by_config
    from pipelines.evaluation import EvaluationResource, feedback_eval, query_log_drift
    from pipelines.resources import RetrievalResource

    client, settings = env["client"], env["settings"]
    asked = [client.post("/api/knowledge/query", json={"query": q, "k": 5, "alpha": a}).json()
             for q, a in ((RESET, 0.5), ("what does error E42 mean", 0.5), ("how do I pair a sensor", 0.3))]
    for answer, rating in zip(asked, ("up", "up", "down")):
        assert client.post("/api/knowledge/feedback", json={"retrieval_request_id": answer["retrieval_request_id"],
                                                             "chunk_id": answer["results"][0]["chunk_id"],
                                                             "rating": rating}).status_code == 201
    env["log"].flush()
    resources = {"evaluation": EvaluationResource(logs_path=str(settings.logs_path), data_dir=str(settings.data_dir)),
                 "retrieval": RetrievalResource(data_dir=str(settings.data_dir))}
    result = dg.materialize([feedback_eval, query_log_drift], resources=resources)
    assert result.success

    body = client.get("/api/evaluation/summary").json()
    assert body["empty"] is False and body["hint"] is None
    helpful = body["helpful"]
    metadata = result.asset_materializations_for_node("feedback_eval")[0].metadata
    assert helpful["samples"] == metadata["samples"].value == 3 and helpful["run_id"] == result.run_id
    assert helpful["overall"] == {"up": 2, "down": 1, "rated": 3, "helpful_rate": pytest.approx(2 / 3)}
    expected = helpful_by_config(env["log"])
    assert [(r["alpha"], r["up"], r["down"]) for r in helpful["by_configuration"]] == [
        (r["alpha"], r["up"], r["down"]) for r in expected]
    drift = body["drift"]
    drift_metadata = result.asset_materializations_for_node("query_log_drift")[0].metadata
    assert drift["queries_replayed"] == drift_metadata["queries_replayed"].value >= 3
    assert drift["mean_top5_overlap"] == pytest.approx(drift_metadata["mean_top5_overlap"].value)
    assert drift["changed_queries"] == len(drift["changed"]) and drift["history"][0]["run_id"] == result.run_id


@pytest.mark.slow
def test_evaluation_summary_shows_the_latest_scorecard_row_per_configuration_with_the_previous_run(env, tmp_path,
                                                                                                   monkeypatch):
    import dagster as dg

    from pipelines.evaluation import EVALUATION_ASSETS, EvaluationResource, eval_scorecard
    from pipelines.resources import RetrievalResource
    from tests.helpers import write_tiny_beir

    settings = env["settings"]
    write_tiny_beir(tmp_path / "tiny")
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(settings.data_dir))
    resources = {"evaluation": EvaluationResource(datasets=[str(tmp_path / "tiny")], data_dir=str(settings.data_dir),
                                                  logs_path=str(settings.logs_path)),
                 "retrieval": RetrievalResource(data_dir=str(settings.data_dir))}
    first = dg.materialize(EVALUATION_ASSETS, resources=resources)
    assert first.success
    hybrid = [a for a in EVALUATION_ASSETS if a.key.path[-1] == "retrieval_eval_hybrid"]
    second = dg.materialize([*hybrid, eval_scorecard], resources=resources)
    assert second.success

    body = env["client"].get("/api/evaluation/summary").json()
    rows = {r["configuration"]: r for r in body["scorecard"] if r["dataset"] == "tiny"}
    assert set(rows) >= {"bm25", "vector", "hybrid", "hybrid_rrf", "hybrid_dbsf", "hybrid_mmr"}
    card = first.asset_materializations_for_node("eval_scorecard")[0].metadata
    assert len(body["scorecard"]) == card["rows"].value
    # the sample index's example questions are evaluated in the same run, next to the labelled set
    assert [r["configuration"] for r in body["scorecard"] if r["dataset"] == "sample corpus"] == ["served"]
    assert rows["hybrid"]["run_id"] == second.run_id and rows["hybrid"]["previous"]["metrics"]["recall@5"] == 1.0
    assert rows["bm25"]["run_id"] == first.run_id and rows["bm25"]["previous"] is None
    metrics = first.asset_materializations_for_node("retrieval_eval_vector")[0].metadata
    assert rows["vector"]["metrics"]["recall@5"] == pytest.approx(metrics["recall@5"].value)
    assert rows["vector"]["metrics"]["ndcg@10"] == pytest.approx(metrics["ndcg@10"].value)
    # the answer metrics: answer support on the labelled set (it has no key facts), both on the example questions
    assert rows["vector"]["metrics"]["answer_support"] == pytest.approx(metrics["answer_support"].value)
    assert "key_fact_recall" not in rows["vector"]["metrics"]
    sample_row = next(r for r in body["scorecard"] if r["dataset"] == "sample corpus")
    examples = first.asset_materializations_for_node("example_questions_eval")[0].metadata
    for name in ("answer_support", "key_fact_recall", "recall@5"):
        assert sample_row["metrics"][name] == pytest.approx(examples[name].value)


@pytest.mark.slow
def test_the_evaluation_page_s_question_table_agrees_with_its_scorecard(env, monkeypatch):
    """The page showed "Recall@5 0.750" beside "2 of 4 found" and ticked passages that do not answer: its caption,
    its table and its scorecard row now read one judgement (the answering section, the first five units)."""
    from knowledge_store.evaluation.sample_eval import evaluate_example_questions
    from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS

    monkeypatch.setenv("GROUNDWORK_QUERY_ENCODER", "torch")  # the suite's model, already loaded
    evaluate_example_questions(env["settings"], embedder=env["engine"].embedder)
    body = env["client"].get("/api/evaluation/summary").json()
    row = next(r for r in body["scorecard"] if r["dataset"] == "sample corpus")
    [run] = [q for q in body["questions"] if q["dataset"] == "sample corpus" and q["run_id"] == row["run_id"]]
    assert run["total"] == row["queries"] == len(EXAMPLE_QUESTIONS) and run["found_within"] == 5
    assert run["found"] == round(row["metrics"]["recall@5"] * run["total"])
    for question in run["questions"]:
        ticked = [hit["rank"] for hit in question["hits"] if hit["relevant"]]
        # one answering section per question: one tick at most, where the table says it was found
        assert ticked == ([question["found_rank"]] if question["found_rank"] else [])
        assert question["scores"]["recall@5"] == (1.0 if ticked else 0.0)
        assert all(hit["judged_as"] == "answering section" for hit in question["hits"] if hit["relevant"])
