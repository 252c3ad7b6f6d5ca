"""Ratings retrain the query adapter without a command: thumbs-up given through the HTTP API, the Dagster
sensor ``feedback_grew`` requesting a run, the run deciding under the cross-validated rule, the decision in
``feedback_learning.json``, ``/api/knowledge/config`` and the next check; and the one switch that stops it.

The corpus is test_tuning's tiny one (8 documents, 24 sections), ingested here into a data dir of its own.
"""

from __future__ import annotations

import json

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.storage.feedback_learning import feedback_learning_path, load_feedback_learning
from tests.integration.test_tuning import DOCS, write_tiny_corpus

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, model_path):
    from knowledge_store.ingest.run import run_sync
    from knowledge_store.models.embeddings import Embedder

    embedder = Embedder(model_path, batch_size=32, torch_threads=1)
    root = tmp_path_factory.mktemp("feedback_learning")
    write_tiny_corpus(root / "docs")
    settings = Settings(data_dir=root / "data", sources=[root / "docs"], torch_threads=1)
    report = run_sync(settings, embedder)
    assert report.publish.chunk_count >= 24  # every section is a chunk of its own
    return settings, embedder


def questions() -> list[tuple[str, str]]:
    """(query, the section heading a user would up-vote): each section asked in other words, 24 in all."""
    return [(f"{title}: {heading.lower().rstrip('?')}", heading)
            for title, sections in DOCS.values() for heading, _ in sections]


def rate_through_the_api(client, pairs: list[tuple[str, str]]) -> int:
    """Search each query and give a thumbs-up to the result of its section (the first result otherwise)."""
    for query, heading in pairs:
        response = client.post("/api/knowledge/query", json={"query": query, "k": 5})
        assert response.status_code == 200, response.text
        body = response.json()
        chosen = next((r for r in body["results"] if heading in r["section"]), body["results"][0])
        stored = client.post("/api/knowledge/feedback", json={"retrieval_request_id": body["retrieval_request_id"],
                                                                "rating": "up", "chunk_id": chosen["chunk_id"]})
        assert stored.status_code == 201, stored.text
    return len(pairs)


def test_thumbs_up_through_the_api_retrain_the_adapter_and_the_decision_is_shown(corpus, monkeypatch):
    import dagster as dg
    from fastapi.testclient import TestClient

    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app
    from knowledge_store.storage.query_log import QueryLog
    from pipelines.definitions import build_definitions, tune_job
    from pipelines.resources import EmbeddingModelResource, KnowledgeStoreResource, RetrievalResource
    from pipelines.tuning import build_feedback_sensor

    settings, embedder = corpus
    monkeypatch.setenv("GROUNDWORK_ADAPTER_RETRAIN_VOTES", "20")  # the default 50 would need 50 ratings here
    monkeypatch.setenv("GROUNDWORK_TORCH_THREADS", "1")
    settings = settings.model_copy(update={"adapter_retrain_votes": 20})
    assert settings.learn_from_feedback is True  # on by default: nobody has to run a command
    log = QueryLog(settings.logs_path)
    engine = RetrievalEngine(settings, embedder=embedder, query_log=log)
    sensor = build_feedback_sensor(tune_job, settings.feedback_check_interval_s)
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    resources = {"retrieval": RetrievalResource(data_dir=str(settings.data_dir))}
    try:
        with TestClient(create_app(settings, engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client, \
                dg.instance_for_test() as instance:
            learning = client.get("/api/knowledge/config").json()["feedback_learning"]
            assert learning["enabled"] is True and learning["last_decision"] is None
            assert learning["retrain_votes"] == 20 and learning["until_next_retrain"] == 20

            rate_through_the_api(client, questions()[:19])
            context = dg.build_sensor_context(instance=instance, resources=resources)
            skipped = sensor(context)
            assert isinstance(skipped, dg.SkipReason)
            assert "19 new thumbs-up since the start (19 in all); the query adapter is retrained at 20" in \
                skipped.skip_message
            learning = client.get("/api/knowledge/config").json()["feedback_learning"]
            assert learning["until_next_retrain"] == 1 and learning["last_check"]["up_votes"] == 19
            assert learning["next_check_at"] > learning["last_check"]["at"]  # one interval after the last check

            rated = rate_through_the_api(client, questions()[19:])
            assert rated == 5
            context = dg.build_sensor_context(instance=instance, cursor=context.cursor, resources=resources)
            request = sensor(context)
            assert isinstance(request, dg.RunRequest), request
            assert request.run_key == "feedback-24" and context.cursor == "24"
            assert [key.to_user_string() for key in request.asset_selection] == ["query_adapter"]

            # the run the sensor asked for, as the daemon would launch it: the tune job, the adapter alone
            defs = build_definitions(store=KnowledgeStoreResource(data_dir=str(settings.data_dir)),
                                     model=EmbeddingModelResource(torch_threads=1))
            result = defs.resolve_job_def("tune").execute_in_process(
                instance=instance, asset_selection=request.asset_selection, tags=request.tags)
            assert result.success
            metadata = result.asset_materializations_for_node("query_adapter")[0].metadata
            assert metadata["rated_queries"].value == 24

            stored = json.loads(feedback_learning_path(settings.index_dir).read_text())
            decision = stored["last_decision"]
            assert decision["decision"] in ("adopted", "declined")
            assert decision["decision"] == ("adopted" if metadata["adopted"].value else "declined")
            assert decision["reason"].startswith(("adopted: on 24 rated queries", "not adopted: on 24 rated queries"))
            assert decision["rated_queries"] == 24 and decision["up_votes"] == 24 and decision["trigger"] == "feedback"
            assert decision["gain"] == pytest.approx(metadata["paired_gain"].value)
            assert decision["standard_error"] >= 0.0 and decision["required"] >= 0.005 and decision["decided_at"]

            learning = client.get("/api/knowledge/config").json()["feedback_learning"]
            assert learning["last_decision"] == decision
            assert learning["new_up_votes"] == 0 and learning["until_next_retrain"] == 20

            # `groundwork status` says the same
            from knowledge_store.app.status import store_status
            shown = store_status(settings)["feedback_learning"]
            assert shown["enabled"] is True and shown["last_decision"] == decision

            # nothing new since the decision: no second run
            context = dg.build_sensor_context(instance=instance, cursor=context.cursor, resources=resources)
            again = sensor(context)
            assert isinstance(again, dg.SkipReason)
            assert "0 new thumbs-up since the last decision (24 in all)" in again.skip_message
    finally:
        log.close()


def test_the_switch_stops_the_sensor_and_says_so(corpus, monkeypatch):
    import dagster as dg

    from pipelines.definitions import tune_job
    from pipelines.resources import RetrievalResource
    from pipelines.tuning import build_feedback_sensor

    settings, _ = corpus
    monkeypatch.setenv("GROUNDWORK_LEARN_FROM_FEEDBACK", "false")
    monkeypatch.setenv("GROUNDWORK_ADAPTER_RETRAIN_VOTES", "1")
    before = load_feedback_learning(settings.index_dir).last_decision
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance, resources={
            "retrieval": RetrievalResource(data_dir=str(settings.data_dir))})
        result = build_feedback_sensor(tune_job)(context)
    assert isinstance(result, dg.SkipReason)
    assert result.skip_message.startswith("GROUNDWORK_LEARN_FROM_FEEDBACK is false")
    assert load_feedback_learning(settings.index_dir).last_decision == before  # nothing retrained
