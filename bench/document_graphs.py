"""Document embedding per ONNX graph of one model on this CPU: batches of real corpus texts, length-sorted as
ingestion cuts them, timed per graph, with each graph's cosine to the fp32 export.

int8 kernels differ by CPU: where the CPU lacks VNNI, ONNX Runtime runs the blockwise (MatMulNBits) graph on AVX2
code that can be slower than fp32, while per-tensor dynamic int8 stays fast.  The fidelity check times the probe
set's batches with fp32 and the document recipe and runs the faster one (``OnnxEmbedder``, ``batch_ms``); this
measures the same choice on a real corpus, beside the other recipes.  Graphs: the fp32 export, the shipped
recipes (``models.artifacts.RECIPES``) and bench/query_graphs.py's two dynamic recipes (quantised into a temporary
folder, never into the model cache).  Every graph embeds each batch back to back, in alternating order (a busy
moment of the shared machine falls on all of them alike); ratios are per batch, to fp32.

    .venv/bin/python bench/document_graphs.py --corpus CORPUS.jsonl [--texts 48] [--batch 8] [--threads 1]
        [--json OUT]

The model is the settings' (``GROUNDWORK_EMBEDDING_MODEL``, default mpnet).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest_throughput import machine  # noqa: E402
from bench.query_graphs import compared_graphs, embedder_tokenizer  # noqa: E402
from knowledge_store.config.settings import Settings  # noqa: E402
from knowledge_store.models.artifacts import ModelArtifacts, cpu_identity  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a BEIR corpus.jsonl (title and text embedded)")
    parser.add_argument("--texts", type=int, default=48, help="texts to embed (a seeded sample)")
    parser.add_argument("--batch", type=int, default=Settings().onnx_batch_size)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    settings = Settings()
    model_path = Path(settings.model_path)
    artifacts = ModelArtifacts(model_path, Path(settings.models_cache_dir))
    documents = [json.loads(line) for line in args.corpus.read_text().splitlines() if line.strip()]
    sample = random.Random(7).sample(documents, min(args.texts, len(documents)))
    texts = [f"{d.get('title', '')}\n{d.get('text', '')}".strip() for d in sample]
    tokenizer = embedder_tokenizer(model_path)
    lengths = [len(e.ids) for e in tokenizer.encode_batch(texts)]
    texts = [texts[i] for i in np.argsort(lengths)]  # length-sorted, as ingestion batches them
    load_before = os.getloadavg()
    graphs, scratch = compared_graphs(artifacts, tokenizer, args.threads, "document-graphs-")
    for _, graph in graphs:
        graph.vectors(texts[: args.batch], args.batch)  # warm-up
    batches = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    seconds = {tag: [] for tag, _ in graphs}
    vectors = {tag: [] for tag, _ in graphs}
    started = time.time()
    for b, batch in enumerate(batches):
        for tag, graph in graphs if b % 2 == 0 else graphs[::-1]:
            start = time.perf_counter()
            vectors[tag].append(graph.vectors(batch, args.batch))
            seconds[tag].append(time.perf_counter() - start)
    reference = np.vstack(vectors["fp32"])
    rows = []
    for tag, _ in graphs:
        cosine = (np.vstack(vectors[tag]) * reference).sum(axis=1)
        ratio = float(np.median(np.array(seconds[tag]) / np.array(seconds["fp32"])))
        rows.append({"graph": tag, "texts_per_s": round(len(texts) / sum(seconds[tag]), 2),
                     "median_batch_ratio_to_fp32": round(ratio, 3),
                     "cosine_mean": round(float(cosine.mean()), 4), "cosine_min": round(float(cosine.min()), 4)})
    report = {"machine": machine(), "cpu": cpu_identity().describe(), "model": model_path.name,
              "texts": len(texts), "word_pieces_median": int(np.median(lengths)), "word_pieces_max": max(lengths),
              "batch": args.batch, "threads": args.threads, "seconds": round(time.time() - started, 1),
              "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
              "graphs": rows}
    print("| graph | texts/s | time per batch vs fp32 (median) | cosine to fp32 mean / min |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['graph']} | {row['texts_per_s']} | {row['median_batch_ratio_to_fp32']:.2f} | "
              f"{row['cosine_mean']:.4f} / {row['cosine_min']:.4f} |")
    print(json.dumps({k: v for k, v in report.items() if k != "graphs"}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
