"""A document's score from its chunks: max (shipped) against alternatives, on both dev sets.

A document ranks where its best chunk ranks.  Two alternatives are measured over the default
ranking's fused candidate pool (``RankingPipeline``, feedback step included; fused scores are in
[0, 1] for weighted fusion; a query whose order phrase evidence changed keeps it):

- ``second γ``: max + γ × the document's second-best fused score (several matching passages are
  evidence; SciFact abstracts have ~2.3 chunks);
- ``length λ [over t]``: max − λ × log(max(1, chunks in the document / t)) (a prior against long
  pages, which get one ticket per chunk in the draw for the top ten).

    .venv/bin/python -m evals.experiments.doc_aggregation_experiment scifact:train debian:train scifact debian:test
"""

from __future__ import annotations

import sys

import numpy as np

from evals.experiments.adapter_eval import ranked_pool
from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings

# (label, weight of the second-best score, length prior, chunks a document may have before the prior starts)
VARIANTS = [("max", 0.0, 0.0, 1)] + [(f"second {g:g}", g, 0.0, 1) for g in (0.1, 0.2, 0.3, 0.5)] \
    + [(f"length {lam:g}", 0.0, lam, 1) for lam in (0.01, 0.02, 0.05, 0.1)] \
    + [(f"length {lam:g} over {t}", 0.0, lam, t) for t in (2, 3, 4) for lam in (0.03, 0.05, 0.08)]


def aggregate(doc_index: np.ndarray, rows: np.ndarray, fused: np.ndarray, doc_chunks: np.ndarray,
              second: float, length: float) -> list[int]:
    """Documents of the pool, best first, scored as max + second·(2nd best) − length·log(chunks)."""
    best: dict[int, list[float]] = {}
    for row, score in zip(rows.tolist(), fused.tolist()):
        best.setdefault(int(doc_index[row]), []).append(score)
    if np.any(np.diff(fused) > 0):  # phrase evidence put a pasted span's page first: keep its order
        return list(best)
    scored = {d: s[0] + second * (s[1] if len(s) > 1 else 0.0) - length * float(np.log(doc_chunks[d]))
              for d, s in best.items()}  # rows arrive best first, so s[0] >= s[1]
    return sorted(scored, key=lambda d: (-scored[d], list(best).index(d)))


def run(name: str) -> dict[str, tuple[float, float]]:
    dev = open_dev_store(name)
    dataset, snapshot, beir, params = dev.dataset, dev.snapshot, dev.beir, dev.params
    settings = Settings()
    vectors = embed_queries(dataset, dev.embedder)
    doc_chunks = np.bincount(snapshot.doc_index, minlength=len(beir)).astype(np.float64)
    pools = []
    for qid, text in dataset.queries.items():
        pools.append((qid, ranked_pool(snapshot, text, vectors[qid], params, settings)))
    out = {}
    for label, second, length, threshold in VARIANTS:
        prior_chunks = np.maximum(1.0, doc_chunks / threshold)
        out[label] = dev.mean_scores(
            (qid, [beir[d] for d in aggregate(snapshot.doc_index, fused.rows, fused.fused, prior_chunks, second, length)])
            for qid, fused in pools)
        print(f"  {name}: {label}: nDCG@10 {out[label][0]:.4f}  Recall@5 {out[label][1]:.4f}", flush=True)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
