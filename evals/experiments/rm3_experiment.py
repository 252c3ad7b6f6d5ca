"""Lexical pseudo-relevance feedback (RM3-style query expansion for BM25), measured on both dev sets.

After the default ranking (vector feedback step included), the best chunk of each of the first
``docs`` documents is read; its stemmed terms are weighted by ``tf / length * idf`` summed over
those chunks; the best ``terms`` not already in the query are added to the BM25 side with weight
``lam * w / max(w)`` (chunk and section BM25 alike), and the corpus is ranked again.

    .venv/bin/python -m evals.experiments.rm3_experiment scifact:train debian:train
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np

from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import ndcg_at_k, recall_at_k
from knowledge_store.learning.tuning import TermCounter
from knowledge_store.retrieval.evidence import QueryEvidence, first_document_rows, gather_evidence
from knowledge_store.retrieval.ranking import PhraseOrderStep, RankingPipeline, VectorFeedbackStep
from knowledge_store.retrieval.snapshot_reader import bm25_idf, bm25_term

VARIANTS = [(docs, terms, lam) for docs in (3, 5) for terms in (5, 10) for lam in (0.1, 0.2, 0.4)]


def expansion(snapshot, counter, texts: list[str], query_terms: set[int], terms: int) -> list[tuple[int, float]]:
    weights: Counter = Counter()
    for text in texts:
        counts = counter.counts(text)
        length = sum(counts.values()) or 1
        for stem, tf in counts.items():
            termid = snapshot.term_ids.get(stem)
            if termid is None or termid in query_terms or snapshot.df[termid] < 2:
                continue
            weights[termid] += tf / length * float(bm25_idf(snapshot.num_docs, snapshot.df[termid]))
    return weights.most_common(terms)


def expanded_evidence(snapshot, evidence: QueryEvidence, chosen: list[tuple[int, float]], lam: float) -> QueryEvidence:
    if not chosen:
        return evidence
    top = chosen[0][1]
    chunk = evidence.bm25_chunk.astype(np.float32).copy()
    section = evidence.bm25_section.astype(np.float32).copy()
    for termid, weight in chosen:
        scale = lam * weight / top
        start, end = snapshot.term_ptr[termid], snapshot.term_ptr[termid + 1]
        idf = bm25_idf(snapshot.num_docs, snapshot.df[termid])
        add = np.zeros(snapshot.size, np.float32)
        add[snapshot.post_rows[start:end]] = bm25_term(np.float32(idf), snapshot.post_tf[start:end],
                                                       snapshot.post_norm[start:end])
        chunk += scale * add
        if snapshot.sections is not None:
            section += scale * snapshot.sections.scores(np.array([termid]))[snapshot.sections.group]
    return QueryEvidence(evidence.terms, chunk, section, evidence.coverage, evidence.vector_chunk, evidence.vector_lead)


def run(name: str) -> None:
    dev = open_dev_store(name)
    dataset, snapshot, beir, params = dev.dataset, dev.snapshot, dev.beir, dev.params
    vectors = embed_queries(dataset, dev.embedder)
    counter = TermCounter(snapshot)
    texts = snapshot.records.column("text").to_pylist()
    scores: dict[str, list] = {}
    settings = Settings()

    feedback = VectorFeedbackStep.from_settings(settings)  # None when the settings turn it off
    pipeline = RankingPipeline(((feedback,) if feedback is not None else ()) + (PhraseOrderStep(),),
                               pool=settings.candidate_pool, rrf_k=settings.rrf_k)

    def rank(evidence, text, vector):
        return pipeline.rank(pipeline.context(text, evidence, params, snapshot, vector, snapshot.active)).rows

    for qid, text in dataset.queries.items():
        evidence = gather_evidence(snapshot, text, vectors[qid])
        base = rank(evidence, text, vectors[qid])
        outs = {"default": base}
        qterms = set(int(t) for t in evidence.terms.termids)
        for docs, terms, lam in VARIANTS:
            rows = first_document_rows(snapshot, base, docs)
            chosen = expansion(snapshot, counter, [texts[r] or "" for r in rows.tolist()], qterms, terms)
            outs[f"docs {docs} terms {terms} lam {lam}"] = rank(expanded_evidence(snapshot, evidence, chosen, lam),
                                                                 text, vectors[qid])
        for label, rows in outs.items():
            ranked = list(dict.fromkeys(beir[d] for d in snapshot.doc_index[rows].tolist()))
            scores.setdefault(label, []).append((ndcg_at_k(ranked, dataset.qrels[qid], 10),
                                                 recall_at_k(ranked, dataset.qrels[qid], 5)))
    for label, values in scores.items():
        ndcg, recall = np.mean(values, axis=0)
        print(f"{name:14s} {label:28s} nDCG@10 {ndcg:.4f}  Recall@5 {recall:.4f}", flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
