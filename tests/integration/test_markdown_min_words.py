"""Markdown stubs are not indexed: a file under ``min_markdown_words`` words is skipped with a
``too_short`` warning row, listed with its kind in the sync summary, ``groundwork ingest --json``, the API's sync
job result and the failures API; the threshold is a setting."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from knowledge_store.cli import main
from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.storage.store import store_connection

pytestmark = pytest.mark.slow

WORDS = ("pump valve impeller casing flange gasket bearing shaft seal motor coupling bolt torque pressure "
         "flow inlet outlet drain vent filter").split()


def text_of(n_words: int, topic: str) -> str:
    body = " ".join(WORDS[i % len(WORDS)] for i in range(n_words - 2))
    return f"# {topic.title()} notes\n\n{body}\n"  # heading words count: n_words in all


def write_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    # front matter and a link target are not words: the short file stays at 20
    (folder / "short.md").write_text("---\ntitle: Stub page with a long front matter title of many words\n---\n"
                                     + text_of(20, "stub").replace("pump", "[pump](https://example.org/a/b/c/d)", 1))
    (folder / "long.md").write_text(text_of(200, "maintenance"))
    return folder


def rows(settings: Settings, sql: str, params=None):
    with store_connection(settings.store_path, read_only=True) as conn:
        return conn.execute(sql, params or []).fetchall()


def active_paths(settings: Settings) -> list[str]:
    return sorted(Path(p).name for p, in rows(settings, "SELECT path FROM documents WHERE status = 'active'"))


def test_short_markdown_is_skipped_with_a_too_short_row(tmp_path, embedder):
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app

    folder = write_folder(tmp_path / "notes")
    settings = Settings(data_dir=tmp_path / "data", sources=[folder])
    assert settings.min_markdown_words == 50
    report = run_sync(settings, embedder)

    assert active_paths(settings) == ["long.md"]
    assert rows(settings, "SELECT count(*) FROM documents")[0][0] == 2
    assert rows(settings, "SELECT status FROM documents WHERE path LIKE '%short.md'") == [("failed",)]
    assert rows(settings, "SELECT count(*) FROM chunks c JOIN documents d USING (doc_id, version) "
                          "WHERE d.path LIKE '%short.md'")[0][0] == 0
    failures = rows(settings, "SELECT path, stage, kind, reason FROM ingestion_failures WHERE resolved_at IS NULL")
    assert [(Path(p).name, stage, kind) for p, stage, kind, _ in failures] == [("short.md", "parse", "too_short")]
    assert "has 20 word(s), under the 50-word minimum" in failures[0][3]
    # a warning, not a failure: the summary lists it as skipped with its kind
    assert [s["kind"] for s in report.parse.skipped] == ["too_short"] and report.parse.failed == 0
    assert "0 failed" in report.summary and "1 skipped (1 too_short)" in report.summary

    engine = RetrievalEngine(settings, embedder=embedder)
    with TestClient(create_app(settings, engine=engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
        listed = client.get("/api/failures").json()["failures"]
        assert [(Path(f["path"]).name, f["kind"]) for f in listed] == [("short.md", "too_short")]
        (folder / "stub2.md").write_text(text_of(12, "another"))
        job = client.post(f"/api/sources/{folder.name}/sync").json()
        for _ in range(600):
            job = client.get(f"/api/knowledge/jobs/{job['job_id']}").json()
            if job["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.1)
        assert job["status"] == "succeeded", job
        assert [(Path(s["path"]).name, s["kind"]) for s in job["skipped"]] == [("stub2.md", "too_short")]
        assert "1 skipped (1 too_short)" in job["summary"] and job["failed"] == 0
    assert active_paths(settings) == ["long.md"]


def test_threshold_is_a_setting(tmp_path, embedder):
    folder = write_folder(tmp_path / "notes")
    settings = Settings(data_dir=tmp_path / "data", sources=[folder], min_markdown_words=10)
    report = run_sync(settings, embedder)
    assert active_paths(settings) == ["long.md", "short.md"] and not report.parse.skipped
    assert rows(settings, "SELECT count(*) FROM ingestion_failures")[0][0] == 0

    other = Settings(data_dir=tmp_path / "data2", sources=[folder], min_markdown_words=500)
    run_sync(other, embedder)
    assert active_paths(other) == []
    assert sorted(kind for kind, in rows(other, "SELECT kind FROM ingestion_failures")) == ["too_short", "too_short"]


def test_ingest_json_lists_the_skipped_file(tmp_path, monkeypatch, capsys):
    folder = write_folder(tmp_path / "notes")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("GROUNDWORK_SOURCES", raising=False)
    assert main(["ingest", "--json", "--data-dir", str(tmp_path / "data"), "--sources", str(folder)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["skipped"] == {"too_short": 1}
    assert [(Path(f["path"]).name, f["kind"]) for f in report["skipped_files"]] == [("short.md", "too_short")]
    assert "1 skipped (1 too_short)" in report["summary"] and report["failed"] == 0
    assert report["documents_indexed"] == 1 and report["added"] == 1
