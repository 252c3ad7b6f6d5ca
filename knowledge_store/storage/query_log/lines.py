"""One JSON line per answered query (the query-line contract's shape), on stdout and/or a rotated file.

Every process that logs a query writes its line to ``<data_dir>/logs/query.log`` (the server, ``groundwork
query``, MCP over stdio, the ``retrieve_knowledge`` support tool, a Python ``RetrievalEngine``); only the
server also prints it on stdout (``ServerState``), because elsewhere stdout is the command's output or the MCP
protocol channel.  So several processes append to one file: each line is one ``write`` in append mode, and
rotation is coordinated (``_DailyAndSizeRotatingHandler``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knowledge_store.storage.query_log.records import _dumps
from knowledge_store.storage.query_log.redaction import redact

if TYPE_CHECKING:
    from knowledge_store.config.settings import Settings

try:  # advisory lock around rotation (POSIX); without it one process per file rotates safely still
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


class _DailyAndSizeRotatingHandler(logging.handlers.TimedRotatingFileHandler):
    """Rotates at midnight (UTC) and whenever the file passes ``max_bytes``; keeps ``backupCount`` files.
    A rotated file is renamed with its timestamp (``query.log.2026-11-23_17-05-00``).

    Several processes may append to one file, each with its own handler, so rotation is shared: it runs under
    an advisory lock on the file's folder (no lock file to keep beside the logs); a handler whose file another process rotated away reopens the new
    file instead of rotating it again (or writing on into the rotated one); and the midnight trigger only
    rotates a file last written before the latest midnight (another process may already have rotated it and
    written today's first lines)."""

    def __init__(self, filename: Path, max_bytes: int, backup_count: int) -> None:
        super().__init__(filename, when="midnight", utc=True, backupCount=backup_count, encoding="utf-8", delay=True)
        self.max_bytes = max_bytes
        self.suffix = "%Y-%m-%d_%H-%M-%S"
        self.extMatch = re.compile(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(\.\d+)?$", re.ASCII)

    def shouldRollover(self, record: logging.LogRecord) -> int:  # noqa: N802 - logging's API
        if self._rotated_elsewhere():
            self._reopen()
        if self.stream is not None and self.max_bytes > 0:
            self.stream.seek(0, 2)
            if self.stream.tell() + len(self.format(record)) + 1 > self.max_bytes:
                return 1
        if not super().shouldRollover(record):
            return 0
        now = int(time.time())
        latest_midnight = self.computeRollover(now) - self.interval
        try:
            written_today = os.stat(self.baseFilename).st_mtime >= latest_midnight
        except FileNotFoundError:
            written_today = True  # nothing to rotate
        if written_today:
            self.rolloverAt = self.computeRollover(now)
            return 0
        return 1

    def doRollover(self) -> None:  # noqa: N802 - logging's API
        with self._rotation_lock():
            if self._rotated_elsewhere():  # another process rotated while this one waited for the lock
                self._reopen()
                return
            super().doRollover()

    def _rotated_elsewhere(self) -> bool:
        """The open file is no longer ``query.log``: another process renamed it (rotation)."""
        if self.stream is None:
            return False
        try:
            ours = os.fstat(self.stream.fileno())
            current = os.stat(self.baseFilename)
        except FileNotFoundError:
            return True
        except (OSError, ValueError):
            return False
        return (ours.st_dev, ours.st_ino) != (current.st_dev, current.st_ino)

    def _reopen(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self.stream = self._open()
        self.rolloverAt = self.computeRollover(int(time.time()))

    @contextlib.contextmanager
    def _rotation_lock(self) -> Iterator[None]:
        if fcntl is None:  # pragma: no cover
            yield
            return
        folder = os.open(os.path.dirname(self.baseFilename), os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            yield
        finally:
            os.close(folder)  # releases the lock

    def rotation_filename(self, default_name: str) -> str:
        # the size trigger can fire twice in one second: never overwrite a rotated file
        name, n = default_name, 1
        while os.path.exists(name):
            name, n = f"{default_name}.{n}", n + 1
        return name


class QueryLines:
    """One JSON line per query in its contract's shape - ``{timestamp, query, num_results, latency_ms, reranker,
    top_score, results: [{chunk_id, source, score, text_preview}], error, answer, ...}`` (answer null unless
    ``answers``: the text is in the query log, under the line's ``retrieval_request_id``) - on stdout (container
    logs) and/or in ``<folder>/query.log``, rotated daily and at ``max_mb``, ``keep_days`` kept.  Rows arrive
    already redacted (``_normalise``); writing never raises into a query."""

    def __init__(self, folder: Path | None, stdout: bool = False, max_mb: float = 100.0, keep_days: int = 7,
                 answers: bool = False) -> None:
        # the answer text quotes the documents (internal ones, for an admin): only written when asked for
        # (GROUNDWORK_LOG_ANSWERS); the line's retrieval_request_id finds it in the query log
        self.answers = answers
        self.logger = logging.getLogger(f"groundwork.query_lines.{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        self.path = None
        self.stdout = False
        if folder is not None:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.path = Path(folder) / "query.log"
            handler = _DailyAndSizeRotatingHandler(self.path, int(max_mb * 1024 * 1024), keep_days)
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.logger.addHandler(handler)
        if stdout:
            self.echo_to_stdout()

    @classmethod
    def for_file(cls, settings: Settings) -> QueryLines:
        """The lines every process writes: ``<data_dir>/logs/query.log`` as the settings rotate it (nothing when
        ``query_log_file`` is off).  Not stdout: only the server may print there (``echo_to_stdout``)."""
        return cls(settings.data_dir / "logs" if settings.query_log_file else None, stdout=False,
                   max_mb=settings.query_log_max_mb, keep_days=settings.query_log_keep_days,
                   answers=settings.log_answers)

    def echo_to_stdout(self) -> None:
        """Also print every line on stdout (container logs); a second call adds nothing."""
        if self.stdout:
            return
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.logger.addHandler(handler)
        self.stdout = True

    @staticmethod
    def line(row: Mapping[str, Any], answers: bool = True) -> dict[str, Any]:
        """The JSON line of one logged row; ``answer`` is null unless ``answers``."""
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
            "results": top, "error": row.get("error"), "answer": row.get("answer") if answers else None,
            "retrieval_request_id": row["retrieval_request_id"], "client": row["client"],
            "reranker_status": row.get("reranker_status"), "coverage": row.get("coverage"),
            "snapshot_version": row.get("snapshot_version"),
        }

    def write(self, row: Mapping[str, Any]) -> None:
        try:
            self.logger.info(_dumps(self.line(row, self.answers)))
        except Exception:  # noqa: BLE001 - a log line must never break a query
            log.warning("query log: could not write a query line", exc_info=True)

    def close(self) -> None:
        for handler in list(self.logger.handlers):
            handler.close()
            self.logger.removeHandler(handler)
