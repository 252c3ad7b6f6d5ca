"""One dataset split, every configuration a reader of docs/EVALUATION.md needs, in one run.

Through the real engine (``engine.search``, as served): the shipped default, its
single methods, the alpha sweep at the default aggregation, each fusion mode,
the previous default (alpha 0.5, chunk evidence only) and each ingredient on
its own; beside them the plain pipelines of ``knowledge_store.evaluation.baselines`` (same run, same
queries), with the default's ratio to the best plain pipeline.

    .venv/bin/python -m evals.experiments.quality_report data/datasets/debian-docs --split test --json-out evals/results/debian_test.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from knowledge_store.evaluation.baselines import evaluate_plain, plain_label, plain_scores
from knowledge_store.evaluation.beir import load_beir
from knowledge_store.evaluation.retrieval_eval import EvalConfig, evaluate, open_engine
from knowledge_store.retrieval.fusion import FUSION_REGISTRY


def configurations(settings) -> list[tuple[str, EvalConfig]]:
    a, s, lw = settings.default_alpha, settings.section_weight, settings.lead_weight

    def config(alpha: float | None, fusion: str, section_weight: float, lead_weight: float) -> EvalConfig:
        return EvalConfig(alpha=alpha, fusion=fusion, section_weight=section_weight, lead_weight=lead_weight)

    return [
        # alpha None: the engine's per-query default (questions at question_alpha, everything else at alpha)
        ("default", config(None, settings.default_fusion, s, lw)),
        (f"every query at alpha {a:g} (no question alpha)", config(a, settings.default_fusion, s, lw)),
        ("BM25 only (section-aware)", config(0.0, "weighted", s, lw)),
        ("vector only (section-aware)", config(1.0, "weighted", s, lw)),
        *((f"alpha {x:g}", config(x, "weighted", s, lw)) for x in (0.5, 0.6, 0.8, 0.9)),
        # every other registered fusion mode, at its textbook alpha (rrf: 0.5) or the default alpha
        *((name, config(a if mode.textbook_alpha is None else mode.textbook_alpha, name, s, lw))
          for name, mode in FUSION_REGISTRY.items() if name != "weighted"),
        ("previous default (alpha 0.5, chunk evidence)", config(0.5, "weighted", 0.0, 0.0)),
        ("chunk evidence, alpha 0.7", config(a, "weighted", 0.0, 0.0)),
        ("+ section BM25 only", config(a, "weighted", s, 0.0)),
        ("+ section lead only", config(a, "weighted", 0.0, lw)),
        ("BM25 only (chunk)", config(0.0, "weighted", 0.0, 0.0)),
        ("vector only (chunk)", config(1.0, "weighted", 0.0, 0.0)),
    ]


def main(argv: list[str] | None = None) -> int:
    from knowledge_store.config.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    dataset = load_beir(args.dataset, split=args.split)
    # built-in defaults only: an eval store's own tuned.json must not change what "default" means here
    engine, doc_map = open_engine(args.dataset, ingest=False, use_tuned_ranking=False)
    rows = []
    for name, config in configurations(engine.settings):
        result = evaluate(engine, dataset, config, doc_map)
        row = {"name": name, **result.row()}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("name", "recall@5", "ndcg@10", "latency_p50_ms", "latency_p95_ms")}), flush=True)
    plain = plain_scores(dataset, Settings().model_path, Settings().data_dir / "eval" / "baselines")
    baselines = []
    for method, alpha in [("dense", None), ("bm25s", None), ("hybrid", 0.5), ("hybrid", 0.7)]:
        metrics = evaluate_plain(dataset, plain, method, alpha or 0.5)
        baselines.append({"name": plain_label(method, alpha), "recall@5": metrics["recall@5"], "ndcg@10": metrics["ndcg@10"],
                          "mrr@10": metrics["mrr@10"]})
        print(json.dumps(baselines[-1]), flush=True)
    default = rows[0]
    best_plain = max(baselines, key=lambda b: b["ndcg@10"])
    report = {
        "dataset": str(args.dataset), "split": args.split, "queries": len(dataset.queries),
        "date": datetime.now(timezone.utc).date().isoformat(), "machine": f"{platform.machine()}, {platform.python_version()}",
        "engine": rows, "plain": baselines,
        "ratio_to_best_plain": {"name": best_plain["name"],
                                "ndcg@10": default["ndcg@10"] / best_plain["ndcg@10"],
                                "recall@5": default["recall@5"] / max(b["recall@5"] for b in baselines)},
    }
    print(json.dumps(report["ratio_to_best_plain"]))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
