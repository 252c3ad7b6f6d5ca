"""Sync runs: one row per ingestion run, holding the summary people read
("3 added, 1 updated, 1 removed, 12 unchanged, 2 failed")."""

from __future__ import annotations

import json
import uuid

import duckdb

from knowledge_store.store import utcnow

COUNTERS = (
    "added", "updated", "removed", "unchanged", "excluded", "failed",
    "chunks_created", "embeddings_computed", "embeddings_reused",
)


def start_sync_run(
    conn: duckdb.DuckDBPyConnection, sync_run_id: str | None = None, trigger: str = "manual",
    scope: list[str] | None = None,
) -> str:
    """Open a run; runs left 'running' by a killed process are marked abandoned.

    ``scope`` names the sources the run syncs (None = every enabled source)."""
    sync_run_id = sync_run_id or uuid.uuid4().hex
    conn.execute(
        "UPDATE sync_runs SET status = 'abandoned', finished_at = ? WHERE status = 'running' AND sync_run_id <> ?",
        [utcnow(), sync_run_id],
    )
    exists = conn.execute("SELECT 1 FROM sync_runs WHERE sync_run_id = ?", [sync_run_id]).fetchone()
    if not exists:
        conn.execute(
            "INSERT INTO sync_runs (sync_run_id, trigger, status, started_at, scope) VALUES (?, ?, 'running', ?, ?)",
            [sync_run_id, trigger, utcnow(), json.dumps(scope) if scope is not None else None],
        )
    return sync_run_id


def current_sync_run(conn: duckdb.DuckDBPyConnection, sync_run_id: str | None = None) -> str:
    """The run a later stage belongs to: the given id if known, else the open one, else a new one."""
    if sync_run_id and conn.execute("SELECT 1 FROM sync_runs WHERE sync_run_id = ?", [sync_run_id]).fetchone():
        return sync_run_id
    row = conn.execute(
        "SELECT sync_run_id FROM sync_runs WHERE status = 'running' ORDER BY started_at DESC LIMIT 1"
    ).fetchone()
    if row:
        return row[0]
    return start_sync_run(conn, sync_run_id, trigger="partial")


def add_counts(conn: duckdb.DuckDBPyConnection, sync_run_id: str, **deltas: int) -> None:
    unknown = set(deltas) - set(COUNTERS)
    if unknown:
        raise ValueError(f"unknown sync counters: {sorted(unknown)}")
    if not deltas:
        return
    assignments = ", ".join(f"{name} = coalesce({name}, 0) + ?" for name in deltas)
    conn.execute(f"UPDATE sync_runs SET {assignments} WHERE sync_run_id = ?", [*deltas.values(), sync_run_id])


def summary_line(row: dict[str, object]) -> str:
    return (
        f"{row.get('added') or 0} added, {row.get('updated') or 0} updated, "
        f"{row.get('removed') or 0} removed, {row.get('unchanged') or 0} unchanged, "
        f"{row.get('excluded') or 0} excluded, {row.get('failed') or 0} failed"
    )


def get_sync_run(conn: duckdb.DuckDBPyConnection, sync_run_id: str) -> dict[str, object]:
    cursor = conn.execute("SELECT * FROM sync_runs WHERE sync_run_id = ?", [sync_run_id])
    row = cursor.fetchone()
    if row is None:
        raise KeyError(sync_run_id)
    result = dict(zip([d[0] for d in cursor.description], row))
    if isinstance(result.get("details"), str):
        result["details"] = json.loads(result["details"])
    return result


def finish_sync_run(
    conn: duckdb.DuckDBPyConnection, sync_run_id: str, snapshot_version: int | None, details: dict[str, object]
) -> dict[str, object]:
    row = get_sync_run(conn, sync_run_id)
    summary = summary_line(row)
    details = {**(row.get("details") or {}), **details}
    conn.execute(
        "UPDATE sync_runs SET status = 'succeeded', finished_at = ?, snapshot_version = ?, summary = ?, details = ? "
        "WHERE sync_run_id = ?",
        [utcnow(), snapshot_version, summary, json.dumps(details, default=str), sync_run_id],
    )
    return get_sync_run(conn, sync_run_id)
