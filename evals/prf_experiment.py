"""Vector pseudo-relevance feedback (Rocchio) over the default ranking, measured with real labels.

Not shipped (docs/EVALUATION.md, "Why the engine lost on documentation"): the query vector
is moved towards the best chunks of the top-k documents of the default ranking and the
ranking is recomputed.  Small gains on both dev sets, but a second vector pass costs what
the 100k-chunk latency budget does not have.  Kept so the figures can be reproduced:

    .venv/bin/python -m evals.prf_experiment [scifact] [debian]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from evals.beir import beir_settings, load_beir
from evals.metrics import ndcg_at_k, recall_at_k
from evals.ranking_sweep import doc_beir_ids, embed_queries
from knowledge_store.embeddings import query_embedder
from knowledge_store.retrieval.evidence import RankingParams, gather_evidence, rank_rows
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot, load_snapshot
from knowledge_store.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DATASETS = {"scifact": (ROOT.parent / "shared" / "datasets" / "scifact", "test"),
            "debian": (ROOT / "data" / "datasets" / "debian-docs", "all")}
VARIANTS = [(0, 0.0)] + [(k, beta) for k in (3, 5, 10) for beta in (0.3, 0.6, 1.0)]


def top_document_rows(snapshot: LoadedSnapshot, rows: np.ndarray, k: int) -> list[int]:
    """The best-ranked chunk of each of the first ``k`` distinct documents."""
    seen: set[int] = set()
    out: list[int] = []
    for row in rows.tolist():
        doc = int(snapshot.doc_index[row])
        if doc not in seen:
            seen.add(doc)
            out.append(row)
            if len(out) == k:
                break
    return out


def feedback_vector(snapshot: LoadedSnapshot, query_vector: np.ndarray, rows: list[int], beta: float) -> np.ndarray:
    """Rocchio: the query vector plus ``beta`` times the centroid of ``rows``, renormalised."""
    moved = query_vector + beta * snapshot.embeddings[rows].mean(axis=0)
    return (moved / np.linalg.norm(moved)).astype(np.float32)


def run(name: str, params: RankingParams) -> dict[tuple[int, float], tuple[float, float]]:
    folder, split = DATASETS[name]
    dataset = load_beir(folder, split=split)
    settings = beir_settings(dataset, Settings().data_dir / "eval")
    snapshot = load_snapshot(settings.index_dir)
    embedder = query_embedder(settings.model_path, settings.query_encoder, Settings().data_dir / "models", 2)
    embedder.load()
    vectors = embed_queries(dataset, embedder)
    beir = doc_beir_ids(snapshot)
    scores: dict[tuple[int, float], list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for qid, text in dataset.queries.items():
        base = rank_rows(gather_evidence(snapshot, text, vectors[qid]), params, snapshot.active, 100, 60,
                         snapshot=snapshot, query=text).rows
        for k, beta in VARIANTS:
            rows = base
            if k:
                moved = feedback_vector(snapshot, vectors[qid], top_document_rows(snapshot, base, k), beta)
                rows = rank_rows(gather_evidence(snapshot, text, moved), params, snapshot.active, 100, 60,
                                 snapshot=snapshot, query=text).rows
            ranked = list(dict.fromkeys(beir[d] for d in snapshot.doc_index[rows].tolist()))
            scores[(k, beta)].append((ndcg_at_k(ranked, dataset.qrels[qid], 10), recall_at_k(ranked, dataset.qrels[qid], 5)))
    return {v: tuple(np.mean(s, axis=0).tolist()) for v, s in scores.items()}


def main(argv: list[str]) -> int:
    defaults = Settings()
    params = RankingParams(alpha=defaults.default_alpha, fusion=defaults.default_fusion,
                           section_weight=defaults.section_weight, lead_weight=defaults.lead_weight)
    for name in argv or list(DATASETS):
        started = time.perf_counter()
        result = run(name, params)
        print(f"{name} ({time.perf_counter() - started:.0f} s), {params.label}")
        for (k, beta), (ndcg, recall) in result.items():
            label = "default ranking" if not k else f"PRF top-{k} documents, beta {beta:g}"
            print(f"  {label:36s} nDCG@10 {ndcg:.4f}  Recall@5 {recall:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
