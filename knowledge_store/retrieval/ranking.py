"""The ranking of one query as a pipeline: the evidence is fused into a candidate pool, then each step re-orders it.

``RankingPipeline`` is the one ranking the engine serves with, self-tuning sweeps, the query adapter's
cross-validated check scores and the experiments measure.  A step is an object with its own configuration and
one method, ``apply(pool, context) -> pool``: it sees the fused pool (``Fused``, best first) and the query's
``RankingContext`` and returns the pool re-ordered (never grown: a step only re-scores candidates the fusion
proposed).  ``RANKING_STEPS`` lists the steps in the order they run; a new ranking idea is a new entry with its
own settings, not a keyword on a shared function.

Which steps a caller ranks with, and why they differ:

- the engine: every step its settings turn on (``RankingPipeline.served``);
- self-tuning and the adapter check leave out ``entity_boost``: their queries are headings, titles and rated
  questions, which name no entity (docs/ARCHITECTURE.md, "Entities");
- the plain self-tuning grid (``score_grid`` without ``served_by``) also leaves out ``sentences`` and
  ``feedback``: both re-score a pseudo-query's target with its stored vectors, which hold the heading the query
  was made from, and would undo the stripping tuning depends on (``tuning.strip_query_from_targets``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from knowledge_store.config.settings import RankingSettings
from knowledge_store.retrieval.evidence import (
    EntityBoost,
    QueryEvidence,
    apply_entity_boost,
    first_document_rows,
    moved_query_vector,
    pool_vector_evidence,
)
from knowledge_store.retrieval.fusion import FUSION_REGISTRY, Fused, NoiseScales, fuse_scores, top_rows
from knowledge_store.retrieval.phrase import PhraseQuery, is_phrase_query, order_by_share, phrase_texts
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot, QueryTerms
from knowledge_store.retrieval.terms import mixes_letters_and_digits
from knowledge_store.storage.tuned import RankingParams


def reference_rows(count: int, size: int) -> np.ndarray:
    """``size`` rows evenly spaced over ``count`` (all of them when there are fewer): the same sample for every query."""
    if count <= size:
        return np.arange(count)
    return np.linspace(0, count - 1, size).astype(np.int64)


@dataclass(frozen=True)
class NoiseCalibration:
    """Each method's noise scale for one query (``fusion.NoiseScales``), what ``calibrated`` fusion floors each
    method's score range with:

    - vector: ``vector_sds`` standard deviations of the query's cosine over ``reference_rows`` chunks evenly spaced
      over the snapshot (how far apart unrelated chunks already are for this query), never below ``vector_floor``
      (a store of a few chunks has no spread to measure);
    - BM25: ``bm25_idf_share`` of the mean idf of the query's known terms (one occurrence of a typical query term
      in a chunk of average length adds about its idf), so a difference of less than a term match is not stretched.

    Measured only for fusion modes that read it (``FusionMode.uses_noise``), once per query."""

    vector_sds: float
    vector_floor: float
    bm25_idf_share: float
    reference_rows: int
    name: str = "calibration"

    @classmethod
    def from_settings(cls, settings: RankingSettings) -> NoiseCalibration:
        return cls(float(settings.calibrated_vector_sds), float(settings.calibrated_vector_floor),
                   float(settings.calibrated_bm25_idf_share), int(settings.calibrated_reference_rows))

    def scales(self, evidence: QueryEvidence, snapshot: LoadedSnapshot | None,
               query_vector: np.ndarray | None) -> NoiseScales:
        cosines = None
        if evidence.partial is None and len(evidence.vector_chunk):
            cosines = evidence.vector_chunk[reference_rows(len(evidence.vector_chunk), self.reference_rows)]
        elif snapshot is not None and query_vector is not None and len(snapshot.embeddings):
            rows = reference_rows(len(snapshot.embeddings), self.reference_rows)
            cosines = snapshot.embeddings[rows] @ np.asarray(query_vector, dtype=np.float32)
        spread = float(np.std(cosines)) if cosines is not None and len(cosines) > 1 else 0.0
        idf = evidence.terms.idf if evidence.terms is not None else np.zeros(0)
        return NoiseScales(vector=max(self.vector_sds * spread, self.vector_floor),
                           bm25=self.bm25_idf_share * float(idf.mean()) if len(idf) else 0.0)


DEFAULT_CALIBRATION = NoiseCalibration.from_settings(RankingSettings())


@dataclass
class RankingContext:
    """One query as the ranking sees it: its evidence, the ranking parameters, and what steps leave for later steps.

    ``replaced``: rows scored with another vector than the stored one (self-tuning's stripped targets, see
    ``QueryEvidence.replaced``).  ``sentence_memo`` and ``phrase_cache`` are per-query caches a caller that ranks
    one query under many parameter sets shares between them (``for_params`` keeps them)."""

    query: str
    evidence: QueryEvidence
    params: RankingParams
    snapshot: LoadedSnapshot | None = None
    query_vector: np.ndarray | None = None
    mask: np.ndarray | None = None
    pool: int = 100
    rrf_k: int = 60
    calibration: NoiseCalibration = DEFAULT_CALIBRATION
    sentence_memo: dict | None = field(default=None, repr=False)
    sentence_blocks: dict = field(default_factory=dict, repr=False)  # gathered sentence vectors per pool (evidence)
    phrase_cache: dict[int, float] | None = field(default=None, repr=False)
    # written by steps: the sentence weight the pool's semantic evidence uses from then on, the entity boost applied
    sentence_weight: float = 0.0
    entity_boost: EntityBoost | None = None
    # each method's noise scale for this query (measured at the first fusion that reads it; the same under any params)
    noise_scales: NoiseScales | None = field(default=None, repr=False)

    def noise(self) -> NoiseScales | None:
        """The query's noise scales when its fusion mode reads them (``FusionMode.uses_noise``), else None."""
        if not FUSION_REGISTRY[self.params.fusion].uses_noise:
            return None
        if self.noise_scales is None:
            self.noise_scales = self.calibration.scales(self.evidence, self.snapshot, self.query_vector)
        return self.noise_scales

    def for_params(self, params: RankingParams) -> RankingContext:
        """The same query under other parameters, sharing its caches; steps' outputs start afresh."""
        return replace(self, params=params, sentence_weight=0.0, entity_boost=None)

    def pool_semantic(self, rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
        """The semantic evidence of pool ``rows`` for ``vector`` as the steps so far define it."""
        return pool_vector_evidence(self.snapshot, rows, vector, self.params.lead_weight, self.sentence_weight,
                                    self.evidence.replaced, self.sentence_memo, self.sentence_blocks)

    def refuse(self, fused: Fused, vector: np.ndarray) -> Fused:
        """``fused``'s candidates fused again with new semantic evidence ``vector`` (in ``fused.rows``' order)."""
        again = fuse_scores(fused.bm25, vector, None, self.params.alpha, self.pool, self.params.fusion, self.rrf_k,
                            noise=self.noise())
        return Fused(rows=fused.rows[again.rows], fused=again.fused, bm25=again.bm25, vector=again.vector,
                     bm25_rank=again.bm25_rank, vector_rank=again.vector_rank)


class RankingStep(Protocol):
    name: str

    def apply(self, pool: Fused, context: RankingContext) -> Fused: ...


def fuse_evidence(context: RankingContext) -> Fused:
    """The candidate pool: BM25 and vector evidence blended by the parameters and fused (``fusion.py``).

    With approximate vectors (``ann.py``) only the rows the index scored have cosines, so the BM25 pool's
    rows are scored exactly first."""
    evidence, params = context.evidence, context.params
    bm25 = evidence.bm25(params.section_weight)
    bm25_top = vector_candidates = None
    if evidence.partial is not None:
        bm25_top = top_rows(bm25, context.mask, context.pool, positive_only=True)
        evidence.partial.score(bm25_top)
        evidence.partial.complete(context.pool, params.lead_weight)
        vector_candidates = evidence.partial.scored_rows
    vector = evidence.vector(params.lead_weight) if evidence.partial is None else evidence.partial.blended(params.lead_weight)
    return fuse_scores(bm25, vector, context.mask, params.alpha, context.pool, params.fusion, context.rrf_k,
                       vector_candidates=vector_candidates, bm25_top=bm25_top, noise=context.noise())


@dataclass(frozen=True)
class SentenceEvidenceStep:
    """Each candidate's vector evidence becomes ``(1 - weight) * chunk cosine + weight * best sentence cosine``
    (and the same for its section's lead, ``sentences.py``) and the pool is fused again; later steps that score
    vectors score them this way too.  Needs sentence vectors in the snapshot; does nothing without them."""

    weight: float
    name: str = "sentences"

    @classmethod
    def from_settings(cls, settings: RankingSettings) -> SentenceEvidenceStep | None:
        return cls(float(settings.sentence_weight)) if settings.sentence_weight > 0.0 else None

    def apply(self, pool: Fused, context: RankingContext) -> Fused:
        if context.snapshot is None or context.query_vector is None or context.snapshot.sentence_index is None:
            return pool
        context.sentence_weight = self.weight
        if len(pool.rows) < 2 or context.params.alpha <= 0.0:
            return pool
        return context.refuse(pool, context.pool_semantic(pool.rows, context.query_vector))


@dataclass(frozen=True)
class VectorFeedbackStep:
    """Pseudo-relevance feedback (Rocchio over the pool): the query vector moves towards the best chunk of each
    of the first ``docs`` documents (``q + beta * centroid``, renormalised), the pool is scored again with the
    moved vector and fused again.  Only the pool is re-scored (a few hundred dot products), never the corpus."""

    docs: int
    beta: float
    name: str = "feedback"

    @classmethod
    def from_settings(cls, settings: RankingSettings) -> VectorFeedbackStep | None:
        if settings.feedback_docs <= 0 or settings.feedback_beta <= 0.0:
            return None
        return cls(int(settings.feedback_docs), float(settings.feedback_beta))

    def apply(self, pool: Fused, context: RankingContext) -> Fused:
        if context.snapshot is None or context.query_vector is None:
            return pool
        if len(pool.rows) < 2 or context.params.alpha <= 0.0:
            return pool
        top = first_document_rows(context.snapshot, pool.rows, self.docs)
        moved = moved_query_vector(context.snapshot, np.asarray(context.query_vector, dtype=np.float32), top, self.beta,
                                   context.evidence.replaced)
        return context.refuse(pool, context.pool_semantic(pool.rows, moved))


@dataclass(frozen=True)
class EntityBoostStep:
    """A query naming entities the corpus mentions (SOP-42, ASSET-104, API 510): candidates mentioning them gain
    ``weight * spread * share`` (``evidence.apply_entity_boost``).  The boost is left in ``context.entity_boost``
    (the engine lifts such passages' relevance to the floor)."""

    weight: float
    name: str = "entity_boost"

    @classmethod
    def from_settings(cls, settings: RankingSettings) -> EntityBoostStep | None:
        return cls(float(settings.entity_boost)) if settings.entity_boost > 0.0 else None

    def apply(self, pool: Fused, context: RankingContext) -> Fused:
        if context.snapshot is None:
            return pool
        rows = context.snapshot.query_entity_rows(context.query)
        if not rows:
            return pool
        context.entity_boost = EntityBoost(tuple(rows), self.weight)
        return apply_entity_boost(pool, context.entity_boost)


def identifier_terms(terms: QueryTerms) -> list[int]:
    """The term ids of the query's known terms that are identifiers: letters and digits together
    (``terms.mixes_letters_and_digits``: E47, ext4, x86_64, sha256)."""
    return [int(t) for t, word in zip(terms.termids.tolist(), terms.known) if mixes_letters_and_digits(word)]


@dataclass(frozen=True)
class IdentifierBoostStep:
    """A query naming an identifier the corpus holds (an error code E47, a file system ext4, a digest sha256):
    candidates whose chunk holds it gain ``weight * spread * share`` like named entities
    (``evidence.apply_entity_boost``; ``share``: the fraction of the query's identifiers the chunk holds).

    Why: the vector side cannot tell E47 from E42 - both are a letter and two digits to the model, and the
    section about E42 is the closer paraphrase of "what does E47 mean" - so at a question's alpha a passage about
    the wrong code outranks the only one naming the asked one.  No pattern list: any known term mixing letters and
    digits, so each corpus's own codes count."""

    weight: float
    name: str = "identifiers"

    @classmethod
    def from_settings(cls, settings: RankingSettings) -> IdentifierBoostStep | None:
        return cls(float(settings.identifier_boost)) if settings.identifier_boost > 0.0 else None

    def apply(self, pool: Fused, context: RankingContext) -> Fused:
        if context.snapshot is None or not len(pool.rows) or not 0.0 < context.params.alpha < 1.0:
            return pool  # BM25 alone already weighs the identifier; vectors alone are asked not to read words
        termids = identifier_terms(context.evidence.terms)
        if not termids:
            return pool
        return apply_entity_boost(pool, EntityBoost(tuple(context.snapshot.term_rows(t) for t in termids), self.weight))


PHRASE_BM25_CANDIDATES = 20  # chunk-BM25 rows read for phrase evidence (20 and 40: 195/200 known items; the whole fused pool: 196)


@dataclass(frozen=True)
class PhraseOrderStep:
    """A pasted passage (``phrase.is_phrase_query``): candidates holding most of its word pairs in order go first
    (``phrase.py``).  The span read across the border into the next chunk counts; holding it alone breaks ties.

    Only the best chunk-BM25 candidates (and the chunk before each: the span may start there) are read: a chunk
    holding the pasted span has all its words, so it is among them; that bounds the work per query."""

    bm25_candidates: int = PHRASE_BM25_CANDIDATES
    name: str = "phrase"

    @classmethod
    def from_settings(cls, settings: RankingSettings) -> PhraseOrderStep | None:
        return cls() if settings.phrase_boost else None

    def apply(self, pool: Fused, context: RankingContext) -> Fused:
        snapshot = context.snapshot
        if snapshot is None or not len(pool.rows) or not is_phrase_query(context.query):
            return pool
        cache = {} if context.phrase_cache is None else context.phrase_cache
        chunk_bm25 = context.evidence.bm25_chunk[pool.rows]
        best = np.argsort(-chunk_bm25, kind="stable")[: self.bm25_candidates]
        lexical_top = pool.rows[best[chunk_bm25[best] > 0]]
        allowed = set(lexical_top.tolist()) | set((lexical_top - 1).tolist())
        for row in pool.rows.tolist():
            if row not in allowed:
                cache.setdefault(int(row), 0.0)
        missing = [int(r) for r in pool.rows if int(r) not in cache]
        if missing:
            phrase = PhraseQuery(context.query)
            for row, (own, pair) in zip(missing, phrase_texts(snapshot, missing)):
                cache[row] = phrase.border_score(own, pair)
        order = order_by_share(np.array([cache[int(r)] for r in pool.rows]))
        return Fused(rows=pool.rows[order], fused=pool.fused[order], bm25=pool.bm25[order], vector=pool.vector[order],
                     bm25_rank=pool.bm25_rank[order], vector_rank=pool.vector_rank[order],
                     boost=pool.boost[order] if pool.boost is not None else None)


# every step, in the order it runs (name -> the step's type); each reads its own settings
RANKING_STEPS: Mapping[str, type] = {
    "sentences": SentenceEvidenceStep,
    "feedback": VectorFeedbackStep,
    "entity_boost": EntityBoostStep,
    "identifiers": IdentifierBoostStep,
    "phrase": PhraseOrderStep,
}
# the steps self-tuning and the adapter check rank with (see the module docstring); "plain": without served_by
TUNING_STEPS = ("sentences", "feedback", "phrase")
PLAIN_TUNING_STEPS = ("phrase",)


class UnknownRankingStep(ValueError):
    def __init__(self, name: str):
        super().__init__(f"ranking step {name!r}: one of {', '.join(RANKING_STEPS)}")
        self.name = name


@dataclass(frozen=True)
class RankingPipeline:
    """Fusion (its noise scales measured by ``calibration`` when the mode reads them), then each step in turn
    (``RANKING_STEPS`` order)."""

    steps: tuple[RankingStep, ...] = ()
    pool: int = 100
    rrf_k: int = 60
    calibration: NoiseCalibration = DEFAULT_CALIBRATION  # the noise scales of ``calibrated`` fusion

    @classmethod
    def served(cls, settings: RankingSettings, only: tuple[str, ...] | None = None) -> RankingPipeline:
        """The steps ``settings`` turn on, in order; ``only`` keeps just those named (the rest are left out)."""
        for name in only or ():
            if name not in RANKING_STEPS:
                raise UnknownRankingStep(name)
        steps = []
        for name, kind in RANKING_STEPS.items():
            if only is not None and name not in only:
                continue
            step = kind.from_settings(settings)
            if step is not None:
                steps.append(step)
        return cls(tuple(steps), pool=settings.candidate_pool, rrf_k=settings.rrf_k,
                   calibration=NoiseCalibration.from_settings(settings))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    def context(self, query: str, evidence: QueryEvidence, params: RankingParams, snapshot: LoadedSnapshot | None = None,
                query_vector: np.ndarray | None = None, mask: np.ndarray | None = None,
                shared_caches: bool = False) -> RankingContext:
        """A query's context under this pipeline's pool and RRF constant.  ``shared_caches``: the query will be
        ranked under many parameter sets (``RankingContext.for_params``): best-sentence cosines and phrase
        scores are kept across them."""
        vector = None if query_vector is None else np.asarray(query_vector, dtype=np.float32)
        return RankingContext(query=query, evidence=evidence, params=params, snapshot=snapshot, query_vector=vector,
                              mask=mask, pool=self.pool, rrf_k=self.rrf_k, calibration=self.calibration,
                              sentence_memo={} if shared_caches else None, phrase_cache={} if shared_caches else None)

    def rank(self, context: RankingContext) -> Fused:
        """The candidate pool for ``context``, best first."""
        pool = fuse_evidence(context)
        for step in self.steps:
            pool = step.apply(pool, context)
        return pool

