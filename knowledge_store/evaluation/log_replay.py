"""Replay logged queries against the current index and measure ranking drift.

``replay`` re-runs the logged queries (every client except ``"eval"``; failed
queries are skipped) with their logged parameters (k, alpha, fusion,
reranker, filters, min_relevance) and ``log=False``, and compares each
query's logged top-k (``results_post``) with the new top-k.

A logged result counts as **kept** when its chunk id is in the new top-k, or
its content hash is: chunk ids change whenever a document gets a new version,
content hashes only when the chunk's text changes, so a re-sync that keeps a
passage's text is not reported as drift for that passage.

Per query: ``overlap`` = kept / max(len(logged), len(current)) over the top
``min(k, logged k)`` (1.0 when both are empty), ``removed`` = logged chunk ids
not kept, ``added`` = new chunk ids that match no logged result by id or hash.
A query is *changed* when anything was added or removed (a pure re-ordering
of the same passages is not a change).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from knowledge_store.storage.query_log import QueryLog

__all__ = ["ReplayRow", "ReplayReport", "replay", "compare"]

REPLAYED_PARAMS = ("k", "alpha", "fusion", "reranker", "filters", "min_relevance")


@dataclass
class ReplayRow:
    retrieval_request_id: str
    query: str
    overlap: float
    added: list[str] = field(default_factory=list)  # chunk ids new in the top-k
    removed: list[str] = field(default_factory=list)  # logged chunk ids no longer in the top-k
    logged_snapshot: int | None = None
    current_snapshot: int | None = None
    kept_by_hash: int = 0  # kept only through the content hash (the chunk id changed)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)


@dataclass
class ReplayReport:
    queries: int = 0
    mean_overlap: float = 1.0  # 0-1; 1.0 when nothing was replayed
    changed_queries: int = 0
    per_query: list[ReplayRow] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {retrieval_request_id, reason}

    def to_rows(self) -> list[dict[str, Any]]:
        """One plain dict per replayed query (for a table, CSV or JSON)."""
        return [{**asdict(row), "changed": row.changed} for row in self.per_query]


def compare(logged: list[dict[str, Any]], current: list[dict[str, Any]]) -> tuple[float, list[str], list[str], int]:
    """(overlap, added, removed, kept_by_hash) of two result lists of
    ``{"chunk_id", "content_hash"}`` dicts; see the module docstring."""
    cur_ids = {r.get("chunk_id") for r in current}
    cur_hashes = {r.get("content_hash") for r in current if r.get("content_hash")}
    kept = 0
    kept_by_hash = 0
    removed = []
    for r in logged:
        if r.get("chunk_id") in cur_ids:
            kept += 1
        elif r.get("content_hash") and r.get("content_hash") in cur_hashes:
            kept += 1
            kept_by_hash += 1
        else:
            removed.append(r.get("chunk_id"))
    log_ids = {r.get("chunk_id") for r in logged}
    log_hashes = {r.get("content_hash") for r in logged if r.get("content_hash")}
    added = [
        r.get("chunk_id")
        for r in current
        if r.get("chunk_id") not in log_ids and not (r.get("content_hash") and r.get("content_hash") in log_hashes)
    ]
    denominator = max(len(logged), len(current))
    overlap = kept / denominator if denominator else 1.0
    return overlap, added, removed, kept_by_hash


def replay(
    log: QueryLog, engine: Any, since: datetime | None = None, limit: int = 500, k: int = 5
) -> ReplayReport:
    """Re-run up to ``limit`` logged queries (newest first, logged at or after
    ``since``) on ``engine`` and compare the top ``min(k, logged k)``."""
    report = ReplayReport()
    overlaps = []
    for record in log.list(since=since, limit=limit):
        if record.client == "eval":
            continue
        if record.error:
            report.skipped.append({"retrieval_request_id": record.retrieval_request_id, "reason": "logged error"})
            continue
        params = {name: record.params[name] for name in REPLAYED_PARAMS if record.params.get(name) is not None}
        cutoff = min(k, int(params.get("k") or k))
        try:
            response = engine.search(request=engine.request(record.query, answer="none", client="eval", **params), log=False)
        except Exception as error:  # noqa: BLE001 - one bad record must not stop the replay
            report.skipped.append(
                {"retrieval_request_id": record.retrieval_request_id, "reason": f"{type(error).__name__}: {error}"}
            )
            continue
        logged = list(record.results_post or [])[:cutoff]
        current = [{"chunk_id": h.chunk_id, "content_hash": h.content_hash} for h in response.hits[:cutoff]]
        overlap, added, removed, kept_by_hash = compare(logged, current)
        row = ReplayRow(
            retrieval_request_id=record.retrieval_request_id,
            query=record.query,
            overlap=overlap,
            added=added,
            removed=removed,
            logged_snapshot=record.snapshot_version,
            current_snapshot=response.snapshot_version,
            kept_by_hash=kept_by_hash,
        )
        report.per_query.append(row)
        overlaps.append(overlap)
    report.queries = len(report.per_query)
    report.changed_queries = sum(1 for row in report.per_query if row.changed)
    report.mean_overlap = sum(overlaps) / len(overlaps) if overlaps else 1.0
    return report
