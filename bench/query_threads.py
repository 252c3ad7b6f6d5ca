"""The query embedding on one ONNX Runtime thread against two (with and without ONNX Runtime's spin-waiting),
inside the served query, paired question by question.

    .venv/bin/python bench/query_threads.py --source-index STORE/index [--size 100000]
        --queries-file QUERIES.jsonl [--index-root DIR] [--out docs/benchmarks/query_threads.md]

Builds (or reuses, ``--index-root`` holding ``index/``) a snapshot of ``--size`` chunks replicated from a real
store as ``bench/query_latency.py`` does, loads one engine per way (one process: the same machine moment for all),
and asks every question of each engine in rotating order, ``--repeats`` times, with the query cache off.  A
second thread can only help where a core is free: the BM25 thread and the machine's other load share the two
cores with it, and spinning threads (ONNX Runtime waits for work by spinning, by default) take the ranking's time.
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

WAYS = {"1 thread": (1, None), "2 threads, spinning": (2, True), "2 threads, no spinning (default)": (2, False)}


def sessions_with_spinning(forced: bool | None):
    """The embedder's session set-up with spinning forced on or off (None: as shipped, no spinning for queries)."""
    from knowledge_store.models.embeddings import _Graph

    shipped = _Graph.__init__

    def init(self, path, tokenizer, threads, spin=True):
        shipped(self, path, tokenizer, threads, spin if forced is None else forced)

    return shipped, init


def compare(index_root: Path, queries: list[str], repeats: int) -> dict:
    import numpy as np

    from knowledge_store.config.settings import Settings
    from knowledge_store.models.embeddings import _Graph
    from knowledge_store.retrieval.engine import RetrievalEngine

    engines = {}
    for way, (threads, spin) in WAYS.items():
        shipped, init = sessions_with_spinning(spin)
        _Graph.__init__ = init
        try:
            engine = RetrievalEngine(Settings(data_dir=index_root, query_torch_threads=threads, search_threads=1,
                                              query_cache_size=0, ann_min_chunks=1))
            engine.warm_up()
            engine.snapshots.wait_for_ann(engine.snapshots.current())
        finally:
            _Graph.__init__ = shipped
        for q in queries[:20]:
            engine.search(q, k=5, min_relevance=0.0)
        engines[way] = engine
    names = list(WAYS)
    total = {w: [] for w in names}
    embed = {w: [] for w in names}
    load_start = os.getloadavg()[0]
    for repeat in range(repeats):
        for i, q in enumerate(queries):
            k = (i + repeat) % len(names)
            for way in names[k:] + names[:k]:
                latency = engines[way].search(q, k=5, min_relevance=0.0).latency_ms
                total[way].append(latency["total"])
                embed[way].append(latency["embed"])
    for engine in engines.values():
        engine.query_log.close()
    first = names[0]
    return {"chunks": engines[first].snapshots.current().size, "queries": len(queries), "repeats": repeats,
            "load_start": load_start, "ways": {w: {
                "p50": percentile(total[w], 0.5), "p95": percentile(total[w], 0.95),
                "embed_p50": percentile(embed[w], 0.5), "embed_p95": percentile(embed[w], 0.95),
                "without_embed_p95": percentile([t - e for t, e in zip(total[w], embed[w])], 0.95),
                "ratio": float(np.median(np.array(total[w]) / np.array(total[first])))} for w in names}}


def main() -> int:
    args = paired_options(__doc__.splitlines()[0], ROOT / "docs" / "benchmarks" / "query_threads.md")
    machine_text = machine()
    r = on_replicated_index(args, compare)
    print(json.dumps(r, indent=1))
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = [f"| {w} | {v['p50']:.1f} | {v['p95']:.1f} | {v['embed_p50']:.1f} | {v['embed_p95']:.1f} | "
            f"{v['without_embed_p95']:.1f} | {v['ratio']:.2f} |" for w, v in r["ways"].items()]
    publish([
        "## The query embedding on one thread or two, in the served query",
        "",
        f"Date: {date}. Machine: {machine_text}; load average {r['load_start']:.2f} at the start, {load_after} at the "
        f"end. Snapshot: `{args.source_index}` replicated to {r['chunks']:,} chunks, approximate index. {r['queries']} "
        f"questions from `{args.queries_file}`, each asked {r['repeats']} times of every engine in rotating order, "
        "query cache off. Reproduce: `.venv/bin/python bench/query_threads.py --source-index ... --queries-file ...`.",
        "",
        "| query embedding | p50 ms | p95 ms | embed p50 | embed p95 | p95 without the embedding | median ratio to 1 thread |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
