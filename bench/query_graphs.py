"""Query embedding per ONNX graph of one model on this CPU: one question at a time, the way a server embeds
queries, timed over a real question set, with each graph's cosine to the fp32 export.

A query is one text embedded on every request, so its graph is the fastest that stays faithful on the CPU.
This measures the candidates on the questions of a real set: the fp32 export, the shipped blockwise int8 recipe
(``models.artifacts.RECIPES``) and per-tensor dynamic int8 with signed 7-bit per-channel weights and the
feed-forward outputs in fp32 (the recipe shipped before the blockwise one; quantised here into a temporary
folder, never into the model cache).  Each query's time is its fastest of ``--repeats`` runs.

    .venv/bin/python bench/query_graphs.py --queries-file QUERIES.jsonl [--threads 1] [--repeats 3] [--json OUT]

The model is the settings' (``GROUNDWORK_EMBEDDING_MODEL``, default mpnet).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from knowledge_store.config.embedding_models import model_facts
from knowledge_store.config.settings import Settings
from knowledge_store.models.artifacts import RECIPES, ModelArtifacts, QuantisationRecipe, cpu_identity, quantise
from knowledge_store.models.embeddings import _Graph

PER_TENSOR = QuantisationRecipe(
    tag="onnx-int8-dyn-pc2-rr", description="dynamic int8, signed 7-bit per-channel weights, feed-forward outputs fp32",
    method="dynamic", weight_type="QInt8", per_channel=True, reduce_range=True,
    keep_fp32=r"/layer\.\d+/output/dense/MatMul$")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries-file", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    settings = Settings()
    model_path = Path(settings.model_path)
    artifacts = ModelArtifacts(model_path, Path(settings.models_cache_dir))
    queries = [json.loads(line)["text"] for line in args.queries_file.read_text().splitlines() if line.strip()]
    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=model_facts(model_path).max_tokens or 256)  # as the served embedder
    tokenizer.no_padding()
    rows = []
    reference = None
    scratch = Path(tempfile.mkdtemp(prefix="query-graphs-"))
    fp32 = artifacts.ensure("")
    per_tensor = scratch / f"{PER_TENSOR.tag}.onnx"
    quantise(fp32, per_tensor, PER_TENSOR)
    for tag, path in [("fp32", fp32)] + [(t, artifacts.ensure(t)) for t in RECIPES] + [(PER_TENSOR.tag, per_tensor)]:
        graph = _Graph(path, tokenizer, args.threads)
        graph.vectors(queries[:10], 1)  # warm-up
        best = []
        vectors = None
        for _ in range(args.repeats):
            times = []
            out = []
            for q in queries:
                start = time.perf_counter()
                out.append(graph.vectors([q], 1)[0])
                times.append((time.perf_counter() - start) * 1000)
            best.append(times)
            vectors = np.array(out)
        per_query = np.min(np.array(best), axis=0)  # each query's fastest run: the graph, not the neighbours
        if reference is None:
            reference = vectors
        cosines = (vectors * reference).sum(axis=1)
        row = {"graph": tag, "p50_ms": round(float(np.percentile(per_query, 50)), 2),
               "p95_ms": round(float(np.percentile(per_query, 95)), 2), "mean_ms": round(float(per_query.mean()), 2),
               "cosine_to_fp32_mean": round(float(cosines.mean()), 5), "cosine_to_fp32_min": round(float(cosines.min()), 5)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"cpu": cpu_identity().describe(), "model": model_path.name, "threads": args.threads,
              "queries": len(queries), "queries_file": str(args.queries_file), "repeats": args.repeats,
              "load_1min_at_end": os.getloadavg()[0], "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    per_tensor.unlink(missing_ok=True)
    scratch.rmdir()


if __name__ == "__main__":
    main()
