"""Ranking a labelled set with the query vectors another kind of CPU computes.

A quantised query graph runs other kernels on a CPU without VNNI (ONNX Runtime dispatches its AVX2 ones), so
its vectors, and the rankings they give, can differ from those measured here.  Where no such CPU is at hand,
an emulator that reports its CPUID runs the same graph with the same kernels as that CPU would (slowly: speed
is not measured this way).  Two steps:

1. ``embed`` - run under the other CPU (or its emulation) - embeds the set's queries one at a time with the
   query embedder exactly as served (``settings_query_embedder``: the model, recipe and machine cache of the
   default settings) and writes the vectors::

       qemu-x86_64 -cpu EPYC-Rome .venv/bin/python -m evals.experiments.cpu_kind_eval embed <set> --out q.npz

2. ``score`` - run natively - evaluates the set through the serving engine over the set's existing store
   twice, with this CPU's query vectors and with the file's, and reports both with each vector's cosine to this
   CPU's fp32 graph's::

       .venv/bin/python -m evals.experiments.cpu_kind_eval score <set> --vectors q.npz --data-root <eval root>

The document vectors are the store's (computed on this CPU); the blockwise document graph's vectors are within
cosine 0.999 of fp32 on both kinds (docs/EVALUATION.md), so the comparison isolates the query graph.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from knowledge_store.config.settings import Settings
from knowledge_store.evaluation.beir import load_beir
from knowledge_store.evaluation.retrieval_eval import EvalConfig, evaluate, open_engine
from knowledge_store.models.embeddings import query_embedder, settings_query_embedder


def embed(dataset: Path, split: str, out: Path, shard: str = "1/1") -> dict:
    """Embed the split's queries (``shard`` "k/n": every n-th from the k-th, so n processes share the work)."""
    k, n = (int(x) for x in shard.split("/"))
    if not 1 <= k <= n:
        raise SystemExit(f"--shard {shard}: expected k/n with 1 <= k <= n")
    settings = Settings()
    data = load_beir(dataset, split=split)
    texts = list(data.queries.values())[k - 1::n]
    embedder = settings_query_embedder(settings, threads=1)
    vectors, seconds = [], []
    for n, text in enumerate(texts, start=1):
        started = time.perf_counter()
        vectors.append(np.asarray(embedder.embed([text]))[0])
        seconds.append(time.perf_counter() - started)
        print(f"{n}/{len(texts)} {seconds[-1]:.1f} s", file=sys.stderr, flush=True)
    np.savez(out, texts=np.array(texts, dtype=object), vectors=np.stack(vectors), model_id=embedder.model_id,
             seconds=np.array(seconds))
    return {"queries": len(texts), "model_id": embedder.model_id, "out": str(out)}


class PrecomputedQueries:
    """A query embedder that answers the file's texts with the file's vectors and anything else (the engine's
    warm-up) with ``inner``; ``unknown`` counts those."""

    def __init__(self, inner, texts: list[str], vectors: np.ndarray) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.torch_threads = getattr(inner, "torch_threads", 1)
        self.vectors = dict(zip(texts, vectors))
        self.unknown = 0

    def load(self):
        self.inner.load()
        return self

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            vector = self.vectors.get(text)
            if vector is None:
                self.unknown += 1
                vector = np.asarray(self.inner.embed([text]))[0]
            rows.append(vector)
        return np.stack(rows).astype(np.float32) if rows else np.zeros((0, self.dim), dtype=np.float32)


def score(dataset: Path, split: str, vectors_files: list[Path], data_root: Path) -> dict:
    data = load_beir(dataset, split=split)
    saved = [np.load(f, allow_pickle=True) for f in vectors_files]
    texts = [str(t) for part in saved for t in part["texts"]]
    other = np.concatenate([part["vectors"] for part in saved]).astype(np.float32)
    seconds = np.concatenate([part["seconds"] for part in saved])
    missing = set(data.queries.values()) - set(texts)
    if missing:
        raise SystemExit(f"{len(missing)} of the split's queries have no vector in the files, e.g. {sorted(missing)[0]!r}")
    settings = Settings()
    native = settings_query_embedder(settings, threads=1)
    fp32 = query_embedder(settings.model_path, settings.query_encoder, settings.models_cache_dir, 1,
                          settings.embedding_dim, settings.embedding_query_prefix, "none")
    here = np.stack([np.asarray(native.embed([t]))[0] for t in texts])
    reference = np.stack([np.asarray(fp32.embed([t]))[0] for t in texts])

    def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    results = {}
    for name, embedder in (("this CPU", PrecomputedQueries(native, texts, here)),
                           ("the file's CPU", PrecomputedQueries(native, texts, other))):
        engine, doc_map = open_engine(dataset, embedder=embedder, ingest=False, data_root=data_root)
        defaults = engine.ranking_defaults()
        config = EvalConfig(fusion=defaults.fusion, reranker=engine.default_reranker())
        metrics = evaluate(engine, data, config, doc_map).metrics
        results[name] = {key: metrics[key] for key in ("recall@5", "ndcg@10", "mrr@10", "answer_support")
                         if key in metrics}
        results[name]["queries embedded here (not in the file)"] = embedder.unknown
    to_fp32_here, to_fp32_other = cosines(here, reference), cosines(other, reference)
    return {
        "dataset": str(dataset), "split": split, "queries": len(texts), "model_id": str(saved[0]["model_id"]),
        "file_seconds_per_query_median": float(np.median(seconds)),
        "cosine to fp32, this CPU: mean / min": [float(to_fp32_here.mean()), float(to_fp32_here.min())],
        "cosine to fp32, the file's CPU: mean / min": [float(to_fp32_other.mean()), float(to_fp32_other.min())],
        "cosine between the two CPUs' vectors: mean / min": [float(cosines(here, other).mean()),
                                                             float(cosines(here, other).min())],
        "rankings": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    one = sub.add_parser("embed", help="embed the set's queries as served, on this (emulated) CPU")
    one.add_argument("dataset", type=Path)
    one.add_argument("--split", default="test")
    one.add_argument("--out", type=Path, required=True)
    one.add_argument("--shard", default="1/1", help="k/n: embed every n-th query from the k-th (n processes in parallel)")
    two = sub.add_parser("score", help="rank the set with this CPU's query vectors and the file's")
    two.add_argument("dataset", type=Path)
    two.add_argument("--split", default="test")
    two.add_argument("--vectors", type=Path, nargs="+", required=True, help="the embed step's files (its shards)")
    two.add_argument("--data-root", type=Path, required=True, help="the folder holding the set's evaluation store")
    two.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.step == "embed":
        result = embed(args.dataset, args.split, args.out, args.shard)
    else:
        result = score(args.dataset, args.split, args.vectors, args.data_root)
        if args.json_out:
            args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
