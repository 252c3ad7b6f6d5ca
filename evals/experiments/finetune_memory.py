"""Peak memory of fine-tuning one model with one memory plan: a few training steps on pairs of full-length
targets (the worst case the estimate covers), for fitting ``knowledge_store.learning.recipe``'s constants.

    /usr/bin/time -v python -m evals.experiments.finetune_memory MODEL_PATH MINI_BATCH CHECKPOINTING(0|1) [STEPS]

Prints the plan, the estimate and pairs/s as JSON; /usr/bin/time's "Maximum resident set size" is the measurement.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from knowledge_store.learning.finetune import RECIPE, resident_bytes, train_embedder
from knowledge_store.learning.pairs import TrainingPair
from knowledge_store.learning.recipe import training_memory_bytes

WORDS = (
    "the package manager resolves dependencies before it installs anything and keeps a log of every "
    "change it made so that an administrator can undo a broken upgrade "
).split()


def main() -> None:
    model_path, mini_batch, checkpointing = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    recipe = replace(RECIPE, mini_batch_size=mini_batch, gradient_checkpointing=checkpointing)
    target = " ".join(WORDS * 12)  # well over 192 word-pieces: every target is cut at the limit
    pairs = [
        TrainingPair(f"how do I undo upgrade number {i}", f"{i} {target}", "heading", i % 50, i)
        for i in range(recipe.batch_size * steps)
    ]
    resident = resident_bytes()  # this probe holds no store or query encoder: the estimate starts from what it holds
    with tempfile.TemporaryDirectory() as tmp:
        run = train_embedder(model_path, pairs, Path(tmp) / "model", budget_s=3600, threads=2, recipe=recipe)
    print(
        json.dumps(
            {
                "mini_batch": mini_batch,
                "checkpointing": checkpointing,
                "steps": run.steps,
                "estimate_gb": round(training_memory_bytes(model_path, recipe, resident) / 2**30, 2),
                "pairs_per_s": run.pairs_per_s,
                "seconds": run.seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
