"""Reading the query log: logged queries, feedback on answers, export and purge.

``QueryLog`` is the log callers use: it appends through ``QueryLogWriter``'s
background writer and reads through short-lived connections, so logging can
never block or break retrieval.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from knowledge_store.storage.query_log.records import (
    _COLUMNS,
    _FEEDBACK_COLUMNS,
    _JSON_COLUMNS,
    QueryLogRecord,
    _dumps,
    _new_id,
    _record_from_db,
    _to_naive_utc,
)
from knowledge_store.storage.query_log.redaction import redact
from knowledge_store.storage.query_log.writer import QueryLogWriter
from knowledge_store.storage.store import transaction, utcnow

DEFAULT_LOG_FILE_NAME = "logs.duckdb"
RATINGS = frozenset({"up", "down"})


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class QueryLog(QueryLogWriter):
    """Append-only log of answered queries, and the feedback table.

    ``append`` never raises and never waits for disk; everything else opens the
    log file for one short unit of work, waiting at most ``lock_timeout_s``
    for another process's lock before raising ``StoreLockedError``.
    """

    def get(self, retrieval_request_id: str) -> QueryLogRecord | None:
        self.flush()
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM query_log WHERE retrieval_request_id = ?",
                [retrieval_request_id],
            ).fetchone()
        return _record_from_db(row) if row else None

    def list(
        self, since: datetime | None = None, limit: int = 1000, client: str | None = None
    ) -> builtins.list[QueryLogRecord]:
        """Logged queries, newest first."""
        self.flush()
        where, args = self._where(since, client)
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM query_log {where} "
                "ORDER BY created_at DESC, retrieval_request_id DESC LIMIT ?",
                [*args, int(limit)],
            ).fetchall()
        return [_record_from_db(row) for row in rows]

    def count(self) -> int:
        self.flush()
        with self._connect() as conn:
            return int(conn.execute("SELECT count(*) FROM query_log").fetchone()[0])

    def feedback_counts(self) -> dict[str, int]:
        """Ratings stored so far: ``{"up": n, "down": m}`` (answer-level ratings included), each client's rating
        of one passage (or answer) counting once however many requests it rated it on: what the learning loop
        weighs is how many people said so, not how many rows one of them wrote.  Ratings that came with no
        client (the Python API, the CLI) count one each."""
        self.flush()
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT rating, count(DISTINCT (coalesce(client, feedback_id), coalesce(chunk_id, retrieval_request_id))) "
                "FROM feedback GROUP BY rating").fetchall()
        counts = {"up": 0, "down": 0}
        counts.update({rating: int(n) for rating, n in rows})
        return counts

    @staticmethod
    def _where(since: datetime | None, client: str | None = None) -> tuple[str, builtins.list[Any]]:
        clauses, args = [], []
        if since is not None:
            clauses.append("created_at >= ?")
            args.append(_to_naive_utc(since))
        if client is not None:
            clauses.append("client = ?")
            args.append(client)
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", args

    def export(self, out_path: Path, fmt: Literal["jsonl", "parquet"] = "jsonl", since: datetime | None = None) -> int:
        """Write the log (oldest first) to JSONL or Parquet; returns the rows written."""
        if fmt not in ("jsonl", "parquet"):
            raise ValueError(f"fmt={fmt!r}: must be 'jsonl' or 'parquet'")
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = out_path.with_name(f".{out_path.name}.{uuid.uuid4().hex[:8]}.tmp")
        self.flush()
        try:
            with self._connect() as conn:
                if fmt == "parquet":
                    where = ""
                    if since is not None:
                        where = f"WHERE created_at >= TIMESTAMP '{_to_naive_utc(since).isoformat(sep=' ')}'"
                    result = conn.execute(
                        f"COPY (SELECT {', '.join(_COLUMNS)} FROM query_log {where} "
                        f"ORDER BY created_at, retrieval_request_id) "
                        f"TO {_sql_string(str(tmp_path))} (FORMAT PARQUET)"
                    ).fetchone()
                    written = int(result[0]) if result else 0
                else:
                    where, args = self._where(since)
                    cursor = conn.execute(
                        f"SELECT {', '.join(_COLUMNS)} FROM query_log {where} "
                        "ORDER BY created_at, retrieval_request_id",
                        args,
                    )
                    written = 0
                    with open(tmp_path, "w", encoding="utf-8") as handle:
                        while batch := cursor.fetchmany(1000):
                            for values in batch:
                                handle.write(_dumps(_record_from_db(values).to_dict()) + "\n")
                                written += 1
            os.replace(tmp_path, out_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp_path.unlink()
        return written

    def purge_older_than(self, days: float) -> int:
        """Delete logged queries older than ``days`` (and their feedback, and
        feedback older than that); returns the number of queries deleted."""
        if days < 0:
            raise ValueError(f"days={days!r}: must be >= 0")
        cutoff = utcnow() - timedelta(days=days)
        self.flush()
        with self._connect() as conn, transaction(conn):
            deleted = int(conn.execute("DELETE FROM query_log WHERE created_at < ?", [cutoff]).fetchone()[0])
            conn.execute(
                "DELETE FROM feedback WHERE created_at < ? OR retrieval_request_id NOT IN "
                "(SELECT retrieval_request_id FROM query_log)",
                [cutoff],
            )
        return deleted

    # -- feedback ---------------------------------------------------------

    def client_pseudonym(self, address: str) -> str:
        """A stable pseudonym of a client address (HMAC-SHA256 under this log's own random key, 16 hex digits):
        ratings of one client can be told apart from another's without the log keeping anyone's address."""
        self.flush()
        with self._connect() as conn, transaction(conn):
            row = conn.execute("SELECT value FROM log_secrets WHERE name = 'client_key'").fetchone()
            if row is None:
                key = secrets.token_hex(32)
                conn.execute("INSERT INTO log_secrets VALUES ('client_key', ?)", [key])
            else:
                key = row[0]
        return hmac.new(bytes.fromhex(key), address.encode("utf-8", "replace"), hashlib.sha256).hexdigest()[:16]

    def add_feedback(
        self, retrieval_request_id: str, rating: str, chunk_id: str | None = None, note: str | None = None,
        client: str | None = None,
    ) -> dict[str, Any]:
        """Store one rating synchronously and return the stored row (ISO ``created_at``).

        ``client`` (``client_pseudonym``): one rating per client, request and passage counts - a client's new
        rating replaces its earlier one of the same passage of the same request (``replaced`` says how many).
        Raises ``ValueError`` for a rating other than 'up'/'down' and
        ``KeyError`` when the request id is not in the log.
        """
        if rating not in RATINGS:
            raise ValueError(f"rating={rating!r}: must be 'up' or 'down'")
        if not retrieval_request_id or not isinstance(retrieval_request_id, str):
            raise ValueError(f"retrieval_request_id={retrieval_request_id!r}: must be a non-empty string")
        row = {
            "feedback_id": _new_id(),
            "retrieval_request_id": retrieval_request_id,
            "chunk_id": chunk_id,
            "rating": rating,
            "note": redact(note) if note is not None else None,
            "created_at": utcnow(),
            "client": client,
        }
        self.flush()
        with self._connect() as conn, transaction(conn):
            known = conn.execute(
                "SELECT 1 FROM query_log WHERE retrieval_request_id = ?", [retrieval_request_id]
            ).fetchone()
            if not known:
                raise KeyError(f"retrieval_request_id={retrieval_request_id!r} is not in the query log")
            replaced = 0
            if client is not None:
                replaced = int(conn.execute(
                    "DELETE FROM feedback WHERE client = ? AND retrieval_request_id = ? "
                    "AND chunk_id IS NOT DISTINCT FROM ?", [client, retrieval_request_id, chunk_id]).fetchone()[0])
            conn.execute(
                f"INSERT INTO feedback ({', '.join(_FEEDBACK_COLUMNS)}) VALUES ({', '.join('?' for _ in _FEEDBACK_COLUMNS)})",
                [row[c] for c in _FEEDBACK_COLUMNS],
            )
        row["created_at"] = row["created_at"].isoformat()
        row["replaced"] = replaced
        return row

    def list_feedback(self, since: datetime | None = None, limit: int = 1000) -> builtins.list[dict[str, Any]]:
        """Feedback rows, newest first."""
        where, args = self._where(since)
        return self._feedback_query(
            f"SELECT {', '.join(_FEEDBACK_COLUMNS)} FROM feedback {where} "
            "ORDER BY created_at DESC, feedback_id DESC LIMIT ?",
            [*args, int(limit)],
        )

    def feedback_for_chunks(self, chunk_ids: Iterable[str]) -> builtins.list[dict[str, Any]]:
        """Feedback given on any of ``chunk_ids``, newest first."""
        ids = [str(c) for c in chunk_ids]
        if not ids:
            return []
        return self._feedback_query(
            f"SELECT {', '.join(_FEEDBACK_COLUMNS)} FROM feedback WHERE list_contains(?, chunk_id) "
            "ORDER BY created_at DESC, feedback_id DESC",
            [ids],
        )

    def feedback_with_queries(self, limit: int = 10000) -> builtins.list[dict[str, Any]]:
        """Each feedback row joined with its logged query: ``query``, ``client``,
        ``params``, ``results_pre``, ``results_post``, ``query_created_at``; newest first."""
        columns = ", ".join(f"f.{c}" for c in _FEEDBACK_COLUMNS)
        return self._feedback_query(
            f"SELECT {columns}, q.query, q.client, q.params, q.results_pre, q.results_post, "
            "q.created_at AS query_created_at "
            "FROM feedback f JOIN query_log q USING (retrieval_request_id) "
            "ORDER BY f.created_at DESC, f.feedback_id DESC LIMIT ?",
            [int(limit)],
        )

    def _feedback_query(self, sql: str, args: builtins.list[Any]) -> builtins.list[dict[str, Any]]:
        # no flush: feedback is written synchronously, and only for requests
        # already in the table, so queued appends cannot change these answers
        with self._connect() as conn:
            cursor = conn.execute(sql, args)
            names = [d[0] for d in cursor.description]
            rows = cursor.fetchall()
        out = []
        for values in rows:
            row = dict(zip(names, values))
            for name, value in row.items():
                if isinstance(value, datetime):
                    row[name] = value.isoformat()
                elif name in _JSON_COLUMNS and isinstance(value, str):
                    row[name] = json.loads(value)
            out.append(row)
        return out


def default_log_path(data_dir: Path) -> Path:
    """``<data_dir>/logs.duckdb``: the query log's own file, next to (not inside) the store."""
    return Path(data_dir) / DEFAULT_LOG_FILE_NAME
