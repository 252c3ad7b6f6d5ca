"""Score fusion for hybrid retrieval, as plain functions over NumPy arrays.

Four methods, registered in ``FUSION_REGISTRY`` (name -> ``FusionMode``: what it does and the function
that does it; ``fuse_scores`` dispatches on it).  ``FUSION_MODES`` is the live name -> description view
that settings, CLI, API, MCP, the console, the tuning grid and the evaluations read, so a mode added
to the registry is accepted and offered everywhere:
- ``weighted``: min-max normalise each method's scores over the candidate pool,
  then ``alpha * vector + (1 - alpha) * bm25`` (alpha 0 = pure BM25, 1 = pure vector).
  Every candidate has *both* raw scores (both are computed for all rows), so a
  chunk found by only one method is not arbitrarily zeroed in the other.
- ``rrf``: reciprocal-rank fusion, ``sum 1 / (rrf_k + rank)`` over the two ranked
  lists (a method that did not rank a chunk in its top pool contributes nothing).
  ``alpha`` weights the two lists here too (0.5 = classic unweighted RRF * 0.5).
- ``dbsf``: distribution-based score fusion: each method's scores are scaled by
  the mean and standard deviation of *its own* top pool (``(x - (mu - 3 sigma)) /
  6 sigma``), so one outlier or a pool padded with the other method's weak
  candidates does not squash the rest, as min-max over the union can.
- ``calibrated``: ``weighted`` with each method's scale floored by its noise scale
  (``NoiseScales``: ``ranking.NoiseCalibration`` measures it per query): a method's
  scores are ``(x - pool min) / max(pool range, noise)``.  Min-max alone turns any
  difference into 0 vs 1, so on a small or boilerplate-heavy pool a cosine difference
  below what the model can tell apart outweighs a document matching the query's rare
  words; with the floor it counts for its size in noise units.  On a large pool, where
  each method's range exceeds its noise, it ranks as ``weighted`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from knowledge_store.config.settings import register_vocabulary
from knowledge_store.core.vocabulary import Vocabulary


@dataclass
class Fused:
    rows: np.ndarray  # candidate rows, best first
    fused: np.ndarray  # fused score per candidate (same order)
    bm25: np.ndarray  # raw BM25 per candidate
    vector: np.ndarray  # raw cosine per candidate
    bm25_rank: np.ndarray  # 1-based rank in the BM25 list, 0 = not in its pool
    vector_rank: np.ndarray  # 1-based rank in the vector list, 0 = not in its pool
    boost: np.ndarray | None = None  # what the query's entities added to ``fused`` (evidence.apply_entity_boost)


@dataclass(frozen=True)
class NoiseScales:
    """Per method, the score difference below which two candidates are not told apart (0 = none known):
    ``calibrated`` fusion never stretches a smaller range than this to the full 0-1 scale."""

    vector: float = 0.0  # in cosine units
    bm25: float = 0.0  # in BM25 score units


@dataclass(frozen=True)
class FusionInputs:
    """What a fusion function sees of one query's candidate pool (every array in the pool's row order)."""

    alpha: float  # weight of the vector method, 0-1
    bm25: np.ndarray  # raw BM25 per candidate
    vector: np.ndarray  # raw cosine per candidate
    bm25_pool: np.ndarray  # raw BM25 of the BM25 method's own top pool
    vector_pool: np.ndarray  # raw cosine of the vector method's own top pool
    bm25_rank: np.ndarray  # 1-based rank in the BM25 pool, 0 = not in it
    vector_rank: np.ndarray  # 1-based rank in the vector pool, 0 = not in it
    rrf_k: int  # reciprocal-rank-fusion constant
    noise: NoiseScales = NoiseScales()  # each method's noise scale (what ``calibrated`` floors its range with)


@dataclass(frozen=True)
class FusionMode:
    """One way of combining the BM25 and vector scores of a candidate pool into one score per candidate."""

    name: str  # what settings, CLI, API, MCP and the console accept
    description: str  # what it does, in one line (help texts, schema, console)
    fuse: Callable[[FusionInputs], np.ndarray]
    # the alpha at which this mode is the published method (rrf: 0.5 = unweighted RRF, halved); None = any alpha.
    # evals/experiments/quality_report.py measures each mode at it, or at the corpus default alpha when None
    textbook_alpha: float | None = None
    # it reads ``FusionInputs.noise``: the ranking measures each method's noise scale for it (a few hundred dot
    # products per query) only then
    uses_noise: bool = False


def _weighted(x: FusionInputs) -> np.ndarray:
    return x.alpha * minmax(x.vector) + (1.0 - x.alpha) * minmax(x.bm25)


def _dbsf(x: FusionInputs) -> np.ndarray:
    return x.alpha * distribution_scaled(x.vector, x.vector_pool) + (1.0 - x.alpha) * distribution_scaled(x.bm25, x.bm25_pool)


def _calibrated(x: FusionInputs) -> np.ndarray:
    return x.alpha * noise_floored(x.vector, x.noise.vector) + (1.0 - x.alpha) * noise_floored(x.bm25, x.noise.bm25)


def _rrf(x: FusionInputs) -> np.ndarray:
    return ((1.0 - x.alpha) * np.where(x.bm25_rank > 0, 1.0 / (x.rrf_k + x.bm25_rank), 0.0)
            + x.alpha * np.where(x.vector_rank > 0, 1.0 / (x.rrf_k + x.vector_rank), 0.0))


# the one place a fusion mode is named (in the order clients list them)
FUSION_REGISTRY: dict[str, FusionMode] = {mode.name: mode for mode in (
    FusionMode("weighted", "min-max normalised scores, alpha * vector + (1 - alpha) * BM25", _weighted),
    FusionMode("dbsf", "distribution-based: each method scaled by mean +- 3 sd of its own top pool, then weighted by alpha",
               _dbsf),
    FusionMode("rrf", "reciprocal-rank fusion, alpha-weighted sum of 1 / (rrf_k + rank)", _rrf, textbook_alpha=0.5),
    FusionMode("calibrated", "weighted, but a method's score range is never stretched beyond its noise scale (query "
               "cosine spread over the corpus; a share of the query terms' idf), so differences below noise stay small "
               "on small pools", _calibrated, uses_noise=True),
)}
FUSION_MODES = Vocabulary("fusion", FUSION_REGISTRY)
register_vocabulary("default_fusion", FUSION_MODES)


def top_rows(scores: np.ndarray, mask: np.ndarray | None, n: int, positive_only: bool = False,
             candidates: np.ndarray | None = None) -> np.ndarray:
    """Indices of the ``n`` best scores among rows allowed by ``mask``, best first.

    ``candidates`` (row numbers) limits the search to those rows: the rows an approximate
    vector search scored (``ann.py``); no other row can be among the best.
    """
    if candidates is not None:
        keep = np.ones(len(candidates), dtype=bool) if mask is None else mask[candidates]
        if positive_only:
            keep &= scores[candidates] > 0
        candidates = candidates[keep]
    elif mask is not None:
        candidates = np.flatnonzero(mask & (scores > 0)) if positive_only else np.flatnonzero(mask)
    else:
        candidates = np.flatnonzero(scores > 0) if positive_only else np.arange(len(scores))
    if len(candidates) == 0:
        return candidates
    values = scores[candidates]
    if len(candidates) > n:
        part = np.argpartition(-values, n - 1)[:n]
        candidates, values = candidates[part], values[part]
    order = np.lexsort((candidates, -values))  # score desc, then row asc for stable ties
    return candidates[order]


def minmax(values: np.ndarray) -> np.ndarray:
    """Scale to [0, 1]; a constant vector maps to 1 where positive (all equally good), else 0."""
    if len(values) == 0:
        return values.astype(np.float64)
    lo, hi = float(values.min()), float(values.max())
    if hi - lo < 1e-12:
        return np.where(values > 0, 1.0, 0.0)
    return (values - lo) / (hi - lo)


def noise_floored(values: np.ndarray, noise: float) -> np.ndarray:
    """``(values - min) / max(max - min, noise)``: min-max when the range exceeds ``noise``; a smaller range keeps
    its size in noise units (at most 1) instead of being stretched to 0 vs 1.  ``noise`` 0 = ``minmax``."""
    if len(values) == 0 or noise <= 0.0:
        return minmax(values)
    lo, hi = float(values.min()), float(values.max())
    return (values - lo) / max(hi - lo, noise)


def distribution_scaled(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Scale ``values`` so ``mean - 3 sd`` of ``reference`` maps to 0 and ``mean + 3 sd`` to 1 (clipped at 0)."""
    if len(reference) == 0:
        return np.zeros(len(values), dtype=np.float64)
    reference = reference.astype(np.float64)
    mu, sd = float(reference.mean()), float(reference.std())
    if sd < 1e-12:
        return np.where(values >= mu, 1.0, 0.0) if mu > 0 else np.zeros(len(values))
    return np.clip((values - (mu - 3.0 * sd)) / (6.0 * sd), 0.0, None)


def fuse_scores(
    bm25_scores: np.ndarray,
    vector_scores: np.ndarray,
    mask: np.ndarray | None,
    alpha: float,
    pool: int,
    method: str = "weighted",
    rrf_k: int = 60,
    vector_candidates: np.ndarray | None = None,
    bm25_top: np.ndarray | None = None,
    noise: NoiseScales | None = None,
) -> Fused:
    """Fuse full-corpus BM25 and vector score arrays into one ranked candidate list.

    ``vector_candidates``: the only rows whose vector scores are known (approximate search);
    ``bm25_top``: the BM25 pool when the caller has already picked it (the same rows);
    ``noise``: each method's noise scale, for the modes that read it (``FusionMode.uses_noise``).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha!r}: must be between 0 and 1")
    if method not in FUSION_MODES:
        raise ValueError(f"fusion={method!r}: {FUSION_MODES.one_of()}")
    if alpha >= 1.0:
        bm25_top = np.zeros(0, dtype=np.int64)
    elif bm25_top is None:
        bm25_top = top_rows(bm25_scores, mask, pool, positive_only=True)
    vector_top = top_rows(vector_scores, mask, pool, candidates=vector_candidates) if alpha > 0.0 else np.zeros(0, dtype=np.int64)
    rows = np.unique(np.concatenate([bm25_top, vector_top])).astype(np.int64)
    br, vr = ranks_in(rows, bm25_top), ranks_in(rows, vector_top)
    b = bm25_scores[rows].astype(np.float64)
    v = vector_scores[rows].astype(np.float64)
    fused = FUSION_REGISTRY[method].fuse(FusionInputs(
        alpha=alpha, bm25=b, vector=v, bm25_pool=bm25_scores[bm25_top], vector_pool=vector_scores[vector_top],
        bm25_rank=br, vector_rank=vr, rrf_k=rrf_k, noise=noise or NoiseScales()))
    order = np.lexsort((rows, -fused))
    rows = rows[order]
    return Fused(
        rows=rows,
        fused=fused[order],
        bm25=b[order],
        vector=v[order],
        bm25_rank=br[order],
        vector_rank=vr[order],
    )


def ranks_in(rows: np.ndarray, top: np.ndarray) -> np.ndarray:
    """1-based rank of each of ``rows`` in the list ``top`` (0 = not in it), without a corpus-length array."""
    ranks = np.zeros(len(rows), dtype=np.int64)
    if len(top) and len(rows):
        order = np.argsort(top, kind="stable")
        ordered = top[order]
        pos = np.minimum(np.searchsorted(ordered, rows), len(top) - 1)
        found = ordered[pos] == rows
        ranks[found] = order[pos[found]] + 1
    return ranks


def relevance(cosine: np.ndarray, coverage: np.ndarray, cos_floor: float = 0.2, cos_ceiling: float = 0.7) -> np.ndarray:
    """Absolute 0-1 relevance of a passage to a query, comparable across queries.

    Fused scores are relative to one query's candidates, so they cannot say
    "nothing here is relevant".  This can: the mean of
    - semantic match: cosine rescaled so ``cos_floor`` (unrelated text for
      MiniLM) maps to 0 and ``cos_ceiling`` (a paraphrase) to 1, and
    - lexical coverage: the idf-weighted share of the query's informative
      terms that the passage contains (terms the corpus has never seen count
      as missing, so questions about absent topics score low).

    The mean (not a soft OR) on purpose: in a single-topic corpus every passage
    is semantically close to every question (MiniLM cosine 0.6 between a
    thermostat question and an unrelated thermostat parameter), so semantic
    similarity alone must not reach the 0.7 floor of the support tool; an
    answering passage also shares the question's rare words.  Measured on the
    sample corpus: answering passages 0.71-1.00, same-topic non-answers
    0.46-0.68, off-topic questions <= 0.25 (tests/integration/test_retrieval.py).
    """
    semantic = np.clip((cosine - cos_floor) / (cos_ceiling - cos_floor), 0.0, 1.0)
    return 0.5 * semantic + 0.5 * np.clip(coverage, 0.0, 1.0)
