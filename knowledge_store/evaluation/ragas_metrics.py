"""Retrieval recall scored by RAGAS, as a cross-check of our own ``recall_at_k``.

RAGAS 0.4.3 defines **ID-based context recall** (``IDBasedContextRecall``,
``ragas/metrics/_context_recall.py``) on a ``SingleTurnSample`` with
``retrieved_context_ids`` and ``reference_context_ids`` as::

    |set(reference ids) ∩ set(retrieved ids)| / |set(reference ids)|

i.e. the fraction of the (distinct) reference ids that are present anywhere
in the retrieved ids; ids are compared as strings, order and rank are ignored,
and RAGAS returns NaN (with a warning) when there are no reference ids.  No
LLM, no embeddings and no network are involved.

Relation to ``knowledge_store.evaluation.metrics.recall_at_k(ranked, relevant, k)``: ours counts
the relevant ids among ``ranked[:k]`` and divides by the number of distinct
relevant ids, so the two are **identical when the ids given to RAGAS are the
deduplicated top-k** — which is exactly what this module passes:
``dedupe_ranking(retrieved_ids)[:k]`` (a document ranks where its best chunk
ranks).  Two conventions are aligned with ours on top of RAGAS:

- duplicates in ``retrieved_ids`` are removed *before* the cut, so a repeated
  id never takes a top-k slot (``recall_at_k`` would instead raise on them);
- an empty reference set scores 0.0 (our convention: such a query should not be
  scored at all), not RAGAS's NaN.

The metric is imported from its defining module
(``ragas.metrics._context_recall``): ``from ragas.metrics import
IDBasedContextRecall`` works too but emits a DeprecationWarning pointing at
``ragas.metrics.collections``, which in 0.4.3 has no ID-based recall.  Importing
ragas takes a few seconds, so it happens lazily, once, on first use; importing
this module is cheap.  ``RAGAS_DO_NOT_TRACK`` is set to ``true`` (unless
already set) before ragas is imported, so no analytics are sent.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from knowledge_store.core.metrics import dedupe_ranking

__all__ = ["ragas_recall_at_k", "ragas_recall_batch"]


@lru_cache(maxsize=1)
def _ragas() -> tuple[Any, Any]:
    """(the shared IDBasedContextRecall metric object, SingleTurnSample), imported once."""
    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
    from ragas.dataset_schema import SingleTurnSample  # noqa: PLC0415 - RAGAS, ~2.5 s to import
    from ragas.metrics._context_recall import IDBasedContextRecall  # noqa: PLC0415 - RAGAS, ~2.5 s to import

    return IDBasedContextRecall(), SingleTurnSample


def _sample(retrieved_ids: Sequence[str], reference_ids: Sequence[str], k: int) -> Any:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    _, sample_cls = _ragas()
    top = dedupe_ranking(str(i) for i in retrieved_ids)[:k]
    return sample_cls(retrieved_context_ids=top, reference_context_ids=[str(i) for i in reference_ids])


def _clean(score: float) -> float:
    score = float(score)
    return 0.0 if math.isnan(score) else score


def ragas_recall_at_k(retrieved_ids: list[str], reference_ids: list[str], k: int = 5) -> float:
    """RAGAS ID-based context recall of the deduplicated top ``k`` of
    ``retrieved_ids`` against ``reference_ids`` (see the module docstring);
    0.0 when ``reference_ids`` is empty.  Scored with the metric's synchronous
    ``single_turn_score``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not reference_ids:
        return 0.0
    metric, _ = _ragas()
    return _clean(metric.single_turn_score(_sample(retrieved_ids, reference_ids, k)))


def ragas_recall_batch(samples: list[tuple[list[str], list[str]]], k: int = 5) -> list[float]:
    """``ragas_recall_at_k`` for many ``(retrieved_ids, reference_ids)`` pairs,
    in order.  One metric object; every sample is scored with its async
    ``single_turn_ascore``, all gathered in a single event loop (no
    ``ragas.evaluate``: it adds an executor, progress bars and a result
    dataset for no benefit on a metric this cheap)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not samples:
        return []
    metric, _ = _ragas()
    prepared = [(_sample(ret, ref, k) if ref else None) for ret, ref in samples]

    async def score_all() -> list[float]:
        async def one(sample: Any) -> float:
            return 0.0 if sample is None else _clean(await metric.single_turn_ascore(sample))

        return list(await asyncio.gather(*(one(s) for s in prepared)))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(score_all())
    # called from inside a running event loop (a notebook, an async server): use ragas's helper
    from ragas.async_utils import run  # noqa: PLC0415 - RAGAS, ~2.5 s to import

    return run(score_all)
