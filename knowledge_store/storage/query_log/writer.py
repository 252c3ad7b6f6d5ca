"""The query log's background writer and its spool.

``QueryLogWriter.append`` only redacts the query, turns the record into a
plain row and puts it on an in-memory queue; it returns the
``retrieval_request_id`` at once and never raises.  A background thread drains
the queue in batches and bulk-inserts each batch through a pyarrow table
registered on the writer's connection, which is closed after
``_IDLE_CLOSE_S`` without records so several processes (the API server, a CLI
run, the MCP server …) can all log into the same file.

When another process holds the file's lock for longer than
``lock_timeout_s``, the batch is appended to a JSONL spool file
``<spool_dir>/query_log.spool-<pid>.jsonl`` instead; the next writer that gets
the lock (in any process) imports every spool file it finds and removes it.
Imports are idempotent (``INSERT OR IGNORE`` on the primary key), so a crash
between insert and unlink cannot duplicate rows.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import duckdb
import pyarrow as pa

from knowledge_store.core.errors import StoreLockedError
from knowledge_store.storage.query_log.records import (
    _ARROW_SCHEMA,
    _COLUMNS,
    _JSON_COLUMNS,
    QueryLogRecord,
    _dumps,
    _new_id,
    _normalise,
    migrate_log,
)
from knowledge_store.storage.store import open_duckdb, transaction

if TYPE_CHECKING:
    from knowledge_store.storage.query_log.lines import QueryLines

try:  # advisory locks on spool files (POSIX); without them spooling still works
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

SPOOL_PREFIX = "query_log.spool-"

_LINGER_S = 0.1
_IDLE_CLOSE_S = 2.0  # close the writer's connection after this long without records
_BATCH_MAX = 500  # records per insert transaction


def _spool_line(row: Mapping[str, Any]) -> str:
    """A normalised row as one JSONL spool line (JSON columns nested, not as text), read back by ``_normalise``."""
    data = dict(row)
    data["created_at"] = row["created_at"].isoformat()
    for name in _JSON_COLUMNS:
        data[name] = json.loads(row[name])
    return _dumps(data)


def _arrow_batch(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as one Arrow table: DuckDB inserts a registered table in bulk, far faster than row by row."""
    return pa.Table.from_pylist(rows, schema=_ARROW_SCHEMA)


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


def _close_at_exit(ref: weakref.ref[QueryLogWriter]) -> None:
    instance = ref()
    if instance is not None:
        instance.close()


class QueryLogWriter:
    """Queues appended records and writes them from a background thread.

    ``append`` never raises and never waits for disk; ``_connect`` gives
    readers (``QueryLog``) a connection for one short unit of work, waiting at
    most ``lock_timeout_s`` for another process's lock.
    """

    def __init__(self, path: Path, *, lock_timeout_s: float = 2.0, spool_dir: Path | None = None,
                 lines: QueryLines | None = None) -> None:
        self.path = Path(path)
        self.lines = lines  # one JSON line per query on stdout / a rotated file (the query-line contract), when set
        self.lock_timeout_s = float(lock_timeout_s)
        self.spool_dir = Path(spool_dir) if spool_dir is not None else self.path.parent
        self._db_lock = _path_lock(self.path)
        self._wconn: duckdb.DuckDBPyConnection | None = None
        self._cond = threading.Condition()
        self._enqueued = 0
        self._processed = 0
        self._closed = False
        self._write_error: str | None = None  # the last batch's failure, cleared by the next written batch
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

    def problem(self) -> str | None:
        """Why queries are not being logged now, or None while they are: closed, the writer thread gone, the
        folder not writable, or the last batch failed (its records wait in the spool file)."""
        if self._closed:
            return f"the query log {self.path} is closed"
        if os.getpid() == self._pid and not self._thread.is_alive():
            return f"the query log's writer thread stopped ({self.path})"
        folder = self.path.parent
        if not os.access(folder if folder.exists() else folder.parent, os.W_OK):
            return f"cannot write to {folder}"
        if self._write_error is not None:
            return f"writing {self.path} failed: {self._write_error}"
        return None

    def __enter__(self) -> Self:
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
                    self._write_error = None
            except Exception as error:  # never let the writer die
                self._write_error = f"{type(error).__name__}: {error}"
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

    # -- connection for readers ---------------------------------------------

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


def _make_atexit_hook(ref: weakref.ref[QueryLogWriter]):
    def hook() -> None:
        _close_at_exit(ref)

    return hook


@contextlib.contextmanager
def _flocked(handle: Any) -> Iterator[None]:
    """Hold an exclusive advisory lock on an open spool file, so a writer and an importer never interleave."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
