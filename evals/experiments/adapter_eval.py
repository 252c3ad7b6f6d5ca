"""Does a query adapter learned from feedback lift unseen queries?  Measured with the real labels.

For every *train* query the default ranking's top five passages are rated as a careful user
would (up when the passage's document is relevant, down otherwise) - the same simulation as
``evals.experiments.feedback_sim``.  ``knowledge_store.learning.adapter_training.train_query_adapter`` learns
from those thumbs alone (its own held-out check decides whether to adopt), then the unseen *test*
queries are ranked by ``RankingPipeline`` (the engine's ranking, feedback step included) with and
without the adapter.  A second source of gold is measured beside it: the train split's labels
themselves (a labelled set a user imports as thumbs, one up-vote on the best chunk of each
relevant document).

The test queries are also split by whether some train query's relevant document is relevant to
them too ("answers rated before") or not ("new answers"): gains on the second group are what
the adapter generalises; gains on the first are feedback remembering useful passages.

    .venv/bin/python -m evals.experiments.adapter_eval scifact debian --json-out evals/results/query_adapter.json
    .venv/bin/python -m evals.experiments.adapter_eval --transfer-from perl debian:train debian:test scifact:train

``--transfer-from SET`` asks whether an adapter is the corpus's or the model's: it learns one from all of
SET's labels (at each L2 of the grid, no held-out check) and ranks the named splits of the *other* sets
with and without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from evals.experiments.dev_store import DATASETS, open_dev_store
from evals.experiments.ranking_sweep import embed_queries
from knowledge_store.config.settings import Settings
from knowledge_store.core.metrics import ndcg_at_k, recall_at_k
from knowledge_store.evaluation.beir import BeirDataset
from knowledge_store.learning.adapter_training import L2_GRID, fit_adapter, rated_queries, train_query_adapter
from knowledge_store.retrieval.evidence import gather_evidence
from knowledge_store.retrieval.fusion import Fused
from knowledge_store.retrieval.query_adapter import QueryAdapter
from knowledge_store.retrieval.query_form import alpha_for
from knowledge_store.retrieval.ranking import PhraseOrderStep, RankingPipeline
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot
from knowledge_store.storage.tuned import RankingParams


def served_pipeline(settings: Settings) -> RankingPipeline:
    """The default path's ranking under ``settings``: sentence evidence and the feedback step as the settings turn
    them on, then phrase order (whatever ``settings.phrase_boost`` says); no entity boost."""
    served = RankingPipeline.served(settings, only=("sentences", "feedback"))
    return replace(served, steps=served.steps + (PhraseOrderStep(),))


def ranked_pool(snapshot: LoadedSnapshot, text: str, vector: np.ndarray, params: RankingParams,
                settings: Settings, question_alpha: float | None = None) -> Fused:
    """The default path's fused candidate pool for one query (sentence evidence and the feedback step included),
    best first; with ``question_alpha`` a question ranks at that alpha, as the engine serves it."""
    params = replace(params, alpha=alpha_for(text, params.alpha, question_alpha, snapshot))
    pipeline = served_pipeline(settings)
    return pipeline.rank(pipeline.context(text, gather_evidence(snapshot, text, vector), params, snapshot, vector,
                                          snapshot.active))


def ranked_rows(snapshot: LoadedSnapshot, text: str, vector: np.ndarray, params: RankingParams,
                settings: Settings, question_alpha: float | None = None) -> np.ndarray:
    return ranked_pool(snapshot, text, vector, params, settings, question_alpha).rows


def thumbs_from_top5(snapshot, train: BeirDataset, vectors, params, settings, beir: list[str]) -> list[dict]:
    """A careful user's votes on the default ranking's first five passages of every train query."""
    rows = []
    for qid, text in train.queries.items():
        for row in ranked_rows(snapshot, text, vectors[qid], params, settings, settings.question_alpha)[:5].tolist():
            good = train.qrels[qid].get(beir[snapshot.doc_index[row]], 0) > 0
            rows.append({"query": text, "chunk_id": snapshot.chunk_ids[row], "rating": "up" if good else "down"})
    return rows


def thumbs_from_labels(snapshot, train: BeirDataset, vectors, beir: list[str]) -> list[dict]:
    """The train labels as up-votes: each relevant document's chunk nearest to the query."""
    rows_of: dict[str, list[int]] = {}
    for row, doc in enumerate(snapshot.doc_index.tolist()):
        rows_of.setdefault(beir[doc], []).append(row)
    out = []
    for qid, text in train.queries.items():
        for doc, grade in train.qrels[qid].items():
            if grade <= 0 or doc not in rows_of:
                continue
            rows = np.array(rows_of[doc])
            best = int(rows[np.argmax(snapshot.embeddings[rows] @ vectors[qid])])
            out.append({"query": text, "chunk_id": snapshot.chunk_ids[best], "rating": "up"})
    return out


def score(snapshot, test: BeirDataset, vectors, params, settings, beir, adapter: QueryAdapter | None,
          seen_docs: set[str]) -> dict:
    per = []
    for qid, text in test.queries.items():
        vector = vectors[qid] if adapter is None else adapter.apply(vectors[qid])
        rows = ranked_rows(snapshot, text, vector, params, settings, settings.question_alpha)
        ranked = list(dict.fromkeys(beir[d] for d in snapshot.doc_index[rows].tolist()))
        relevant = test.qrels[qid]
        per.append((ndcg_at_k(ranked, relevant, 10), recall_at_k(ranked, relevant, 5),
                    any(d in seen_docs for d, g in relevant.items() if g > 0)))
    arr = np.array(per, dtype=float)
    seen = arr[:, 2] > 0

    def mean(mask):
        return {"queries": int(mask.sum()), "ndcg@10": round(float(arr[mask, 0].mean()), 4) if mask.any() else None,
                "recall@5": round(float(arr[mask, 1].mean()), 4) if mask.any() else None}

    return {"all": mean(np.ones(len(arr), bool)), "answers rated before": mean(seen), "new answers": mean(~seen)}


def run(name: str) -> dict:
    dev = open_dev_store(f"{name}:test")
    test, train = dev.dataset, dev.split("train")
    settings = Settings()
    snapshot, embedder, beir, params = dev.snapshot, dev.embedder, dev.beir, dev.params
    train_vectors, test_vectors = embed_queries(train, embedder), embed_queries(test, embedder)
    out: dict = {"dataset": name, "train_queries": len(train.queries), "test_queries": len(test.queries),
                 "ranking": params.to_dict(), "question_alpha": settings.question_alpha}
    sources = {"thumbs on the top 5 of train queries": thumbs_from_top5(snapshot, train, train_vectors, params,
                                                                        settings, beir),
               "train labels as thumbs": thumbs_from_labels(snapshot, train, train_vectors, beir)}
    chunk_doc = {c: beir[snapshot.doc_index[r]] for c, r in snapshot.row_of.items()}
    for label, feedback in sources.items():
        up = [r for r in feedback if r["rating"] == "up"]
        seen_docs = {chunk_doc[r["chunk_id"]] for r in up}
        started = time.perf_counter()
        training = train_query_adapter(snapshot, settings, feedback, embedder.embed, params,
                                       question_alpha=settings.question_alpha)
        entry = {"votes": len(feedback), "up_votes": len(up), "training": training.to_dict(),
                 "train_seconds": round(time.perf_counter() - started, 1),
                 "test without adapter": score(snapshot, test, test_vectors, params, settings, beir, None, seen_docs)}
        if training.adapter is not None:
            entry["test with adapter"] = score(snapshot, test, test_vectors, params, settings, beir,
                                               training.adapter, seen_docs)
        out[label] = entry
        print(json.dumps({label: entry}, indent=1), flush=True)
    snapshot.close()
    return out


def transfer(source: str, targets: list[str]) -> dict:
    """Adapters learned from every label of ``source``, applied to the splits ``targets`` of other sets."""
    settings = Settings()
    src = open_dev_store(f"{source}:all")
    vectors = embed_queries(src.dataset, src.embedder)
    rated = rated_queries(src.snapshot, thumbs_from_labels(src.snapshot, src.dataset, vectors, src.beir), src.embedder.embed)
    matrices = {l2: fit_adapter(src.snapshot, rated, l2) for l2 in L2_GRID}
    src.snapshot.close()
    out: dict = {"source": source, "rated_queries": len(rated), "targets": {}}
    for spec in targets:
        if spec.partition(":")[0] == source:
            raise SystemExit(f"--transfer-from {source}: {spec} is the same set; name another set's split")
        dev = open_dev_store(spec)
        target_vectors = embed_queries(dev.dataset, dev.embedder)
        rows = {"without": score(dev.snapshot, dev.dataset, target_vectors, dev.params, settings, dev.beir, None, set())["all"]}
        for l2, matrix in matrices.items():
            rows[f"{source} adapter, l2 {l2:g}"] = score(dev.snapshot, dev.dataset, target_vectors, dev.params, settings,
                                                        dev.beir, QueryAdapter(matrix), set())["all"]
        dev.snapshot.close()
        out["targets"][spec] = rows
        print(json.dumps({spec: rows}, indent=1), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+", help=f"sets ({', '.join(sorted(DATASETS))}); with --transfer-from, "
                                                    "splits of other sets (debian:test ...)")
    parser.add_argument("--transfer-from", choices=sorted(DATASETS))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    unknown = [d for d in args.datasets if d.partition(":")[0] not in DATASETS]
    if unknown:
        parser.error(f"unknown set(s) {unknown}: choose from {sorted(DATASETS)}")
    if not args.transfer_from and any(":" in d for d in args.datasets):
        parser.error("name whole sets (train feedback, test queries); splits are for --transfer-from")
    if args.transfer_from:
        results = transfer(args.transfer_from, args.datasets)
        if args.json_out:
            args.json_out.write_text(json.dumps(results, indent=2))
        return 0
    results = [run(name) for name in args.datasets]
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
