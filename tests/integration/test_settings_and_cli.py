"""Settings from the environment and the groundwork command.

The parts that need no model, store or server are in tests/unit/test_settings_and_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import MARKDOWN_FILLER
from tests.helpers import REPO_ROOT as ROOT


def _embeddings_column_type(store_path: Path) -> str:
    from knowledge_store.storage.store import store_connection

    with store_connection(store_path) as conn:
        return conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name = 'embeddings' AND column_name = 'embedding'"
        ).fetchone()[0]


def test_a_store_takes_vectors_of_any_width_so_models_of_several_widths_share_it(tmp_path):
    # migration 1 created FLOAT[embedding_dim]; migration 9 lifts it: minilm (384) and mpnet (768) vectors side by side,
    # each snapshot casting its model's vectors to FLOAT[n] (tests/integration/test_models.py switches between them)
    assert _embeddings_column_type(tmp_path / "default.duckdb") == "FLOAT[]"


def test_embedders_expect_the_width_their_model_declares(monkeypatch, tmp_path, model_path):
    from knowledge_store.models.embeddings import Embedder, OnnxEmbedder, query_embedder

    monkeypatch.setenv("GROUNDWORK_EMBEDDING_DIM", "8")  # for folders that do not say their width; this one does
    assert Embedder(model_path).dim == 384
    assert OnnxEmbedder(model_path, tmp_path / "cache").dim == 384
    assert query_embedder(model_path, "torch", tmp_path / "cache", threads=1).dim == 384
    assert Embedder(model_path, dim=16).dim == 16


def groundwork(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "knowledge_store.cli", *args],
        env={**os.environ, **env}, capture_output=True, text=True, cwd=ROOT, timeout=600,
    )


@pytest.mark.slow
def test_cli_ingest_and_status_report_the_sync(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("# Guide\n\n## Reset\n\nHold the button for ten seconds to reset the hub.\n" + MARKDOWN_FILLER)
    (docs / "broken.pdf").write_text("not a pdf at all")
    env = {"GROUNDWORK_DATA_DIR": str(tmp_path / "data"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    first = groundwork("ingest", "--sources", str(docs), "--json", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads(first.stdout)
    assert report["summary"] == "1 added, 0 updated, 0 removed, 0 unchanged, 0 excluded, 1 failed"
    assert report["documents_indexed"] == 1 and report["chunks_indexed"] >= 1
    assert all(report["checks"].values()) and len(report["checks"]) == 4
    assert [f["kind"] for f in report["open_failures"]] == ["wrong_extension"]
    assert (tmp_path / "dagster_home").is_dir()  # the run is recorded where `dagster dev` shows it

    status = groundwork("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["counts"]["active_documents"] == 1
    assert data["index_snapshot"]["snapshot_version"] == 1
    assert data["documents"][0]["relative_path"] in {"broken.pdf", "guide.md"}
    assert data["ingestion_failures"][0]["path"].endswith("broken.pdf")

    text = groundwork("status", env=env)
    assert "ingestion failures (1 open)" in text.stdout and "guide.md" in text.stdout


def test_cli_rejects_a_source_that_is_not_a_folder(tmp_path):
    result = groundwork("ingest", "--sources", str(tmp_path / "nope"), env={"GROUNDWORK_DATA_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "not a folder" in result.stderr


def test_status_without_a_store_says_what_to_do(tmp_path):
    result = groundwork("status", env={"GROUNDWORK_DATA_DIR": str(tmp_path / "empty")})
    assert result.returncode == 2
    assert "groundwork ingest" in result.stderr


def test_the_cli_launches_the_dagster_jobs_by_the_names_the_project_gives_them():
    from knowledge_store import cli
    from pipelines.definitions import INGEST_JOB_NAME, SYNC_SOURCE_JOB_NAME, defs
    from pipelines.sources import SOURCE_PARTITIONS

    assert (cli.INGEST_JOB_NAME, cli.SYNC_SOURCE_JOB_NAME, cli.SOURCE_PARTITIONS_NAME) == (
        INGEST_JOB_NAME, SYNC_SOURCE_JOB_NAME, SOURCE_PARTITIONS.name)
    assert defs.resolve_job_def(cli.INGEST_JOB_NAME) and defs.resolve_job_def(cli.SYNC_SOURCE_JOB_NAME)
