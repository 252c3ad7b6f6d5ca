"""Retries of ingestion: a transient parse failure is tried again after the waits of
``ingest_retry_delays_s``; a permanent one fails at once; the failure row keeps the attempts, the class, the
last traceback (secrets redacted) and the input's size and sha256, and the failures API shows them.

Waits are the setting's values handed to a recording sleep: no test waits for real.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import FileReadError
from knowledge_store.ingest import retry as retry_module
from knowledge_store.ingest.parsers import markdown as markdown_parser
from knowledge_store.ingest.parsers import text as text_parser
from knowledge_store.ingest.run import run_sync
from knowledge_store.storage.index import open_snapshot, read_pointer
from knowledge_store.storage.store import store_connection

DELAYS = [0.5, 1.5, 4.0]
SECRET_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
SECRETS = ("hunter2", "s3cr3tPass", SECRET_TOKEN, "QWxhZGRpbjpvcGVuIHNlc2FtZQ")


def write_docs(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("Release notes\n\n" + " ".join(
        f"The pump calibration step {i} needs the torque wrench set to {i} newton metres." for i in range(6)))
    (folder / "guide.md").write_text("# Guide\n\n" + " ".join(
        f"Mount the valve bracket {i} with the two long screws before wiring." for i in range(6)))


@pytest.fixture()
def waits(monkeypatch) -> list[float]:
    """Every wait between attempts, in order (the sleep records instead of sleeping)."""
    recorded: list[float] = []
    monkeypatch.setattr(retry_module, "wait", recorded.append)
    return recorded


def rows(settings: Settings, sql: str, params=None) -> list[tuple]:
    with store_connection(settings.store_path) as conn:
        return conn.execute(sql, params or []).fetchall()


def test_transient_parse_failure_is_retried_and_the_document_indexed(tmp_path, embedder, monkeypatch, waits):
    write_docs(tmp_path / "docs")
    settings = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"], ingest_retry_delays_s=DELAYS)
    real = text_parser.parse_text
    calls: list[int] = []

    def flaky(path: Path, *args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            raise FileReadError(path, "reading the file failed: Input/output error", errno=5)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(text_parser, "parse_text", flaky)
    report = run_sync(settings, embedder)

    assert len(calls) == 3
    assert waits == DELAYS[:2]  # the setting's first two waits, in order
    assert (report.parse.retried, report.parse.recovered, report.parse.retry_attempts) == (1, 1, 2)
    assert report.parse.retry_wait_s == pytest.approx(2.0)
    assert report.parse.failed == 0 and report.parse.parsed == 2
    docs = rows(settings, "SELECT relative_path, status, parse_attempts FROM documents ORDER BY relative_path")
    assert docs == [("guide.md", "active", 1), ("notes.txt", "active", 3)]
    assert rows(settings, "SELECT count(*) FROM ingestion_failures WHERE resolved_at IS NULL") == [(0,)]
    conn, _ = open_snapshot(settings.index_dir, read_pointer(settings.index_dir))
    try:
        indexed = conn.execute("SELECT DISTINCT source_path FROM chunks ORDER BY 1").fetchall()
    finally:
        conn.close()
    assert [Path(p).name for p, in indexed] == ["guide.md", "notes.txt"]


def test_transient_failure_gives_up_after_the_last_wait(tmp_path, embedder, monkeypatch, waits):
    write_docs(tmp_path / "docs")
    settings = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"], ingest_retry_delays_s=DELAYS)
    calls: list[int] = []

    def broken(path: Path, *args, **kwargs):
        calls.append(1)
        raise FileReadError(path, "reading the file failed: Stale file handle", errno=116)

    monkeypatch.setattr(text_parser, "parse_text", broken)
    report = run_sync(settings, embedder)

    assert len(calls) == 1 + len(DELAYS) == 4
    assert waits == DELAYS
    assert report.parse.failed == 1 and report.parse.recovered == 0
    (row,) = rows(settings, "SELECT kind, attempts, failure_class, input_size_bytes FROM ingestion_failures "
                            "WHERE resolved_at IS NULL")
    assert row == ("read_error", 4, "transient", (tmp_path / "docs" / "notes.txt").stat().st_size)
    assert rows(settings, "SELECT parse_attempts, status FROM documents WHERE relative_path = 'notes.txt'") == [(4, "failed")]


def test_permanent_failure_is_tried_once_with_redacted_traceback_and_input(tmp_path, embedder, monkeypatch, waits):
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app

    write_docs(tmp_path / "docs")
    settings = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"], ingest_retry_delays_s=DELAYS)
    calls: list[int] = []

    def corrupt(path: Path, *args, **kwargs):
        calls.append(1)
        raise ValueError(
            f"bad front matter near https://bob:hunter2@docs.example.com/x; Authorization: Basic "
            f"QWxhZGRpbjpvcGVuIHNlc2FtZQ== password=s3cr3tPass token {SECRET_TOKEN}")

    monkeypatch.setattr(markdown_parser, "parse_markdown", corrupt)
    report = run_sync(settings, embedder)

    assert len(calls) == 1 and waits == []
    assert report.parse.failed == 1 and report.parse.retried == 0
    guide = tmp_path / "docs" / "guide.md"
    (row,) = rows(settings, "SELECT path, stage, kind, attempts, failure_class, traceback, input_size_bytes, "
                            "input_sha256, reason FROM ingestion_failures WHERE resolved_at IS NULL")
    path, stage, kind, attempts, failure_class, trace, size, sha, reason = row
    assert (path, stage, kind, attempts, failure_class) == (str(guide), "parse", "corrupt", 1, "permanent")
    assert size == guide.stat().st_size and sha == hashlib.sha256(guide.read_bytes()).hexdigest()
    # the traceback runs from the parse stage down to the parser that raised, with its cause
    assert "Traceback (most recent call last)" in trace and "in corrupt" in trace and "ValueError" in trace
    assert "CorruptFileError" in trace
    for secret in SECRETS:
        assert secret not in trace and secret not in reason
    assert "https://bob:[SECRET]@docs.example.com" in trace and "Authorization: Basic [SECRET]" in trace

    engine = RetrievalEngine(settings, embedder=embedder)
    with TestClient(create_app(settings, engine=engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
        listed = client.get("/api/failures")
        assert listed.status_code == 200
        (failure,) = listed.json()["failures"]
        assert failure["attempts"] == 1 and failure["failure_class"] == "permanent"
        assert failure["input_sha256"] == sha and failure["input_size_bytes"] == size
        assert failure["traceback"] == trace
