"""`groundwork eval` on a BEIR-format folder, through the normal ingestion path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as ROOT
from tests.helpers import write_tiny_beir


def groundwork(*args: str, data_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GROUNDWORK_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "knowledge_store.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_eval_prints_the_metrics_and_reuses_its_store(tmp_path):
    write_tiny_beir(tmp_path / "tiny")
    result = groundwork("eval", str(tmp_path / "tiny"), "--json", data_dir=tmp_path / "data")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    for key in ("recall@5", "ndcg@10", "mrr@10", "precision@5", "latency_p50_ms", "latency_p95_ms"):
        assert key in report
    assert report["queries"] == 3 and report["recall@5"] == 1.0 and report["mrr@10"] == 1.0
    assert Path(report["store"]).is_relative_to(tmp_path / "data" / "eval")
    again = groundwork("eval", str(tmp_path / "tiny"), "--alpha", "0", "--k", "5", data_dir=tmp_path / "data")
    assert again.returncode == 0 and "BM25 only" in again.stdout and "nDCG@5" in again.stdout


@pytest.mark.slow
def test_eval_records_its_result_where_the_evaluation_page_reads_it(tmp_path):
    from knowledge_store.evaluation.results_store import evaluation_summary, results_path

    write_tiny_beir(tmp_path / "tiny")
    result = groundwork("eval", str(tmp_path / "tiny"), "--alpha", "0", "--k", "5", "--json", data_dir=tmp_path / "data")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert Path(report["recorded_in"]) == results_path(tmp_path / "data")
    summary = evaluation_summary(tmp_path / "data", tmp_path / "data" / "index")
    [row] = summary["scorecard"]
    assert (row["dataset"], row["split"], row["configuration"]) == ("tiny", "test", "BM25 only (groundwork eval)")
    assert (row["metrics"]["recall@5"], row["queries"], row["alpha"]) == (report["recall@5"], 3, 0.0)
    assert row["metrics"]["ndcg@10"] is not None and summary["empty"] is False  # nDCG@10 is recorded whatever --k says


def test_eval_on_a_folder_without_a_corpus_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = groundwork("eval", str(tmp_path / "empty"), data_dir=tmp_path / "data")
    assert result.returncode == 2 and "corpus.jsonl" in result.stderr
