"""The evidence one query has for every row of a snapshot, and how it becomes one ranking.

Four score arrays per query, all full-length (one value per row):

- ``bm25_chunk``   BM25 of the chunk itself;
- ``bm25_section`` BM25 of the chunk's section (its chunks under one heading, taken as one text);
- ``vector_chunk`` cosine of the chunk's vector;
- ``vector_lead``  cosine of the section's first chunk (the one that carries its opening).

``RankingParams`` says how to blend them: a row's lexical evidence is
``(1 - section_weight) * bm25_chunk + section_weight * bm25_section`` and its
semantic evidence ``(1 - lead_weight) * vector_chunk + lead_weight * vector_lead``;
the two are then fused with ``alpha`` by ``fusion`` (see ``fusion.py``).

Why sections: with chunk-only evidence a long reference page gets one ticket
per chunk in the draw for the top ten while a short answer section gets one,
and a section's words split across chunk borders count for neither chunk.
docs/EVALUATION.md has the measurements on SciFact and the documentation set.

The engine and the self-tuning sweep (``knowledge_store.learning.tuning``) both rank with
``rank_rows``, so what tuning measures is what the server does.  Two exceptions:
the engine passes an ``EntityBoost`` when the query names an entity (SOP-42,
ASSET-104, API 510); the sweeps do not (their queries are headings, titles and
dev-set questions, which name none: docs/ARCHITECTURE.md, "Entities").  And the
engine passes ``VectorFeedback`` (pseudo-relevance feedback, on by default); the
sweeps do not: it would re-score a pseudo-query's target with its stored vector,
which holds the heading the query was made from, and undo the stripping tuning
depends on.  Its effect is measured on its own (``research/prf_experiment.py``).  Likewise
``SentenceEvidence`` (each chunk's best sentence, ``sentences.py``): a target's stored sentences hold
the heading its pseudo-query was made from (``research/sentence_evidence_experiment.py`` measures it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from knowledge_store.retrieval.ann import PartialVectors, approximate_semantic_evidence
from knowledge_store.retrieval.fusion import Fused, fuse_scores, top_rows
from knowledge_store.retrieval.phrase import (
    PHRASE_MIN_SHARE,
    bigrams,
    is_phrase_query,
    normalise,
    normalised_share,
    order_by_share,
    words,
)
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot, QueryTerms
from knowledge_store.storage.tuned import RankingParams


@dataclass(frozen=True)
class EntityBoost:
    """The entities a query names (each as the sorted rows mentioning it) and the boost weight."""

    rows: tuple[np.ndarray, ...]
    weight: float


def entity_boost_for(snapshot: LoadedSnapshot, query: str, weight: float) -> EntityBoost | None:
    """The boost for ``query``: None when it is off or the query names no entity a chunk mentions."""
    if weight <= 0.0:
        return None
    rows = snapshot.query_entity_rows(query)
    return EntityBoost(tuple(rows), float(weight)) if rows else None


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
    order = np.lexsort((fused.rows, -scores))
    return Fused(rows=fused.rows[order], fused=scores[order], bm25=fused.bm25[order], vector=fused.vector[order],
                 bm25_rank=fused.bm25_rank[order], vector_rank=fused.vector_rank[order], boost=amount[order])


@dataclass(frozen=True)
class VectorFeedback:
    """Pseudo-relevance feedback for one query (settings ``feedback_docs``, ``feedback_beta``).

    Rocchio over the fused pool: the query vector is moved towards the best chunk of each of the
    first ``docs`` documents of the fused ranking (``q + beta * centroid``, renormalised), the pool's
    chunks and section leads are scored again with the moved vector, and the pool is fused again.
    Only the pool is re-scored (a few hundred dot products), never the corpus: on both dev sets that
    gives the same figures as a second full vector pass (docs/EVALUATION.md, 2026-11-24).
    """

    query_vector: np.ndarray
    docs: int
    beta: float


def vector_feedback_for(settings, query_vector: np.ndarray) -> VectorFeedback | None:
    """The feedback step for a query under ``settings``; None when it is off."""
    if settings.feedback_docs <= 0 or settings.feedback_beta <= 0.0:
        return None
    return VectorFeedback(np.asarray(query_vector, dtype=np.float32), settings.feedback_docs, settings.feedback_beta)


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


@dataclass(frozen=True)
class SentenceEvidence:
    """Sentence evidence for one query (``settings.sentence_weight``; ``retrieval/sentences.py``): the pool's
    chunks and section leads are scored again as ``(1 - weight) * chunk cosine + weight * best sentence
    cosine`` and the pool is fused again; the feedback step then scores the same way."""

    query_vector: np.ndarray
    weight: float
    # query vector (bytes) -> best sentence cosine per snapshot row (NaN = not yet computed), or None: self-tuning
    # ranks one query under ~250 configurations whose pools and feedback vectors mostly repeat (``with_memo``)
    memo: dict | None = field(default=None, compare=False, repr=False)

    def with_memo(self) -> SentenceEvidence:
        """The same evidence, remembering each row's best sentence cosine per query vector across rankings."""
        return SentenceEvidence(self.query_vector, self.weight, {})


def best_sentence_cosines(snapshot: LoadedSnapshot, rows: np.ndarray, query_vector: np.ndarray,
                          memo: dict | None = None) -> np.ndarray:
    """Each row's best sentence cosine with ``query_vector`` (``SentenceIndex.best``), computed once per row and
    vector when ``memo`` (``SentenceEvidence.memo``) is given."""
    index = snapshot.sentence_index
    if memo is None:
        return index.best(rows, query_vector)
    key = query_vector.tobytes()
    known = memo.get(key)
    if known is None:
        known = memo[key] = np.full(len(index.start), np.nan, dtype=np.float32)
    out = known[rows]
    missing = np.isnan(out)
    if missing.any():
        fresh = index.best(rows[missing], query_vector)
        known[rows[missing]] = fresh
        out[missing] = fresh
    return out


def sentence_evidence_for(settings, snapshot: LoadedSnapshot, query_vector: np.ndarray) -> SentenceEvidence | None:
    """The sentence step for a query under ``settings``; None when it is off or the snapshot has no sentence vectors."""
    if settings.sentence_weight <= 0.0 or snapshot.sentence_index is None:
        return None
    return SentenceEvidence(np.asarray(query_vector, dtype=np.float32), float(settings.sentence_weight))


def served_steps(settings, snapshot: LoadedSnapshot, query_vector: np.ndarray, memo: bool = False) -> dict[str, object]:
    """``rank_rows``' keyword arguments for the second passes the engine serves with under ``settings``: the feedback
    step and sentence evidence (each None when off).  ``memo``: the sentence evidence remembers best-sentence
    cosines across rankings of the same query (``SentenceEvidence.with_memo``; self-tuning's grid)."""
    sentences = sentence_evidence_for(settings, snapshot, query_vector)
    return {"feedback": vector_feedback_for(settings, query_vector),
            "sentences": sentences.with_memo() if memo and sentences is not None else sentences}


def pool_vector_evidence(snapshot: LoadedSnapshot, rows: np.ndarray, query_vector: np.ndarray, lead_weight: float,
                         sentence_weight: float = 0.0, replaced: Mapping[int, np.ndarray] | None = None,
                         memo: dict | None = None) -> np.ndarray:
    """The semantic evidence of ``rows`` for ``query_vector``: each chunk's cosine (blended with its best
    sentence's when ``sentence_weight`` and the snapshot has sentence vectors), blended with its section lead's.
    ``replaced``: rows scored with another vector than the stored one (``chunk_vectors``); ``memo``: see
    ``best_sentence_cosines``."""
    with_sentences = sentence_weight > 0.0 and snapshot.sentence_index is not None

    def cosine(r: np.ndarray) -> np.ndarray:
        own = chunk_vectors(snapshot, r, replaced) @ query_vector
        if not with_sentences:
            return own
        return (1.0 - sentence_weight) * own + sentence_weight * best_sentence_cosines(snapshot, r, query_vector, memo)

    chunk = cosine(rows)
    if snapshot.sections is None:
        return chunk
    return blend(chunk, cosine(snapshot.sections.lead_row[snapshot.sections.group[rows]]), lead_weight)


def refuse_pool(fused: Fused, vector: np.ndarray, params: RankingParams, pool: int, rrf_k: int) -> Fused:
    """``fused``'s candidates fused again with new semantic evidence ``vector`` (same order as ``fused.rows``)."""
    rows = fused.rows
    again = fuse_scores(fused.bm25, vector, None, params.alpha, pool, params.fusion, rrf_k)
    return Fused(rows=rows[again.rows], fused=again.fused, bm25=again.bm25, vector=again.vector,
                 bm25_rank=again.bm25_rank, vector_rank=again.vector_rank)


def feedback_rescore(fused: Fused, feedback: VectorFeedback, snapshot: LoadedSnapshot, params: RankingParams,
                     pool: int, rrf_k: int, sentence_weight: float = 0.0,
                     replaced: Mapping[int, np.ndarray] | None = None, memo: dict | None = None) -> Fused:
    """``fused`` fused again with the vector moved towards its own top documents (``VectorFeedback``)."""
    rows = fused.rows
    if len(rows) < 2 or params.alpha <= 0.0:
        return fused
    moved = moved_query_vector(snapshot, feedback.query_vector, first_document_rows(snapshot, rows, feedback.docs),
                               feedback.beta, replaced)
    return refuse_pool(fused, pool_vector_evidence(snapshot, rows, moved, params.lead_weight, sentence_weight, replaced,
                                                   memo), params, pool, rrf_k)


@dataclass
class QueryEvidence:
    terms: QueryTerms
    bm25_chunk: np.ndarray
    bm25_section: np.ndarray
    coverage: np.ndarray  # idf mass of the query's terms present in each chunk
    vector_chunk: np.ndarray
    vector_lead: np.ndarray
    # approximate vector search (ann.py): only the rows it scored have cosines; rank_rows scores the BM25 pool too
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


PHRASE_TEXT_CACHE_ROWS = 50_000  # normalised texts kept per snapshot (~1-2 KB each)
PHRASE_BM25_CANDIDATES = 20  # chunk-BM25 rows read for phrase evidence (20 and 40: 195/200 known items; the whole fused pool: 196)


def phrase_texts(snapshot: LoadedSnapshot, rows: list[int]) -> list[tuple[str, str]]:
    """(own, pair) normalised texts per row, padded with spaces: ``own`` is the chunk's text, ``pair`` the
    text followed by the next chunk of the same document (and its heading when it opens a section), so a
    pasted span that crosses a chunk border is still found whole.  Cached on the snapshot: a popular chunk
    is normalised once, not per query."""
    cache = snapshot.phrase_text_cache
    missing = [r for r in dict.fromkeys(rows) if r not in cache]
    if missing:
        records = snapshot.records
        following = [r + 1 if r + 1 < snapshot.size and snapshot.doc_index[r + 1] == snapshot.doc_index[r] else -1
                     for r in missing]
        own_cache = snapshot.normalised_text_cache
        if len(cache) > PHRASE_TEXT_CACHE_ROWS:
            cache.clear()
            own_cache.clear()
        wanted = [r for r in dict.fromkeys(missing + [r for r in following if r >= 0]) if r not in own_cache]
        if wanted:
            for row, text in zip(wanted, records.column("text").take(wanted).to_pylist()):
                own_cache[row] = normalise(text or "")
        present = [r for r in following if r >= 0]
        paths = dict(zip(present, records.column("section_path").take(present).to_pylist())) if present else {}
        for row, nxt in zip(missing, following):
            own = own_cache[row]
            if nxt < 0:
                cache[row] = (own, own)
                continue
            heading = ""
            if snapshot.sections is not None and snapshot.sections.group[nxt] != snapshot.sections.group[row]:
                heading = normalise((paths[nxt] or [""])[-1]).strip()
            # normalised strings join with one space: a bigram across the border stays a substring
            cache[row] = (own, " ".join(part for part in (own.strip(), heading, own_cache[nxt].strip()) if part).join("  "))
    return [cache[r] for r in rows]


def rank_rows(evidence: QueryEvidence, params: RankingParams, mask: np.ndarray | None, pool: int,
              rrf_k: int = 60, snapshot: LoadedSnapshot | None = None, query: str | None = None,
              phrase_cache: dict[int, float] | None = None, entity_boost: EntityBoost | None = None,
              feedback: VectorFeedback | None = None, sentences: SentenceEvidence | None = None) -> Fused:
    """The fused candidate list (best first) for one query under ``params``.

    ``sentences`` (``sentence_evidence_for``, needs ``snapshot``) fuses the pool again with each chunk's best
    sentence in its vector evidence; ``feedback`` (``vector_feedback_for``, needs ``snapshot``) fuses the
    pool again with the query vector moved towards its top documents (with the sentence evidence too).  ``entity_boost`` (``entity_boost_for``) lifts
    candidates mentioning the entities the query names.  With ``snapshot`` and ``query`` given, a long query then gets phrase
    evidence (``phrase.py``): candidates that hold most of its word pairs in order go first.
    """
    bm25 = evidence.bm25(params.section_weight)
    bm25_top = vector_candidates = None
    if evidence.partial is not None:  # approximate vectors: the BM25 pool needs true cosines too
        bm25_top = top_rows(bm25, mask, pool, positive_only=True)
        evidence.partial.score(bm25_top)
        evidence.partial.complete(pool, params.lead_weight)
        vector_candidates = evidence.partial.scored_rows
    vector = evidence.vector(params.lead_weight) if evidence.partial is None else evidence.partial.blended(params.lead_weight)
    fused = fuse_scores(bm25, vector, mask, params.alpha, pool, params.fusion, rrf_k,
                        vector_candidates=vector_candidates, bm25_top=bm25_top)
    sentence_weight = sentences.weight if sentences is not None and snapshot is not None else 0.0
    if sentence_weight > 0.0 and len(fused.rows) > 1 and params.alpha > 0.0:
        fused = refuse_pool(fused, pool_vector_evidence(snapshot, fused.rows, sentences.query_vector, params.lead_weight,
                                                        sentence_weight, evidence.replaced, sentences.memo),
                            params, pool, rrf_k)
    if feedback is not None and snapshot is not None:
        fused = feedback_rescore(fused, feedback, snapshot, params, pool, rrf_k, sentence_weight, evidence.replaced,
                                 sentences.memo if sentences is not None else None)
    if entity_boost is not None:
        fused = apply_entity_boost(fused, entity_boost)
    if snapshot is None or query is None or not len(fused.rows) or not is_phrase_query(query):
        return fused
    cache = {} if phrase_cache is None else phrase_cache  # sweeps rank one query many times: share once per row
    # a chunk holding the pasted span has all its words: it is among the best chunk-BM25 rows (or just
    # before one, when the span crosses into the next chunk); reading only those bounds the work per query
    # (chosen among the fused candidates: a second pass over the whole corpus cost ~1 ms at 100k chunks)
    chunk_bm25 = evidence.bm25_chunk[fused.rows]
    best = np.argsort(-chunk_bm25, kind="stable")[:PHRASE_BM25_CANDIDATES]
    lexical_top = fused.rows[best[chunk_bm25[best] > 0]]
    allowed = set(lexical_top.tolist()) | set((lexical_top - 1).tolist())
    for row in fused.rows.tolist():
        if row not in allowed:
            cache.setdefault(int(row), 0.0)
    missing = [int(r) for r in fused.rows if int(r) not in cache]
    if missing:
        tokens = words(query)
        pairs = bigrams(tokens)
        texts = phrase_texts(snapshot, missing)
        # pigeonhole pre-screen: a text missing all of any (misses + 1) bigrams cannot reach the share
        probe = sorted(pairs, key=lambda p: -len(p[0]) - len(p[1]))[: int(len(pairs) * (1 - PHRASE_MIN_SHARE)) + 1]
        pattern = re.compile("|".join(re.escape(f" {a} {b} ") for a, b in probe)) if probe else None
        for row, (own, pair) in zip(missing, texts):
            if pattern is None or not pattern.search(pair):
                cache[row] = 0.0
                continue
            # the span read across the border to the next chunk counts; holding it alone breaks ties
            cache[row] = normalised_share(pairs, pair) + 0.1 * normalised_share(pairs, own)
    order = order_by_share(np.array([cache[int(r)] for r in fused.rows]))
    return Fused(rows=fused.rows[order], fused=fused.fused[order], bm25=fused.bm25[order], vector=fused.vector[order],
                 bm25_rank=fused.bm25_rank[order], vector_rank=fused.vector_rank[order],
                 boost=fused.boost[order] if fused.boost is not None else None)
