"""Do near-copies crowd the answer out of the top five?  Document-level MMR over the served ranking.

Programming documentation has families of near-identical pages (``IO::Uncompress::Inflate`` /
``RawInflate`` / ``RawDeflate``: "Optional Parameters"); when three of them fill the top five, the
answer may be sixth.  This re-orders the default ranking's first 30 documents (as served: ``RankingPipeline``
with sentence evidence, the feedback step and questions at ``question_alpha``) by maximal marginal
relevance - ``lambda * fused score (rescaled to [0, 1]) - (1 - lambda) * the highest cosine to a
document already placed`` (each document by its best chunk's vector) - and scores it with the real
labels.  A query whose order phrase evidence decided keeps it.  Lambda 1 is the served ranking.

    .venv/bin/python -m evals.experiments.doc_diversity_experiment perl:train debian:train scifact:train
"""

from __future__ import annotations

import sys

import numpy as np

from evals.experiments.adapter_eval import ranked_pool
from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import ndcg_at_k, recall_at_k

LAMBDAS = (1.0, 0.95, 0.9, 0.85, 0.8)
DOCUMENTS = 30  # documents re-ordered per query


def mmr_order(relevance: np.ndarray, similarity: np.ndarray, lam: float) -> list[int]:
    """Indices of the documents in MMR order (``lam`` 1 = by relevance alone)."""
    chosen: list[int] = []
    remaining = list(range(len(relevance)))
    while remaining:
        redundancy = similarity[np.ix_(remaining, chosen)].max(axis=1) if chosen else np.zeros(len(remaining))
        best = int(np.argmax(lam * relevance[remaining] - (1.0 - lam) * redundancy))
        chosen.append(remaining.pop(best))
    return chosen


def run(spec: str, lambdas=LAMBDAS) -> dict[float, tuple[float, float]]:
    settings = Settings()
    dev = open_dev_store(spec)
    snapshot = dev.snapshot
    vectors = embed_queries(dev.dataset, dev.embedder)
    scores: dict[float, list[tuple[float, float]]] = {lam: [] for lam in lambdas}
    for qid, text in dev.dataset.queries.items():
        fused = ranked_pool(snapshot, text, vectors[qid], dev.params, settings, settings.question_alpha)
        best: dict[int, tuple[int, float]] = {}  # document -> (its best row, that row's fused score)
        for row, score in zip(fused.rows.tolist(), fused.fused.tolist()):
            best.setdefault(int(snapshot.doc_index[row]), (row, score))
            if len(best) >= DOCUMENTS:
                break
        docs = list(best)
        rows = np.array([best[d][0] for d in docs])
        fused_scores = np.array([best[d][1] for d in docs])
        phrase_decided = bool(np.any(np.diff(fused_scores) > 1e-12))  # phrase evidence reordered it: keep
        relevance = (fused_scores - fused_scores.min()) / max(float(np.ptp(fused_scores)), 1e-12)
        chunk_vectors = snapshot.embeddings[rows]
        similarity = chunk_vectors @ chunk_vectors.T
        for lam in lambdas:
            order = range(len(docs)) if lam == 1.0 or phrase_decided else mmr_order(relevance, similarity, lam)
            ranked = [dev.beir[docs[i]] for i in order]
            scores[lam].append((ndcg_at_k(ranked, dev.dataset.qrels[qid], 10), recall_at_k(ranked, dev.dataset.qrels[qid], 5)))
    out = {}
    for lam in lambdas:
        out[lam] = tuple(np.round(np.mean(scores[lam], axis=0), 4).tolist())
        print(f"  {spec}: lambda {lam:g}: nDCG@10 {out[lam][0]:.4f}  Recall@5 {out[lam][1]:.4f}", flush=True)
    snapshot.close()
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
