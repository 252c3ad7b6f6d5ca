"""Fine-tuning recipes compared on one corpus: effective batch sizes (more in-batch negatives per query) and
mined hard negatives, each trained on the same pairs and judged by the same held-out pseudo-queries the
adoption rule uses.

Each configuration runs the product's own ``finetune_corpus`` on a private copy of one data folder (a store that
``groundwork ingest`` or ``groundwork eval`` built), with the same training budget, so the pairs, the held-out
set and the decision rule are the product's; only the recipe differs.  Gradient caching keeps memory flat in the
batch size (the mini-batch is the memory plan's), so a larger batch costs time per step, not memory.

    .venv/bin/python -m evals.experiments.finetune_batch_experiment DATA_DIR OUT_DIR \\
        [--configs 32,64,128,32+hn] [--budget 300] [--json evals/results/finetune_batch.json]

``32+hn``: batch 32 with ``--hard-negatives`` mined negatives per pair (default 1); ``32+t128``: batch 32 with
every text cut at 128 word-pieces in training (``ContrastiveRecipe.max_tokens``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

from knowledge_store.config.settings import Settings
from knowledge_store.learning.finetune import RECIPE, finetune_corpus


def _recipe(config: str, hard_negatives: int):
    """``32``, ``32+hn`` (mined hard negatives), ``32+t128`` (targets cut at 128 word-pieces), combined with ``+``."""
    batch, *extras = config.split("+")
    recipe = replace(RECIPE, batch_size=int(batch))
    for extra in extras:
        if extra == "hn":
            recipe = replace(recipe, hard_negatives=hard_negatives)
        elif extra.startswith("t") and extra[1:].isdigit():
            recipe = replace(recipe, max_tokens=int(extra[1:]))
        else:
            raise SystemExit(f"--configs: {config!r} has {extra!r}; a batch size, then +hn or +t<word-pieces>")
    return recipe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="a data folder with a published index (copied, never changed)")
    parser.add_argument("out_dir", type=Path, help="where the copies go (one per configuration)")
    parser.add_argument("--configs", default="32,64,128", help="comma-separated: a batch size, +hn for hard negatives, +tN for targets cut at N word-pieces")
    parser.add_argument("--budget", type=float, default=300.0, help="training seconds per configuration")
    parser.add_argument("--hard-negatives", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    rows = []
    for config in args.configs.split(","):
        copy = args.out_dir / config.replace("+", "-")
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(args.data_dir, copy, ignore=shutil.ignore_patterns("finetuned", "*.wal"))
        settings = Settings(data_dir=copy)
        recipe = _recipe(config, args.hard_negatives)
        load = os.getloadavg()[0]
        started = time.perf_counter()
        decision = finetune_corpus(settings, budget_s=args.budget, force=True, recipe=recipe, log=print)
        training = decision.training or {}
        row = {"config": config, "batch_size": recipe.batch_size, "hard_negatives": recipe.hard_negatives,
               "max_tokens": recipe.max_tokens,
               "decision": decision.decision, "gain": decision.gain, "standard_error": decision.standard_error,
               "required": decision.required, "before": decision.before, "after": decision.after,
               "held_out": decision.held_out, "pairs": decision.pairs,
               "trained_pairs": training.get("trained_pairs"), "steps": training.get("steps"),
               "train_s": training.get("seconds"), "stopped_by": training.get("stopped_by"),
               "peak_rss_mb": decision.peak_rss_mb, "seconds": round(time.perf_counter() - started, 1),
               "load_1min_at_start": round(load, 2), "reason": decision.reason}
        rows.append(row)
        print(json.dumps(row))
    settings = Settings(data_dir=args.data_dir)
    report = {"data_dir": str(args.data_dir), "budget_s": args.budget, "model": Path(settings.model_path).name,
              "cpu_threads": settings.torch_threads, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
