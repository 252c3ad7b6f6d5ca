"""The query log: one row per answered query, plus the feedback people give on answers.

The log lives in its own DuckDB file (by default ``<data_dir>/logs.duckdb``),
separate from the store and the index snapshots, so logging can never block or
break retrieval.  One job per module:

* ``redaction``: ``redact`` replaces e-mail addresses and secrets in queries,
  error messages, answers and feedback notes; callers are never trusted to
  have done it.
* ``records``: ``QueryLogRecord``, the log file's schema (``LOG_MIGRATIONS``,
  applied like the store's) and row conversion.
* ``writer``: the background writer thread, batching inserts, and the JSONL
  spool used while another process holds the file's lock.
* ``repository``: ``QueryLog`` — reads, feedback, export and purge.
* ``retention``: ``purge_query_log``, the configured retention applied.
* ``lines``: ``QueryLines``, one JSON line per query on stdout and/or a
  rotated ``query.log`` (the query-line contract).

This package re-exports the public names, so callers import from
``knowledge_store.storage.query_log`` and need not know the layout.
"""

from knowledge_store.storage.query_log.lines import QueryLines, _DailyAndSizeRotatingHandler
from knowledge_store.storage.query_log.records import LOG_MIGRATIONS, QueryLogRecord, migrate_log
from knowledge_store.storage.query_log.redaction import EMAIL_PLACEHOLDER, SECRET_PLACEHOLDER, redact
from knowledge_store.storage.query_log.repository import DEFAULT_LOG_FILE_NAME, RATINGS, QueryLog, default_log_path
from knowledge_store.storage.query_log.retention import RetentionResult, purge_query_log
from knowledge_store.storage.query_log.writer import SPOOL_PREFIX, QueryLogWriter

__all__ = [
    "DEFAULT_LOG_FILE_NAME",
    "EMAIL_PLACEHOLDER",
    "LOG_MIGRATIONS",
    "RATINGS",
    "SECRET_PLACEHOLDER",
    "SPOOL_PREFIX",
    "QueryLines",
    "QueryLog",
    "QueryLogRecord",
    "QueryLogWriter",
    "RetentionResult",
    "_DailyAndSizeRotatingHandler",
    "default_log_path",
    "purge_query_log",
    "migrate_log",
    "redact",
]
