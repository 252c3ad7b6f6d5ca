"""Questions and statements: which alpha (and lead weight, feedback step) suits which, on all three dev sets.

The two documentation sets' queries are FAQ questions; SciFact's are claims (statements).  For every
split this ranks each query by a ``RankingPipeline`` (the engine's ranking, phrase order included) at
alpha 0.6-0.85 x lead weight 0.6/0.8 x the feedback step on/off, and writes per-configuration means
plus, for the questions, the paired per-query difference of each alpha against 0.7 (mean and standard
error) - the evidence behind ``question_alpha`` (docs/EVALUATION.md, "Questions and statements").

    .venv/bin/python -m evals.experiments.question_alpha_experiment perl:train perl:test debian:train debian:test \\
        scifact:train scifact:test --json-out evals/results/question_alpha_grid.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import ndcg_at_k, recall_at_k
from knowledge_store.retrieval.evidence import gather_evidence
from knowledge_store.retrieval.query_form import is_question
from knowledge_store.retrieval.ranking import PhraseOrderStep, RankingPipeline, VectorFeedbackStep
from knowledge_store.storage.tuned import RankingParams

ALPHAS = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85)
LEADS = (0.6, 0.8)
REFERENCE_ALPHA = 0.7  # the alpha every query had before question_alpha


def key(alpha: float, lead: float, feedback: bool) -> str:
    return f"alpha={alpha:g} lead={lead:g} feedback={'on' if feedback else 'off'}"


def per_query_scores(spec: str) -> dict[str, dict[str, tuple[float, float]]]:
    """{configuration key: {query id: (nDCG@10, Recall@5)}} of one split."""
    settings = Settings()
    dev = open_dev_store(spec)
    vectors = embed_queries(dev.dataset, dev.embedder)
    evidence = {q: gather_evidence(dev.snapshot, text, vectors[q]) for q, text in dev.dataset.queries.items()}
    feedback_step = VectorFeedbackStep.from_settings(settings)  # None when the settings turn it off
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for alpha, lead, feedback in itertools.product(ALPHAS, LEADS, (True, False)):
        params = RankingParams(alpha, "weighted", dev.params.section_weight, lead)
        steps = (feedback_step,) if feedback and feedback_step is not None else ()
        pipeline = RankingPipeline(steps + (PhraseOrderStep(),), pool=settings.candidate_pool, rrf_k=settings.rrf_k)
        scores = {}
        for q, text in dev.dataset.queries.items():
            rows = pipeline.rank(pipeline.context(text, evidence[q], params, dev.snapshot, vectors[q],
                                                  dev.snapshot.active)).rows
            ranked = dev.ranked_docs(rows)
            scores[q] = (ndcg_at_k(ranked, dev.dataset.qrels[q], 10), recall_at_k(ranked, dev.dataset.qrels[q], 5))
        out[key(alpha, lead, feedback)] = scores
        mean = np.mean(list(scores.values()), axis=0)
        print(f"{spec} {key(alpha, lead, feedback)}: nDCG@10 {mean[0]:.4f}  Recall@5 {mean[1]:.4f}", flush=True)
    return out


def paired(scores: dict[str, dict[str, dict[str, tuple[float, float]]]], specs: list[str], alpha: float,
           queries: dict[str, set[str]]) -> dict[str, float]:
    """Mean and standard error of (alpha - REFERENCE_ALPHA) per question over ``specs`` (lead 0.6, feedback on)."""
    diffs = []
    for spec in specs:
        new, old = scores[spec][key(alpha, 0.6, True)], scores[spec][key(REFERENCE_ALPHA, 0.6, True)]
        diffs += [np.subtract(new[q], old[q]) for q in new if q in queries[spec]]
    d = np.array(diffs)
    if not len(d):
        return {}
    se = d.std(axis=0, ddof=1) / np.sqrt(len(d)) if len(d) > 1 else np.zeros(2)
    return {"questions": len(d), "ndcg@10": round(float(d[:, 0].mean()), 4), "ndcg@10_se": round(float(se[0]), 4),
            "recall@5": round(float(d[:, 1].mean()), 4), "recall@5_se": round(float(se[1]), 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help="scifact:train, perl:test, debian ...")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    scores = {spec: per_query_scores(spec) for spec in args.specs}
    questions = {}
    for spec in args.specs:
        dev_queries = open_dev_store(spec).dataset.queries
        questions[spec] = {q for q, text in dev_queries.items() if is_question(text)}
        print(f"{spec}: {len(questions[spec])} of {len(dev_queries)} queries are questions")
    means = {spec: {k: [round(float(x), 4) for x in np.mean(list(v.values()), axis=0)] for k, v in s.items()}
             for spec, s in scores.items()}
    asked = [s for s in args.specs if questions[s]]
    by_split = {split: [s for s in asked if s.endswith(f":{split}")] for split in ("train", "test")}
    contrasts = {f"alpha {a:g} - {REFERENCE_ALPHA:g}, {name}": paired(scores, specs, a, questions)
                 for a in ALPHAS if a != REFERENCE_ALPHA for name, specs in (*by_split.items(), ("all", asked)) if specs}
    for label, row in contrasts.items():
        print(label, json.dumps(row))
    if args.json_out:
        args.json_out.write_text(json.dumps({"means": means, "question_contrasts": contrasts}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
