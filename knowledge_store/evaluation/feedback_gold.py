"""A gold set built from the feedback people gave in the query log.

Every logged query with at least one feedback row becomes one ``GoldSample``:

* chunks rated **up** are its references (``reference_ids``), chunks rated
  **down** its negatives (``negative_ids``);
* several feedback rows on the same request are merged; when the same chunk
  was rated more than once, the **newest** rating wins (so a chunk rated up
  and later down is a negative only);
* request-level feedback (``chunk_id`` is NULL, "this answer was helpful")
  names no chunk, so it adds no ids; it does count in ``helpful_by_config``;
* the content hash of every rated chunk is looked up in the logged results
  (``results_post`` then ``results_pre``) and kept in ``reference_hashes`` /
  ``negative_hashes``.  Chunk ids change whenever a document gets a new
  version, content hashes only when the chunk's text changes, so matching by
  hash keeps a sample usable across re-syncs that keep the text.  A rated
  chunk that is not in the logged results has no hash (it is kept by id only).

Requests whose feedback has no up-rated chunk are still returned (with
``reference_ids == []``) so their negatives are not lost.  Ranking metrics
(``knowledge_store.evaluation.metrics``) return 0.0 for an empty relevant set; such samples carry no
signal for recall/nDCG and **must be skipped** when scoring (use
``GoldSample.has_references``), exactly as ``knowledge_store.evaluation.beir.load_beir`` drops
queries without a positive qrel.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from knowledge_store.storage.query_log import QueryLog

__all__ = ["GoldSample", "feedback_gold_set", "helpful_by_config", "config_key"]


@dataclass
class GoldSample:
    retrieval_request_id: str
    query: str
    reference_ids: list[str] = field(default_factory=list)  # chunk ids rated up (newest rating)
    negative_ids: list[str] = field(default_factory=list)  # chunk ids rated down (newest rating)
    reference_hashes: list[str] = field(default_factory=list)  # content hashes of reference_ids, where logged
    negative_hashes: list[str] = field(default_factory=list)  # content hashes of negative_ids, where logged
    params: dict[str, Any] = field(default_factory=dict)  # the logged alpha, fusion, reranker, filters, k …
    created_at: datetime | None = None  # when the query was logged (naive UTC)
    request_ratings: list[str] = field(default_factory=list)  # request-level ratings, oldest first
    hash_of: dict[str, str] = field(default_factory=dict)  # rated chunk id -> its content hash, where logged

    @property
    def has_references(self) -> bool:
        """False for negative-only samples: metrics must skip those."""
        return bool(self.reference_ids)

    def relevant(self) -> set[str]:
        """Reference chunk ids, as a ``relevant`` set for ``knowledge_store.evaluation.metrics``."""
        return set(self.reference_ids)


def _as_datetime(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def _naive_utc(value: datetime) -> datetime:
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def _hashes(row: dict[str, Any]) -> dict[str, str]:
    """chunk_id -> content_hash from the logged results (post-rerank order preferred)."""
    out: dict[str, str] = {}
    for result in (row.get("results_post") or []) + (row.get("results_pre") or []):
        chunk_id, content_hash = result.get("chunk_id"), result.get("content_hash")
        if chunk_id and content_hash and chunk_id not in out:
            out[chunk_id] = content_hash
    return out


def _merged(log: QueryLog, since: datetime | None = None) -> list[dict[str, Any]]:
    """Feedback merged per request: newest rating per chunk (and for the request itself)."""
    rows = log.feedback_with_queries(limit=10**9)  # newest first
    cutoff = _naive_utc(since) if since is not None else None
    requests: dict[str, dict[str, Any]] = {}
    for row in reversed(rows):  # oldest first: later rows overwrite earlier ones
        created = _as_datetime(row.get("query_created_at"))
        if cutoff is not None and created is not None and created < cutoff:
            continue
        rid = row["retrieval_request_id"]
        entry = requests.get(rid)
        if entry is None:
            entry = requests[rid] = {
                "retrieval_request_id": rid,
                "query": row.get("query") or "",
                "params": row.get("params") or {},
                "created_at": created,
                "hashes": _hashes(row),
                "chunks": {},  # chunk_id -> newest rating (insertion order = first rated)
                "request_ratings": [],  # every request-level rating, oldest first
            }
        chunk_id = row.get("chunk_id")
        if chunk_id:
            entry["chunks"].pop(chunk_id, None)  # re-insert: order by the newest rating
            entry["chunks"][chunk_id] = row["rating"]
        else:
            entry["request_ratings"].append(row["rating"])
    return sorted(requests.values(), key=lambda e: (e["created_at"] or datetime.min, e["retrieval_request_id"]))


def feedback_gold_set(log: QueryLog, since: datetime | None = None) -> list[GoldSample]:
    """One ``GoldSample`` per logged query that has feedback (queries logged at
    or after ``since``), oldest query first.  See the module docstring."""
    samples = []
    for entry in _merged(log, since):
        ups = [c for c, r in entry["chunks"].items() if r == "up"]
        downs = [c for c, r in entry["chunks"].items() if r == "down"]
        hashes = entry["hashes"]
        samples.append(
            GoldSample(
                retrieval_request_id=entry["retrieval_request_id"],
                query=entry["query"],
                reference_ids=ups,
                negative_ids=downs,
                reference_hashes=[hashes[c] for c in ups if c in hashes],
                negative_hashes=[hashes[c] for c in downs if c in hashes],
                params=dict(entry["params"]),
                created_at=entry["created_at"],
                request_ratings=list(entry["request_ratings"]),
                hash_of={c: hashes[c] for c in (*ups, *downs) if c in hashes},
            )
        )
    return samples


def config_key(params: dict[str, Any]) -> tuple[Any, ...]:
    """(alpha, fusion, reranker) of logged params; missing values are None."""
    alpha = params.get("alpha")
    return (float(alpha) if alpha is not None else None, params.get("fusion"), params.get("reranker"))


def helpful_by_config(log: QueryLog, since: datetime | None = None) -> list[dict[str, Any]]:
    """Helpful rate ``up / (up + down)`` per configuration (alpha, fusion, reranker).

    Counted judgements: one per rated chunk of a request (its newest rating,
    as in the gold set) plus every request-level rating.  Each row:
    ``alpha``, ``fusion``, ``reranker``, ``up``, ``down``, ``rated`` (up + down),
    ``requests`` (queries with feedback), ``helpful_rate`` (None when nothing
    was rated).  Sorted by ``rated`` descending, then by configuration.
    """
    stats: dict[tuple[Any, ...], dict[str, int]] = defaultdict(lambda: {"up": 0, "down": 0, "requests": 0})
    for entry in _merged(log, since):
        counts = stats[config_key(entry["params"])]
        counts["requests"] += 1
        for rating in [*entry["chunks"].values(), *entry["request_ratings"]]:
            counts[rating] += 1
    rows = []
    for (alpha, fusion, reranker), counts in stats.items():
        rated = counts["up"] + counts["down"]
        rows.append(
            {
                "alpha": alpha,
                "fusion": fusion,
                "reranker": reranker,
                "up": counts["up"],
                "down": counts["down"],
                "rated": rated,
                "requests": counts["requests"],
                "helpful_rate": counts["up"] / rated if rated else None,
            }
        )
    rows.sort(key=lambda r: (-r["rated"], str(r["alpha"]), str(r["fusion"]), str(r["reranker"])))
    return rows
