"""The logged record, the log file's schema and the conversion between them.

``QueryLogRecord`` is what callers hand to ``QueryLog.append``; ``_normalise``
turns it (or a spooled dict) into a row of plain, redacted values, and
``_record_from_db`` turns a stored row back into a record.  The schema is
created and migrated by code, exactly like the store: an append-only
``LOG_MIGRATIONS`` list, each applied once in a transaction and recorded in
the log file's own ``schema_migrations`` table.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from knowledge_store.storage.query_log.redaction import redact
from knowledge_store.storage.store import migrate, utcnow


def _new_id() -> str:
    return uuid.uuid4().hex


@dataclass(kw_only=True)
class QueryLogRecord:
    """One answered (or failed) query.  ``query`` is redacted when logged."""

    query: str
    client: str = "python"  # cli | api | mcp | support_tool | eval | python | llamaindex
    retrieval_request_id: str = field(default_factory=_new_id)
    created_at: datetime = field(default_factory=utcnow)  # naive UTC
    params: dict[str, Any] = field(default_factory=dict)  # alpha, fusion, reranker, filters, k …
    results_pre: list[dict[str, Any]] = field(default_factory=list)  # fused order, before reranking
    results_post: list[dict[str, Any]] = field(default_factory=list)  # after reranking
    latency_ms: dict[str, float] = field(default_factory=dict)  # embed, bm25, vector, fuse, rerank, format, total
    reranker_status: str = "none"  # "ok" | "none" | "fallback: <reason>"
    coverage: str = ""
    snapshot_version: int | None = None
    error: str | None = None
    answer: str | None = None  # the answer text shown with the results (redacted)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``created_at`` as ISO-8601)."""
        row = dataclasses.asdict(self)
        row["created_at"] = self.created_at.isoformat()
        return row


_COLUMNS = (
    "retrieval_request_id",
    "created_at",
    "query",
    "client",
    "params",
    "results_pre",
    "results_post",
    "latency_ms",
    "reranker_status",
    "coverage",
    "snapshot_version",
    "error",
    "answer",
)
_JSON_COLUMNS = ("params", "results_pre", "results_post", "latency_ms")
_JSON_EMPTY = {"params": {}, "results_pre": [], "results_post": [], "latency_ms": {}}
_FEEDBACK_COLUMNS = ("feedback_id", "retrieval_request_id", "chunk_id", "rating", "note", "created_at", "client")

_ARROW_SCHEMA = pa.schema(
    [
        ("retrieval_request_id", pa.string()),
        ("created_at", pa.timestamp("us")),
        ("query", pa.string()),
        ("client", pa.string()),
        ("params", pa.string()),
        ("results_pre", pa.string()),
        ("results_post", pa.string()),
        ("latency_ms", pa.string()),
        ("reranker_status", pa.string()),
        ("coverage", pa.string()),
        ("snapshot_version", pa.int64()),
        ("error", pa.string()),
        ("answer", pa.string()),
    ]
)

LOG_MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "query log and answer feedback",
        """
        CREATE TABLE query_log (
            retrieval_request_id VARCHAR PRIMARY KEY,   -- uuid4 hex, returned to the caller
            created_at       TIMESTAMP NOT NULL,        -- UTC
            query            VARCHAR NOT NULL,          -- redacted
            client           VARCHAR NOT NULL,          -- cli | api | mcp | support_tool | eval | python | llamaindex
            params           JSON NOT NULL,             -- alpha, fusion, reranker, filters, k ...
            results_pre      JSON NOT NULL,             -- fused order before reranking
            results_post     JSON NOT NULL,             -- after reranking
            latency_ms       JSON NOT NULL,             -- embed, bm25, vector, fuse, rerank, format, total
            reranker_status  VARCHAR NOT NULL,          -- ok | none | fallback: <reason>
            coverage         VARCHAR,
            snapshot_version INTEGER,
            error            VARCHAR                    -- redacted
        );
        CREATE INDEX query_log_created_at ON query_log (created_at);
        CREATE TABLE feedback (
            feedback_id          VARCHAR PRIMARY KEY,
            retrieval_request_id VARCHAR NOT NULL,
            chunk_id             VARCHAR,               -- NULL = feedback on the whole answer
            rating               VARCHAR NOT NULL CHECK (rating IN ('up', 'down')),
            note                 VARCHAR,               -- redacted
            created_at           TIMESTAMP NOT NULL
        );
        CREATE INDEX feedback_request ON feedback (retrieval_request_id);
        """,
    ),
    (2, "the answer text of each query (redacted)", "ALTER TABLE query_log ADD COLUMN answer VARCHAR;"),
    (
        3,
        "who rated: one rating per client, request and passage",
        """
        ALTER TABLE feedback ADD COLUMN client VARCHAR;  -- keyed pseudonym of the rating client; NULL: not over HTTP
        CREATE TABLE log_secrets (name VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
        """,
    ),
]


def migrate_log(conn: duckdb.DuckDBPyConnection) -> int:
    """Apply every log migration not yet applied; returns the schema version."""
    return migrate(conn, LOG_MIGRATIONS)


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    for attr in ("tolist", "item"):  # numpy arrays / scalars
        if hasattr(value, attr):
            try:
                return getattr(value, attr)()
            except Exception:
                pass
    return str(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, ensure_ascii=False, allow_nan=True)


def _to_naive_utc(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        return utcnow()
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def _normalise(source: QueryLogRecord | Mapping[str, Any]) -> dict[str, Any]:
    """A record (or a spooled dict) as a row of plain values: JSON columns as
    text, the query and error redacted, ``created_at`` naive UTC."""
    get = source.get if isinstance(source, Mapping) else (lambda k, d=None: getattr(source, k, d))
    row: dict[str, Any] = {}
    row["retrieval_request_id"] = str(get("retrieval_request_id") or _new_id())
    row["created_at"] = _to_naive_utc(get("created_at"))
    row["query"] = redact(str(get("query") or ""))
    row["client"] = str(get("client") or "python")
    for name in _JSON_COLUMNS:
        value = get(name)
        if value is None:
            value = _JSON_EMPTY[name]
        row[name] = value if isinstance(value, str) else _dumps(value)
    row["reranker_status"] = str(get("reranker_status") or "none")
    coverage = get("coverage")
    row["coverage"] = None if coverage is None else str(coverage)
    snapshot = get("snapshot_version")
    row["snapshot_version"] = None if snapshot is None else int(snapshot)
    error = get("error")
    row["error"] = None if error is None else redact(str(error))
    answer = get("answer")
    row["answer"] = None if answer is None else redact(str(answer))
    return row


def _record_from_db(values: Iterable[Any]) -> QueryLogRecord:
    data = dict(zip(_COLUMNS, values))
    for name in _JSON_COLUMNS:
        raw = data[name]
        data[name] = json.loads(raw) if isinstance(raw, str) else (raw if raw is not None else _JSON_EMPTY[name])
    return QueryLogRecord(**data)
