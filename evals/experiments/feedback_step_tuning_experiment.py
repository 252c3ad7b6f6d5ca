"""Could self-tuning decide the feedback step per corpus?  Pseudo-queries against the real labels.

The feedback step (``ranking.VectorFeedbackStep``) wins on SciFact and the Debian docs set and loses on
the Perl docs set (docs/EVALUATION.md, 2026-11-26), so a per-corpus switch would help, if the
corpus's own pseudo-queries could tell which way it goes.  For each store this ranks the same 300
pseudo-queries self-tuning draws (``tuning.build_pseudo_queries``) at the built-in ranking with and
without the step; the targets are scored without the query text as in tuning, and for the step's
second pass their vectors are the re-embedded ones too (``tuning.stripped_vectors``), so the step
cannot find a target through the title its query was made from.  The real-label effect is in
``evals/results/question_alpha_grid.json``.

    .venv/bin/python -m evals.experiments.feedback_step_tuning_experiment perl debian scifact
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

from evals.experiments.dev_store import open_dev_store
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import ndcg_at_k
from knowledge_store.learning.tuning import (
    TermCounter,
    build_pseudo_queries,
    strip_query_from_targets,
    stripped_vectors,
    target_rows,
    units_of,
)
from knowledge_store.retrieval.evidence import gather_evidence
from knowledge_store.retrieval.query_form import alpha_for
from knowledge_store.retrieval.ranking import PhraseOrderStep, RankingPipeline, VectorFeedbackStep


def run(spec: str) -> dict[str, float]:
    settings = Settings()
    dev = open_dev_store(spec)
    snapshot = dev.snapshot
    queries = build_pseudo_queries(snapshot, limit=300)
    vectors = dev.embedder.embed([q.query for q in queries])
    counter = TermCounter(snapshot)
    plain_pipeline = RankingPipeline((PhraseOrderStep(),), pool=settings.candidate_pool, rrf_k=settings.rrf_k)
    feedback = VectorFeedbackStep.from_settings(settings)  # None when the settings turn it off
    stepped_pipeline = RankingPipeline(((feedback,) if feedback is not None else ()) + (PhraseOrderStep(),),
                                       pool=settings.candidate_pool, rrf_k=settings.rrf_k)
    without, with_step = [], []
    for pq, qv in zip(queries, vectors):
        rows = target_rows(snapshot, pq)
        stripped = stripped_vectors(snapshot, pq, rows, dev.embedder.embed) if pq.strip_field and len(rows) else None
        evidence = strip_query_from_targets(snapshot, pq, gather_evidence(snapshot, pq.query, qv), dev.embedder.embed,
                                            counter, qv, vectors=stripped)
        params = replace(dev.params, alpha=alpha_for(pq.query, dev.params.alpha, settings.question_alpha, snapshot))
        plain = plain_pipeline.rank(plain_pipeline.context(pq.query, evidence, params, snapshot, qv,
                                                           snapshot.active)).rows
        # the step's second pass sees the targets without the query text too (``evidence.replaced``)
        stepped = stepped_pipeline.rank(stepped_pipeline.context(pq.query, evidence, params, snapshot, qv,
                                                                 snapshot.active)).rows
        without.append(ndcg_at_k(units_of(snapshot, plain, pq.unit), pq.targets, 10))
        with_step.append(ndcg_at_k(units_of(snapshot, stepped, pq.unit), pq.targets, 10))
    diff = np.array(with_step) - np.array(without)
    out = {"pseudo_queries": len(queries), "ndcg@10 without": round(float(np.mean(without)), 4),
           "ndcg@10 with the step": round(float(np.mean(with_step)), 4), "gain": round(float(diff.mean()), 4),
           "standard_error": round(float(diff.std(ddof=1) / np.sqrt(len(diff))), 4)}
    print(spec, out, flush=True)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
