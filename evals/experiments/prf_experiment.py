"""Vector evidence measured with the real labels: pseudo-relevance feedback and mean-of-chunks vectors.

docs/EVALUATION.md ("Why the engine lost on documentation" and the 2026-11-24 section) has the
figures.  The baseline ("default ranking") is a ``RankingPipeline`` with phrase order alone (no feedback step):

- ``prf``: Rocchio - the query vector moved towards the best chunks of the top-k documents of
  the default ranking, then the whole corpus ranked again;
- ``prf-pool``: the same, but only the default ranking's fused pool re-scored with the moved vector
  and fused again - the engine's own step (``ranking.VectorFeedbackStep``, on by default since
  2026-11-24 with top-3 documents, beta 0.3);
- ``section-mean`` / ``document-mean``: each chunk's cosine (and its section lead's) blended with
  the cosine of its section's / document's mean chunk vector.

    .venv/bin/python -m evals.experiments.prf_experiment [scifact] [debian] [scifact:train] [debian:test]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from evals.experiments.dev_store import DATASETS, open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import ndcg_at_k, recall_at_k
from knowledge_store.retrieval.evidence import (
    QueryEvidence,
    first_document_rows,
    gather_evidence,
    moved_query_vector,
)
from knowledge_store.retrieval.ranking import PhraseOrderStep, RankingPipeline, VectorFeedbackStep
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot
from knowledge_store.storage.tuned import RankingParams

PRF_VARIANTS = [(k, beta) for k in (3, 5, 10) for beta in (0.3, 0.6, 1.0)]
MEAN_WEIGHTS = (0.2, 0.4, 0.6)


def mean_vectors(snapshot: LoadedSnapshot, groups: np.ndarray) -> np.ndarray:
    """The L2-normalised mean chunk vector of each group (section or document) of rows."""
    means = np.zeros((int(groups.max()) + 1, snapshot.embeddings.shape[1]), dtype=np.float32)
    np.add.at(means, groups, snapshot.embeddings)
    return means / np.linalg.norm(means, axis=1, keepdims=True)


def with_vectors(evidence: QueryEvidence, chunk: np.ndarray, lead: np.ndarray) -> QueryEvidence:
    return QueryEvidence(evidence.terms, evidence.bm25_chunk, evidence.bm25_section, evidence.coverage, chunk, lead)


def variants(snapshot: LoadedSnapshot) -> dict[str, Callable]:
    """name -> f(text, query vector, evidence, default rows) -> rows, for every variant measured."""
    group = snapshot.sections.group
    means = {"section-mean": (mean_vectors(snapshot, group), group),
             "document-mean": (mean_vectors(snapshot, snapshot.doc_index), snapshot.doc_index)}
    out: dict[str, Callable] = {"default ranking": lambda text, vector, evidence, base, rank: base}

    def prf(k: int, beta: float, pool_only: bool):
        def run(text, vector, evidence, base, rank):
            if pool_only:  # what the engine ships (ranking.VectorFeedbackStep)
                return rank(evidence, snapshot.active, VectorFeedbackStep(k, beta))
            moved = moved_query_vector(snapshot, vector, first_document_rows(snapshot, base, k), beta)
            return rank(gather_evidence(snapshot, text, moved), snapshot.active)
        return run

    def mean(name: str, weight: float):
        vectors, groups = means[name]

        def run(text, vector, evidence, base, rank):
            extra = (vectors @ vector)[groups]
            return rank(with_vectors(evidence, (1 - weight) * evidence.vector_chunk + weight * extra,
                                     (1 - weight) * evidence.vector_lead + weight * extra), snapshot.active)
        return run

    for k, beta in PRF_VARIANTS:
        out[f"PRF top-{k} documents, beta {beta:g}"] = prf(k, beta, False)
        out[f"PRF top-{k} documents, beta {beta:g}, pool only"] = prf(k, beta, True)
    for name in means:
        for weight in MEAN_WEIGHTS:
            out[f"+ {name} cosine, weight {weight:g}"] = mean(name, weight)
    return out


def run(name: str, params: RankingParams) -> dict[str, tuple[float, float]]:
    """``name``: ``scifact`` or ``debian``, optionally with ``:split`` (``evals.experiments.dev_store``)."""
    dev = open_dev_store(name)
    dataset, snapshot, beir = dev.dataset, dev.snapshot, dev.beir
    vectors = embed_queries(dataset, dev.embedder)
    measured = variants(snapshot)
    scores: dict[str, list[tuple[float, float]]] = {label: [] for label in measured}
    for qid, text in dataset.queries.items():
        def rank(evidence, mask, feedback=None, text=text, vector=vectors[qid]):
            steps = (PhraseOrderStep(),) if feedback is None else (feedback, PhraseOrderStep())
            pipeline = RankingPipeline(steps, pool=100, rrf_k=60)
            return pipeline.rank(pipeline.context(text, evidence, params, snapshot, vector, mask)).rows

        evidence = gather_evidence(snapshot, text, vectors[qid])
        base = rank(evidence, snapshot.active)
        for label, variant in measured.items():
            rows = variant(text, vectors[qid], evidence, base, rank)
            ranked = list(dict.fromkeys(beir[d] for d in snapshot.doc_index[rows].tolist()))
            scores[label].append((ndcg_at_k(ranked, dataset.qrels[qid], 10), recall_at_k(ranked, dataset.qrels[qid], 5)))
    return {label: tuple(np.mean(s, axis=0).tolist()) for label, s in scores.items()}


def main(argv: list[str]) -> int:
    from knowledge_store.retrieval.ranking_defaults import builtin_ranking

    params = builtin_ranking(Settings())
    for name in argv or list(DATASETS):
        started = time.perf_counter()
        result = run(name, params)
        print(f"{name} ({time.perf_counter() - started:.0f} s), {params.label}")
        for label, (ndcg, recall) in result.items():
            print(f"  {label:48s} nDCG@10 {ndcg:.4f}  Recall@5 {recall:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
