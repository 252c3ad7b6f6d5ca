"""The query log: one row per answered query, plus the feedback people give on answers.

The log lives in its own DuckDB file (by default ``<data_dir>/logs.duckdb``),
separate from the store and the index snapshots, so logging can never block or
break retrieval:

* ``QueryLog.append`` only redacts the query, turns the record into a plain row
  and puts it on an in-memory queue; it returns the ``retrieval_request_id``
  at once and never raises.
* A background writer thread drains the queue in batches and bulk-inserts each
  batch through a pyarrow table registered on a short-lived connection.  The
  file is opened only while a batch is written, so several processes (the API
  server, a CLI run, the MCP server …) can all log into the same file.
* When another process holds the file's lock for longer than
  ``lock_timeout_s``, the batch is appended to a JSONL spool file
  ``<spool_dir>/query_log.spool-<pid>.jsonl`` instead; the next writer that
  gets the lock (in any process) imports every spool file it finds and
  removes it.  Imports are idempotent (``INSERT OR IGNORE`` on the primary
  key), so a crash between insert and unlink cannot duplicate rows.

Queries, error messages and feedback notes are redacted (e-mail addresses and
secrets) inside this module: callers are never trusted to have done it.

The schema is created and migrated by code, exactly like the store: an
append-only ``LOG_MIGRATIONS`` list, each applied once in a transaction and
recorded in the log file's own ``schema_migrations`` table.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import json
import logging
import logging.handlers
import os
import queue
import re
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow as pa

from knowledge_store.errors import StoreLockedError
from knowledge_store.store import migrate, open_duckdb, transaction, utcnow

try:  # advisory locks on spool files (POSIX); without them spooling still works
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

DEFAULT_LOG_FILE_NAME = "logs.duckdb"
SPOOL_PREFIX = "query_log.spool-"
CLIENTS = frozenset({"cli", "api", "mcp", "support_tool", "eval", "python"})
RATINGS = frozenset({"up", "down"})
LATENCY_KEYS = ("embed", "bm25", "vector", "fuse", "rerank", "format", "total")

_LINGER_S = 0.1
_IDLE_CLOSE_S = 2.0  # close the writer's connection after this long without records
_BATCH_MAX = 500  # records per insert transaction

# ---------------------------------------------------------------------------
# Redaction
# ---------------------------------------------------------------------------

EMAIL_PLACEHOLDER = "[EMAIL]"
SECRET_PLACEHOLDER = "[SECRET]"
_PLACEHOLDER_AHEAD = r"(?!\[(?:SECRET|EMAIL)\])"

_PEM_BLOCK = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=:,\-\s]*)",
    re.DOTALL,
)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
_SPECIFIC_SECRETS = re.compile(
    r"""
      \bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}          # Anthropic / OpenAI
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                   # AWS access key id
    | \b(?:ghp|gho|ghs|ghu|ghr)_[A-Za-z0-9]{20,}\b    # GitHub tokens
    | \bgithub_pat_[A-Za-z0-9_]{20,}                  # GitHub fine-grained PAT
    | \bxox[baprs]-[A-Za-z0-9-]{10,}                  # Slack
    | \bAIza[0-9A-Za-z_-]{30,}                        # Google API key
    """,
    re.VERBOSE,
)
# "Bearer <token>": the token must look like one (>= 12 chars with a digit or
# punctuation) so that prose such as "Bearer authentication" is left alone.
_BEARER = re.compile(
    r"\b(Bearer)(\s+)" + _PLACEHOLDER_AHEAD
    + r"(?=[A-Za-z0-9\-._~+/]*[0-9\-._~+/])[A-Za-z0-9\-._~+/]{12,}=*",
    re.IGNORECASE,
)
# key = value / key: value / "key": "value" for secret-looking key names; the
# key name (and quotes) are kept, only the value is replaced.  The keyword must
# end the key name (``token_count=5`` and ``max_tokens=512`` are not secrets).
_KV_SECRET = re.compile(
    r"""
    (?P<key>\b(?:[A-Za-z0-9]+[_.-])*
        (?:password|passwd|passphrase|api[_-]?key|apikey|access[_-]?key|secret[_-]?key
          |private[_-]?key|client[_-]?secret|secret|token|credentials?)\b)
    (?P<sep>["']?\s*[:=]\s*)
    """ + _PLACEHOLDER_AHEAD + r"""
    (?:"(?P<dq>[^"\n]+)"|'(?P<sq>[^'\n]+)'|(?P<bare>[^\s"',;&}\]]+))
    """,
    re.VERBOSE | re.IGNORECASE,
)
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
_LONG_TOKEN = re.compile(r"(?<![A-Za-z0-9+/=_\-\[])[A-Za-z0-9+/_\-]{32,}={0,2}(?![A-Za-z0-9+/=_\-])")
_HEX = re.compile(r"[0-9a-fA-F]+")


_WORDY = re.compile(r"[a-z]{3,}")


def _class_changes(text: str) -> float:
    """Share of neighbouring letters/digits that switch class (upper/lower/digit)."""
    chars = [c for c in text if c.isalnum()]
    kind = [0 if c.isupper() else 1 if c.islower() else 2 for c in chars]
    return sum(a != b for a, b in zip(kind, kind[1:])) / max(1, len(kind) - 1)


def _looks_random(token: str) -> bool:
    """A >= 32-char hex/base64-ish token that mixes character classes like a key does.

    Hex needs digits and letters.  Anything else needs upper case, lower case
    and digits, and must not read like words: identifiers and paths
    (``HTTPServerErrorHandlerV2``, ``docs/Decisions/ADR0012``) are mostly runs
    of 3+ lower-case letters with few class switches, random base64 is not
    (measured: < 0.2 % of random 32-char base64 keys slip through).
    """
    core = token.rstrip("=")
    if len(core) < 32:
        return False
    if _HEX.fullmatch(core):  # hex digests / keys: digits and letters mixed
        return any(c.isdigit() for c in core) and any(c.isalpha() for c in core)
    if not (any(c.isupper() for c in core) and any(c.islower() for c in core) and any(c.isdigit() for c in core)):
        return False  # UUIDs, snake_case identifiers, lower-case paths
    wordy = sum(len(run) for run in _WORDY.findall(core)) / len(core)
    return wordy < 0.5 or _class_changes(core) > 0.45


def _kv_replace(match: re.Match[str]) -> str:
    head = match.group("key") + match.group("sep")
    if match.group("dq") is not None:
        return f'{head}"{SECRET_PLACEHOLDER}"'
    if match.group("sq") is not None:
        return f"{head}'{SECRET_PLACEHOLDER}'"
    return head + SECRET_PLACEHOLDER


def redact(text: str) -> str:
    """Replace e-mail addresses with ``[EMAIL]`` and secrets with ``[SECRET]``.

    Idempotent: ``redact(redact(x)) == redact(x)``.  Key names of key/value
    secrets (``password=``, ``api_key:`` …) and the word ``Bearer`` are kept.
    """
    if not text:
        return text
    if not isinstance(text, str):
        text = str(text)
    text = _PEM_BLOCK.sub(SECRET_PLACEHOLDER, text)
    text = _JWT.sub(SECRET_PLACEHOLDER, text)
    text = _SPECIFIC_SECRETS.sub(SECRET_PLACEHOLDER, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{SECRET_PLACEHOLDER}", text)
    text = _KV_SECRET.sub(_kv_replace, text)
    text = _EMAIL.sub(EMAIL_PLACEHOLDER, text)
    text = _LONG_TOKEN.sub(lambda m: SECRET_PLACEHOLDER if _looks_random(m.group(0)) else m.group(0), text)
    return text


# ---------------------------------------------------------------------------
# Records and schema
# ---------------------------------------------------------------------------


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
_FEEDBACK_COLUMNS = ("feedback_id", "retrieval_request_id", "chunk_id", "rating", "note", "created_at")

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
]


def migrate_log(conn: duckdb.DuckDBPyConnection) -> int:
    """Apply every log migration not yet applied; returns the schema version."""
    return migrate(conn, LOG_MIGRATIONS)


# ---------------------------------------------------------------------------
# Row conversion
# ---------------------------------------------------------------------------


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


def _spool_line(row: Mapping[str, Any]) -> str:
    data = dict(row)
    data["created_at"] = row["created_at"].isoformat()
    for name in _JSON_COLUMNS:
        data[name] = json.loads(row[name])
    return _dumps(data)


def _record_from_db(values: Iterable[Any]) -> QueryLogRecord:
    data = dict(zip(_COLUMNS, values))
    for name in _JSON_COLUMNS:
        raw = data[name]
        data[name] = json.loads(raw) if isinstance(raw, str) else (raw if raw is not None else _JSON_EMPTY[name])
    return QueryLogRecord(**data)


def _arrow_batch(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=_ARROW_SCHEMA)


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# ---------------------------------------------------------------------------
# The log
# ---------------------------------------------------------------------------

_STOP = object()
_FLUSH = object()

# One lock per log file per process: connections from this process to the same
# file are serialised (the DuckDB file lock only arbitrates between processes).
_PATH_LOCKS: dict[str, threading.RLock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def _path_lock(path: Path) -> threading.RLock:
    key = str(path.resolve())
    with _PATH_LOCKS_GUARD:
        lock = _PATH_LOCKS.get(key)
        if lock is None:
            lock = _PATH_LOCKS[key] = threading.RLock()
        return lock


def _close_at_exit(ref: weakref.ref[QueryLog]) -> None:
    instance = ref()
    if instance is not None:
        instance.close()


class QueryLog:
    """Append-only log of answered queries, and the feedback table.

    ``append`` never raises and never waits for disk; everything else opens the
    log file for one short unit of work, waiting at most ``lock_timeout_s``
    for another process's lock before raising ``StoreLockedError``.
    """

    def __init__(self, path: Path, *, lock_timeout_s: float = 2.0, spool_dir: Path | None = None,
                 lines: QueryLines | None = None) -> None:
        self.path = Path(path)
        self.lines = lines  # one JSON line per query on stdout / a rotated file (seed 004), when set
        self.lock_timeout_s = float(lock_timeout_s)
        self.spool_dir = Path(spool_dir) if spool_dir is not None else self.path.parent
        self._db_lock = _path_lock(self.path)
        self._wconn: duckdb.DuckDBPyConnection | None = None
        self._cond = threading.Condition()
        self._enqueued = 0
        self._processed = 0
        self._closed = False
        self._pid = os.getpid()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = self._start_writer()
        self._atexit = _make_atexit_hook(weakref.ref(self))
        atexit.register(self._atexit)

    # -- writing ----------------------------------------------------------

    def append(self, record: QueryLogRecord) -> str:
        """Queue a record for writing; returns its ``retrieval_request_id`` at once. Never raises."""
        request_id = ""
        try:
            request_id = getattr(record, "retrieval_request_id", None) or (
                record.get("retrieval_request_id") if isinstance(record, Mapping) else None
            )
            if not request_id:
                request_id = _new_id()
                if isinstance(record, QueryLogRecord):
                    record.retrieval_request_id = request_id
            row = _normalise(record)
            row["retrieval_request_id"] = request_id
            if self.lines is not None:
                self.lines.write(row)
            if self._put(row) is None:
                # closed: no writer any more, keep the record in the spool for the next writer
                self._spool([row])
        except Exception:  # logging must never break a query
            log.warning("query log: could not log a query", exc_info=True)
        return str(request_id)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything queued so far is written (or spooled).

        Also makes the writer import spool files left by earlier lock conflicts.
        Returns False if the timeout passed first.
        """
        try:
            target = self._put(_FLUSH)
        except Exception:
            log.warning("query log: flush failed", exc_info=True)
            return False
        if target is None:  # closed: nothing can be queued any more
            return True
        with self._cond:
            return self._cond.wait_for(lambda: self._processed >= target, timeout=timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush, then stop the writer thread.  Safe to call more than once."""
        if self._closed:
            return
        try:
            self.flush(timeout_s)
            with self._cond:
                if self._closed:
                    return
                self._closed = True
                self._queue.put(_STOP)
            if self._thread.is_alive() and self._thread is not threading.current_thread():
                self._thread.join(timeout_s)
        finally:
            self._closed = True
            with contextlib.suppress(Exception):
                atexit.unregister(self._atexit)

    def __enter__(self) -> QueryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, item: Any) -> int | None:
        """Queue ``item``; returns its sequence number, or None once the log is closed."""
        if os.getpid() != self._pid:  # forked child: the writer thread did not come along
            self._after_fork()
        with self._cond:
            if self._closed:
                return None
            self._enqueued += 1
            self._queue.put(item)
            return self._enqueued

    def _after_fork(self) -> None:
        # the parent's locks may have been held by threads that do not exist here
        self._pid = os.getpid()
        self._queue = queue.SimpleQueue()
        self._enqueued = self._processed = 0
        self._cond = threading.Condition()
        self._db_lock = threading.RLock()
        self._wconn = None  # never use the parent's connection
        if not self._closed:
            self._thread = self._start_writer()

    def _start_writer(self) -> threading.Thread:
        thread = threading.Thread(target=self._writer_loop, name=f"query-log-writer:{self.path.name}", daemon=True)
        thread.start()
        return thread

    def _writer_loop(self) -> None:
        q = self._queue
        while True:
            try:
                items = [q.get(timeout=_IDLE_CLOSE_S)]
            except queue.Empty:
                self._close_writer_conn()  # idle: let other processes have the file
                continue
            # linger briefly so a busy server writes a few batches a second instead of opening
            # the file for every query (opening and migrating costs milliseconds of CPU)
            deadline = time.monotonic() + _LINGER_S
            while len(items) < _BATCH_MAX and items[-1] is not _STOP:
                remaining = deadline - time.monotonic()
                try:
                    items.append(q.get(timeout=remaining) if remaining > 0 else q.get_nowait())
                except queue.Empty:
                    break
            stop = any(item is _STOP for item in items)
            rows = [item for item in items if isinstance(item, dict)]
            try:
                if rows or self._spool_files():
                    self._write(rows)
            except Exception:  # never let the writer die
                log.warning("query log: writer failed", exc_info=True)
            with self._cond:
                self._processed += sum(1 for item in items if item is not _STOP)
                self._cond.notify_all()
            if stop:
                self._close_writer_conn()
                return

    def _writer_conn_get(self) -> duckdb.DuckDBPyConnection:
        """The writer thread's connection, kept open while queries keep coming (opening and
        migrating the file per batch cost a tenth of the server's CPU under load)."""
        if self._wconn is None:
            conn = open_duckdb(self.path, read_only=False, timeout_s=self.lock_timeout_s)
            try:
                migrate_log(conn)
            except BaseException:
                conn.close()
                raise
            self._wconn = conn
        return self._wconn

    def _close_writer_conn(self) -> None:
        with self._db_lock:
            if self._wconn is not None:
                try:
                    self._wconn.close()
                finally:
                    self._wconn = None

    def _write(self, rows: list[dict[str, Any]]) -> None:
        """Insert ``rows`` and import any spool files; spool ``rows`` if the file stays locked."""
        try:
            with self._db_lock:
                conn = self._writer_conn_get()
                try:
                    if rows:
                        self._insert(conn, rows)
                    self._import_spools(conn)
                except duckdb.Error:
                    self._close_writer_conn()
                    raise
        except Exception as error:
            if rows:
                level = logging.INFO if isinstance(error, StoreLockedError) else logging.WARNING
                log.log(level, "query log: %s; spooling %d record(s)", error, len(rows))
                self._spool(rows)

    @staticmethod
    def _insert(conn: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> None:
        unique = list({row["retrieval_request_id"]: row for row in rows}.values())
        columns = ", ".join(_COLUMNS)
        select = ", ".join(f"{c}::JSON" if c in _JSON_COLUMNS else c for c in _COLUMNS)
        conn.register("_query_log_batch", _arrow_batch(unique))
        try:
            with transaction(conn):
                conn.execute(f"INSERT OR IGNORE INTO query_log ({columns}) SELECT {select} FROM _query_log_batch")
        finally:
            conn.unregister("_query_log_batch")

    # -- spool ------------------------------------------------------------

    def _spool_path(self) -> Path:
        return self.spool_dir / f"{SPOOL_PREFIX}{os.getpid()}.jsonl"

    def _spool_files(self) -> list[Path]:
        try:
            return sorted(self.spool_dir.glob(f"{SPOOL_PREFIX}*.jsonl"))
        except OSError:
            return []

    def _spool(self, rows: list[dict[str, Any]]) -> None:
        text = "".join(_spool_line(row) + "\n" for row in rows)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        path = self._spool_path()
        for _ in range(10):
            with open(path, "a", encoding="utf-8") as handle:
                with _flocked(handle):
                    # an importer may have consumed and unlinked this file while we waited
                    try:
                        same = os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
                    except FileNotFoundError:
                        same = False
                    if not same:
                        continue
                    handle.write(text)
                    handle.flush()
                    return
        log.error("query log: could not spool %d record(s) to %s", len(rows), path)

    def _import_spools(self, conn: duckdb.DuckDBPyConnection) -> int:
        """Import and remove every spool file (we hold the log's write lock)."""
        imported = 0
        for path in self._spool_files():
            try:
                with open(path, encoding="utf-8") as handle, _flocked(handle):
                    rows = []
                    for number, line in enumerate(handle, 1):
                        if not line.strip():
                            continue
                        try:
                            rows.append(_normalise(json.loads(line)))
                        except Exception:
                            log.warning("query log: skipping unreadable line %d of %s", number, path)
                    for start in range(0, len(rows), _BATCH_MAX):
                        self._insert(conn, rows[start : start + _BATCH_MAX])
                    path.unlink()
                    imported += len(rows)
            except FileNotFoundError:
                continue
            except Exception:
                log.warning("query log: could not import spool file %s", path, exc_info=True)
        return imported

    # -- reading ----------------------------------------------------------

    @contextlib.contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A migrated read-write connection, held only for one unit of work.

        Raises ``StoreLockedError`` when another process keeps the file locked
        for longer than ``lock_timeout_s``.
        """
        with self._db_lock:
            if self._wconn is not None:  # the writer's open connection serves readers too
                cursor = self._wconn.cursor()
                try:
                    yield cursor
                finally:
                    cursor.close()
                return
            conn = open_duckdb(self.path, read_only=False, timeout_s=self.lock_timeout_s)
            try:
                migrate_log(conn)
                yield conn
            finally:
                conn.close()

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

    def add_feedback(
        self, retrieval_request_id: str, rating: str, chunk_id: str | None = None, note: str | None = None
    ) -> dict[str, Any]:
        """Store one rating synchronously and return the stored row (ISO ``created_at``).

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
        }
        self.flush()
        with self._connect() as conn, transaction(conn):
            known = conn.execute(
                "SELECT 1 FROM query_log WHERE retrieval_request_id = ?", [retrieval_request_id]
            ).fetchone()
            if not known:
                raise KeyError(f"retrieval_request_id={retrieval_request_id!r} is not in the query log")
            conn.execute(
                f"INSERT INTO feedback ({', '.join(_FEEDBACK_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)",
                [row[c] for c in _FEEDBACK_COLUMNS],
            )
        row["created_at"] = row["created_at"].isoformat()
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


def _make_atexit_hook(ref: weakref.ref[QueryLog]):
    def hook() -> None:
        _close_at_exit(ref)

    return hook


@contextlib.contextmanager
def _flocked(handle: Any) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class _DailyAndSizeRotatingHandler(logging.handlers.TimedRotatingFileHandler):
    """Rotates at midnight (UTC) and whenever the file passes ``max_bytes``; keeps ``backupCount`` files.
    A rotated file is renamed with its timestamp (``query.log.2026-11-23_17-05-00``)."""

    def __init__(self, filename: Path, max_bytes: int, backup_count: int) -> None:
        super().__init__(filename, when="midnight", utc=True, backupCount=backup_count, encoding="utf-8", delay=True)
        self.max_bytes = max_bytes
        self.suffix = "%Y-%m-%d_%H-%M-%S"
        self.extMatch = re.compile(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(\.\d+)?$", re.ASCII)

    def shouldRollover(self, record: logging.LogRecord) -> int:  # noqa: N802 - logging's API
        if self.stream is not None and self.max_bytes > 0:
            self.stream.seek(0, 2)
            if self.stream.tell() + len(self.format(record)) + 1 > self.max_bytes:
                return 1
        return super().shouldRollover(record)

    def rotation_filename(self, default_name: str) -> str:
        # the size trigger can fire twice in one second: never overwrite a rotated file
        name, n = default_name, 1
        while os.path.exists(name):
            name, n = f"{default_name}.{n}", n + 1
        return name


class QueryLines:
    """One JSON line per query in seed 004's shape - ``{timestamp, query, num_results, latency_ms, reranker,
    top_score, results: [{chunk_id, source, score, text_preview}], error, answer, ...}`` - on stdout (container
    logs) and/or in ``<folder>/query.log``, rotated daily and at ``max_mb``, ``keep_days`` kept.  Rows arrive
    already redacted (``_normalise``); writing never raises into a query."""

    def __init__(self, folder: Path | None, stdout: bool = False, max_mb: float = 100.0, keep_days: int = 7) -> None:
        self.logger = logging.getLogger(f"groundwork.query_lines.{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        self.path = None
        if folder is not None:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.path = Path(folder) / "query.log"
            handler = _DailyAndSizeRotatingHandler(self.path, int(max_mb * 1024 * 1024), keep_days)
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.logger.addHandler(handler)
        if stdout:
            handler = logging.StreamHandler(sys.stdout)
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.logger.addHandler(handler)

    @staticmethod
    def line(row: Mapping[str, Any]) -> dict[str, Any]:
        results = row["results_post"]
        results = json.loads(results) if isinstance(results, str) else results
        latency = row["latency_ms"]
        latency = json.loads(latency) if isinstance(latency, str) else latency
        params = row["params"]
        params = json.loads(params) if isinstance(params, str) else params
        top = [{"chunk_id": r.get("chunk_id"), "source": r.get("url") or r.get("source_path") or r.get("doc_id"),
                "score": r.get("score"), "text_preview": redact(str(r.get("text") or r.get("snippet") or ""))[:200]}
               for r in results]
        return {
            "timestamp": row["created_at"].isoformat(timespec="seconds") + "Z", "query": row["query"],
            "num_results": len(top), "latency_ms": (latency or {}).get("total"),
            "reranker": (params or {}).get("reranker"), "top_score": top[0]["score"] if top else None,
            "results": top, "error": row.get("error"), "answer": row.get("answer"),
            "retrieval_request_id": row["retrieval_request_id"], "client": row["client"],
            "reranker_status": row.get("reranker_status"), "coverage": row.get("coverage"),
            "snapshot_version": row.get("snapshot_version"),
        }

    def write(self, row: Mapping[str, Any]) -> None:
        try:
            self.logger.info(_dumps(self.line(row)))
        except Exception:  # noqa: BLE001 - a log line must never break a query
            log.warning("query log: could not write a query line", exc_info=True)

    def close(self) -> None:
        for handler in list(self.logger.handlers):
            handler.close()
            self.logger.removeHandler(handler)


def default_log_path(data_dir: Path) -> Path:
    """``<data_dir>/logs.duckdb``: the query log's own file, next to (not inside) the store."""
    return Path(data_dir) / DEFAULT_LOG_FILE_NAME
