"""BM25's k1 and b (chunk and section BM25 alike) swept through ``RankingPipeline`` on the dev sets.

The snapshot reader scores with the fts formula's constants (``snapshot_reader.BM25_K1`` / ``BM25_B``,
1.2 / 0.75); this re-derives the per-posting length norms for each pair and ranks every query of the
split with the default ranking and the feedback step.

    .venv/bin/python -m evals.experiments.bm25_params_experiment debian:train scifact:train
"""

from __future__ import annotations

import sys

import numpy as np

import knowledge_store.retrieval.snapshot_reader as reader
from evals.experiments.adapter_eval import ranked_rows
from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings

K1 = (0.9, 1.2, 1.6)
B = (0.4, 0.6, 0.75, 0.9)


def run(name: str) -> None:
    dev = open_dev_store(name)
    dataset, snapshot, params = dev.dataset, dev.snapshot, dev.params
    vectors = embed_queries(dataset, dev.embedder)
    settings = Settings()
    defaults = reader.BM25_K1, reader.BM25_B
    try:
        for k1 in K1:
            for b in B:
                reader.BM25_K1, reader.BM25_B = k1, b
                snapshot.post_norm = reader.bm25_norm(snapshot.doc_len[snapshot.post_rows], snapshot.avgdl).astype(np.float32)
                sections = snapshot.sections
                sections.post_norm = reader.bm25_norm(sections.length[sections.post_groups], sections.avgdl).astype(np.float32)
                ndcg, recall = dev.mean_scores((qid, dev.ranked_docs(ranked_rows(snapshot, text, vectors[qid], params, settings)))
                                               for qid, text in dataset.queries.items())
                print(f"{name:14s} k1 {k1:g} b {b:g}  nDCG@10 {ndcg:.4f}  Recall@5 {recall:.4f}", flush=True)
    finally:
        reader.BM25_K1, reader.BM25_B = defaults


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
