"""Evaluation results on disk: what the evaluation assets and ``groundwork eval`` write, and what the console reads.

One DuckDB file, ``<data_dir>/eval/results.duckdb``, append-only per run:

- ``eval_results``  one row per dataset, split, configuration and run (the ``retrieval_eval_*`` assets and
  ``groundwork eval``); ``scorecard`` is its latest row per dataset, split and configuration, rewritten by
  the ``eval_scorecard`` asset;
- ``feedback_eval_runs`` / ``helpful_rates``  one row per ``feedback_eval`` run (gold set from thumbs, recall
  of today's engine on it) and its helpful rate per configuration (alpha, fusion, reranker);
- ``drift_runs`` / ``drift_queries``  one row per ``query_log_drift`` run (logged queries replayed on today's
  index) and one per replayed query (top-5 overlap, passages added and removed).

The alpha sweeps are files: the ``alpha_sweep`` notebook writes
``<data_dir>/notebooks/alpha_sweep-<UTC stamp>/alpha_sweep_<dataset>_<split>.csv`` (and ``.png``), and
``groundwork tune`` keeps its whole grid in ``<index_dir>/tuned.json``.

``evaluation_summary`` reads all of it for ``GET /api/evaluation/summary``; it never computes a metric
itself, so the console shows exactly what the evaluation runs measured, and nothing when none ran.
"""

from __future__ import annotations

import csv
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.duckdb"

RESULTS_SCHEMA = """
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

SCORECARD_SQL = (
    "CREATE OR REPLACE TABLE scorecard AS SELECT * EXCLUDE (rn) FROM (SELECT *, row_number() OVER "
    "(PARTITION BY dataset, split, configuration ORDER BY created_at DESC) AS rn FROM eval_results) WHERE rn = 1"
)
SCORECARD_COLUMNS = ("dataset", "split", "configuration", "alpha", "fusion", "reranker", "queries", "recall_at_5",
                     "ndcg_at_10", "mrr_at_10", "precision_at_5", "ragas_recall_at_5", "grounding", "p50_ms", "p95_ms",
                     "created_at", "run_id")
ALPHA_SWEEP_NOTEBOOK = "alpha_sweep"
DRIFT_CHANGED_SHOWN = 50  # changed queries listed per drift run (the counts cover all of them)
EMPTY_HINT = ("No evaluation has run yet: run the evaluation assets in Dagster (job evaluate) or "
              "`groundwork eval <BEIR folder>`; the alpha sweep comes from the alpha_sweep notebook asset "
              "(or `groundwork notebook alpha_sweep`).")


def results_path(data_dir: Path) -> Path:
    return Path(data_dir) / "eval" / RESULTS_FILE


def open_results(path: Path):
    """A read-write connection with every table present (waits while another process writes)."""
    from knowledge_store.store import open_duckdb

    conn = open_duckdb(path)
    conn.execute(RESULTS_SCHEMA)
    return conn


def _insert(conn, table: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(['?'] * len(row))})",
                     list(row.values()))


def record_eval_results(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append retrieval-evaluation rows (columns of ``eval_results``) in one transaction."""
    from knowledge_store.store import transaction

    conn = open_results(path)
    try:
        with transaction(conn):
            _insert(conn, "eval_results", rows)
    finally:
        conn.close()


def refresh_scorecard(path: Path) -> list[dict[str, Any]]:
    """Rewrite ``scorecard`` (latest row per dataset, split and configuration) and return it, best nDCG@10 first."""
    from knowledge_store.store import transaction

    conn = open_results(path)
    try:
        with transaction(conn):
            conn.execute(SCORECARD_SQL)
        cursor = conn.execute("SELECT * FROM scorecard ORDER BY dataset, ndcg_at_10 DESC")
        columns = [d[0] for d in cursor.description]
        return [dict(zip(columns, r)) for r in cursor.fetchall()]
    finally:
        conn.close()


def record_feedback_eval(path: Path, run_id: str, created_at: datetime, summary: dict[str, Any],
                         helpful: list[dict[str, Any]]) -> None:
    """One ``feedback_eval`` run: its gold-set figures and the helpful rate per configuration."""
    from knowledge_store.store import transaction

    conn = open_results(path)
    try:
        with transaction(conn):
            _insert(conn, "feedback_eval_runs", [{"run_id": run_id, "created_at": created_at, **summary}])
            _insert(conn, "helpful_rates", [{"run_id": run_id, "created_at": created_at, **{
                key: row.get(key) for key in ("alpha", "fusion", "reranker", "up", "down", "rated", "requests",
                                              "helpful_rate")}} for row in helpful])
    finally:
        conn.close()


def record_drift(path: Path, run_id: str, created_at: datetime, report) -> None:
    """One ``query_log_drift`` run (an ``evals.log_replay.ReplayReport``) and its per-query rows."""
    from knowledge_store.store import transaction

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


def _scorecard(conn) -> list[dict[str, Any]]:
    """The latest row per dataset, split and configuration (what ``eval_scorecard`` keeps), with the run before it."""
    rows = _rows(conn, f"""
        SELECT {', '.join(SCORECARD_COLUMNS)}, previous_recall_at_5, previous_ndcg_at_10, previous_created_at, runs
        FROM (SELECT *, row_number() OVER w_desc AS rn, lag(recall_at_5) OVER w AS previous_recall_at_5,
                     lag(ndcg_at_10) OVER w AS previous_ndcg_at_10, lag(created_at) OVER w AS previous_created_at,
                     count(*) OVER (PARTITION BY dataset, split, configuration) AS runs
              FROM eval_results
              WINDOW w AS (PARTITION BY dataset, split, configuration ORDER BY created_at),
                     w_desc AS (PARTITION BY dataset, split, configuration ORDER BY created_at DESC))
        WHERE rn = 1 ORDER BY dataset, split, ndcg_at_10 DESC NULLS LAST, configuration""")
    for row in rows:
        previous = {"recall_at_5": row.pop("previous_recall_at_5"), "ndcg_at_10": row.pop("previous_ndcg_at_10"),
                    "created_at": row.pop("previous_created_at")}
        row["previous"] = previous if previous["created_at"] is not None else None
    return rows


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
            series = [{"name": {"recall@5": "Recall@5"}.get(m, m.replace("ndcg", "nDCG")),
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
    from knowledge_store.tuning import load_tuned

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
    from knowledge_store.store import open_duckdb

    path = results_path(data_dir)
    summary: dict[str, Any] = {"results_path": str(path), "scorecard": [], "helpful": None, "drift": None}
    if path.exists():
        conn = open_duckdb(path, read_only=True, timeout_s=timeout_s)
        try:
            tables = _tables(conn)
            if "eval_results" in tables:
                summary["scorecard"] = _scorecard(conn)
            if {"feedback_eval_runs", "helpful_rates"} <= tables:
                summary["helpful"] = _helpful(conn)
            if {"drift_runs", "drift_queries"} <= tables:
                summary["drift"] = _drift(conn)
        finally:
            conn.close()
    sweeps = notebook_alpha_sweeps(Path(data_dir) / "notebooks")
    tuning = tuning_alpha_sweep(index_dir)
    summary["alpha_sweeps"] = sweeps + ([tuning] if tuning else [])
    empty = not (summary["scorecard"] or summary["helpful"] or summary["drift"] or summary["alpha_sweeps"])
    summary["empty"] = empty
    summary["hint"] = EMPTY_HINT if empty else None
    return json.loads(json.dumps(summary, default=str))
