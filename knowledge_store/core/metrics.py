"""Ranking metrics as pure functions, and the paired comparison every adoption rule decides by.

The metric registry that evaluation runs record (names, labels, directions) is
``knowledge_store.evaluation.metrics``; self-tuning, the query adapter and fine-tuning score their
held-out queries with these functions and decide with ``paired_gain``.

Conventions (the same as BEIR / pytrec_eval):

- doc ids are compared as strings on both sides (an int id 5 in ``ranked`` matches "5" or 5 in
  ``relevant``: self-tuning ranks section numbers); ``ranked`` is a list of unique doc ids, best
  first (turn a ranked list of chunks into one with ``dedupe_ranking``);
- ``relevant`` is a mapping doc id -> graded relevance, or a set (every member
  grade 1).  Only grades > 0 count as relevant;
- ``k`` cuts the ranking: only the first ``k`` ids are looked at;
- recall@k divides by the number of relevant documents (not by min(k, |rel|));
- precision@k divides by k, even when fewer than k ids were returned;
- nDCG@k uses the grade as the gain with a log2(rank + 1) discount; the ideal
  DCG ranks the qrels' own grades best first;
- MRR@k is 1 / rank of the first relevant id within the top k, else 0.

**Empty relevant set**: every metric returns 0.0.  Such a query has nothing
to find, so it says nothing about the system; it must not be scored at all
(``knowledge_store.evaluation.beir.load_beir`` drops queries without a positive qrel, exactly so).

A ``ranked`` list with a repeated id raises ValueError: it would count the
same document twice and could push recall or nDCG above 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np

Relevant = Union[Mapping[str, float], Iterable[str]]

DEFAULT_KS = (1, 3, 5, 10, 100)


def _grades(relevant: Relevant) -> dict[str, float]:
    if isinstance(relevant, Mapping):
        return {str(doc_id): float(grade) for doc_id, grade in relevant.items() if grade > 0}
    return {str(doc_id): 1.0 for doc_id in relevant}


def _top(ranked: Sequence[str], k: int) -> list[str]:
    """The first ``k`` ids as strings, the form ``_grades`` keys them by."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(set(ranked)) != len(ranked):
        raise ValueError("ranked contains repeated doc ids; pass it through dedupe_ranking first")
    return [str(doc_id) for doc_id in ranked[:k]]


def recall_at_k(ranked: Sequence[str], relevant: Relevant, k: int) -> float:
    """Share of the relevant documents found in the top k."""
    top = _top(ranked, k)
    grades = _grades(relevant)
    if not grades:
        return 0.0
    return sum(1 for doc_id in top if doc_id in grades) / len(grades)


def precision_at_k(ranked: Sequence[str], relevant: Relevant, k: int) -> float:
    """Relevant documents in the top k, divided by k."""
    top = _top(ranked, k)
    grades = _grades(relevant)
    if not grades:
        return 0.0
    return sum(1 for doc_id in top if doc_id in grades) / k


def dcg(gains: Iterable[float]) -> float:
    """Sum of gain / log2(rank + 1), ranks from 1."""
    return sum(gain / math.log2(rank + 1) for rank, gain in enumerate(gains, start=1))


def ndcg_at_k(ranked: Sequence[str], relevant: Relevant, k: int) -> float:
    """Graded nDCG@k: DCG of the top k over the DCG of the ideal top k from the qrels."""
    top = _top(ranked, k)
    grades = _grades(relevant)
    if not grades:
        return 0.0
    ideal = dcg(sorted(grades.values(), reverse=True)[:k])
    return dcg(grades.get(doc_id, 0.0) for doc_id in top) / ideal


def mrr_at_k(ranked: Sequence[str], relevant: Relevant, k: int) -> float:
    """Reciprocal rank of the first relevant document in the top k, else 0."""
    top = _top(ranked, k)
    grades = _grades(relevant)
    for rank, doc_id in enumerate(top, start=1):
        if doc_id in grades:
            return 1.0 / rank
    return 0.0


def aggregate(per_query: list[dict]) -> dict[str, float]:
    """Mean of every numeric key over the queries (non-numeric values such as a
    query id are ignored).  Empty input gives ``{}``; a numeric key missing from
    some queries raises ValueError rather than averaging over a subset."""
    if not per_query:
        return {}
    keys: list[str] = []
    for row in per_query:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in keys:
                keys.append(key)
    means: dict[str, float] = {}
    for key in keys:
        values = []
        for index, row in enumerate(per_query):
            value = row.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"query #{index} has no numeric {key!r}")
            values.append(float(value))
        means[key] = math.fsum(values) / len(values)
    return means


def dedupe_ranking(chunk_doc_ids: Iterable[str]) -> list[str]:
    """Ranked chunks' doc ids -> ranked unique doc ids.

    The first occurrence wins, so a document ranks where its best chunk ranks
    (max-score aggregation over its chunks).
    """
    seen: set[str] = set()
    ranking: list[str] = []
    for doc_id in chunk_doc_ids:
        if doc_id not in seen:
            seen.add(doc_id)
            ranking.append(doc_id)
    return ranking


def paired_gain(best: np.ndarray, base: np.ndarray, min_gain: float = 0.005, z: float = 2.0) -> dict[str, Any]:
    """Is ``best`` clearly better than ``base`` (per-query scores of the same queries, paired)?

    Clear = the mean paired gain exceeds both ``min_gain`` (a change smaller than that is not worth
    making) and ``z`` standard errors of that mean (it is not the luck of which queries were drawn).
    Returns gain, standard_error, required and adopted; self-tuning (``keep_decision``) and the query
    adapter's held-out check (``learning.adapter_training.train_query_adapter``) both decide by it.
    """
    diff = np.asarray(best, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    gain = float(diff.mean()) if len(diff) else 0.0
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
    required = max(min_gain, z * se)
    return {"gain": round(gain, 4), "standard_error": round(se, 4), "required": round(required, 4),
            "adopted": bool(gain > required), "changed": bool(diff.any())}
