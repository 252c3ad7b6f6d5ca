"""How self-tuning should decide to leave the built-in ranking: the keep-rules compared on both dev sets.

Every pseudo-query self-tuning can build from a dev store (``--limit``, ~1,000) is scored on the
whole grid (``tuning.score_grid``), once.  Then 200 random draws of 300 of them (what ``groundwork
tune`` uses) are decided by each rule, and each decision is looked up in the real-label grid of the
same store (``evals.experiments.ranking_sweep --json-out``: its ``rows``): how often the rule changed the
ranking, and how far the choice is from the best real-label configuration (mean, worst).

    .venv/bin/python -m evals.experiments.keep_rule_experiment debian evals/results/tuning_debian_docs_all.json
    GROUNDWORK_DATA_DIR=data/bare .venv/bin/python -m evals.experiments.keep_rule_experiment debian evals/results/tuning_debian_docs_bare05.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from evals.experiments.dev_store import open_dev_store
from knowledge_store.config.settings import Settings
from knowledge_store.learning.tuning import build_pseudo_queries, default_grid, keep_decision, score_grid
from knowledge_store.retrieval.ranking_defaults import builtin_ranking

RULES = {
    "gain > 0.005 (before 2026-11-25)": lambda best, builtin: float((best - builtin).mean()) > 0.005,
    "gain > 0.005 and > 2 standard errors (now)": lambda best, builtin: keep_decision(best, builtin)["adopted"],
    "always the pseudo-query argmax": lambda best, builtin: True,
}


def _key(row: dict) -> tuple:
    return row["alpha"], row["fusion"], row["section_weight"], row["lead_weight"]


def run(spec: str, real_grid: Path, limit: int, draw: int, draws: int) -> dict:
    dev = open_dev_store(spec)
    settings = Settings()
    queries = build_pseudo_queries(dev.snapshot, (), limit=limit, seed=13)
    grid = default_grid()
    builtin = builtin_ranking(settings)
    if builtin not in grid:
        grid.append(builtin)
    ndcg, _ = score_grid(dev.snapshot, queries, dev.embedder.embed, grid, settings.candidate_pool, settings.rrf_k)
    real = {_key(r): r["ndcg@10"] for r in json.loads(real_grid.read_text())["rows"]}
    best_real = max(real.values())
    b = grid.index(builtin)
    rng = np.random.default_rng(0)
    samples = [rng.choice(len(queries), min(draw, len(queries)), replace=False) for _ in range(draws)]
    out = {"set": spec, "model_id": dev.snapshot.info.model_id, "pseudo_queries": len(queries), "draw": draw,
           "draws": draws, "builtin_real_ndcg@10": real[_key(builtin.to_dict())], "best_real_ndcg@10": best_real,
           "rules": {}}
    for name, rule in RULES.items():
        gaps, changed = [], 0
        for cols in samples:
            a = int(np.argmax(ndcg[:, cols].mean(axis=1)))
            pick = a if a != b and rule(ndcg[a, cols], ndcg[b, cols]) else b
            changed += pick != b
            gaps.append(best_real - real[_key(grid[pick].to_dict())])
        out["rules"][name] = {"changed": changed, "mean_gap": round(float(np.mean(gaps)), 4),
                              "worst_gap": round(float(np.max(gaps)), 4)}
        print(f"{spec:10s} {name:45s} changed {changed:3d}/{draws}  gap mean {np.mean(gaps):.4f}  worst {np.max(gaps):.4f}",
              flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", help="scifact or debian (research.dev_store)")
    parser.add_argument("real_grid", type=Path, help="research.ranking_sweep JSON of the same store (real-label grid)")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--draw", type=int, default=300)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    result = run(args.set, args.real_grid, args.limit, args.draw, args.draws)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
