"""Self-tuning per corpus: a labelled set from the corpus's own structure, a sweep, a stored default.

No people and no LLM.  A corpus already says what its parts are about:

- ``heading``  a section heading is a query whose answer is that section;
- ``question`` a heading that asks something (FAQ: "How do I ...?") is a query whose answer is that section;
- ``title``    a document title is a query whose answer is that document;
- ``feedback`` a thumbs-up in the query log is a real query whose answer is the rated passage's section.

A heading or title is part of what it labels: the chunker puts "title / section"
in front of every chunk it embeds, and BM25 indexes both fields.  Scored as
is, every such pseudo-query would find its target by its own words and the
sweep would learn "trust BM25 on titles".  So for each pseudo-query the target's
evidence is recomputed *without the query text*: its chunks are re-embedded with
the header rebuilt minus that heading/title, and its BM25 (chunk and section) is
recomputed from the remaining fields.  Everything else in the corpus keeps its
real scores, so the competition is the real one.

The sweep ranks with ``knowledge_store.retrieval.ranking.RankingPipeline`` - the
ranking the engine serves with - over a grid of alpha x fusion x section weight x
lead weight, and picks the best mean nDCG@10.  The choice is written to
``<index_dir>/tuned.json`` (atomically), where the engine, the evaluations and
``/api/knowledge/config`` read it.  Precedence: a value a query passes > a
setting set explicitly (environment, ``.env``, code) > a value set by hand in the
console (``manual`` in the same file) > the tuned value > the built-in default.

The console's Settings page (``PUT /api/knowledge/ranking``) writes alpha, fusion
and the default reranker into the same file, beside the tuning evidence, so the
server, the CLI and MCP have one place to read a corpus's ranking from.  A later
``groundwork tune`` chooses alpha and fusion again (the hand-set ones give way to
the measured choice) but keeps a hand-set reranker, which tuning does not choose;
``groundwork tune --reset`` removes the file and with it both.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError
from knowledge_store.core.metrics import ndcg_at_k, paired_gain, recall_at_k
from knowledge_store.core.progress import stage_progress
from knowledge_store.ingest.chunking import SECTION_SEPARATOR
from knowledge_store.models.embeddings import Embedder, bare_weight_of, embed_chunks
from knowledge_store.models.serving import model_path_for
from knowledge_store.retrieval.evidence import QueryEvidence, gather_evidence
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.query_form import alpha_for
from knowledge_store.retrieval.ranking import TUNING_STEPS, PhraseOrderStep, RankingPipeline
from knowledge_store.retrieval.ranking_defaults import builtin_ranking
from knowledge_store.retrieval.snapshot_reader import _FTS_SPLIT, LoadedSnapshot, bm25_norm, bm25_term, load_snapshot
from knowledge_store.storage.query_log import QueryLog
from knowledge_store.storage.tuned import RankingParams, TunedConfig, save_tuned

PSEUDO_QUERY_KINDS = ("question", "heading", "title", "feedback")

# the grid: every value here is tried with every other one, and with every fusion mode registered when
# default_grid() is called (retrieval/fusion.py FUSION_REGISTRY)
ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
SECTION_WEIGHTS = (0.0, 0.5, 1.0)
LEAD_WEIGHTS = (0.0, 0.3, 0.6, 0.8)

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'-]*")


class TuningError(GroundworkError):
    """The corpus cannot be tuned (too few pseudo-queries, no snapshot ...); says why."""


# --------------------------------------------------------------------------- labelled set


@dataclass(frozen=True)
class PseudoQuery:
    query: str
    kind: str  # one of PSEUDO_QUERY_KINDS
    unit: str  # "section" or "document": what a ranking is deduplicated to
    targets: frozenset[int]  # section numbers or document indices (LoadedSnapshot.documents)
    strip: str = ""  # the query text removed from the targets' header ("" = nothing to remove)
    strip_field: str = ""  # "title" or "section"


def _informative_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text) if len(w) > 2]


_SEGMENT_SPLIT = re.compile(r"\s*[:|\u2014\u2013]\s+|\s+-\s+")
_NUMBERING = re.compile(r"^\s*(?:(?:chapter|section|appendix)\s+)?(?:[0-9]+|[A-Z])(?:\.[0-9]+)*\.?\s+", re.IGNORECASE)


def shared_segments(titles: Iterable[str], min_titles: int = 3) -> set[str]:
    """Title segments ("Debian Reference" in "Debian Reference: 2.3 Basic package ...") that many titles share.

    They name a book or a site, not what the section is about: a person does not
    type them, and as query words they would favour every sibling of the target.
    """
    counts: Counter = Counter()
    for title in set(titles):
        counts.update(set(seg.strip().lower() for seg in _SEGMENT_SPLIT.split(title) if seg.strip()))
    return {seg for seg, n in counts.items() if n >= min_titles}


def query_text(label: str, shared: set[str]) -> str:
    """What a person would type for a heading or title: its own words, without shared segments or numbering."""
    segments = [seg.strip() for seg in _SEGMENT_SPLIT.split(label) if seg.strip()]
    kept = [seg for seg in segments if seg.lower() not in shared] or segments[-1:]
    return _NUMBERING.sub("", " ".join(kept)).strip()


def build_pseudo_queries(snapshot: LoadedSnapshot, feedback: Iterable[dict] = (), limit: int = 300,
                         seed: int = 13) -> list[PseudoQuery]:
    """Pseudo-queries from ``snapshot``'s headings, questions and titles, plus thumbs-up ``feedback``.

    Kept only when they can label something: at least two informative words, and
    a heading shared by more than three sections (e.g. "Introduction") or a
    title shared by more than five documents is too ambiguous to be a label.
    At most ``limit`` (seeded sample, every kind represented in proportion).
    """
    sections = snapshot.sections
    if sections is None or snapshot.size == 0:
        raise TuningError("the snapshot has no rows to tune on")
    records = snapshot.records
    section_paths = records.column("section_path").to_pylist()
    titles = records.column("title").to_pylist()
    active = snapshot.active
    heading_targets: dict[str, set[int]] = {}
    title_targets: dict[str, set[int]] = {}
    for lead in sections.lead_row.tolist():
        if not active[lead]:
            continue
        title = (titles[lead] or "").strip()
        path = [p for p in (section_paths[lead] or []) if p and p.strip() and p.strip() != title]
        if path:
            heading_targets.setdefault(path[-1].strip(), set()).add(int(sections.group[lead]))
        if title:
            title_targets.setdefault(title, set()).add(int(snapshot.doc_index[lead]))
    queries: list[PseudoQuery] = []
    shared = shared_segments(list(title_targets) + list(heading_targets))
    for heading, groups in heading_targets.items():
        text = query_text(heading, shared)
        if len(groups) > 3 or len(_informative_words(text)) < 2:
            continue
        kind = "question" if heading.rstrip().endswith("?") else "heading"
        queries.append(PseudoQuery(text, kind, "section", frozenset(groups), heading, "section"))
    for title, docs in title_targets.items():
        text = query_text(title, shared)
        if len(docs) > 5 or len(_informative_words(text)) < 2:
            continue
        queries.append(PseudoQuery(text, "title", "document", frozenset(docs), title, "title"))
    rng = random.Random(seed)
    rng.shuffle(queries)
    by_kind: dict[str, list[PseudoQuery]] = {}
    for q in queries:
        by_kind.setdefault(q.kind, []).append(q)
    gold = feedback_queries(snapshot, feedback)
    budget = max(0, limit - len(gold))
    total = sum(len(v) for v in by_kind.values())
    chosen: list[PseudoQuery] = []
    if total:
        for kind in PSEUDO_QUERY_KINDS:
            pool = by_kind.get(kind, [])
            share = max(1, round(budget * len(pool) / total)) if pool else 0
            chosen.extend(pool[:share])
    return gold + chosen[:budget]


def feedback_queries(snapshot: LoadedSnapshot, feedback: Iterable[dict]) -> list[PseudoQuery]:
    """Thumbs-up rows (query, chunk) as gold: the rated chunk's section answers the query."""
    targets: dict[str, set[int]] = {}
    sections = snapshot.sections
    for row in feedback:
        rating = row.get("rating")
        if not (rating == 1 or rating is True or str(rating).lower() in ("1", "up", "+1", "true")):
            continue
        chunk = snapshot.row_of.get(row.get("chunk_id"))
        query = (row.get("query") or "").strip()
        if chunk is None or not query or sections is None:
            continue
        targets.setdefault(query, set()).add(int(sections.group[chunk]))
    return [PseudoQuery(q, "feedback", "section", frozenset(g)) for q, g in targets.items()]


# --------------------------------------------------------------------------- removing the query text


def _title_without(title: str, query: str) -> str:
    """The title minus the query's part of it: a shared segment ("Debian Reference") stays, as on its siblings."""
    return re.sub(re.escape(query), " ", title or "", flags=re.IGNORECASE).strip(" :|-\u2014\u2013") if query else ""


def _header_without(title: str, section_path: list[str], pq: PseudoQuery) -> str:
    """The chunk header the chunker would have built, minus the pseudo-query's own text."""
    path = [p for p in (section_path or []) if p and p.strip() and p.strip() != (title or "").strip()]
    if pq.strip_field == "section":
        path = [p for p in path if p.strip() != pq.strip]
    title = _reduced_title(title, pq)
    parts = [title] if title else []
    if path:
        parts.append(SECTION_SEPARATOR.join(path))
    return "\n".join(parts)


class TermCounter:
    """Stemmed term counts of a text, the way the fts index counted them (stop words dropped)."""

    def __init__(self, snapshot: LoadedSnapshot) -> None:
        self.snapshot = snapshot

    def counts(self, text: str) -> Counter:
        tokens = _FTS_SPLIT.sub(" ", text.lower()).split()
        stop = self.snapshot.stopwords
        return Counter(stem for token, stem in zip(tokens, self.snapshot.stem_tokens(tokens))
                       if stem and token not in stop and stem not in stop)


def _bm25(tf: np.ndarray, length: float, avgdl: float, idf: np.ndarray) -> float:
    return float(np.sum(bm25_term(idf, tf, bm25_norm(length, avgdl))))


def _reduced_title(title: str, pq: PseudoQuery) -> str:
    """A chunk's title minus the pseudo-query's own text (the whole title when the query is not in it verbatim)."""
    title = (title or "").strip()
    if pq.strip_field != "title":
        return title
    reduced = _title_without(title, pq.query)
    return "" if reduced == title else reduced


def target_rows(snapshot: LoadedSnapshot, pq: PseudoQuery) -> np.ndarray:
    """The rows of ``pq``'s target sections or documents."""
    if pq.unit == "section":
        return np.flatnonzero(np.isin(snapshot.sections.group, list(pq.targets)))
    return np.flatnonzero(np.isin(snapshot.doc_index, list(pq.targets)))


def _stripped_texts(snapshot: LoadedSnapshot, pq: PseudoQuery, rows: np.ndarray) -> tuple[list[str], list, list]:
    """(texts, titles, section paths) of ``rows``; the texts without the query's own words."""
    take = snapshot.records.take(rows)
    # Markdown keeps a "## Heading" line in the chunk's own text: the query goes from there too
    own_words = re.compile("|".join(re.escape(t) for t in sorted({pq.strip, pq.query}, key=len, reverse=True) if t),
                           re.IGNORECASE)
    texts = [own_words.sub(" ", t or "") for t in take.column("text").to_pylist()]
    return texts, take.column("title").to_pylist(), take.column("section_path").to_pylist()


def stripped_vectors(snapshot: LoadedSnapshot, pq: PseudoQuery, rows: np.ndarray,
                     embed: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """``rows``' chunk vectors re-embedded as if their header and text did not hold the query."""
    return _embed_stripped(snapshot, pq, embed, *_stripped_texts(snapshot, pq, rows))


def stripped_embed_texts(snapshot: LoadedSnapshot, pq: PseudoQuery, rows: np.ndarray) -> tuple[list[str], list[str]]:
    """(embed texts, texts) of ``rows`` as the chunker would have built them had their header and text not held
    ``pq``'s own words: what the model sees of a pseudo-query's targets, for ranking them (``stripped_vectors``)
    and for training on them (``learning.pairs``)."""
    texts, titles, paths = _stripped_texts(snapshot, pq, rows)
    return _stripped_embed_texts(pq, texts, titles, paths), texts


def _stripped_embed_texts(pq: PseudoQuery, texts: list[str], titles: list, paths: list) -> list[str]:
    headers = [_header_without(t, p, pq) for t, p in zip(titles, paths)]
    return [f"{h}\n\n{x}" if h else x for h, x in zip(headers, texts)]


def _embed_stripped(snapshot: LoadedSnapshot, pq: PseudoQuery, embed: Callable[[list[str]], np.ndarray],
                    texts: list[str], titles: list, paths: list) -> np.ndarray:
    # the same recipe as the stored vectors (``bare_vector_weight``, read off the snapshot's model id)
    return embed_chunks(embed, _stripped_embed_texts(pq, texts, titles, paths), texts,
                        bare_weight_of(snapshot.info.model_id))


def strip_query_from_targets(snapshot: LoadedSnapshot, pq: PseudoQuery, evidence: QueryEvidence,
                             embed: Callable[[list[str]], np.ndarray], counter: TermCounter,
                             query_vector: np.ndarray, vectors: np.ndarray | None = None) -> QueryEvidence:
    """``evidence`` with the target rows rescored as if their header did not contain the query
    (``vectors``: the targets' ``stripped_vectors`` when the caller has them already)."""
    if not pq.strip_field:
        return evidence
    sections = snapshot.sections
    rows = target_rows(snapshot, pq)
    if not len(rows):
        return evidence
    texts, titles, paths = _stripped_texts(snapshot, pq, rows)
    if vectors is None:
        vectors = _embed_stripped(snapshot, pq, embed, texts, titles, paths)
    bm25_chunk = evidence.bm25_chunk.copy()
    bm25_section = evidence.bm25_section.copy()
    vector_chunk = evidence.vector_chunk.copy()
    vector_chunk[rows] = vectors @ query_vector.astype(np.float32)
    terms = evidence.terms
    idf = terms.idf
    known = terms.known
    # chunk BM25 from the fields the fts index saw: title, section, text (each minus the query text)
    section_tf: dict[int, np.ndarray] = {}
    section_len: dict[int, float] = {}
    for i, row in enumerate(rows.tolist()):
        # the fts ``section`` field is the whole heading path (title-equal parts included)
        title = _reduced_title(titles[i], pq)
        path = [p for p in (paths[i] or []) if not (pq.strip_field == "section" and p.strip() == pq.strip)]
        counts = counter.counts(" ".join([title, SECTION_SEPARATOR.join(path), texts[i] or ""]))
        tf = np.array([counts.get(s, 0) for s in known], dtype=np.float64)
        length = float(sum(counts.values()))
        bm25_chunk[row] = _bm25(tf, length, snapshot.avgdl, idf) if len(known) else 0.0
        group = int(sections.group[row])
        section_tf[group] = section_tf.get(group, 0) + tf
        section_len[group] = section_len.get(group, 0.0) + length
    if len(known):
        sec_idf = sections.idf(terms.termids)
        for group, tf in section_tf.items():
            bm25_section[sections.group == group] = _bm25(tf, section_len[group], sections.avgdl, sec_idf)
    # the section lead's cosine follows its (re-embedded) lead row
    vector_lead = vector_chunk[sections.lead_row][sections.group]
    # the served second passes (sentence evidence, the feedback step) score the pool again from chunk vectors:
    # they must see the targets' stripped vectors too, or the stored header would hand them the answer
    replaced = {**(evidence.replaced or {}), **dict(zip(rows.tolist(), np.asarray(vectors, dtype=np.float32)))}
    return QueryEvidence(terms, bm25_chunk, bm25_section, evidence.coverage, vector_chunk, vector_lead, replaced=replaced)


# --------------------------------------------------------------------------- the sweep


def default_grid() -> list[RankingParams]:
    return [RankingParams(a, f, s, lw) for f in FUSION_MODES for a in ALPHAS for s in SECTION_WEIGHTS for lw in LEAD_WEIGHTS]


def units_of(snapshot: LoadedSnapshot, rows: np.ndarray, unit: str) -> list[int]:
    ids = snapshot.sections.group[rows] if unit == "section" else snapshot.doc_index[rows]
    return list(dict.fromkeys(int(i) for i in ids))


@dataclass
class SweepRow:
    params: RankingParams
    ndcg10: float
    recall5: float
    by_kind: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.params.to_dict(), "ndcg@10": round(self.ndcg10, 4), "recall@5": round(self.recall5, 4),
                "ndcg@10_by_kind": {k: round(v, 4) for k, v in self.by_kind.items()}}


def tuning_pipeline(served_by: Settings | None, pool: int, rrf_k: int) -> RankingPipeline:
    """The ranking a grid is scored with: the served steps under ``served_by`` but the entity boost (pseudo-queries
    name no entity), or phrase order alone without it (``ranking.py`` says why)."""
    if served_by is None:
        return RankingPipeline((PhraseOrderStep(),), pool=pool, rrf_k=rrf_k)
    return replace(RankingPipeline.served(served_by, only=TUNING_STEPS), pool=pool, rrf_k=rrf_k)


def score_grid(snapshot: LoadedSnapshot, queries: list[PseudoQuery], embed: Callable[[list[str]], np.ndarray],
               grid: list[RankingParams], pool: int = 100, rrf_k: int = 60,
               strip: bool = True, question_alpha: float | None = None,
               served_by=None) -> tuple[np.ndarray, np.ndarray]:
    """nDCG@10 and Recall@5 of every grid point (rows) on every pseudo-query (columns).

    A pseudo-query phrased as a question (an FAQ heading, a rated user question) that names no entity is
    ranked with ``question_alpha`` whatever the grid point's alpha, as the engine ranks it
    (``query_form.alpha_for``): the alpha tuning chooses is the one of every other query.  ``served_by``
    (Settings) adds the second passes the engine serves with under them - sentence evidence and the
    feedback step - with the targets' stripped vectors (``strip_query_from_targets``), so the grid is
    ranked as it will be served.
    """
    vectors = embed([q.query for q in queries]) if queries else np.zeros((0, snapshot.embeddings.shape[1]), dtype=np.float32)
    counter = TermCounter(snapshot)
    mask = snapshot.active
    pipeline = tuning_pipeline(served_by, pool, rrf_k)
    ndcg = np.zeros((len(grid), len(queries)))
    recall = np.zeros((len(grid), len(queries)))
    counts = stage_progress("tune", "pseudo-queries").start(len(queries))
    for j, (pq, qv) in enumerate(zip(queries, vectors)):
        counts.advance()
        evidence = gather_evidence(snapshot, pq.query, qv)
        if strip:
            evidence = strip_query_from_targets(snapshot, pq, evidence, embed, counter, qv)
        context = pipeline.context(pq.query, evidence, grid[0] if grid else RankingParams(), snapshot, qv, mask,
                                   shared_caches=True)
        for i, params in enumerate(grid):
            params = replace(params, alpha=alpha_for(pq.query, params.alpha, question_alpha, snapshot))
            fused = pipeline.rank(context.for_params(params))
            ranked = units_of(snapshot, fused.rows, pq.unit)
            ndcg[i, j] = ndcg_at_k(ranked, pq.targets, 10)
            recall[i, j] = recall_at_k(ranked, pq.targets, 5)
    counts.finish()
    return ndcg, recall


def summarise_grid(queries: list[PseudoQuery], grid: list[RankingParams], ndcg: np.ndarray,
                   recall: np.ndarray) -> list[SweepRow]:
    """``score_grid``'s matrices as one row per grid point (means, nDCG@10 by query kind), best first."""
    kinds = sorted({q.kind for q in queries})
    rows = []
    for i, params in enumerate(grid):
        by_kind = {k: float(np.mean([ndcg[i, j] for j, q in enumerate(queries) if q.kind == k])) for k in kinds}
        rows.append(SweepRow(params, float(ndcg[i].mean()) if len(queries) else 0.0,
                             float(recall[i].mean()) if len(queries) else 0.0, by_kind))
    rows.sort(key=lambda r: (-r.ndcg10, -r.recall5, r.params.label))
    return rows


# --------------------------------------------------------------------------- the whole job


def tune_snapshot(snapshot: LoadedSnapshot, settings, embed: Callable[[list[str]], np.ndarray],
                  feedback: Iterable[dict] = (), limit: int = 300, grid: list[RankingParams] | None = None,
                  min_queries: int = 20, seed: int = 13, min_gain: float = 0.005) -> TunedConfig:
    """Build the pseudo-labelled set of ``snapshot``, sweep ``grid`` and return the choice (not saved)."""
    started = time.perf_counter()
    queries = build_pseudo_queries(snapshot, feedback, limit=limit, seed=seed)
    if len(queries) < min_queries:
        raise TuningError(
            f"only {len(queries)} pseudo-queries could be built from this corpus (need {min_queries}): "
            "it has too few distinct headings and titles; keep the built-in defaults or add thumbs-up feedback")
    grid = list(grid or default_grid())
    builtin = builtin_ranking(settings)
    if builtin not in grid:
        grid.append(builtin)
    ndcg, recall = score_grid(snapshot, queries, embed, grid, pool=settings.candidate_pool, rrf_k=settings.rrf_k,
                              question_alpha=settings.question_alpha, served_by=settings)
    rows = summarise_grid(queries, grid, ndcg, recall)
    before = next(r for r in rows if r.params == builtin)
    decision = keep_decision(ndcg[grid.index(rows[0].params)], ndcg[grid.index(builtin)], min_gain)
    best = rows[0] if decision["adopted"] else before
    return TunedConfig(
        params=best.params,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        snapshot_version=snapshot.info.snapshot_version,
        pseudo_queries=dict(Counter(q.kind for q in queries)),
        before={"params": before.params.to_dict(), "ndcg@10": round(before.ndcg10, 4), "recall@5": round(before.recall5, 4)},
        after={"params": best.params.to_dict(), "ndcg@10": round(best.ndcg10, 4), "recall@5": round(best.recall5, 4)},
        table=[r.to_dict() for r in rows],
        seconds=round(time.perf_counter() - started, 2),
        decision=decision,
    )


def keep_decision(best: np.ndarray, builtin: np.ndarray, min_gain: float = 0.005, z: float = 2.0) -> dict[str, Any]:
    """Adopt the best grid point only if its gain over the built-in is clear on these pseudo-queries (``paired_gain``).

    ``best`` and ``builtin`` are per-pseudo-query nDCG@10.  Why the standard-error condition: with a
    fixed margin alone, random draws of pseudo-queries from the same corpus often changed the ranking,
    away from the choice the real labels make; with the paired test far less often, and less far
    (``evals/experiments/keep_rule_experiment.py``, docs/EVALUATION.md).
    """
    decision = paired_gain(best, builtin, min_gain, z)
    gain, se, required, n = decision["gain"], decision["standard_error"], decision["required"], len(best)
    if not decision.pop("changed"):
        reason = "the best configuration is the built-in (or ranks every pseudo-query the same)"
    elif decision["adopted"]:
        reason = f"adopted: +{gain:.4f} nDCG@10 on {n} pseudo-queries, above {required:.4f} (min_gain, {z:g} standard errors)"
    else:
        reason = (f"kept the built-in: the best configuration gains {gain:+.4f} nDCG@10 on {n} pseudo-queries, "
                  f"not above {required:.4f} (min_gain {min_gain:g}; {z:g} standard errors = {z * se:.4f})")
    return {**decision, "reason": reason}


@contextmanager
def corpus_inputs(settings, embedder=None, feedback: Iterable[dict] | None = None):
    """(snapshot, embedder, feedback rows) of the corpus served from ``settings.index_dir``: what self-tuning
    and the query adapter learn from.  ``embedder`` and ``feedback`` default to the settings' model and the
    query log's ratings; the snapshot is closed on exit."""
    snapshot = load_snapshot(settings.index_dir)
    try:
        # queries are embedded with the model of the snapshot they are ranked over (a fine-tuned one, once adopted)
        model_path = snapshot.info.model_path or model_path_for(settings, snapshot.info.model_id) or settings.model_path
        embedder = embedder or Embedder(model_path, settings.embed_batch_size, settings.torch_threads,
                                        settings.embedding_dim, prefix=settings.embedding_query_prefix)
        yield snapshot, embedder, list(feedback_rows(settings) if feedback is None else feedback)
    finally:
        snapshot.close()


def tune_corpus(settings, embedder=None, feedback: Iterable[dict] | None = None, limit: int = 300,
                save: bool = True, min_queries: int = 20) -> TunedConfig:
    """Tune the corpus served from ``settings.index_dir`` and (by default) store the choice there."""
    with corpus_inputs(settings, embedder, feedback) as (snapshot, embedder, feedback):
        tuned = tune_snapshot(snapshot, settings, embedder.embed, feedback=feedback, limit=limit,
                              min_queries=min_queries)
    if save:
        save_tuned(settings.index_dir, tuned)
    return tuned


def feedback_rows(settings) -> list[dict]:
    """The query log's ratings joined with their queries (none when there is no query log yet)."""
    if not Path(settings.logs_path).exists():
        return []

    log = QueryLog(settings.logs_path)
    try:
        return log.feedback_with_queries()
    finally:
        log.close()
