"""Sentence evidence's float16 products: ONNX Runtime's Cast + MatMul (``retrieval.half_products``) against NumPy's
``astype(float32) @ vector``, inside the served query path, paired query by query.

    .venv/bin/python bench/half_products.py --source-index STORE/index [--size 100000]
        [--queries-file QUERIES.jsonl] [--index-root DIR] [--out docs/benchmarks/half_products.md]

Builds (or reuses, ``--index-root`` holding ``index/``) a snapshot of ``--size`` chunks replicated from a real
store as ``bench/query_latency.py`` does, serves it with the approximate index, and asks every question twice
with each way of scoring the sentence vectors, in an order that alternates (the shared machine's speed drifts
within minutes).  Reported: each way's time without the query embedding (the embedding is the same call, and
cached after the first ask), the median per-query ratio, and whether the top 5 agree.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.ingest_throughput import machine  # noqa: E402
from bench.query_latency import on_replicated_index, paired_options, percentile  # noqa: E402
from bench.report import publish  # noqa: E402


def numpy_ways(shipped_gather):
    """``SentenceIndex.gather`` and ``best`` with NumPy's conversion: the gathered float16 block made float32 once
    (a pool scored with a second vector reuses it), then one product per vector."""
    import numpy as np

    def gather(index, rows):
        block, offsets = shipped_gather(index, rows)
        return block.astype(np.float32), offsets

    def best(index, rows, query_vector, gathered=None):
        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        block, offsets = index.gather(rows) if gathered is None else gathered
        return np.maximum.reduceat(block @ np.asarray(query_vector, dtype=np.float32), offsets)

    return gather, best


def compare(index_root: Path, queries: list[str], repeats: int) -> dict:
    import numpy as np

    from knowledge_store.config.settings import Settings
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.retrieval.sentences import SentenceIndex

    engine = RetrievalEngine(Settings(data_dir=index_root, query_torch_threads=1, search_threads=1, ann_min_chunks=1))
    engine.warm_up()
    snapshot = engine.snapshots.current()
    if snapshot.sentence_index is None:
        raise SystemExit(f"{index_root}: the snapshot has no sentence vectors, nothing to compare")
    engine.snapshots.wait_for_ann(snapshot)
    shipped = (SentenceIndex.gather, SentenceIndex.best)
    ways = {"numpy": numpy_ways(SentenceIndex.gather), "onnxruntime": shipped}
    for q in queries[:20]:
        engine.search(q, k=5, min_relevance=0.0)
    times = {w: [] for w in ways}
    tops = {w: [] for w in ways}
    try:
        for repeat in range(repeats):
            for i, q in enumerate(queries):
                for way in (list(ways) if (i + repeat) % 2 == 0 else list(ways)[::-1]):
                    SentenceIndex.gather, SentenceIndex.best = ways[way]
                    response = engine.search(q, k=5, min_relevance=0.0)
                    times[way].append(response.latency_ms["total"] - response.latency_ms["embed"])
                    if repeat == 0:
                        tops[way].append([c.chunk_id for c in response.results])
    finally:
        SentenceIndex.gather, SentenceIndex.best = shipped
        engine.query_log.close()
    ratio = np.array(times["onnxruntime"]) / np.array(times["numpy"])
    return {"chunks": snapshot.size, "sentences": snapshot.sentence_index.count, "queries": len(queries),
            "repeats": repeats, "median_ratio": float(np.median(ratio)),
            "same_top5": float(np.mean([a == b for a, b in zip(tops["numpy"], tops["onnxruntime"])])),
            **{f"{w}_p50": percentile(times[w], 0.5) for w in ways},
            **{f"{w}_p95": percentile(times[w], 0.95) for w in ways}}


def main() -> int:
    args = paired_options(__doc__.splitlines()[0], ROOT / "docs" / "benchmarks" / "half_products.md")
    machine_text = machine()
    r = on_replicated_index(args, compare)
    print(json.dumps(r, indent=1))
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    publish([
        "## Sentence evidence's float16 products: ONNX Runtime against NumPy, in the served query",
        "",
        f"Date: {date}. Machine: {machine_text}; load average at the end {load_after}. Snapshot: `{args.source_index}` "
        f"replicated to {r['chunks']:,} chunks ({r['sentences']:,} sentence vectors, float16), approximate index. "
        f"{r['queries']} questions from `{args.queries_file}`, each asked {r['repeats']} times per way in alternating "
        "order; times exclude the query embedding. Reproduce: `.venv/bin/python bench/half_products.py "
        "--source-index ... --queries-file ...`.",
        "",
        "| products | p50 ms | p95 ms |",
        "|---|---|---|",
        f"| NumPy astype + matmul | {r['numpy_p50']:.1f} | {r['numpy_p95']:.1f} |",
        f"| ONNX Runtime Cast + MatMul (shipped) | {r['onnxruntime_p50']:.1f} | {r['onnxruntime_p95']:.1f} |",
        "",
        f"Median per-query ratio, shipped / NumPy: {r['median_ratio']:.3f}. Same top 5 on {r['same_top5']:.1%} of the questions.",
        "",
    ], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
