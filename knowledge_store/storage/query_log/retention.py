"""Query-log retention: logged queries (and their feedback) older than ``settings.query_log_retention_days`` go.

Run daily by the Dagster schedule ``query_log_retention_daily`` and on demand by ``groundwork logs purge``.
A retention of 0 days keeps everything (the scheduled purge does nothing); ``days`` given explicitly always
purges (0 = every query logged before now).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta

from knowledge_store.config.settings import Settings
from knowledge_store.storage.query_log.repository import QueryLog
from knowledge_store.storage.store import utcnow


@dataclass(frozen=True)
class RetentionResult:
    days: float  # the retention applied (0 with ``kept_everything``: retention is off)
    cutoff: str | None  # ISO time: queries logged before it were deleted (None: nothing was purged)
    queries_deleted: int
    queries_left: int
    kept_everything: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def purge_query_log(settings: Settings, days: float | None = None, log: QueryLog | None = None) -> RetentionResult:
    """Delete the queries older than ``days`` (default: the configured retention) with their feedback.

    ``log``: the query log to purge (default: the one at ``settings.logs_path``, opened and closed here)."""
    explicit = days is not None
    days = settings.query_log_retention_days if days is None else float(days)
    if days < 0:
        raise ValueError(f"days={days!r}: must be >= 0")
    own = log is None
    log = log or QueryLog(settings.logs_path, lock_timeout_s=settings.lock_timeout_s)
    try:
        if days == 0 and not explicit:
            return RetentionResult(0.0, None, 0, log.count(), kept_everything=True)
        cutoff = utcnow() - timedelta(days=days)
        deleted = log.purge_older_than(days)
        return RetentionResult(days, cutoff.isoformat(timespec="seconds") + "Z", deleted, log.count())
    finally:
        if own:
            log.close()
