"""Can a query's own scores tell which alpha suits it?  Per-query alpha from query-time features.

Every query of each split is ranked as served (``RankingPipeline`` with sentence evidence and the feedback
step) at alpha 0.3 ... 1.0, which gives the headroom: the mean over queries of the best alpha for each
query (the "oracle") against one alpha for all.  Then a one-feature rule is chosen on the three *train*
splits together. The rule moves the served alpha (0.8 for questions, 0.7 otherwise) by -0.2 ... +0.2
on one side of a threshold. It is chosen by its worst per-set gain, and also by its mean gain, and then
scored on the test splits.  The features are known at query time: the top cosine, cosine top-1 minus
top-10, top BM25 over the query's idf mass, BM25 (top-1 minus top-10) over top-1, the share of query
terms in the vocabulary, and the word count.

    .venv/bin/python -m evals.experiments.query_alpha_prediction_experiment
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import replace

import numpy as np

from evals.experiments.adapter_eval import served_pipeline
from evals.experiments.dev_store import open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import ndcg_at_k, recall_at_k
from knowledge_store.retrieval.evidence import gather_evidence
from knowledge_store.retrieval.query_form import is_question

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
FEATURES = ("top cosine", "cosine gap 1-10", "top BM25 / idf mass", "BM25 gap 1-10 (relative)", "known terms", "words")
SETS = ("debian", "perl", "scifact")


def measure(spec: str) -> dict[str, np.ndarray]:
    """Per query: nDCG@10 and Recall@5 at every alpha, the features, and whether it is a question."""
    settings = Settings()
    dev = open_dev_store(spec)
    snapshot = dev.snapshot
    vectors = embed_queries(dev.dataset, dev.embedder)
    n = len(dev.dataset.queries)
    ndcg, recall = np.zeros((n, len(ALPHAS))), np.zeros((n, len(ALPHAS)))
    features, question = np.zeros((n, len(FEATURES))), np.zeros(n, dtype=bool)
    pipeline = served_pipeline(settings)
    for j, (qid, text) in enumerate(dev.dataset.queries.items()):
        evidence = gather_evidence(snapshot, text, vectors[qid])
        cosines = np.sort(evidence.vector(dev.params.lead_weight))[::-1]
        bm25 = np.sort(evidence.bm25(dev.params.section_weight))[::-1]
        terms = evidence.terms
        features[j] = (cosines[0], cosines[0] - cosines[9], bm25[0] / max(terms.total_weight, 1e-9),
                       (bm25[0] - bm25[9]) / max(bm25[0], 1e-9),
                       len(terms.known) / max(1, len(terms.known) + len(terms.unknown)), len(text.split()))
        question[j] = is_question(text)
        for i, alpha in enumerate(ALPHAS):
            # a fresh context per alpha: phrase scores are not shared between alphas (as before the pipeline)
            rows = pipeline.rank(pipeline.context(text, evidence, replace(dev.params, alpha=alpha), snapshot,
                                                  vectors[qid], snapshot.active)).rows
            ranked = dev.ranked_docs(rows)
            ndcg[j, i] = ndcg_at_k(ranked, dev.dataset.qrels[qid], 10)
            recall[j, i] = recall_at_k(ranked, dev.dataset.qrels[qid], 5)
    snapshot.close()
    return {"ndcg": ndcg, "recall": recall, "features": features, "question": question}


def served_index(split: dict[str, np.ndarray]) -> np.ndarray:
    return np.where(split["question"], ALPHAS.index(0.8), ALPHAS.index(0.7))


def rule_gain(splits: dict[str, dict], feature: int, threshold: float, below: int, above: int) -> np.ndarray:
    """(sets, 2): the rule's nDCG@10 and Recall@5 gain over the served alpha on each split."""
    out = []
    for split in splits.values():
        served = served_index(split)
        moved = np.clip(served + np.where(split["features"][:, feature] < threshold, below, above), 0, len(ALPHAS) - 1)
        rows = np.arange(len(served))
        out.append([split[m][rows, moved].mean() - split[m][rows, served].mean() for m in ("ndcg", "recall")])
    return np.array(out)


def main() -> int:
    train = {name: measure(f"{name}:train") for name in SETS}
    test = {name: measure(f"{name}:test") for name in SETS}
    report: dict = {"headroom": {}, "rules": {}}
    for label, splits in (("train", train), ("test", test)):
        for name, split in splits.items():
            served = split["ndcg"][np.arange(len(split["ndcg"])), served_index(split)].mean()
            row = {"served": round(float(served), 4), "oracle": round(float(split["ndcg"].max(axis=1).mean()), 4),
                   "by_alpha": dict(zip(map(str, ALPHAS), np.round(split["ndcg"].mean(axis=0), 4).tolist()))}
            report["headroom"][f"{name}:{label}"] = row
            print(f"{name}:{label}: served {row['served']:.4f}  per-query oracle {row['oracle']:.4f}  {row['by_alpha']}")
    candidates = []
    for feature in range(len(FEATURES)):
        values = np.concatenate([train[name]["features"][:, feature] for name in SETS])
        for threshold in np.unique(np.quantile(values, np.linspace(0.1, 0.9, 17))):
            for below, above in itertools.product((-2, -1, 0, 1, 2), repeat=2):
                if below or above:
                    gain = rule_gain(train, feature, float(threshold), below, above)[:, 0]
                    candidates.append((float(gain.min()), float(gain.mean()), feature, float(threshold), below, above))
    for criterion, key in (("worst train set", lambda c: (c[0], c[1])), ("mean over train sets", lambda c: (c[1], c[0]))):
        worst, mean, feature, threshold, below, above = max(candidates, key=key)
        held = rule_gain(test, feature, threshold, below, above)
        rule = (f"{FEATURES[feature]} < {threshold:.3f}: alpha {below * 0.1:+.1f}, else {above * 0.1:+.1f}")
        report["rules"][criterion] = {"rule": rule, "train_gain_worst": round(worst, 4), "train_gain_mean": round(mean, 4),
                                      "test_ndcg_gain": dict(zip(SETS, np.round(held[:, 0], 4).tolist())),
                                      "test_recall_gain": dict(zip(SETS, np.round(held[:, 1], 4).tolist()))}
        print(f"best by {criterion}: {rule} | train worst {worst:+.4f} mean {mean:+.4f} | test nDCG@10 "
              f"{np.round(held[:, 0], 4).tolist()} Recall@5 {np.round(held[:, 1], 4).tolist()} ({', '.join(SETS)})")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            json.dump(report, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
