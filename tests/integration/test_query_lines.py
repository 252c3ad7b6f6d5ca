"""The operations logs and metrics: one JSON line per query (stdout + rotated file), answers kept, Prometheus names.

The parts that need no model, store or server are in tests/unit/test_query_lines.py.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from fastapi.testclient import TestClient

from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.app import create_app
from knowledge_store.storage.query_log import QueryLines, QueryLog, QueryLogRecord
from knowledge_store.storage.store import store_connection
from tests.helpers import MARKDOWN_FILLER, build_sample_index

SEED_FIELDS = {"timestamp", "query", "num_results", "latency_ms", "reranker", "top_score", "results"}


def test_a_query_line_has_the_seed_fields_redacted(tmp_path, capsys):
    lines = QueryLines(tmp_path / "logs", stdout=True)
    log = QueryLog(tmp_path / "logs.duckdb", lines=lines)
    try:
        log.append(QueryLogRecord(
            query="reset password for user@example.com", client="api", params={"reranker": "mmr"},
            results_post=[{"chunk_id": "c1", "url": "file:///docs/a.md#reset", "score": 0.94,
                           "snippet": "Hold the button; mail admin@example.com"}],
            latency_ms={"total": 23.4}, answer="Hold the button [1]."))
        log.append(QueryLogRecord(query="broken", client="api", error="IndexNotBuiltError: no index"))
        log.flush()
        out = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        stored = [json.loads(line) for line in (tmp_path / "logs" / "query.log").read_text().splitlines()]
        assert out == stored and len(stored) == 2
        first = stored[0]
        assert SEED_FIELDS <= set(first)
        assert first["query"] == "reset password for user@[REDACTED]" and first["num_results"] == 1 and first["latency_ms"] == 23.4
        assert first["reranker"] == "mmr" and first["top_score"] == 0.94
        assert first["results"][0] == {"chunk_id": "c1", "source": "file:///docs/a.md#reset", "score": 0.94,
                                       "text_preview": "Hold the button; mail admin@[REDACTED]"}
        datetime.fromisoformat(first["timestamp"].rstrip("Z"))
        assert stored[1]["error"].startswith("IndexNotBuiltError") and stored[1]["num_results"] == 0
        # the answer text is kept in the query log itself too
        assert [r.answer for r in log.list() if r.query.startswith("reset")] == ["Hold the button [1]."]
    finally:
        log.close()
        lines.close()


@pytest.mark.slow
def test_a_cli_query_writes_its_line_to_the_file_and_nothing_on_its_stdout(tmp_path, embedder, monkeypatch, capsys):
    from knowledge_store.cli import main
    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest.run import run_sync

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "hub.md").write_text("# Hub\n\nTo reset the hub, hold its button for ten seconds; "
                                              "mail ops@example.com if it stays red.\n" + MARKDOWN_FILLER,
                                              encoding="utf-8")
    run_sync(Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"]), embedder)
    monkeypatch.chdir(tmp_path)  # no project .env
    for name, value in {"GROUNDWORK_DATA_DIR": str(tmp_path / "data"), "GROUNDWORK_SOURCES": str(tmp_path / "docs"),
                        "GROUNDWORK_QUERY_TORCH_THREADS": "2", "GROUNDWORK_QUERY_ENCODER": "torch"}.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert main(["query", "how do I reset the hub", "--json"]) == 0
    out = capsys.readouterr().out
    printed = json.loads(out)  # stdout is the command's output alone: no query line in it
    lines = [json.loads(line) for line in (tmp_path / "data" / "logs" / "query.log").read_text().splitlines()]
    assert len(lines) == 1
    line = lines[0]
    assert SEED_FIELDS <= set(line)
    assert (line["client"], line["retrieval_request_id"]) == ("cli", printed["retrieval_request_id"])
    assert line["answer"] is None and printed["answer"]  # the answer text stays in the query log unless asked for
    assert line["num_results"] == len(printed["results"]) and "example.com" not in json.dumps(line)
    monkeypatch.setenv("GROUNDWORK_LOG_ANSWERS", "true")
    assert main(["query", "how do I reset the hub", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    line = json.loads((tmp_path / "data" / "logs" / "query.log").read_text().splitlines()[-1])
    assert line["answer"] == printed["answer"].replace("ops@example.com", "ops@[REDACTED]")  # redacted, as the server's


@pytest.mark.slow
def test_the_server_logs_lines_and_exports_the_seed_metrics(embedder, shared_sample_index):
    settings = shared_sample_index.model_copy(update={"query_log_stdout": False})
    with store_connection(settings.store_path, read_only=True) as conn:
        pages = conn.execute("SELECT coalesce(sum(pages_parsed), 0) FROM sync_runs").fetchone()[0]
        stored_pages = conn.execute("SELECT count(*) FROM pages").fetchone()[0]
    assert pages == stored_pages > 0
    engine = RetrievalEngine(settings, embedder=embedder, query_log=QueryLog(settings.logs_path))
    with TestClient(create_app(settings, engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
        answer = client.post("/api/knowledge/query", json={"query": "how do I reset the Aurora", "k": 3}).json()
        engine.query_log.flush()
        metrics = client.get("/metrics").text
    line = json.loads((settings.data_dir / "logs" / "query.log").read_text().splitlines()[-1])
    assert line["retrieval_request_id"] == answer["retrieval_request_id"] and line["num_results"] == len(answer["results"])
    assert line["answer"] is None and answer["answer"]["text"]  # GROUNDWORK_LOG_ANSWERS is off
    assert 'http_request_duration_seconds_count{endpoint="/api/knowledge/query"} 1.0' in metrics
    assert f"pages_ingested_total {float(pages)}" in metrics


@pytest.mark.slow
def test_the_answer_ask_returns_is_the_one_the_query_log_keeps(tmp_path, embedder):
    settings = build_sample_index(tmp_path, embedder, query_log_stdout=False, log_answers=True)  # lines carry answers
    engine = RetrievalEngine(settings, embedder=embedder, query_log=QueryLog(settings.logs_path))
    asked = []
    with TestClient(create_app(settings, engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
        for route, body in (("/api/ask", {"query": "how do I reset the Aurora"}),
                            ("/api/ask-local", {"query": "what does this mean?", "context": "reset the Aurora",
                                                "source_file": "*"})):
            response = client.post(route, json=body)
            assert response.status_code == 200, response.text
            asked.append(response.json())
        engine.query_log.flush()
    lines = {line["retrieval_request_id"]: line for line in map(
        json.loads, (settings.data_dir / "logs" / "query.log").read_text().splitlines())}
    for answer in asked:
        assert answer["sources"] and answer["answer"] != "No relevant content found."
        record = engine.query_log.get(answer["retrieval_request_id"])
        assert record is not None and record.answer == answer["answer"]
        assert record.params["answer"] == "extractive"  # the mode the answer was written in, not "none"
        assert lines[answer["retrieval_request_id"]]["answer"] == answer["answer"]
