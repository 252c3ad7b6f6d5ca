"""Sentence evidence along its weight, on the dev sets: how much should a chunk's best sentence count?

Ranks each split's queries by a ``RankingPipeline`` - the engine's ranking, with the feedback step and
questions at ``question_alpha``, as served - with ``SentenceEvidenceStep`` at each weight (0 = off) over
the snapshot's own sentence vectors (``retrieval/sentences.py``; a store synced with
``sentence_vectors`` on has them).  The shipped ``sentence_weight`` was chosen on the train splits
from these figures (docs/EVALUATION.md, 2026-11-26).

    .venv/bin/python -m evals.experiments.sentence_evidence_experiment perl:train debian:train scifact:train \\
        perl:test debian:test scifact:test
"""

from __future__ import annotations

import sys
from dataclasses import replace

from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError
from knowledge_store.retrieval.evidence import gather_evidence
from knowledge_store.retrieval.query_form import alpha_for
from knowledge_store.retrieval.ranking import (
    PhraseOrderStep,
    RankingPipeline,
    SentenceEvidenceStep,
    VectorFeedbackStep,
)

WEIGHTS = (0.0, 0.1, 0.15, 0.2, 0.3)


def run(spec: str, weights=WEIGHTS) -> dict[float, tuple[float, float]]:
    settings = Settings()
    dev = open_dev_store(spec)
    snapshot = dev.snapshot
    if snapshot.sentence_index is None:
        raise GroundworkError(f"{spec}: the store's snapshot has no sentence vectors; sync it with "
                              "GROUNDWORK_SENTENCE_VECTORS=true first (python -c 'from knowledge_store.evaluation.beir import ingest_beir; ...')")
    vectors = embed_queries(dev.dataset, dev.embedder)
    evidence = {q: gather_evidence(snapshot, text, vectors[q]) for q, text in dev.dataset.queries.items()}
    feedback = VectorFeedbackStep.from_settings(settings)  # None when the settings turn it off
    out = {}
    for w in weights:
        steps = ((SentenceEvidenceStep(float(w)),) if w > 0 else ()) + ((feedback,) if feedback is not None else ())
        pipeline = RankingPipeline(steps + (PhraseOrderStep(),), pool=settings.candidate_pool, rrf_k=settings.rrf_k)

        def ranked(q: str, text: str, pipeline=pipeline):
            params = replace(dev.params, alpha=alpha_for(text, dev.params.alpha, settings.question_alpha, snapshot))
            return pipeline.rank(pipeline.context(text, evidence[q], params, snapshot, vectors[q], snapshot.active)).rows

        out[w] = dev.mean_scores((q, dev.ranked_docs(ranked(q, t))) for q, t in dev.dataset.queries.items())
        print(f"  {spec}: sentence weight {w:g}: nDCG@10 {out[w][0]:.4f}  Recall@5 {out[w][1]:.4f}", flush=True)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
