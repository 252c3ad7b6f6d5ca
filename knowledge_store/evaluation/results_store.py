"""Evaluation results on disk: what the evaluation assets and ``groundwork eval`` write, and what the console reads.

One DuckDB file, ``<data_dir>/eval/results.duckdb``, append-only per run:

- ``eval_runs``  one row per dataset, split, configuration and run (the ``retrieval_eval_*`` assets and
  ``groundwork eval``): when, how many queries, the configuration's alpha, fusion, reranker and weights;
- ``eval_metrics``  long-form, one row per metric of such a run (``run_id, dataset, split, configuration,
  metric, value``), ``metric`` being the canonical name of ``knowledge_store.evaluation.metrics.METRICS`` - a new metric needs
  no schema change; ``scorecard`` is a view: the latest ``eval_runs`` row per dataset, split and
  configuration; a run also records how its answers were written (``answer_method``) and, when an LLM
  judged them, the judge model and the RAGAS version;
- ``eval_metric_notes``  one row per metric of a run that has no value: ``status`` ``not_applicable``
  (grounding of extractive answers) or ``failed`` (the judge's error), and the ``reason`` - never a 0 in
  ``eval_metrics``;
- ``feedback_eval_runs`` / ``helpful_rates``  one row per ``feedback_eval`` run (gold set from thumbs, recall
  of today's engine on it) and its helpful rate per configuration (alpha, fusion, reranker);
- ``feedback_eval_metrics``  one row per configuration and metric of a ``feedback_eval`` run: RAGAS context
  recall@5 (ID-based and on text) and context precision on the references the thumbs make (``log_eval``);
- ``query_log_eval_metrics`` / ``query_log_eval_notes``  one row per answer method and metric of a
  ``query_log_eval`` run (faithfulness, answer relevancy, answer support, key-fact recall) and the metrics it
  has no value for, and why;
- ``drift_runs`` / ``drift_queries``  one row per ``query_log_drift`` run (logged queries replayed on today's
  index) and one per replayed query (top-5 overlap, passages added and removed);
- ``eval_questions`` / ``eval_sweeps``  a run's questions (what each should find, the rank it was found at, its
  first hits) and its metrics against alpha, written with the run (``groundwork eval --sample`` does).

The alpha sweeps are files: the ``alpha_sweep`` notebook writes
``<data_dir>/notebooks/alpha_sweep-<UTC stamp>/alpha_sweep_<dataset>_<split>.csv`` (and ``.png``), and
``groundwork tune`` keeps its whole grid in ``<index_dir>/tuned.json``.

``evaluation_summary`` reads all of it for ``GET /api/evaluation/summary``; it never computes a metric
itself, so the console shows exactly what the evaluation runs measured, and nothing when none ran.

The file's schema is versioned like the store's: ``RESULTS_MIGRATIONS`` is append-only, each entry applied
once (``knowledge_store.storage.store.migrate``) when a writer opens the file, or by the first summary read of a file
written by an older version, so results files keep their history across schema changes.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from knowledge_store.evaluation.metrics import (
    METRICS,
    PRIMARY_METRIC,
    MetricError,
    check_metric_value,
    metric_label,
    metric_order,
    metric_spec,
)
from knowledge_store.storage.store import migrate, open_duckdb, transaction
from knowledge_store.storage.tuned import load_tuned


class EvaluatedConfiguration(Protocol):
    """What a run record is made from (``retrieval_eval.EvalResult``): the configuration, its figures, the query count."""

    config: Any  # retrieval_eval.EvalConfig: name/configuration, alpha, fusion, reranker, section and lead weights
    metrics: dict[str, float]
    queries: int
    unavailable: dict[str, dict[str, str]]  # metric -> {"status", "reason"}: no value, and why
    answer_method: str
    judge_model: str | None
    ragas_version: str | None

RESULTS_FILE = "results.duckdb"

_FIRST_SCHEMA = """
CREATE TABLE IF NOT EXISTS eval_results (
    run_id VARCHAR, dataset VARCHAR, split VARCHAR, configuration VARCHAR, alpha DOUBLE, fusion VARCHAR,
    reranker VARCHAR, queries INTEGER, recall_at_5 DOUBLE, ndcg_at_10 DOUBLE, mrr_at_10 DOUBLE,
    precision_at_5 DOUBLE, p50_ms DOUBLE, p95_ms DOUBLE, created_at TIMESTAMP,
    ragas_recall_at_5 DOUBLE, grounding DOUBLE
);
-- columns added after the first release of this table
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS ragas_recall_at_5 DOUBLE;
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS grounding DOUBLE;
CREATE TABLE IF NOT EXISTS feedback_eval_runs (
    run_id VARCHAR, created_at TIMESTAMP, samples INTEGER, samples_with_references INTEGER,
    recall_at_5 DOUBLE, unhelpful_passages_in_top5 INTEGER
);
CREATE TABLE IF NOT EXISTS helpful_rates (
    run_id VARCHAR, created_at TIMESTAMP, alpha DOUBLE, fusion VARCHAR, reranker VARCHAR,
    up INTEGER, down INTEGER, rated INTEGER, requests INTEGER, helpful_rate DOUBLE
);
CREATE TABLE IF NOT EXISTS drift_runs (
    run_id VARCHAR, created_at TIMESTAMP, queries_replayed INTEGER, mean_top5_overlap DOUBLE,
    changed_queries INTEGER, skipped INTEGER
);
CREATE TABLE IF NOT EXISTS drift_queries (
    run_id VARCHAR, created_at TIMESTAMP, retrieval_request_id VARCHAR, query VARCHAR, overlap DOUBLE,
    added VARCHAR[], removed VARCHAR[], logged_snapshot INTEGER, current_snapshot INTEGER, kept_by_hash INTEGER
);
"""

# the newest run first within each dataset, split and configuration
_BY_RECENCY = "PARTITION BY dataset, split, configuration ORDER BY created_at DESC"
_LEGACY_COPY = "QUALIFY row_number() OVER (PARTITION BY run_id, dataset, split, configuration ORDER BY created_at DESC) = 1"
# eval_results' metric columns and the canonical names they become (frozen: what that table held)
_LEGACY_METRIC_COLUMNS = (("recall_at_5", "recall@5"), ("ndcg_at_10", "ndcg@10"), ("mrr_at_10", "mrr@10"),
                          ("precision_at_5", "precision@5"), ("ragas_recall_at_5", "ragas_recall@5"),
                          ("grounding", "grounding"), ("p50_ms", "latency_p50_ms"), ("p95_ms", "latency_p95_ms"))
_LONG_FORM = f"""
CREATE TABLE eval_runs (
    run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, split VARCHAR NOT NULL, configuration VARCHAR NOT NULL,
    created_at TIMESTAMP NOT NULL, queries INTEGER, alpha DOUBLE, fusion VARCHAR, reranker VARCHAR,
    section_weight DOUBLE, lead_weight DOUBLE,
    PRIMARY KEY (run_id, dataset, split, configuration)
);
CREATE TABLE eval_metrics (
    run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, split VARCHAR NOT NULL, configuration VARCHAR NOT NULL,
    metric VARCHAR NOT NULL, value DOUBLE NOT NULL,
    PRIMARY KEY (run_id, dataset, split, configuration, metric)
);
INSERT INTO eval_runs
SELECT run_id, dataset, split, configuration, created_at, queries, alpha, fusion, reranker, NULL, NULL
FROM eval_results {_LEGACY_COPY};
INSERT INTO eval_metrics
WITH legacy AS (SELECT * FROM eval_results {_LEGACY_COPY})
SELECT run_id, dataset, split, configuration, metric, value FROM (
    {" UNION ALL ".join(f"SELECT run_id, dataset, split, configuration, '{name}' AS metric, {column} AS value FROM legacy"
                        for column, name in _LEGACY_METRIC_COLUMNS)}
) WHERE value IS NOT NULL AND isfinite(value);
DROP TABLE eval_results;
DROP TABLE IF EXISTS scorecard;
CREATE VIEW scorecard AS SELECT * FROM eval_runs QUALIFY row_number() OVER ({_BY_RECENCY}) = 1;
"""

RESULTS_MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "tables as first released: eval_results (one column per metric), feedback_eval and query_log_drift runs",
     _FIRST_SCHEMA),
    (2, "retrieval results long-form: eval_runs + eval_metrics (one row per canonical metric name); eval_results "
        "copied over and dropped; scorecard becomes a view of the latest run per dataset, split and configuration",
     _LONG_FORM),
    (3, "feedback_eval_runs.recall_at_5 renamed to the canonical metric name recall@5",
     'ALTER TABLE feedback_eval_runs RENAME COLUMN recall_at_5 TO "recall@5";'),
    (4, "eval_runs records how the answers were written, the judge model and the RAGAS version; "
        "eval_metric_notes holds the metrics a run has no value for (not applicable or failed) and why; the "
        "scorecard view is made again over the wider eval_runs (a view keeps the columns it was made with)",
     f"""ALTER TABLE eval_runs ADD COLUMN answer_method VARCHAR;
        ALTER TABLE eval_runs ADD COLUMN judge_model VARCHAR;
        ALTER TABLE eval_runs ADD COLUMN ragas_version VARCHAR;
        DROP VIEW IF EXISTS scorecard;
        CREATE VIEW scorecard AS SELECT * FROM eval_runs QUALIFY row_number() OVER ({_BY_RECENCY}) = 1;
        CREATE TABLE eval_metric_notes (
            run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, split VARCHAR NOT NULL, configuration VARCHAR NOT NULL,
            metric VARCHAR NOT NULL, status VARCHAR NOT NULL, reason VARCHAR NOT NULL,
            PRIMARY KEY (run_id, dataset, split, configuration, metric));"""),
    (5, "eval_questions (each question of a run: what it should find, the rank it found it at, its first hits) and "
        "eval_sweeps (a run's metrics against alpha)",
     """CREATE TABLE eval_questions (
            run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, split VARCHAR NOT NULL, configuration VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL, query_id VARCHAR NOT NULL, query VARCHAR NOT NULL, expected VARCHAR,
            found_rank INTEGER, scores VARCHAR, hits VARCHAR,
            PRIMARY KEY (run_id, dataset, split, configuration, query_id));
        CREATE TABLE eval_sweeps (
            run_id VARCHAR NOT NULL, dataset VARCHAR NOT NULL, split VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL,
            fusion VARCHAR, reranker VARCHAR, alpha DOUBLE NOT NULL, metric VARCHAR NOT NULL, value DOUBLE NOT NULL,
            PRIMARY KEY (run_id, dataset, split, alpha, metric));"""),
    (6, "RAGAS on the logs: feedback_eval_metrics (each configuration's figures on the feedback references) and "
        "query_log_eval_metrics / query_log_eval_notes (each answer method's figures on the served answers, the "
        "judge model, and the metrics without a value and why)",
     """CREATE TABLE feedback_eval_metrics (
            run_id VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL, configuration VARCHAR NOT NULL,
            metric VARCHAR NOT NULL, value DOUBLE NOT NULL, samples INTEGER,
            PRIMARY KEY (run_id, configuration, metric));
        CREATE TABLE query_log_eval_metrics (
            run_id VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL, answer_method VARCHAR NOT NULL,
            metric VARCHAR NOT NULL, value DOUBLE NOT NULL, queries INTEGER, judge_model VARCHAR,
            ragas_version VARCHAR, PRIMARY KEY (run_id, answer_method, metric));
        CREATE TABLE query_log_eval_notes (
            run_id VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL, answer_method VARCHAR NOT NULL,
            metric VARCHAR NOT NULL, status VARCHAR NOT NULL, reason VARCHAR NOT NULL,
            PRIMARY KEY (run_id, answer_method, metric));"""),
]
NOTE_STATUSES = ("not_applicable", "failed")
ALPHA_SWEEP_NOTEBOOK = "alpha_sweep"
DRIFT_CHANGED_SHOWN = 50  # changed queries listed per drift run (the counts cover all of them)
EMPTY_HINT = ("No evaluation has run yet: `groundwork eval --sample` evaluates the sample corpus's example "
              "questions in seconds (`make run` does it after ingesting); run the evaluation assets in Dagster (job "
              "evaluate) or `groundwork eval <BEIR folder>` for a labelled set; the alpha sweep also comes from the "
              "alpha_sweep notebook asset (or `groundwork notebook alpha_sweep`).")


def results_path(data_dir: Path) -> Path:
    return Path(data_dir) / "eval" / RESULTS_FILE


def open_results(path: Path, timeout_s: float = 30.0):
    """A read-write connection with the schema migrated to the newest version (waits while another process
    writes)."""
    conn = open_duckdb(path, timeout_s=timeout_s)
    try:
        migrate(conn, RESULTS_MIGRATIONS)
    except BaseException:
        conn.close()
        raise
    return conn


def schema_version(conn) -> int:
    """The newest migration applied to this results file (0: none, a file from before versioning)."""
    if "schema_migrations" not in _tables(conn):
        return 0
    return conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0]


def _insert(conn, table: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        columns = ", ".join(f'"{column}"' for column in row)  # quoted: canonical metric names contain '@'
        conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['?'] * len(row))})",
                     list(row.values()))


@dataclass(frozen=True)
class EvalRun:
    """One retrieval evaluation of one configuration on one dataset split: an ``eval_runs`` row and its
    ``eval_metrics`` rows.  ``metrics`` is keyed by canonical metric names; ``unavailable`` lists the metrics
    with no value (``{name: {"status", "reason"}}``), recorded as ``eval_metric_notes`` rows."""

    run_id: str
    dataset: str
    split: str
    configuration: str
    created_at: datetime
    metrics: Mapping[str, float]
    queries: int | None = None
    alpha: float | None = None
    fusion: str | None = None
    reranker: str | None = None
    section_weight: float | None = None
    lead_weight: float | None = None
    unavailable: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    answer_method: str | None = None
    judge_model: str | None = None
    ragas_version: str | None = None

    @classmethod
    def from_result(cls, result: EvaluatedConfiguration, *, run_id: str, dataset: str, split: str, created_at: datetime,
                    configuration: str | None = None) -> EvalRun:
        """The record of an ``knowledge_store.evaluation.retrieval_eval.EvalResult``: every metric of the registry (the depth extras a
        caller asked for are its own display, not recorded), filed under ``configuration`` (default: the
        configuration's name or label)."""
        unavailable = dict(getattr(result, "unavailable", {}) or {})
        missing = [name for name in METRICS if name not in result.metrics and name not in unavailable]
        if missing:
            raise MetricError(missing[0], f"registered in knowledge_store.evaluation.metrics.METRICS but the evaluation did not produce "
                                          f"it (produced: {', '.join(result.metrics)})")
        config = result.config
        return cls(run_id=run_id, dataset=dataset, split=split,
                   configuration=configuration or config.configuration, created_at=created_at,
                   metrics={name: result.metrics[name] for name in METRICS if name in result.metrics},
                   queries=result.queries, alpha=config.alpha, fusion=config.fusion, reranker=config.reranker,
                   section_weight=config.section_weight, lead_weight=config.lead_weight,
                   unavailable={name: dict(unavailable[name]) for name in METRICS if name in unavailable},
                   answer_method=getattr(result, "answer_method", None),
                   judge_model=getattr(result, "judge_model", None),
                   ragas_version=getattr(result, "ragas_version", None))


@dataclass(frozen=True)
class QuestionHits:
    """One question of a run as the Evaluation page lists it: what it should find (``expected``, e.g. the
    answering document and section), the rank of its first relevant judged unit (None: not among ``hits``), its
    per-query metric values and the best passage of each of its first judged units (``retrieval_eval.evaluate(
    keep_hits=...)`` rows: ``rank`` as the ranking metrics count it, ``relevant`` as they judged it)."""

    query_id: str
    query: str
    expected: str
    found_rank: int | None
    scores: Mapping[str, float]
    hits: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class SweepPoint:
    """One alpha of a run's sweep: the metrics its queries reached at that alpha (canonical names)."""

    alpha: float
    metrics: Mapping[str, float]
    fusion: str | None = None
    reranker: str | None = None


_RUN_COLUMNS = ("run_id", "dataset", "split", "configuration", "created_at", "queries", "alpha", "fusion", "reranker",
                "section_weight", "lead_weight", "answer_method", "judge_model", "ragas_version")


def _checked_notes(run: EvalRun) -> dict[str, tuple[str, str]]:
    """``run.unavailable`` as ``{name: (status, reason)}``; MetricError for an unknown name, a status outside
    ``NOTE_STATUSES``, an empty reason, or a metric that has a value as well."""
    notes = {}
    for name, note in run.unavailable.items():
        metric_spec(name)
        status, reason = note.get("status"), note.get("reason")
        if status not in NOTE_STATUSES:
            raise MetricError(name, f"status must be one of {', '.join(NOTE_STATUSES)}, got {status!r}")
        if not isinstance(reason, str) or not reason.strip():
            raise MetricError(name, f"an unavailable metric needs its reason, got {reason!r}")
        if name in run.metrics:
            raise MetricError(name, "has a value and is listed as unavailable")
        notes[name] = (status, reason)
    return notes


def record_eval_results(path: Path, runs: Sequence[EvalRun], questions: Sequence[QuestionHits] = (),
                        sweep: Sequence[SweepPoint] = ()) -> None:
    """Append retrieval-evaluation runs in one transaction: one ``eval_runs`` row each and one ``eval_metrics``
    row per metric, and one ``eval_metric_notes`` row per metric without a value.  Every name must be canonical
    and every value a finite number (``MetricError`` naming the metric otherwise, raised before anything is
    written).  ``questions`` and ``sweep`` belong to the first run (its per-question hits and its metrics against
    alpha: ``eval_questions``, ``eval_sweeps``)."""
    checked = [(run, {name: check_metric_value(name, value) for name, value in run.metrics.items()},
                _checked_notes(run)) for run in runs]
    points = [(point, {name: check_metric_value(name, value) for name, value in point.metrics.items()})
              for point in sweep]
    if (questions or sweep) and not runs:
        raise ValueError("questions and sweep points belong to a run: none was given")
    conn = open_results(path)
    try:
        with transaction(conn):
            for run, metrics, notes in checked:
                conn.execute(f"INSERT INTO eval_runs ({', '.join(_RUN_COLUMNS)}) "
                             f"VALUES ({', '.join(['?'] * len(_RUN_COLUMNS))})",
                             [getattr(run, column) for column in _RUN_COLUMNS])
                if metrics:
                    conn.executemany("INSERT INTO eval_metrics VALUES (?, ?, ?, ?, ?, ?)",
                                     [[run.run_id, run.dataset, run.split, run.configuration, name, value]
                                      for name, value in metrics.items()])
                if notes:
                    conn.executemany("INSERT INTO eval_metric_notes VALUES (?, ?, ?, ?, ?, ?, ?)",
                                     [[run.run_id, run.dataset, run.split, run.configuration, name, status, reason]
                                      for name, (status, reason) in notes.items()])
            first = runs[0] if runs else None
            if questions:
                conn.executemany(
                    "INSERT INTO eval_questions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [[first.run_id, first.dataset, first.split, first.configuration, first.created_at, q.query_id,
                      q.query, q.expected, q.found_rank, json.dumps(dict(q.scores)), json.dumps(list(q.hits))]
                     for q in questions])
            if points:
                conn.executemany(
                    "INSERT INTO eval_sweeps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [[first.run_id, first.dataset, first.split, first.created_at, point.fusion, point.reranker,
                      float(point.alpha), name, value] for point, metrics in points for name, value in metrics.items()])
    finally:
        conn.close()


def read_scorecard(path: Path) -> list[dict[str, Any]]:
    """The latest run per dataset, split and configuration with its metrics and the run before it
    (``_scorecard``): what the ``eval_scorecard`` asset shows and the regression check compares."""
    conn = open_results(path)
    try:
        return _scorecard(conn)
    finally:
        conn.close()


def record_feedback_eval(path: Path, run_id: str, created_at: datetime, summary: dict[str, Any],
                         helpful: list[dict[str, Any]]) -> None:
    """One ``feedback_eval`` run: its gold-set figures and the helpful rate per configuration."""
    conn = open_results(path)
    try:
        with transaction(conn):
            _insert(conn, "feedback_eval_runs", [{"run_id": run_id, "created_at": created_at, **summary}])
            _insert(conn, "helpful_rates", [{"run_id": run_id, "created_at": created_at, **{
                key: row.get(key) for key in ("alpha", "fusion", "reranker", "up", "down", "rated", "requests",
                                              "helpful_rate")}} for row in helpful])
    finally:
        conn.close()


def record_feedback_ragas(path: Path, run_id: str, created_at: datetime, samples: int,
                          by_configuration: Mapping[str, Mapping[str, float]]) -> None:
    """One ``feedback_eval`` run's RAGAS figures per configuration (``log_eval.FeedbackReport``)."""
    conn = open_results(path)
    try:
        with transaction(conn):
            _insert(conn, "feedback_eval_metrics", [
                {"run_id": run_id, "created_at": created_at, "configuration": config, "metric": metric,
                 "value": float(value), "samples": samples}
                for config, figures in by_configuration.items() for metric, value in figures.items()])
    finally:
        conn.close()


def previous_feedback_ragas(path: Path, before_run: str) -> dict[str, dict[str, float]]:
    """The figures per configuration of the ``feedback_eval`` run before ``before_run`` ({} when none)."""
    if not Path(path).exists():
        return {}
    conn = open_results(path)
    try:
        rows = _rows(conn, "SELECT run_id, configuration, metric, value FROM feedback_eval_metrics WHERE run_id = ("
                           "SELECT run_id FROM feedback_eval_metrics WHERE run_id <> ? GROUP BY run_id "
                           "ORDER BY max(created_at) DESC LIMIT 1)", [before_run])
    finally:
        conn.close()
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        out.setdefault(row["configuration"], {})[row["metric"]] = float(row["value"])
    return out


def latest_feedback_ragas(path: Path) -> dict[str, Any] | None:
    """The latest ``feedback_eval`` run's RAGAS figures per configuration (None before one ran)."""
    if not Path(path).exists():
        return None
    conn = open_results(path)
    try:
        return _feedback_ragas(conn)
    finally:
        conn.close()


def record_query_log_eval(path: Path, run_id: str, created_at: datetime, report) -> None:
    """One ``query_log_eval`` run (a ``log_eval.QueryLogReport``): figures and notes per answer method."""
    conn = open_results(path)
    try:
        with transaction(conn):
            _insert(conn, "query_log_eval_metrics", [
                {"run_id": run_id, "created_at": created_at, "answer_method": method, "metric": metric,
                 "value": float(value), "queries": report.queries, "judge_model": report.judge_model,
                 "ragas_version": report.ragas_version}
                for method, figures in report.by_method.items() for metric, value in figures.items()])
            _insert(conn, "query_log_eval_notes", [
                {"run_id": run_id, "created_at": created_at, "answer_method": method, "metric": metric,
                 "status": note["status"], "reason": note["reason"]}
                for method, notes in report.unavailable.items() for metric, note in notes.items()])
    finally:
        conn.close()


def record_drift(path: Path, run_id: str, created_at: datetime, report) -> None:
    """One ``query_log_drift`` run (an ``knowledge_store.evaluation.log_replay.ReplayReport``) and its per-query rows."""
    conn = open_results(path)
    try:
        with transaction(conn):
            _insert(conn, "drift_runs", [{
                "run_id": run_id, "created_at": created_at, "queries_replayed": report.queries,
                "mean_top5_overlap": float(report.mean_overlap), "changed_queries": report.changed_queries,
                "skipped": len(report.skipped)}])
            _insert(conn, "drift_queries", [{
                "run_id": run_id, "created_at": created_at, "retrieval_request_id": row.retrieval_request_id,
                "query": row.query, "overlap": float(row.overlap), "added": list(row.added), "removed": list(row.removed),
                "logged_snapshot": row.logged_snapshot, "current_snapshot": row.current_snapshot,
                "kept_by_hash": row.kept_by_hash} for row in report.per_query])
    finally:
        conn.close()


# ------------------------------------------------------------------ reading (the console)


def _iso(value: Any) -> Any:
    return value.isoformat(timespec="seconds") + "Z" if isinstance(value, datetime) else value


def _rows(conn, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params or [])
    columns = [d[0] for d in cursor.description]
    return [{k: _iso(v) for k, v in zip(columns, row)} for row in cursor.fetchall()]


def _tables(conn) -> set[str]:
    return {row[0] for row in conn.execute("SELECT table_name FROM information_schema.tables").fetchall()}


_SCORECARD_SQL = f"""
    WITH ranked AS (
        SELECT *, row_number() OVER ({_BY_RECENCY}) AS recency,
               count(*) OVER (PARTITION BY dataset, split, configuration) AS runs
        FROM eval_runs)
    SELECT ranked.*, eval_metrics.metric, eval_metrics.value FROM ranked
    LEFT JOIN eval_metrics USING (run_id, dataset, split, configuration)
    WHERE ranked.recency <= 2"""
_NOTES_SQL = f"""
    WITH ranked AS (SELECT run_id, dataset, split, configuration, row_number() OVER ({_BY_RECENCY}) AS recency
                    FROM eval_runs)
    SELECT ranked.recency, ranked.dataset, ranked.split, ranked.configuration, notes.metric, notes.status,
           notes.reason
    FROM ranked JOIN eval_metric_notes AS notes USING (run_id, dataset, split, configuration)
    WHERE ranked.recency <= 2 ORDER BY notes.metric"""


def _ordered(metrics: dict[str, float]) -> dict[str, float]:
    return {name: metrics[name] for name in metric_order(metrics)}


def _scorecard(conn) -> list[dict[str, Any]]:
    """The latest run per dataset, split and configuration: its ``eval_runs`` fields, ``runs`` (how many there
    are), ``metrics`` ({canonical name: value}, in column order), ``unavailable`` ({name: {status, reason}}:
    the metrics it has no value for) and ``previous`` (the run before it: ``run_id``, ``created_at``,
    ``metrics``, ``unavailable``; None for a first run).  Best ``PRIMARY_METRIC`` first within each
    dataset and split."""
    runs: dict[int, dict[tuple[str, str, str], dict[str, Any]]] = {1: {}, 2: {}}
    for record in _rows(conn, _SCORECARD_SQL):
        key = (record["dataset"], record["split"], record["configuration"])
        run = runs[record["recency"]].setdefault(key, {
            **{k: v for k, v in record.items() if k not in ("metric", "value", "recency")}, "metrics": {}})
        if record["metric"] is not None:
            run["metrics"][record["metric"]] = record["value"]
    notes: dict[int, dict[tuple[str, str, str], dict[str, dict[str, str]]]] = {1: {}, 2: {}}
    if "eval_metric_notes" in _tables(conn):
        for record in _rows(conn, _NOTES_SQL):
            key = (record["dataset"], record["split"], record["configuration"])
            notes[record["recency"]].setdefault(key, {})[record["metric"]] = {
                "status": record["status"], "reason": record["reason"]}
    rows = []
    for key, run in runs[1].items():
        run["metrics"] = _ordered(run["metrics"])
        run["unavailable"] = notes[1].get(key, {})
        before = runs[2].get(key)
        run["previous"] = None if before is None else {
            "run_id": before["run_id"], "created_at": before["created_at"], "metrics": _ordered(before["metrics"]),
            "unavailable": notes[2].get(key, {})}
        rows.append(run)

    def order(row: dict[str, Any]) -> tuple:
        primary = row["metrics"].get(PRIMARY_METRIC)
        best_first = -primary if primary is not None and metric_spec(PRIMARY_METRIC).higher_is_better else primary
        return row["dataset"], row["split"], primary is None, best_first or 0.0, row["configuration"]

    rows.sort(key=order)
    return rows


def shown_metrics(rows: Sequence[dict[str, Any]]) -> list[dict[str, object]]:
    """The columns of a scorecard: every registered metric (``MetricSpec.public``), then any other metric the
    rows carry (stored by a run when it was registered, or a ranking depth) under its own name."""
    stored = {name for row in rows for run in (row, row.get("previous") or {}) for name in run.get("metrics", {})}
    columns = []
    for name in metric_order(set(METRICS) | stored):
        try:
            columns.append({**metric_spec(name).public(), "name": name})
        except MetricError:
            columns.append({"name": name, "label": name, "higher_is_better": True, "digits": 3, "headline": False,
                            "gated": False, "description": "no longer in knowledge_store.evaluation.metrics.METRICS"})
    return columns


def _helpful(conn) -> dict[str, Any] | None:
    latest = _rows(conn, "SELECT * FROM feedback_eval_runs ORDER BY created_at DESC LIMIT 1")
    if not latest:
        return None
    run = latest[0]
    run["by_configuration"] = _rows(
        conn, "SELECT alpha, fusion, reranker, up, down, rated, requests, helpful_rate FROM helpful_rates "
              "WHERE run_id = ? ORDER BY rated DESC, alpha, fusion, reranker", [run["run_id"]])
    up = sum(r["up"] or 0 for r in run["by_configuration"])
    rated = sum(r["rated"] or 0 for r in run["by_configuration"])
    run["overall"] = {"up": up, "down": rated - up, "rated": rated, "helpful_rate": up / rated if rated else None}
    return run


def _drift(conn) -> dict[str, Any] | None:
    history = _rows(conn, "SELECT * FROM drift_runs ORDER BY created_at DESC LIMIT 10")
    if not history:
        return None
    run = dict(history[0])
    run["changed"] = _rows(
        conn, "SELECT retrieval_request_id, query, overlap, added, removed, logged_snapshot, current_snapshot "
              "FROM drift_queries WHERE run_id = ? AND (len(added) > 0 OR len(removed) > 0) "
              f"ORDER BY overlap, query LIMIT {DRIFT_CHANGED_SHOWN}", [run["run_id"]])
    run["history"] = [{k: r[k] for k in ("run_id", "created_at", "queries_replayed", "mean_top5_overlap",
                                         "changed_queries")} for r in history]
    return run


def _feedback_ragas(conn) -> dict[str, Any] | None:
    """The latest ``feedback_eval`` run's RAGAS figures per configuration."""
    rows = _rows(conn, "SELECT * FROM feedback_eval_metrics QUALIFY dense_rank() OVER (ORDER BY created_at DESC, "
                       "run_id DESC) = 1 ORDER BY configuration, metric")
    if not rows:
        return None
    by_configuration: dict[str, dict[str, float]] = {}
    for row in rows:
        by_configuration.setdefault(row["configuration"], {})[row["metric"]] = row["value"]
    return {"run_id": rows[0]["run_id"], "created_at": rows[0]["created_at"], "samples": rows[0]["samples"],
            "by_configuration": by_configuration}


def _query_log_eval(conn) -> dict[str, Any] | None:
    """The latest ``query_log_eval`` run: figures and notes per answer method, the judge model."""
    latest = _rows(conn, "SELECT run_id, max(created_at) AS created_at FROM (SELECT run_id, created_at FROM "
                         "query_log_eval_metrics UNION ALL SELECT run_id, created_at FROM query_log_eval_notes) "
                         "GROUP BY run_id ORDER BY created_at DESC, run_id DESC LIMIT 1")
    if not latest:
        return None
    run_id = latest[0]["run_id"]
    metrics = _rows(conn, "SELECT * FROM query_log_eval_metrics WHERE run_id = ? ORDER BY answer_method, metric",
                    [run_id])
    notes = _rows(conn, "SELECT * FROM query_log_eval_notes WHERE run_id = ? ORDER BY answer_method, metric", [run_id])
    by_method: dict[str, dict[str, Any]] = {}
    for row in metrics:
        by_method.setdefault(row["answer_method"], {"metrics": {}, "unavailable": {}})["metrics"][row["metric"]] = \
            row["value"]
    for row in notes:
        by_method.setdefault(row["answer_method"], {"metrics": {}, "unavailable": {}})["unavailable"][row["metric"]] \
            = {"status": row["status"], "reason": row["reason"]}
    first = metrics[0] if metrics else {}
    return {"run_id": run_id, "created_at": latest[0]["created_at"], "queries": first.get("queries"),
            "judge_model": first.get("judge_model"), "ragas_version": first.get("ragas_version"),
            "by_method": by_method}


# the newest run per dataset and split of a per-run table
_LATEST_RUN = "QUALIFY dense_rank() OVER (PARTITION BY dataset, split ORDER BY created_at DESC, run_id DESC) = 1"


def _questions(conn) -> list[dict[str, Any]]:
    """The latest run's questions per dataset and split: what each should find, the rank it was found at and
    its first hits (``eval_questions``)."""
    rows = _rows(conn, f"SELECT * FROM eval_questions {_LATEST_RUN} ORDER BY dataset, split, query")
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        run = runs.setdefault((row["dataset"], row["split"]), {
            k: row[k] for k in ("run_id", "dataset", "split", "configuration", "created_at")} | {"questions": []})
        run["questions"].append({"query_id": row["query_id"], "query": row["query"], "expected": row["expected"],
                                 "found_rank": row["found_rank"], "scores": json.loads(row["scores"] or "{}"),
                                 "hits": json.loads(row["hits"] or "[]")})
    for run in runs.values():
        found = [q for q in run["questions"] if q["found_rank"] is not None]
        run["found"], run["total"] = len(found), len(run["questions"])
        # how many units each question lists: "found" counts the questions with a relevant one among them
        run["found_within"] = max((len(q["hits"]) for q in run["questions"]), default=0)
    return list(runs.values())


def stored_alpha_sweeps(conn) -> list[dict[str, Any]]:
    """The latest stored sweep per dataset and split (``eval_sweeps``), one series per metric, in the form
    ``notebook_alpha_sweeps`` gives."""
    rows = _rows(conn, f"SELECT * FROM eval_sweeps {_LATEST_RUN} ORDER BY dataset, split, metric, alpha")
    sweeps: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        sweep = sweeps.setdefault((row["dataset"], row["split"]), {
            "source": "evaluation run", "dataset": row["dataset"], "split": row["split"], "run_id": row["run_id"],
            "created_at": row["created_at"], "table_path": None, "plot_path": None,
            "x_label": "alpha (0 = BM25, 1 = vector)", "y_label": "score", "fusion": row["fusion"],
            "reranker": row["reranker"], "by_metric": {}, "marks": [], "rows": []})
        sweep["by_metric"].setdefault(row["metric"], []).append([row["alpha"], row["value"]])
    out = []
    for sweep in sweeps.values():
        by_metric = sweep.pop("by_metric")
        shown = [name for name in ("recall@5", "ndcg@10") if name in by_metric] or sorted(by_metric)[:2]
        sweep["series"] = [{"name": metric_label(name), "points": by_metric[name]} for name in shown]
        alphas = sorted({point[0] for points in by_metric.values() for point in points})
        sweep["rows"] = [{"alpha": alpha, **{name: next((v for a, v in by_metric[name] if a == alpha), None)
                                             for name in shown}} for alpha in alphas]
        out.append(sweep)
    return out


_SWEEP_DIR = re.compile(rf"^{ALPHA_SWEEP_NOTEBOOK}-(\d{{8}}T\d{{6}}Z)$")
_SWEEP_FILE = re.compile(rf"^{ALPHA_SWEEP_NOTEBOOK}_(.+)_([^_]+)\.csv$")
_NDCG_COLUMN = re.compile(r"^ndcg@(\d+)$")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def notebook_alpha_sweeps(notebooks_dir: Path) -> list[dict[str, Any]]:
    """The latest alpha sweep per dataset and split, from the notebook's CSV tables (newest run first)."""
    if not notebooks_dir.is_dir():
        return []
    runs = sorted((p for p in notebooks_dir.iterdir() if p.is_dir() and _SWEEP_DIR.match(p.name)),
                  key=lambda p: p.name, reverse=True)
    seen: set[tuple[str, str]] = set()
    sweeps = []
    for run in runs:
        stamp = datetime.strptime(_SWEEP_DIR.match(run.name).group(1), "%Y%m%dT%H%M%SZ")
        for table in sorted(run.glob(f"{ALPHA_SWEEP_NOTEBOOK}_*.csv")):
            match = _SWEEP_FILE.match(table.name)
            if not match or (match.group(1), match.group(2)) in seen:
                continue
            with table.open(newline="") as handle:
                records = list(csv.DictReader(handle))
            if not records:
                continue
            ndcg = next((c for c in records[0] if _NDCG_COLUMN.match(c)), None)
            metrics = [m for m in ("recall@5", ndcg) if m and m in records[0]]
            points = sorted((r for r in records if _number(r.get("alpha")) is not None),
                            key=lambda r: float(r["alpha"]))
            series = [{"name": metric_label(m),
                       "points": [[float(r["alpha"]), _number(r[m])] for r in points if _number(r[m]) is not None]}
                      for m in metrics]
            seen.add((match.group(1), match.group(2)))
            png = table.with_suffix(".png")
            sweeps.append({
                "source": "alpha_sweep notebook", "dataset": match.group(1), "split": match.group(2),
                "created_at": _iso(stamp), "table_path": str(table), "plot_path": str(png) if png.exists() else None,
                "x_label": "alpha (0 = BM25, 1 = vector)", "y_label": "score", "series": series, "marks": [],
                "rows": [{k: (_number(v) if k != "method" else v) for k, v in r.items()} for r in points],
            })
    return sweeps


def tuning_alpha_sweep(index_dir: Path) -> dict[str, Any] | None:
    """``groundwork tune``'s grid as nDCG@10 against alpha per fusion mode (best section/lead weights at each
    alpha), with the built-in and the chosen configuration marked - what the ``corpus_tuning`` asset plots."""
    tuned = load_tuned(index_dir)
    if tuned is None or not tuned.table:
        return None
    best: dict[str, dict[float, float]] = {}
    for row in tuned.table:
        by_alpha = best.setdefault(row["fusion"], {})
        by_alpha[row["alpha"]] = max(by_alpha.get(row["alpha"], 0.0), row["ndcg@10"])
    return {
        "source": "groundwork tune", "dataset": "this corpus", "split": f"{sum(tuned.pseudo_queries.values())} "
        "pseudo-queries", "created_at": tuned.created_at, "table_path": None, "plot_path": None,
        "x_label": "alpha (0 = BM25, 1 = vector)", "y_label": "nDCG@10 (best section/lead weights)",
        "series": [{"name": mode, "points": [[a, best[mode][a]] for a in sorted(best[mode])]} for mode in best],
        "marks": [{"name": f"{label}: {s['params']['fusion']} alpha={s['params']['alpha']:g}",
                   "point": [s["params"]["alpha"], s["ndcg@10"]]} for label, s in (("built-in", tuned.before),
                                                                                  ("chosen", tuned.after))],
        "rows": [],
    }


def evaluation_summary(data_dir: Path, index_dir: Path, timeout_s: float = 2.0) -> dict[str, Any]:
    """Everything the Evaluation page shows, read from what the evaluation runs wrote (read-only)."""
    path = results_path(data_dir)
    summary: dict[str, Any] = {"results_path": str(path), "scorecard": [], "helpful": None, "drift": None,
                               "questions": [], "feedback_ragas": None, "query_log_eval": None}
    stored_sweeps: list[dict[str, Any]] = []
    if path.exists():
        conn = open_duckdb(path, read_only=True, timeout_s=timeout_s)
        if schema_version(conn) < RESULTS_MIGRATIONS[-1][0]:  # written by an older version: migrate once
            conn.close()
            open_results(path, timeout_s=timeout_s).close()
            conn = open_duckdb(path, read_only=True, timeout_s=timeout_s)
        try:
            tables = _tables(conn)
            if "eval_runs" in tables:
                summary["scorecard"] = _scorecard(conn)
            if {"feedback_eval_runs", "helpful_rates"} <= tables:
                summary["helpful"] = _helpful(conn)
            if {"drift_runs", "drift_queries"} <= tables:
                summary["drift"] = _drift(conn)
            if "eval_questions" in tables:
                summary["questions"] = _questions(conn)
            if "eval_sweeps" in tables:
                stored_sweeps = stored_alpha_sweeps(conn)
            if "feedback_eval_metrics" in tables:
                summary["feedback_ragas"] = _feedback_ragas(conn)
            if {"query_log_eval_metrics", "query_log_eval_notes"} <= tables:
                summary["query_log_eval"] = _query_log_eval(conn)
        finally:
            conn.close()
    sweeps = stored_sweeps + notebook_alpha_sweeps(Path(data_dir) / "notebooks")
    tuning = tuning_alpha_sweep(index_dir)
    summary["alpha_sweeps"] = sweeps + ([tuning] if tuning else [])
    summary["metrics"] = shown_metrics(summary["scorecard"])
    empty = not (summary["scorecard"] or summary["helpful"] or summary["drift"] or summary["alpha_sweeps"]
                 or summary["questions"] or summary["feedback_ragas"] or summary["query_log_eval"])
    summary["empty"] = empty
    summary["hint"] = EMPTY_HINT if empty else None
    return json.loads(json.dumps(summary, default=str))
