"""The ingestion-failures table: one row per (file, stage, kind, content),
refreshed rather than duplicated when the same problem is seen again, and
marked resolved when the file is fixed or removed."""

from __future__ import annotations

import hashlib

import duckdb

from knowledge_store.storage.query_log import redact
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
    attempts: int = 1,
    failure_class: str | None = None,
    traceback: str | None = None,
    input_size_bytes: int | None = None,
    input_sha256: str | None = None,
) -> bool:
    """Insert or refresh a failure row; returns True when it is new.

    ``attempts`` made before giving up, ``failure_class`` (``retry.FailureClass``: transient | permanent), the
    last attempt's ``traceback`` (already redacted) and the input's size and sha256 describe what failed."""
    fid = failure_id(path, stage, kind, identity or checksum or "")
    reason = redact(reason)  # a parser library's message can quote what it read: a token, a password
    now = utcnow()
    existing = conn.execute(
        "SELECT resolved_at FROM ingestion_failures WHERE failure_id = ?", [fid]
    ).fetchone()
    if existing is None:
        conn.execute(
            "INSERT INTO ingestion_failures (failure_id, source_id, path, doc_id, checksum, stage, kind, reason, "
            "first_seen_at, last_seen_at, resolved_at, sync_run_id, attempts, failure_class, traceback, "
            "input_size_bytes, input_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?)",
            [fid, source_id, path, doc_id, checksum, stage, kind, reason, now, now, sync_run_id,
             attempts, failure_class, traceback, input_size_bytes, input_sha256],
        )
        return True
    conn.execute(
        "UPDATE ingestion_failures SET last_seen_at = ?, reason = ?, resolved_at = NULL, sync_run_id = ?, "
        "attempts = ?, failure_class = ?, traceback = ?, input_size_bytes = ?, input_sha256 = ? "
        "WHERE failure_id = ?",
        [now, reason, sync_run_id, attempts, failure_class, traceback, input_size_bytes, input_sha256, fid],
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


# store migration 10's columns; a store opened read-only before it has run reads them as NULL
RETRY_COLUMNS = ("attempts", "failure_class", "traceback", "input_size_bytes", "input_sha256")


def open_failures(conn: duckdb.DuckDBPyConnection) -> list[dict[str, object]]:
    """Open failures, newest first, with their attempts, class, last traceback and input size/sha256."""
    present = {row[0] for row in conn.execute("SELECT * FROM ingestion_failures LIMIT 0").description}
    extra = ", ".join(c if c in present else f"NULL AS {c}" for c in RETRY_COLUMNS)
    cursor = conn.execute(
        f"SELECT failure_id, source_id, path, stage, kind, reason, first_seen_at, last_seen_at, {extra} "
        "FROM ingestion_failures "
        "WHERE resolved_at IS NULL ORDER BY last_seen_at DESC, path"
    )
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row)) for row in cursor.fetchall()]
