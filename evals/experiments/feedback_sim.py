"""Does feedback learn?  Simulated thumbs from the train split, Recall@5 measured on unseen test queries.

For every *train* query the engine's top ``votes_k`` passages are rated as a
careful user would: up when the passage's document is relevant (qrels), down
otherwise.  Those ratings are the only feedback the ``feedback`` reranker sees.
Then:

- ``test``  the unseen test queries, without and with the feedback reranker;
- ``seen``  the train queries asked again (the case feedback is built for:
  repeated and near-repeated questions);
- ``overlap`` how many test queries have a relevant document that some train
  query up-voted: the ceiling of what per-passage feedback can do for them;
- ``tuning`` the other way feedback can reach unseen queries: the thumbs-up are
  gold for self-tuning (``knowledge_store.learning.tuning``, kind ``feedback``), which
  changes the corpus's ranking for every query.  The chosen configuration is
  scored on the test queries beside the built-in default and the choice made
  from pseudo-queries alone.

    .venv/bin/python -m evals.experiments.feedback_sim data/datasets/debian-docs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from knowledge_store.core.metrics import recall_at_k
from knowledge_store.evaluation.beir import BeirDataset, load_beir
from knowledge_store.evaluation.retrieval_eval import open_engine


def simulated_feedback(engine, train: BeirDataset, doc_map: dict[str, str], votes_k: int = 5) -> list[dict]:
    rows = []
    for qid, text in train.queries.items():
        response = engine.search(text, k=votes_k, min_relevance=0.0, answer="none", log=False, client="eval")
        relevant = train.qrels[qid]
        for hit in response.hits:
            good = relevant.get(doc_map.get(hit.doc_id, hit.doc_id), 0) > 0
            rows.append({"query": text, "chunk_id": hit.chunk_id, "content_hash": hit.content_hash,
                         "rating": "up" if good else "down", "doc": doc_map.get(hit.doc_id, hit.doc_id)})
    return rows


def recall5(engine, ds: BeirDataset, doc_map: dict[str, str], reranker: str) -> float:
    total = 0.0
    for qid, text in ds.queries.items():
        hits = engine.search(text, k=20, reranker=reranker, min_relevance=0.0, answer="none", log=False,
                             client="eval").hits
        ranked = list(dict.fromkeys(doc_map.get(h.doc_id, h.doc_id) for h in hits))
        total += recall_at_k(ranked, ds.qrels[qid], 5)
    return total / max(1, len(ds.queries))


def feedback_tuning(folder: Path, engine, feedback: list[dict], test: BeirDataset) -> dict:
    """Self-tune with and without the simulated thumbs as gold; score each choice on the test queries."""
    from evals.experiments.ranking_sweep import embed_queries, real_label_sweep
    from knowledge_store.learning.tuning import tune_snapshot
    from knowledge_store.retrieval.ranking_defaults import builtin_ranking
    from knowledge_store.retrieval.snapshot_reader import load_snapshot

    snapshot = load_snapshot(engine.settings.index_dir)
    embed = engine.embedder.embed
    vectors = embed_queries(test, engine.embedder)
    settings = engine.settings
    out: dict = {}
    choices = {"built-in default": builtin_ranking(settings)}
    for label, rows in (("pseudo-queries only", []), ("pseudo-queries + train thumbs", feedback),
                        ("train thumbs only", feedback)):
        limit = len({r["query"] for r in rows if r["rating"] == "up"}) if label == "train thumbs only" else 300
        tuned = tune_snapshot(snapshot, settings, embed, feedback=rows, limit=limit, min_queries=10)
        choices[label] = tuned.params
        out[f"{label}: pseudo-queries used"] = tuned.pseudo_queries
    scored = real_label_sweep(snapshot, test, vectors, list(dict.fromkeys(choices.values())))
    by_params = {(r["alpha"], r["fusion"], r["section_weight"], r["lead_weight"]): r for r in scored}
    for label, params in choices.items():
        row = by_params[(params.alpha, params.fusion, params.section_weight, params.lead_weight)]
        out[label] = {"params": params.to_dict(), "test_ndcg@10": row["ndcg@10"], "test_recall@5": row["recall@5"]}
    return out


def main(argv: list[str] | None = None) -> int:
    from knowledge_store.retrieval.rerankers import FeedbackReranker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--similarity", type=float, nargs="+", default=[0.8, 0.6])
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    train, test = load_beir(args.dataset, split="train"), load_beir(args.dataset, split="test")
    engine, doc_map = open_engine(args.dataset, ingest=False)
    feedback = simulated_feedback(engine, train, doc_map)
    up_docs = {r["doc"] for r in feedback if r["rating"] == "up"}
    overlap = sum(1 for qid in test.queries if set(d for d, g in test.qrels[qid].items() if g > 0) & up_docs)
    result = {"dataset": str(args.dataset), "train_queries": len(train.queries), "test_queries": len(test.queries),
              "votes": len(feedback), "up_votes": sum(r["rating"] == "up" for r in feedback),
              "test_queries_with_upvoted_relevant_doc": overlap,
              "test_recall@5_none": recall5(engine, test, doc_map, "none"),
              "seen_recall@5_none": recall5(engine, train, doc_map, "none"), "by_similarity": []}
    for similarity in args.similarity:
        engine._rerankers["feedback"] = FeedbackReranker(feedback_source=lambda: feedback, embed=engine.embedder.embed,
                                                         similarity=similarity, weight=engine.settings.feedback_weight)
        result["by_similarity"].append({
            "similarity": similarity,
            "test_recall@5_feedback": recall5(engine, test, doc_map, "feedback"),
            "seen_recall@5_feedback": recall5(engine, train, doc_map, "feedback"),
        })
    result["tuning"] = feedback_tuning(args.dataset, engine, feedback, test)
    print(json.dumps(result, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
