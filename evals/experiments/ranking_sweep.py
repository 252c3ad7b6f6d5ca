"""Sweep ranking configurations on a BEIR dataset with its real labels, fast.

Ranks with ``knowledge_store.retrieval.ranking.RankingPipeline`` - the ranking the
engine serves with - straight over the dataset's published snapshot, so a
grid of a few hundred configurations costs one query embedding per query plus
a few milliseconds per (query, configuration).  ``knowledge_store.evaluation.retrieval_eval`` runs
the full ``engine.search`` path for the configurations reported in
docs/EVALUATION.md; this module is for choosing them, and for checking the
self-tuned choice against the one the real labels would make.

    .venv/bin/python -m evals.experiments.ranking_sweep data/datasets/debian-docs --split test
    .venv/bin/python -m evals.experiments.ranking_sweep ../shared/datasets/scifact --split train --tune
    .venv/bin/python -m evals.experiments.ranking_sweep data/datasets/perl-docs --split all --tune --served

``--served`` ranks every grid point with the steps the engine serves with (sentence evidence and
the feedback step, the settings' defaults); without it the grid is ranked without them, as
self-tuning scores it.  Either way a grid point's alpha applies to every query, questions too, so
the real labels choose the questions' alpha as well; the self-tuned choice is then scored as served
(questions at ``question_alpha``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from knowledge_store.core.metrics import ndcg_at_k, recall_at_k
from knowledge_store.evaluation.beir import BeirDataset, beir_settings, chunk_to_beir_id, load_beir
from knowledge_store.retrieval.evidence import gather_evidence
from knowledge_store.retrieval.query_form import alpha_for
from knowledge_store.retrieval.ranking import PhraseOrderStep, RankingPipeline
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot, load_snapshot
from knowledge_store.storage.tuned import RankingParams


def doc_beir_ids(snapshot: LoadedSnapshot) -> list[str]:
    """BEIR ``_id`` per document index of the snapshot."""
    return [chunk_to_beir_id(d["metadata"]) for d in snapshot.documents]


def real_label_sweep(snapshot: LoadedSnapshot, dataset: BeirDataset, query_vectors: dict[str, np.ndarray],
                     grid: list[RankingParams], pool: int = 100, rrf_k: int = 60, phrase: bool = True,
                     question_alpha: float | None = None, served_by=None) -> list[dict]:
    """Mean nDCG@10 / Recall@5 per configuration over ``dataset``'s queries, best first.

    ``question_alpha`` ranks question-form queries at that alpha whatever the configuration's, as the
    engine serves them (``query_form.py``); None = every query at the configuration's alpha.
    ``served_by`` (a Settings) adds the steps the engine serves with under those settings: sentence
    evidence and the feedback step.
    """
    beir = doc_beir_ids(snapshot)
    ndcg = np.zeros((len(grid), len(dataset.queries)))
    recall = np.zeros_like(ndcg)
    served = () if served_by is None else RankingPipeline.served(served_by, only=("sentences", "feedback")).steps
    # phrase order whatever the settings' phrase_boost: ``phrase`` decides it here
    pipeline = RankingPipeline(served + ((PhraseOrderStep(),) if phrase else ()), pool=pool, rrf_k=rrf_k)
    for j, (qid, text) in enumerate(dataset.queries.items()):
        evidence = gather_evidence(snapshot, text, query_vectors[qid])
        relevant = dataset.qrels[qid]
        # one context per query, its caches (phrase scores, best-sentence cosines) shared by the grid
        context = pipeline.context(text, evidence, grid[0] if grid else RankingParams(), snapshot, query_vectors[qid],
                                   snapshot.active, shared_caches=True)
        for i, params in enumerate(grid):
            params = replace(params, alpha=alpha_for(text, params.alpha, question_alpha, snapshot))
            rows = pipeline.rank(context.for_params(params)).rows
            ranked = list(dict.fromkeys(beir[d] for d in snapshot.doc_index[rows].tolist()))
            ndcg[i, j] = ndcg_at_k(ranked, relevant, 10)
            recall[i, j] = recall_at_k(ranked, relevant, 5)
    out = [{**p.to_dict(), "ndcg@10": float(ndcg[i].mean()), "recall@5": float(recall[i].mean())}
           for i, p in enumerate(grid)]
    out.sort(key=lambda r: (-r["ndcg@10"], -r["recall@5"]))
    return out


def embed_queries(dataset: BeirDataset, embedder) -> dict[str, np.ndarray]:
    ids = list(dataset.queries)
    vectors = embedder.embed([dataset.queries[i] for i in ids])
    return dict(zip(ids, vectors))


def main(argv: list[str] | None = None) -> int:
    from knowledge_store.config.settings import Settings
    from knowledge_store.learning.tuning import default_grid, tune_snapshot
    from knowledge_store.models.embeddings import settings_query_embedder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--tune", action="store_true", help="also self-tune on the corpus and compare the choices")
    parser.add_argument("--served", action="store_true",
                        help="rank every grid point as served: questions at question_alpha, sentence evidence, feedback step")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    dataset = load_beir(args.dataset, split=args.split)
    settings = beir_settings(dataset, Settings().data_dir / "eval")
    snapshot = load_snapshot(settings.index_dir)
    embedder = settings_query_embedder(settings, threads=2)  # as the server embeds queries (its quantised graph)
    vectors = embed_queries(dataset, embedder)
    grid = default_grid()
    started = time.perf_counter()
    served_by = Settings() if args.served else None  # the grid's alpha applies to every query, questions too
    rows = real_label_sweep(snapshot, dataset, vectors, grid, served_by=served_by)
    print(f"{len(grid)} configurations x {len(dataset.queries)} queries in {time.perf_counter() - started:.1f}s")
    for row in rows[:10]:
        print(json.dumps(row))
    result: dict = {"dataset": str(args.dataset), "split": args.split, "served": args.served, "rows": rows}
    if args.tune:
        tuned = tune_snapshot(snapshot, settings, embedder.embed)
        keys = ("alpha", "fusion", "section_weight", "lead_weight")
        chosen = next(r for r in rows if RankingParams(**{k: r[k] for k in keys}) == tuned.params)
        # the pseudo-label argmax itself (before the "keep the built-in unless clearly better" rule)
        top = RankingParams(**{k: tuned.table[0][k] for k in keys})
        argmax = next(r for r in rows if RankingParams(**{k: r[k] for k in keys}) == top)
        # the choice as the engine serves it: questions at the question alpha (the grid gives every query one alpha)
        served = real_label_sweep(snapshot, dataset, vectors, [tuned.params], question_alpha=Settings().question_alpha,
                                  served_by=served_by)[0]
        result["tuned"] = {"params": tuned.params.to_dict(), "pseudo_queries": tuned.pseudo_queries,
                           "real_ndcg@10": chosen["ndcg@10"], "real_recall@5": chosen["recall@5"],
                           "best_real": rows[0], "gap": rows[0]["ndcg@10"] - chosen["ndcg@10"],
                           "pseudo_argmax": {"params": top.to_dict(), "pseudo_ndcg@10": tuned.table[0]["ndcg@10"],
                                             "real_ndcg@10": argmax["ndcg@10"], "real_recall@5": argmax["recall@5"],
                                             "gap": rows[0]["ndcg@10"] - argmax["ndcg@10"]},
                           "served": {"question_alpha": settings.question_alpha, "real_ndcg@10": served["ndcg@10"],
                                      "real_recall@5": served["recall@5"], "gap": rows[0]["ndcg@10"] - served["ndcg@10"]},
                           "seconds": tuned.seconds, "pseudo_after": tuned.after, "pseudo_before": tuned.before,
                           "decision": tuned.decision}
        print(json.dumps(result["tuned"], indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
