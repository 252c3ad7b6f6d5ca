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


@pytest.mark.slow
def test_eval_suite_runs_every_configuration_and_its_gate_fails_naming_what_dropped(tmp_path):
    """`groundwork eval --suite`: the suite's sets x configurations from YAML, gated against its baseline file
    (exit 1 naming set, configuration and metric), and --write-baseline makes the run the new reference."""
    write_tiny_beir(tmp_path / "tiny")
    evals = tmp_path / "repo" / "evals"
    (evals / "sets").mkdir(parents=True)
    (evals / "suites").mkdir()
    (evals / "sets" / "tiny.yaml").write_text(f"name: tiny\nkind: beir\npath: {tmp_path / 'tiny'}\nsplit: test\n")
    (evals / "sets" / "missing.yaml").write_text("name: missing\nkind: beir\npath: not-built\nbuild: make devset\n")
    suite = evals / "suites" / "tiny.yaml"
    suite.write_text("name: tiny\nsets: [tiny, missing]\nconfigurations: [{name: hybrid}, {name: bm25, alpha: 0.0}]\n"
                     "metrics: [recall@5, ndcg@10]\ngate: {metric: recall@5, margin: 0.02}\n")
    baseline = evals / "baseline.json"
    baseline.write_text(json.dumps({"tiny/hybrid": {"recall@5": 1.5}}))  # more than any run can reach
    failed = groundwork("eval", "--suite", str(suite), data_dir=tmp_path / "data")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "regression: tiny/hybrid recall@5: 1.0000 vs baseline 1.5000" in failed.stdout
    assert "tiny/bm25" not in failed.stdout.split("gate:")[1]  # no baseline entry: not compared
    assert "missing: not evaluated" in failed.stdout and "make devset" in failed.stdout
    written = groundwork("eval", "--suite", str(suite), "--write-baseline", "--json", data_dir=tmp_path / "data")
    assert written.returncode == 0, written.stderr[-3000:]
    report = json.loads(written.stdout)
    assert {(r["set"], r["configuration"]) for r in report["rows"]} == {("tiny", "hybrid"), ("tiny", "bm25")}
    assert json.loads(baseline.read_text())["tiny/hybrid"]["recall@5"] == 1.0
    again = groundwork("eval", "--suite", str(suite), data_dir=tmp_path / "data")
    assert again.returncode == 0 and "passed" in again.stdout
    # a bad suite is refused before anything runs, naming the file and the field
    suite.write_text(suite.read_text().replace("alpha: 0.0", "alpha: 2"))
    bad = groundwork("eval", "--suite", str(suite), data_dir=tmp_path / "data")
    assert bad.returncode == 2 and "configurations[1].alpha" in bad.stderr + bad.stdout
