"""``/health`` is its contract's ``{"status", "services", "version"}``: healthy, degraded (200) and unhealthy (503)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.app import create_app
from knowledge_store.storage.query_log import QueryLog
from tests.helpers import CorruptModel, GatedModel

pytestmark = pytest.mark.slow

BASE = "http://127.0.0.1:8080"
SERVICES = {"store", "index", "model", "query_log", "dagster_home"}
QUESTION = "how do I reset the Aurora to factory settings"


@pytest.fixture()
def dagster_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def engine_over(settings: Settings, model, tmp_path) -> RetrievalEngine:
    return RetrievalEngine(settings, embedder=model, query_log=QueryLog(tmp_path / "log.duckdb"))


def get_health(client) -> tuple[int, dict]:
    response = client.get("/health")
    return response.status_code, response.json()


def test_a_served_index_with_every_part_up_is_healthy(shared_sample_index, embedder, tmp_path, dagster_home):
    engine = engine_over(shared_sample_index, embedder, tmp_path)
    with TestClient(create_app(shared_sample_index, engine), base_url=BASE) as client:
        engine.warm_up_in_background().result(timeout=60)
        code, health = get_health(client)
    assert code == 200 and health["status"] == "healthy", health
    assert health["services"] == {name: "up" for name in SERVICES}
    assert health["reasons"] == {} and "reason" not in health
    assert isinstance(health["version"], str) and health["version"]
    # the fields earlier clients read stay beside the health contract's
    assert health["model_loaded"] is True and health["store"] is True and health["index"]["snapshot_version"] >= 1
    assert health["warm_up"]["state"] == "ready" and {"remote", "tls", "admin_token_required"} <= set(health)


def test_no_index_is_unhealthy_with_503(embedder, tmp_path, dagster_home):
    settings = Settings(data_dir=tmp_path / "empty")
    engine = engine_over(settings, embedder, tmp_path)
    with TestClient(create_app(settings, engine), base_url=BASE) as client:
        code, health = get_health(client)
    assert code == 503 and health["status"] == "unhealthy", health
    assert health["services"]["index"] == "missing" and health["services"]["store"] == "missing"
    assert "groundwork ingest" in health["reasons"]["index"] and health["index"] is None
    assert set(health["services"]) == SERVICES and health["version"]


def test_a_loading_model_is_degraded_then_healthy_once_loaded(shared_sample_index, embedder, tmp_path, dagster_home):
    model = GatedModel(embedder)
    engine = engine_over(shared_sample_index, model, tmp_path)
    with TestClient(create_app(shared_sample_index, engine), base_url=BASE) as client:
        try:
            code, health = get_health(client)  # the lifespan's warm-up waits in model.load()
            assert code == 200 and health["status"] == "degraded", health
            assert health["services"]["model"] == "loading" and "loading" in health["reasons"]["model"]
            assert health["services"]["index"] == "up" and health["model_loaded"] is False
            assert health["warm_up"]["state"] == "warming" and health["model_load"]["state"] == "loading"
            # a query does not wait for the model: 503 at once, with when to come back
            query = client.post("/api/knowledge/query", json={"query": QUESTION})
            assert query.status_code == 503 and query.json()["error"] == "model_loading", query.text
            assert int(query.headers["Retry-After"]) >= 1 and "still loading" in query.json()["message"]
        finally:
            model.release.set()
        engine.warm_up_in_background().result(timeout=60)
        code, health = get_health(client)
        assert client.post("/api/knowledge/query", json={"query": QUESTION}).status_code == 200
    assert code == 200 and health["status"] == "healthy" and health["services"]["model"] == "up", health


def test_a_model_that_cannot_load_is_unhealthy_and_says_why(shared_sample_index, embedder, tmp_path, dagster_home):
    engine = engine_over(shared_sample_index, CorruptModel(embedder), tmp_path)
    with TestClient(create_app(shared_sample_index, engine), base_url=BASE) as client:
        with pytest.raises(RuntimeError):
            engine.warm_up_in_background().result(timeout=60)
        code, health = get_health(client)
        refused = client.post("/api/knowledge/query", json={"query": QUESTION})
    assert code == 503 and health["status"] == "unhealthy", health
    assert health["services"]["model"] == "error" and "model weights are corrupt" in health["reasons"]["model"]
    assert health["model_load"]["state"] == "failed" and "model weights are corrupt" in health["model_load"]["error"]
    assert "model weights are corrupt" in health["warm_up"]["error"]
    assert refused.status_code == 503 and refused.json()["error"] == "model_load_failed", refused.text
    assert "model weights are corrupt" in refused.json()["message"] and "Retry-After" not in refused.headers


def test_optional_parts_missing_are_degraded_with_reasons_and_no_dagster_is_healthy(shared_sample_index, embedder, tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    engine = engine_over(shared_sample_index, embedder, tmp_path)
    with TestClient(create_app(shared_sample_index, engine), base_url=BASE) as client:
        engine.warm_up_in_background().result(timeout=60)
        code, health = get_health(client)
        assert code == 200 and health["status"] == "healthy", health  # Dagster is optional for a server
        assert health["services"]["dagster_home"] == "not_configured" and "DAGSTER_HOME" in health["reasons"]["dagster_home"]
        assert {health["services"][name] for name in ("store", "index", "model", "query_log")} == {"up"}
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "nowhere"))
        engine.query_log.close()
        code, health = get_health(client)
    assert code == 200 and health["status"] == "degraded"
    assert health["services"]["dagster_home"] == "missing" and "nowhere" in health["reasons"]["dagster_home"]
    assert health["services"]["query_log"] == "down" and "closed" in health["reasons"]["query_log"]
