"""Can a query adapter be learned with no feedback at all, from the corpus's headings and titles?

Pseudo-queries as self-tuning builds them (``knowledge_store.learning.tuning.build_pseudo_queries``:
heading -> its section, title -> its document; FAQ *questions* are left out here because on the
Debian set they are the evaluation's own queries).  Each target is re-embedded without the query
text in its header (the stored vector holds the heading it would otherwise be matched on), and
the adapter is trained to pick it out of the query's nearest stored chunks.  Then the real test
queries are ranked by ``RankingPipeline`` (``adapter_eval.ranked_rows``) with and without it.

    .venv/bin/python -m evals.experiments.pseudo_adapter_experiment scifact debian
"""

from __future__ import annotations

import sys
import time

import numpy as np

from evals.experiments.adapter_eval import ranked_rows
from evals.experiments.dev_store import DATASETS, open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import ndcg_at_k, recall_at_k
from knowledge_store.learning.adapter_training import fit_matrix
from knowledge_store.learning.tuning import build_pseudo_queries, stripped_embed_texts, target_rows
from knowledge_store.retrieval.query_adapter import QueryAdapter


def stripped_target_vectors(snapshot, pq, embed) -> tuple[np.ndarray, np.ndarray]:
    """``pq``'s target rows and their vectors embedded from the header and text without the query's own words
    (``tuning.stripped_embed_texts``: the header plus text alone, no bare-vector blend)."""
    rows = target_rows(snapshot, pq)
    embed_texts, _ = stripped_embed_texts(snapshot, pq, rows)
    return rows, embed(embed_texts)


def training_tensors(snapshot, pqs, embed, nearest: int = 100, max_targets: int = 8):
    qv = embed([pq.query for pq in pqs])
    width = nearest + max_targets
    dim = snapshot.embeddings.shape[1]
    cand = np.zeros((len(pqs), width, dim), np.float32)
    valid = np.zeros((len(pqs), width), bool)
    target = np.zeros((len(pqs), width), bool)
    for i, (pq, v) in enumerate(zip(pqs, qv)):
        rows, vecs = stripped_target_vectors(snapshot, pq, embed)
        rows, vecs = rows[:max_targets], vecs[:max_targets]
        scores = snapshot.embeddings @ v
        scores[rows] = -np.inf
        near = np.argpartition(-scores, nearest)[:nearest]
        cand[i, :len(rows)] = vecs
        target[i, :len(rows)] = True
        cand[i, len(rows):len(rows) + nearest] = snapshot.embeddings[near]
        valid[i, :len(rows) + nearest] = True
    return qv, cand, valid, target


def run(name: str, limit: int, l2s: list[float]) -> None:
    dev = open_dev_store(name)  # SciFact test, Debian docs all
    test, snapshot, embedder, beir, params = dev.dataset, dev.snapshot, dev.embedder, dev.beir, dev.params
    settings = Settings()
    started = time.perf_counter()
    pqs = [q for q in build_pseudo_queries(snapshot, limit=limit) if q.kind != "question"]
    qv, cand, valid, target = training_tensors(snapshot, pqs, embedder.embed)
    kinds = {k: sum(q.kind == k for q in pqs) for k in {q.kind for q in pqs}}
    print(f"{name}: {len(pqs)} pseudo-queries {kinds}, tensors in {time.perf_counter() - started:.0f} s", flush=True)
    vectors = embed_queries(test, embedder)

    def score(adapter):
        out = []
        for qid, text in test.queries.items():
            v = vectors[qid] if adapter is None else adapter.apply(vectors[qid])
            rows = ranked_rows(snapshot, text, v, params, settings)
            ranked = list(dict.fromkeys(beir[d] for d in snapshot.doc_index[rows].tolist()))
            out.append((ndcg_at_k(ranked, test.qrels[qid], 10), recall_at_k(ranked, test.qrels[qid], 5)))
        return np.round(np.mean(out, axis=0), 4).tolist()

    print(f"  no adapter: nDCG@10 / Recall@5 {score(None)}", flush=True)
    for l2 in l2s:
        t = time.perf_counter()
        matrix = fit_matrix(qv, cand, valid, target, l2)
        print(f"  l2 {l2:g} ({time.perf_counter() - t:.0f} s, |W| {np.linalg.norm(matrix):.2f}): "
              f"{score(QueryAdapter(matrix))}", flush=True)


if __name__ == "__main__":
    names = [a for a in sys.argv[1:] if a in DATASETS]
    for n in names:
        run(n, 1000, [0.03, 0.1, 0.3, 1.0])
