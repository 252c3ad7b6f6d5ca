"""The evidence one query has for every row of a snapshot, and the pieces the ranking steps re-score a pool with.

Four score arrays per query, all full-length (one value per row):

- ``bm25_chunk``   BM25 of the chunk itself;
- ``bm25_section`` BM25 of the chunk's section (its chunks under one heading, taken as one text);
- ``vector_chunk`` cosine of the chunk's vector;
- ``vector_lead``  cosine of the section's first chunk (the one that carries its opening).

``RankingParams`` says how to blend them: a row's lexical evidence is
``(1 - section_weight) * bm25_chunk + section_weight * bm25_section`` and its
semantic evidence ``(1 - lead_weight) * vector_chunk + lead_weight * vector_lead``;
the two are then fused with ``alpha`` by ``fusion`` (see ``fusion.py``); the steps of
``ranking.RankingPipeline`` then re-order the fused pool.

Why sections: with chunk-only evidence a long reference page gets one ticket
per chunk in the draw for the top ten while a short answer section gets one,
and a section's words split across chunk borders count for neither chunk.
docs/EVALUATION.md has the measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from knowledge_store.retrieval.ann import PartialVectors, approximate_semantic_evidence
from knowledge_store.retrieval.fusion import Fused
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot, QueryTerms


@dataclass(frozen=True)
class EntityBoost:
    """The entities a query names (each as the sorted rows mentioning it) and the boost weight."""

    rows: tuple[np.ndarray, ...]
    weight: float


def mention_share(boost: EntityBoost, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows``: the fraction of the query's entities its chunk mentions (0..1)."""
    rows = np.asarray(rows, dtype=np.int64)
    share = np.zeros(len(rows), dtype=np.float64)
    if not len(rows) or not boost.rows:
        return share
    for mentioning in boost.rows:
        if not len(mentioning):
            continue
        pos = np.minimum(np.searchsorted(mentioning, rows), len(mentioning) - 1)
        share += mentioning[pos] == rows
    return share / len(boost.rows)


def apply_entity_boost(fused: Fused, boost: EntityBoost) -> Fused:
    """Add ``weight * spread * share`` to each candidate's fused score and re-sort.

    ``share`` is the fraction of the query's entities the chunk mentions; ``spread``
    is max - min of the fused scores, so the boost means the same under weighted,
    dbsf and rrf scores (weight 1: a chunk naming every entity beats every chunk
    naming none).  Only candidates are boosted: a chunk neither BM25 nor the vectors
    proposed stays out (the entity's own words are in BM25's query, so they rarely do).
    """
    if not len(fused.rows):
        return fused
    share = mention_share(boost, fused.rows)
    spread = float(fused.fused.max() - fused.fused.min())
    if spread <= 0.0:
        spread = abs(float(fused.fused.max())) or 1.0
    amount = boost.weight * spread * share
    scores = fused.fused + amount
    added = amount if fused.boost is None else fused.boost + amount  # a boost applied before stays counted
    order = np.lexsort((fused.rows, -scores))
    return Fused(rows=fused.rows[order], fused=scores[order], bm25=fused.bm25[order], vector=fused.vector[order],
                 bm25_rank=fused.bm25_rank[order], vector_rank=fused.vector_rank[order], boost=added[order])


def first_document_rows(snapshot: LoadedSnapshot, rows: np.ndarray, k: int) -> np.ndarray:
    """The best-ranked row of each of the first ``k`` distinct documents of ``rows``."""
    docs = snapshot.doc_index[rows]
    _, first = np.unique(docs, return_index=True)
    return rows[np.sort(first)[:k]]


def chunk_vectors(snapshot: LoadedSnapshot, rows: np.ndarray, replaced: Mapping[int, np.ndarray] | None = None) -> np.ndarray:
    """The stored vectors of ``rows``; a row in ``replaced`` gets that vector instead (self-tuning scores a
    pseudo-query's targets as if their header did not hold the query: ``tuning.strip_query_from_targets``)."""
    vectors = snapshot.embeddings[rows]
    if replaced:
        for i, row in enumerate(np.asarray(rows).tolist()):
            if row in replaced:
                vectors[i] = replaced[row]  # fancy indexing copied: the snapshot is untouched
    return vectors


def moved_query_vector(snapshot: LoadedSnapshot, query_vector: np.ndarray, rows: np.ndarray, beta: float,
                       replaced: Mapping[int, np.ndarray] | None = None) -> np.ndarray:
    """Rocchio: the query vector plus ``beta`` times the centroid of ``rows``' vectors, renormalised."""
    moved = query_vector + beta * chunk_vectors(snapshot, rows, replaced).mean(axis=0)
    return (moved / np.linalg.norm(moved)).astype(np.float32)


def best_sentence_cosines(snapshot: LoadedSnapshot, rows: np.ndarray, query_vector: np.ndarray,
                          memo: dict | None = None, blocks: dict | None = None) -> np.ndarray:
    """Each row's best sentence cosine with ``query_vector`` (``SentenceIndex.best``), computed once per row and
    vector when ``memo`` (``ranking.RankingContext.sentence_memo``) is given; ``blocks``
    (``RankingContext.sentence_blocks``) keeps the gathered sentence vectors of each set of rows scored, for the
    query's next vector over the same rows."""
    index = snapshot.sentence_index

    def best(wanted: np.ndarray) -> np.ndarray:
        if blocks is None:
            return index.best(wanted, query_vector)
        order = np.argsort(wanted, kind="stable")  # a step that re-fused the pool asks for its rows in a new order
        ordered = wanted[order]
        key = ordered.tobytes()
        if key not in blocks:
            blocks[key] = index.gather(ordered)
        out = np.empty(len(wanted), dtype=np.float32)
        out[order] = index.best(ordered, query_vector, blocks[key])
        return out

    if memo is None:
        return best(np.asarray(rows, dtype=np.int64))
    key = query_vector.tobytes()
    known = memo.get(key)
    if known is None:
        known = memo[key] = np.full(len(index.start), np.nan, dtype=np.float32)
    out = known[rows]
    missing = np.isnan(out)
    if missing.any():
        fresh = best(np.asarray(rows[missing], dtype=np.int64))
        known[rows[missing]] = fresh
        out[missing] = fresh
    return out


def pool_vector_evidence(snapshot: LoadedSnapshot, rows: np.ndarray, query_vector: np.ndarray, lead_weight: float,
                         sentence_weight: float = 0.0, replaced: Mapping[int, np.ndarray] | None = None,
                         memo: dict | None = None, blocks: dict | None = None) -> np.ndarray:
    """The semantic evidence of ``rows`` for ``query_vector``: each chunk's cosine (blended with its best
    sentence's when ``sentence_weight`` and the snapshot has sentence vectors), blended with its section lead's.
    ``replaced``: rows scored with another vector than the stored one (``chunk_vectors``); ``memo`` and
    ``blocks``: see ``best_sentence_cosines``."""
    with_sentences = sentence_weight > 0.0 and snapshot.sentence_index is not None

    def cosine(r: np.ndarray) -> np.ndarray:
        own = chunk_vectors(snapshot, r, replaced) @ query_vector
        if not with_sentences:
            return own
        return (1.0 - sentence_weight) * own + sentence_weight * best_sentence_cosines(snapshot, r, query_vector, memo,
                                                                                       blocks)

    chunk = cosine(rows)
    if snapshot.sections is None:
        return chunk
    return blend(chunk, cosine(snapshot.sections.lead_row[snapshot.sections.group[rows]]), lead_weight)


@dataclass
class QueryEvidence:
    terms: QueryTerms
    bm25_chunk: np.ndarray
    bm25_section: np.ndarray
    coverage: np.ndarray  # idf mass of the query's terms present in each chunk
    vector_chunk: np.ndarray
    vector_lead: np.ndarray
    # approximate vector search (ann.py): only the rows it scored have cosines; the ranking (ranking.fuse_evidence) scores the BM25 pool too
    partial: PartialVectors | None = None
    # rows whose vector is not the stored one (self-tuning's stripped targets): the pool's second passes use these
    replaced: dict[int, np.ndarray] | None = None

    def bm25(self, section_weight: float) -> np.ndarray:
        return blend(self.bm25_chunk, self.bm25_section, section_weight)

    def vector(self, lead_weight: float) -> np.ndarray:
        return blend(self.vector_chunk, self.vector_lead, lead_weight)


def blend(own: np.ndarray, wider: np.ndarray, weight: float) -> np.ndarray:
    """``(1 - weight) * own + weight * wider``; the ends return an input as is (no arithmetic on the hot path)."""
    if weight <= 0.0:
        return own
    if weight >= 1.0:
        return wider
    return (1.0 - weight) * own + weight * wider


def lexical_evidence(snapshot: LoadedSnapshot, query: str) -> tuple[QueryTerms, np.ndarray, np.ndarray, np.ndarray]:
    """(terms, chunk BM25, section BM25, coverage) of ``query``; needs no query vector."""
    terms = snapshot.query_terms(query)
    chunk, coverage = snapshot.bm25_scores(terms)
    return terms, chunk, snapshot.section_bm25_scores(terms), coverage


def semantic_evidence(snapshot: LoadedSnapshot, query_vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(chunk cosine, section-lead cosine) for every row."""
    chunk = snapshot.vector_scores(query_vector)
    if snapshot.sections is None or not len(chunk):
        return chunk, chunk
    return chunk, chunk[snapshot.sections.lead_row][snapshot.sections.group]


def vector_evidence(snapshot: LoadedSnapshot, query_vector: np.ndarray, mask: np.ndarray | None,
                    pool: int) -> tuple[np.ndarray, np.ndarray, PartialVectors | None]:
    """What the engine uses: exact ``semantic_evidence`` unless the snapshot has an ANN index (large
    corpora, ``settings.ann_min_chunks``), then only the rows that can make the vector pool are scored."""
    ann = snapshot.ann
    if ann is None:
        return (*semantic_evidence(snapshot, query_vector), None)
    partial = approximate_semantic_evidence(snapshot, ann, query_vector, mask, pool, ann.config)
    return partial.chunk, partial.lead, partial


def gather_evidence(snapshot: LoadedSnapshot, query: str, query_vector: np.ndarray) -> QueryEvidence:
    terms, bm25_chunk, bm25_section, coverage = lexical_evidence(snapshot, query)
    vector_chunk, vector_lead = semantic_evidence(snapshot, query_vector)
    return QueryEvidence(terms, bm25_chunk, bm25_section, coverage, vector_chunk, vector_lead)
