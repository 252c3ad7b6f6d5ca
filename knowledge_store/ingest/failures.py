"""The ingestion-failures table: one row per (file, stage, kind, content),
refreshed rather than duplicated when the same problem is seen again, and
marked resolved when the file is fixed or removed."""

from __future__ import annotations

import hashlib

import duckdb

from knowledge_store.storage.store import utcnow


def failure_id(path: str, stage: str, kind: str, identity: str) -> str:
    return hashlib.sha256(f"{path}|{stage}|{kind}|{identity}".encode()).hexdigest()[:24]


def record_failure(
    conn: duckdb.DuckDBPyConnection,
    *,
    path: str,
    stage: str,
    kind: str,
    reason: str,
    sync_run_id: str | None,
    source_id: str | None = None,
    doc_id: str | None = None,
    checksum: str | None = None,
    identity: str | None = None,
) -> bool:
    """Insert or refresh a failure row; returns True when it is new."""
    fid = failure_id(path, stage, kind, identity or checksum or "")
    now = utcnow()
    existing = conn.execute(
        "SELECT resolved_at FROM ingestion_failures WHERE failure_id = ?", [fid]
    ).fetchone()
    if existing is None:
        conn.execute(
            "INSERT INTO ingestion_failures VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
            [fid, source_id, path, doc_id, checksum, stage, kind, reason, now, now, sync_run_id],
        )
        return True
    conn.execute(
        "UPDATE ingestion_failures SET last_seen_at = ?, reason = ?, resolved_at = NULL, sync_run_id = ? "
        "WHERE failure_id = ?",
        [now, reason, sync_run_id, fid],
    )
    return existing[0] is not None


def resolve_failures(conn: duckdb.DuckDBPyConnection, path: str, keep_ids: set[str] | None = None, stages: tuple[str, ...] | None = None) -> int:
    """Mark a file's open failures resolved (it parsed, or it is gone), except ``keep_ids``."""
    rows = conn.execute(
        "SELECT failure_id, stage FROM ingestion_failures WHERE path = ? AND resolved_at IS NULL", [path]
    ).fetchall()
    ids = [fid for fid, stage in rows if fid not in (keep_ids or set()) and (stages is None or stage in stages)]
    if ids:
        conn.execute(
            "UPDATE ingestion_failures SET resolved_at = ? WHERE list_contains(?, failure_id)", [utcnow(), ids]
        )
    return len(ids)


def open_failures(conn: duckdb.DuckDBPyConnection) -> list[dict[str, object]]:
    cursor = conn.execute(
        "SELECT failure_id, source_id, path, stage, kind, reason, first_seen_at, last_seen_at FROM ingestion_failures "
        "WHERE resolved_at IS NULL ORDER BY last_seen_at DESC, path"
    )
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row)) for row in cursor.fetchall()]
