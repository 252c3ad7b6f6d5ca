"""The fine-tuned candidate through the engine on a labelled set, whatever the decision was.

`groundwork eval` follows the product's path: it reports the fine-tuned model only when it was adopted.  To
check the adoption rule itself (does it decline models that would help, or adopt ones that hurt?) this runs
both models over the same store that `groundwork eval DATASET --split SPLIT` built and fine-tuned: the base
model's vectors and the candidate's (re-embedded into the store when a declined run dropped them), each as an
unpublished copy of the served chunks, through `RetrievalEngine` with the corpus's effective ranking.

    .venv/bin/python evals/experiments/finetune_eval.py data/datasets/perl-docs all [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from knowledge_store.config.settings import Settings
from knowledge_store.evaluation.beir import beir_ids_by_doc_id, beir_settings, load_beir
from knowledge_store.evaluation.retrieval_eval import EvalConfig, NullQueryLog, evaluate
from knowledge_store.learning.finetune import base_index, index_copy
from knowledge_store.models.serving import load_record
from knowledge_store.retrieval.engine import RetrievalEngine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("split")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    dataset = load_beir(args.dataset, split=args.split)
    settings = beir_settings(dataset, Settings().data_dir / "eval")
    record = load_record(settings.index_dir)
    if record is None or not record.decision or not record.decision.get("model_path"):
        print(f"no fine-tuning decision with a model in {settings.index_dir}: run `groundwork eval` first", file=sys.stderr)
        return 2
    decision = record.decision
    doc_map = beir_ids_by_doc_id(settings)
    rows = {}
    for label, make in (("base", lambda: base_index(settings)),
                        ("fine-tuned", lambda: index_copy(settings, Path(decision["model_path"]),
                                                          Path(settings.data_dir) / "index-candidate"))):
        started = time.perf_counter()
        folder = make()
        engine = RetrievalEngine(settings, query_log=NullQueryLog(), snapshot_dir=folder)
        defaults = engine.ranking_defaults()
        result = evaluate(engine, dataset, EvalConfig(alpha=None, fusion=defaults.fusion,
                                                      reranker=engine.default_reranker()), doc_map)
        rows[label] = {"model_id": engine.snapshots.current().info.model_id, "ndcg@10": result.metrics["ndcg@10"],
                       "recall@5": result.metrics["recall@5"], "queries": result.queries,
                       "seconds": round(time.perf_counter() - started, 1)}
        print(f"{label:10s} {rows[label]['model_id']}: nDCG@10 {rows[label]['ndcg@10']:.4f}  "
              f"Recall@5 {rows[label]['recall@5']:.4f}")
    report = {"dataset": dataset.name, "split": args.split,
              "decision": {k: decision.get(k) for k in ("decision", "reason", "gain", "standard_error", "required",
                                                          "pairs", "held_out", "seconds", "seconds_by_stage",
                                                          "before", "after", "training")}, **rows}
    print(f"decision: {decision['reason']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
