"""Query embedding per ONNX graph of one model on this CPU: one question at a time, the way a server embeds
queries, timed over a real question set, with each graph's cosine to the fp32 export.

A query is one text embedded on every request, so its graph is the fastest that stays faithful on the CPU.
This measures the candidates on the questions of a real set: the fp32 export, the shipped recipes
(``models.artifacts.RECIPES``: the all-blockwise int8 document recipe, the mixed query recipe and the smoothed
one), per-tensor
dynamic int8 with signed 7-bit per-channel weights and the feed-forward outputs in fp32 (the recipe shipped before
the blockwise one) and the same with every MatMul dynamic (the fastest, and the one that shows why the feed-forward
layers are kept out of dynamic int8); the last two are quantised into a temporary folder, never into the model
cache.  Each query's time is its fastest of ``--repeats`` runs, every graph embedding each question back to back (the
machine's speed drifts within minutes); ratios are per question, to the document recipe.

    .venv/bin/python bench/query_graphs.py --queries-file QUERIES.jsonl [--threads 1] [--repeats 3] [--json OUT]

The model is the settings' (``GROUNDWORK_EMBEDDING_MODEL``, default mpnet).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
PER_CHANNEL_ALL = QuantisationRecipe(
    tag="onnx-int8-dyn-pc-rr-all", description="dynamic int8, signed 7-bit per-channel weights, every MatMul",
    method="dynamic", weight_type="QInt8", per_channel=True, reduce_range=True)


def embedder_tokenizer(model_path: Path) -> Tokenizer:
    """The model's tokenizer cut at its window and without padding, as the served embedders run it."""
    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=model_facts(model_path).max_tokens or 256)
    tokenizer.no_padding()
    return tokenizer


def compared_graphs(artifacts: ModelArtifacts, tokenizer: Tokenizer, threads: int,
                    prefix: str) -> tuple[list[tuple[str, _Graph]], Path]:
    """The graphs these benchmarks compare, as (tag, session), and the temporary folder (named ``prefix``...) the
    two dynamic recipes above were quantised into, never the model cache (the caller removes it); then the fp32
    export and the shipped recipes."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    fp32 = artifacts.ensure("")
    extra = []
    for recipe in (PER_TENSOR, PER_CHANNEL_ALL):
        extra.append((recipe.tag, scratch / f"{recipe.tag}.onnx"))
        quantise(fp32, extra[-1][1], recipe)
    return [(tag, _Graph(path, tokenizer, threads))
            for tag, path in [("fp32", fp32)] + [(t, artifacts.ensure(t)) for t in RECIPES] + extra], scratch


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
    tokenizer = embedder_tokenizer(model_path)
    rows = []
    graphs, scratch = compared_graphs(artifacts, tokenizer, args.threads, "query-graphs-")
    for _, graph in graphs:
        graph.vectors(queries[:10], 1)  # warm-up
    times = {tag: np.zeros((args.repeats, len(queries))) for tag, _ in graphs}
    vectors = {tag: [None] * len(queries) for tag, _ in graphs}
    for repeat in range(args.repeats):
        for i, q in enumerate(queries):
            # every graph embeds each question back to back, in an order that alternates: a slower minute of the
            # shared machine falls on all of them alike
            for tag, graph in graphs if (i + repeat) % 2 == 0 else graphs[::-1]:
                start = time.perf_counter()
                vectors[tag][i] = graph.vectors([q], 1)[0]
                times[tag][repeat, i] = (time.perf_counter() - start) * 1000
    reference = np.array(vectors["fp32"])
    first = times[graphs[1][0]].min(axis=0)  # the document recipe: the ratios' base
    for tag, _ in graphs:
        per_query = times[tag].min(axis=0)  # each query's fastest run: the graph, not the neighbours
        cosines = (np.array(vectors[tag]) * reference).sum(axis=1)
        row = {"graph": tag, "p50_ms": round(float(np.percentile(per_query, 50)), 2),
               "p95_ms": round(float(np.percentile(per_query, 95)), 2), "mean_ms": round(float(per_query.mean()), 2),
               "median_ratio_to_document_recipe": round(float(np.median(per_query / first)), 3),
               "cosine_to_fp32_mean": round(float(cosines.mean()), 5), "cosine_to_fp32_min": round(float(cosines.min()), 5)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"cpu": cpu_identity().describe(), "model": model_path.name, "threads": args.threads,
              "queries": len(queries), "queries_file": str(args.queries_file), "repeats": args.repeats,
              "load_1min_at_end": os.getloadavg()[0], "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
