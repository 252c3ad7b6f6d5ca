"""Queries that fail: a typed answer on every surface, and a trace in the query log.

- An unavailable reranker (``cross-encoder`` without ``GROUNDWORK_CROSS_ENCODER_PATH``)
  is a field error naming ``reranker``: HTTP 422, one ``error:`` line and exit code 2
  from ``groundwork query``, a readable ``isError`` result over MCP.
- A query that fails once its parameters are valid (unavailable reranker, no index,
  any unexpected exception) leaves a query-log record with the error (type and
  message, redacted) and the latency so far, and the exception reaches the caller
  unchanged.  Malformed input (blank query, ``k`` out of range...) is refused before
  that point and is not logged: it is the caller's typo, answered at once, not a
  retrieval failure.
"""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import pytest
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError, IndexNotBuiltError
from knowledge_store.retrieval.engine import QueryValidationError, RetrievalEngine
from knowledge_store.storage.query_log import QueryLog
from tests.helpers import MARKDOWN_FILLER
from tests.helpers import REPO_ROOT as ROOT

GUIDE = """# Hub guide

## Reset

Hold the reset button for ten seconds to restore the hub to factory settings.

## Pairing

Press the pair button once; the light blinks blue while the hub looks for sensors.
"""


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory, embedder) -> Settings:
    """One small Markdown document, really ingested and published (a few seconds)."""
    from knowledge_store.ingest.run import run_sync

    root = tmp_path_factory.mktemp("failures")
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text(GUIDE + MARKDOWN_FILLER, encoding="utf-8")
    settings = Settings(data_dir=root / "data", sources=[root / "docs"], cross_encoder_path=None)
    run_sync(settings, embedder)
    return settings


@pytest.fixture()
def engine(tiny_index, embedder, tmp_path):
    log = QueryLog(tmp_path / "logs.duckdb")
    engine = RetrievalEngine(tiny_index, embedder=embedder, query_log=log)
    yield engine
    log.close()


def _only_record(log: QueryLog):
    assert log.flush(timeout_s=10.0)
    records = log.list()
    assert len(records) == 1, [r.error for r in records]
    return records[0]


# ------------------------------------------------------------------ unavailable reranker, every surface

def test_unavailable_reranker_is_a_field_error_naming_reranker_and_its_value(engine):
    with pytest.raises(QueryValidationError) as caught:
        engine.search("how do I reset the hub", reranker="cross-encoder")
    error = caught.value
    assert isinstance(error, GroundworkError)
    assert error.field == "reranker" and error.value == "cross-encoder"
    assert "GROUNDWORK_CROSS_ENCODER_PATH" in str(error)


def test_http_query_with_an_unavailable_reranker_is_422_naming_reranker(tiny_index, embedder, tmp_path):
    from knowledge_store.server.app import create_app

    log = QueryLog(tmp_path / "logs.duckdb")
    engine = RetrievalEngine(tiny_index, embedder=embedder, query_log=log)
    with TestClient(create_app(tiny_index, engine), base_url="http://127.0.0.1:8080") as client:
        config = client.get("/api/knowledge/config").json()
        assert "cross-encoder" not in config["rerankers"]
        response = client.post("/api/knowledge/query", json={"query": "how do I reset the hub", "reranker": "cross-encoder"})
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["error"] == "validation_error"
        assert body["errors"][0]["field"] == "reranker"
        ok = client.post("/api/knowledge/query", json={"query": "how do I reset the hub", "reranker": "mmr"})
        assert ok.status_code == 200, ok.text
    log.close()


def test_cli_query_with_an_unavailable_reranker_prints_one_error_line_and_exits_non_zero(tiny_index):
    env = {k: v for k, v in os.environ.items() if k != "GROUNDWORK_CROSS_ENCODER_PATH"}
    env.update(GROUNDWORK_DATA_DIR=str(tiny_index.data_dir), GROUNDWORK_SOURCES=str(tiny_index.source_dirs[0]),
               GROUNDWORK_QUERY_TORCH_THREADS="2", GROUNDWORK_QUERY_ENCODER="torch")
    result = subprocess.run(
        [sys.executable, "-m", "knowledge_store.cli", "query", "how do I reset the hub", "--reranker", "cross-encoder"],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: reranker") and "GROUNDWORK_CROSS_ENCODER_PATH" in lines[0]
    # the failed CLI query is in the shared query log (written when the process exits)
    log = QueryLog(tiny_index.logs_path)
    try:
        failed = [r for r in log.list(client="cli") if r.error]
        assert failed and "RerankerUnavailable" in failed[0].error
    finally:
        log.close()


def test_mcp_search_with_an_unavailable_reranker_is_a_readable_tool_error(engine):
    from mcp.client.client import Client

    from knowledge_store.server.mcp_server import build_mcp_server

    async def main():
        async with Client(build_mcp_server(engine)) as client:
            return await client.call_tool("search", {"query": "how do I reset the hub", "reranker": "cross-encoder"})

    result = anyio.run(main)
    assert result.is_error
    assert "GROUNDWORK_CROSS_ENCODER_PATH" in result.content[0].text


# ------------------------------------------------------------------ failed queries are logged

def test_failed_query_is_logged_with_its_error_and_latency_and_re_raised(engine):
    query = "how do I reset the hub? mail jane.doe@example.com"
    with pytest.raises(QueryValidationError):
        engine.search(query, k=3, reranker="cross-encoder", client="cli")
    record = _only_record(engine.query_log)
    assert record.error.startswith("RerankerUnavailable: ") and "GROUNDWORK_CROSS_ENCODER_PATH" in record.error
    assert record.client == "cli" and record.params["reranker"] == "cross-encoder" and record.params["k"] == 3
    assert record.latency_ms["total"] > 0
    assert record.results_pre == [] and record.results_post == []
    assert "jane.doe@example.com" not in record.query and "reset the hub" in record.query


def test_query_without_a_published_index_is_logged_as_index_not_built(tmp_path):
    settings = Settings(data_dir=tmp_path / "empty", sources=[tmp_path], query_encoder="torch")
    log = QueryLog(tmp_path / "logs.duckdb")
    engine = RetrievalEngine(settings, query_log=log)  # never reaches the model
    try:
        with pytest.raises(IndexNotBuiltError):
            engine.search("reset the hub")
        record = _only_record(log)
        assert record.error.startswith("IndexNotBuiltError: ") and "groundwork ingest" in record.error
        assert record.latency_ms["total"] > 0 and record.snapshot_version is None
    finally:
        log.close()


def test_unexpected_exception_is_logged_redacted_and_reaches_the_caller_unchanged(engine, monkeypatch):
    boom = RuntimeError("vector store exploded; api_key=hunter2hunter2")

    def explode(*args, **kwargs):
        raise boom

    monkeypatch.setattr(engine, "candidates", explode)
    with pytest.raises(RuntimeError) as caught:
        engine.search("reset the hub")
    assert caught.value is boom
    record = _only_record(engine.query_log)
    assert record.error.startswith("RuntimeError: vector store exploded")
    assert "hunter2" not in record.error


def test_failed_query_with_logging_off_leaves_no_record(engine):
    with pytest.raises(QueryValidationError):
        engine.search("reset the hub", reranker="cross-encoder", log=False)
    assert engine.query_log.flush(timeout_s=10.0)
    assert engine.query_log.list() == []


@pytest.mark.parametrize("params", [{"query": "   "}, {"query": "reset", "k": 0}, {"query": "reset", "reranker": "magic"}])
def test_malformed_input_is_refused_without_a_log_record(engine, params):
    with pytest.raises(QueryValidationError):
        engine.search(params.pop("query"), **params)
    assert engine.query_log.flush(timeout_s=10.0)
    assert engine.query_log.list() == []
