"""The open metric set (issue 15 item 2): one registry (knowledge_store.evaluation.metrics.METRICS) of canonical metric names that the
evaluator, the long-form results store, the CLI table, the Dagster scorecard and regression gate and the
evaluation summary API all read - so adding a metric is one entry there.

The parts that need no model, store or server are in tests/unit/test_metric_registry.py.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta

import duckdb
import pytest

from knowledge_store.core.errors import ConfigError
from knowledge_store.evaluation import results_store
from knowledge_store.evaluation.metrics import METRICS, MetricError, MetricSpec, UnknownMetricError, each_query
from knowledge_store.evaluation.results_store import (
    EvalRun,
    evaluation_summary,
    read_scorecard,
    record_eval_results,
    results_path,
)

T0 = datetime(2026, 1, 1, 12, 0, 0)


def run(run_id: str, created_at: datetime, configuration: str = "hybrid", **metrics: float) -> EvalRun:
    values = {"recall@5": 0.8, "ndcg@10": 0.7, "mrr@10": 0.6, "precision@5": 0.2, "ragas_recall@5": 0.8,
              "grounding": 0.9, "latency_p50_ms": 9.0, "latency_p95_ms": 15.0}
    values.update({name.replace("__", "@"): value for name, value in metrics.items()})
    return EvalRun(run_id=run_id, dataset="scifact", split="test", configuration=configuration, created_at=created_at,
                   metrics=values, queries=300, alpha=0.7, fusion="weighted", reranker="none")


# ------------------------------------------------------------------ the long-form results store


def test_results_are_stored_long_form_and_a_misspelt_metric_writes_nothing(tmp_path):
    path = results_path(tmp_path)
    record_eval_results(path, [run("r1", T0)])
    conn = duckdb.connect(str(path), read_only=True)
    stored = dict(conn.execute("SELECT metric, value FROM eval_metrics WHERE run_id = 'r1'").fetchall())
    conn.close()
    assert stored == dict(run("r1", T0).metrics)
    with pytest.raises(UnknownMetricError, match="recall_at_5"):
        record_eval_results(path, [run("r2", T0), run("r3", T0, recall_at_5=0.5)])
    with pytest.raises(MetricError, match="finite"):
        record_eval_results(path, [run("r4", T0, grounding=float("nan"))])
    assert [r["run_id"] for r in read_scorecard(path)] == ["r1"]  # r2 was not written either: one transaction


def test_a_results_file_from_before_the_registry_keeps_its_history(tmp_path):
    """A results.duckdb written with one column per metric (eval_results, the first release) is migrated on the
    first read: the console shows its runs with canonical names and the previous run."""
    path = results_path(tmp_path)
    path.parent.mkdir(parents=True)
    conn = duckdb.connect(str(path))
    conn.execute("""CREATE TABLE eval_results (
        run_id VARCHAR, dataset VARCHAR, split VARCHAR, configuration VARCHAR, alpha DOUBLE, fusion VARCHAR,
        reranker VARCHAR, queries INTEGER, recall_at_5 DOUBLE, ndcg_at_10 DOUBLE, mrr_at_10 DOUBLE,
        precision_at_5 DOUBLE, p50_ms DOUBLE, p95_ms DOUBLE, created_at TIMESTAMP)""")  # before ragas/grounding
    for run_id, created_at, recall in (("old-1", T0, 0.80), ("old-2", T0 + timedelta(days=1), 0.76)):
        conn.execute("INSERT INTO eval_results VALUES (?, 'scifact', 'test', 'hybrid', 0.7, 'weighted', 'none', 300, "
                     "?, 0.71, 0.66, 0.17, 9.0, 15.5, ?)", [run_id, recall, created_at])
    conn.execute("CREATE TABLE scorecard AS SELECT * FROM eval_results")
    conn.execute("CREATE TABLE feedback_eval_runs (run_id VARCHAR, created_at TIMESTAMP, samples INTEGER, "
                 "samples_with_references INTEGER, recall_at_5 DOUBLE, unhelpful_passages_in_top5 INTEGER)")
    conn.execute("INSERT INTO feedback_eval_runs VALUES ('fb-1', ?, 4, 3, 0.67, 1)", [T0])
    conn.close()

    summary = evaluation_summary(tmp_path, tmp_path / "index")
    [row] = summary["scorecard"]
    assert row["run_id"] == "old-2" and row["runs"] == 2 and row["previous"]["run_id"] == "old-1"
    assert row["metrics"] == {"recall@5": 0.76, "ndcg@10": 0.71, "mrr@10": 0.66, "precision@5": 0.17,
                              "latency_p50_ms": 9.0, "latency_p95_ms": 15.5}  # no ragas/grounding columns: absent
    assert row["previous"]["metrics"]["recall@5"] == 0.80
    assert [m["name"] for m in summary["metrics"]] == list(METRICS)
    assert summary["helpful"]["recall@5"] == 0.67 and "recall_at_5" not in summary["helpful"]
    conn = duckdb.connect(str(path), read_only=True)
    tables = dict(conn.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
    versions = [v for (v,) in conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()]
    conn.close()
    assert "eval_results" not in tables and tables["scorecard"] == "VIEW"
    assert versions == [v for v, _, _ in results_store.RESULTS_MIGRATIONS]
    # new runs append to the migrated history
    record_eval_results(path, [run("new-3", T0 + timedelta(days=2), recall__5=0.9)])
    [row] = read_scorecard(path)
    assert (row["run_id"], row["runs"], row["previous"]["run_id"]) == ("new-3", 3, "old-2")


# ------------------------------------------------------------------ the regression gate


def test_the_regression_gate_checks_every_gated_metric_in_its_own_direction(tmp_path, monkeypatch):
    from pipelines.evaluation import regressions

    # gate a lower-is-better metric too (Recall@5 is gated by default)
    monkeypatch.setitem(METRICS, "latency_p95_ms", MetricSpec(
        "latency_p95_ms", "p95 ms", False, METRICS["latency_p95_ms"].score, gated=True))
    path = results_path(tmp_path)
    record_eval_results(path, [run("r1", T0), run("r2", T0 + timedelta(hours=1), recall__5=0.79, latency_p95_ms=15.5)])
    rows = read_scorecard(path)
    # recall fell 0.01 (within the margin); p95 rose 0.5 ms, which is worse for a lower-is-better metric
    assert [(d["metric"], d["drop"]) for d in regressions(rows, {}, margin=0.02)] == [("latency_p95_ms", 0.5)]
    record_eval_results(path, [run("r3", T0 + timedelta(hours=2), recall__5=0.70, latency_p95_ms=14.0)])
    drops = regressions(read_scorecard(path), {}, margin=0.02)
    assert [(d["metric"], d["drop"]) for d in drops] == [("recall@5", 0.09)]  # p95 fell: better, not a drop

    # a baseline wins over the previous run; a bare number is the format from before the registry (Recall@5)
    def recall_references(baseline):
        return [d["reference"] for d in regressions(rows, baseline, 0.02) if d["metric"] == "recall@5"]

    assert recall_references({"scifact/hybrid": 0.95}) == [0.95]
    assert recall_references({"scifact/hybrid": {"recall@5": 0.95}}) == [0.95]
    assert recall_references({"scifact/hybrid": {"recall@5": 0.8}}) == []
    with pytest.raises(UnknownMetricError, match="recall_at_5"):
        regressions(rows, {"scifact/hybrid": {"recall_at_5": 0.8}}, 0.02)
    with pytest.raises(ConfigError):
        regressions(rows, [0.8], 0.02)


# ------------------------------------------------------------------ one edit per metric


@pytest.mark.slow
def test_a_metric_registered_once_reaches_the_stored_rows_the_cli_table_and_the_summary_api(
        tmp_path, monkeypatch, capsys, embedder):
    """Registering a metric is the only edit: ``groundwork eval`` computes it, prints it in its table, records it
    long-form, and GET /api/evaluation/summary lists it as a column with its value."""
    from fastapi.testclient import TestClient

    from knowledge_store.cli import main
    from knowledge_store.config.settings import Settings
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app
    from tests.helpers import write_tiny_beir

    monkeypatch.setitem(METRICS, "answer_words", MetricSpec(
        "answer_words", "Answer words", False, each_query(lambda outcome: float(len(outcome.answer.text.split()))),
        aggregate=statistics.median, digits=1, description="words in the extractive answer"))
    data = tmp_path / "data"
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(data))
    write_tiny_beir(tmp_path / "tiny")

    assert main(["eval", str(tmp_path / "tiny"), "--alpha", "0"]) == 0
    table = capsys.readouterr().out
    header, _, values = table.splitlines()[1:4]
    assert header.split()[-2:] == ["Answer", "words"]  # the last registered column, by its label
    words = float(values.split()[-1])
    assert words > 0

    conn = duckdb.connect(str(results_path(data)), read_only=True)
    stored = conn.execute("SELECT value FROM eval_metrics WHERE metric = 'answer_words'").fetchall()
    conn.close()
    assert stored == [(pytest.approx(words, abs=0.05),)]

    settings = Settings(data_dir=data)  # a server over the data folder `groundwork eval` recorded in
    with TestClient(create_app(settings, RetrievalEngine(settings, embedder=embedder), mount_mcp=False),
                    base_url="http://127.0.0.1:8080") as client:
        body = client.get("/api/evaluation/summary").json()
    assert body["metrics"][-1] == {"name": "answer_words", "label": "Answer words", "higher_is_better": False,
                                   "digits": 1, "headline": False, "gated": False,
                                   "description": "words in the extractive answer"}
    [row] = body["scorecard"]
    assert row["configuration"] == "BM25 only (groundwork eval)"
    assert row["metrics"]["answer_words"] == pytest.approx(words, abs=0.05)
