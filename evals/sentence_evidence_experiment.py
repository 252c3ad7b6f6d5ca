"""Sentence-level vector evidence: does a chunk's best-matching sentence add to its whole-chunk cosine?

A 200-word-piece chunk's vector averages everything it says; an FAQ answer or an abstract often
answers in one sentence.  This embeds every sentence of every chunk alone (cached beside the store,
keyed by the snapshot's chunk ids) and re-scores the default ranking's fused pool with
``(1 - w) * chunk cosine + w * best sentence cosine`` for each candidate and its section lead - only
the pool, as a shipped version would (a full pass over ~5 sentences per chunk would not fit the
latency budget) - then fuses again; the feedback step then moves the query and re-scores the same
way.  Questions rank at ``question_alpha``, as served.

    .venv/bin/python -m evals.sentence_evidence_experiment perl:train debian:train scifact:train \\
        perl:test debian:test scifact:test
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import numpy as np

from evals.dev_store import DevStore, open_dev_store
from evals.ranking_sweep import embed_queries
from knowledge_store.embeddings import document_embedder
from knowledge_store.retrieval.evidence import (
    blend,
    first_document_rows,
    gather_evidence,
    moved_query_vector,
    rank_rows,
)
from knowledge_store.retrieval.fusion import Fused, fuse_scores
from knowledge_store.retrieval.query_form import alpha_for
from knowledge_store.retrieval.sentences import split_sentences
from knowledge_store.settings import Settings

WEIGHTS = (0.0, 0.1, 0.2, 0.3)
class SentenceVectors:
    """Every chunk's sentence vectors, contiguous per row: ``starts[r]:starts[r + 1]``."""

    def __init__(self, dev: DevStore, settings: Settings) -> None:
        folder = dev.store.index_dir.parent
        cache, ids = folder / "sentence_vectors.npz", folder / "sentence_vectors.ids"
        if cache.exists() and ids.exists() and ids.read_text().split("\n") == dev.snapshot.chunk_ids:
            data = np.load(cache)
            self.vectors, self.starts = data["vectors"], data["starts"]
            return
        texts = [t or "" for t in dev.snapshot.records.column("text").to_pylist()]
        split = [split_sentences(t) for t in texts]
        flat = [s for parts in split for s in parts]
        started = time.perf_counter()
        embedder = document_embedder(settings)
        self.vectors = np.concatenate([embedder.embed(flat[i:i + 512]) for i in range(0, len(flat), 512)]).astype(np.float32)
        self.starts = np.concatenate([[0], np.cumsum([len(parts) for parts in split])]).astype(np.int64)
        np.savez(cache, vectors=self.vectors, starts=self.starts)
        ids.write_text("\n".join(dev.snapshot.chunk_ids))
        print(f"  {dev.name}: {len(flat)} sentences of {len(texts)} chunks embedded in "
              f"{time.perf_counter() - started:.0f} s", flush=True)

    def best(self, rows: np.ndarray, query_vector: np.ndarray) -> np.ndarray:
        """Each row's best sentence cosine."""
        lo, hi = self.starts[rows], self.starts[rows + 1]
        counts = hi - lo
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        index = np.repeat(lo - offsets, counts) + np.arange(counts.sum())
        return np.maximum.reduceat(self.vectors[index] @ query_vector, offsets)


def pool_vector(dev: DevStore, sents: SentenceVectors, rows: np.ndarray, query_vector: np.ndarray,
                lead_weight: float, w: float) -> np.ndarray:
    """The pool's semantic evidence with sentence evidence blended into each chunk and section lead."""
    snapshot = dev.snapshot

    def chunk(r: np.ndarray) -> np.ndarray:
        cos = snapshot.embeddings[r] @ query_vector
        return cos if w <= 0 else (1 - w) * cos + w * sents.best(r, query_vector)

    if snapshot.sections is None:
        return chunk(rows)
    return blend(chunk(rows), chunk(snapshot.sections.lead_row[snapshot.sections.group[rows]]), lead_weight)


def rank(dev: DevStore, sents: SentenceVectors, text: str, vector: np.ndarray, settings: Settings, w: float) -> np.ndarray:
    params = replace(dev.params, alpha=alpha_for(text, dev.params.alpha, settings.question_alpha, dev.snapshot))
    fused = rank_rows(gather_evidence(dev.snapshot, text, vector), params, dev.snapshot.active,
                      settings.candidate_pool, settings.rrf_k)

    def refuse(current: Fused, query_vector: np.ndarray) -> Fused:
        rows = current.rows
        again = fuse_scores(current.bm25, pool_vector(dev, sents, rows, query_vector, params.lead_weight, w), None,
                            params.alpha, settings.candidate_pool, params.fusion, settings.rrf_k)
        return Fused(rows=rows[again.rows], fused=again.fused, bm25=again.bm25, vector=again.vector,
                     bm25_rank=again.bm25_rank, vector_rank=again.vector_rank)

    if w > 0:
        fused = refuse(fused, vector)
    if settings.feedback_docs > 0 and settings.feedback_beta > 0 and len(fused.rows) > 1:  # the shipped step
        top = first_document_rows(dev.snapshot, fused.rows, settings.feedback_docs)
        fused = refuse(fused, moved_query_vector(dev.snapshot, vector, top, settings.feedback_beta))
    return fused.rows


def run(spec: str) -> dict[float, tuple[float, float]]:
    settings = Settings()
    dev = open_dev_store(spec)
    sents = SentenceVectors(dev, settings)
    vectors = embed_queries(dev.dataset, dev.embedder)
    out = {}
    for w in WEIGHTS:
        out[w] = dev.mean_scores((q, dev.ranked_docs(rank(dev, sents, t, vectors[q], settings, w)))
                                 for q, t in dev.dataset.queries.items())
        print(f"  {spec}: sentence weight {w:g}: nDCG@10 {out[w][0]:.4f}  Recall@5 {out[w][1]:.4f}", flush=True)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
