"""1M chunks: approximate nearest-neighbour index for the vector step (issue 12, item 4).

    flock /tmp/groundwork-bench.lock .venv/bin/python bench/ann_1m.py --root /tmp/gw-ann/n1000000 \
        [--size 1000000] [--libraries usearch-f32 usearch-i8 faiss hnswlib] [--skip-engine] \
        [--out docs/benchmarks/ann_1m.md]

Data: the synthetic snapshot of ``bench/query_latency.py`` (``build_synthetic``): the
SciFact evaluation store's 11,696 real MiniLM chunk vectors, replicated with Gaussian
noise (sigma 0.02 per dimension, re-normalised) up to ``--size`` rows, texts kept so BM25
postings grow like a real corpus.  It is built once under ``--root`` and reused.
Queries: the 300 SciFact test claims and the 809 training claims (1,109), embedded by the
serving query encoder.  Ground truth: exact top-100 by cosine (NumPy).

Two parts, each in a fresh subprocess so RSS deltas are clean:

1. ``library`` - every candidate library builds an HNSW graph over the 1M stored vectors
   (connectivity 16, expansion at build 128, 2 build threads): build time, RSS growth,
   then single-query latency (1 thread) and recall@10 against exact, both raw (the
   library's own top-10) and the way the engine uses it (fetch 100 candidates, re-score
   them exactly with the float32 matrix, keep the best 10).
2. ``engine`` - ``RetrievalEngine.search`` over the 1M snapshot, ANN on, the way the
   server runs it (query embedding + BM25 + vector + fusion + citations + answer + log):
   p50/p95 with and without the embedding, per-stage p95 (BM25 at 1M included), snapshot
   load and ANN build/cache-load time, RSS; and how often its top-5 equals the exact
   engine's (``ann_min_chunks`` above the corpus size) for the same queries.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SCIFACT = ROOT.parent / "shared" / "datasets" / "scifact"
M_CONNECTIVITY = 16
EF_CONSTRUCTION = 128
EF_SEARCH = (64, 128, 256, 512)
FETCH = 100  # candidates the engine asks for (settings.candidate_pool)
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


# --------------------------------------------------------------------------- data
def mixture_vectors(base: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
    """Row k (a replica of base chunk i = k % len(base)): ``(1-w)*base_i + w*base_j + sigma*noise``,
    re-normalised, j random, w ~ U(0, 0.3), sigma ~ U(0.01, 0.04) - the distribution of
    bench/vector_index.py (cosine to the parent ~0.75-0.98, like chunks of related texts);
    replica 0 keeps the real vectors."""
    rng = np.random.default_rng(seed)
    n, dim = base.shape
    out = np.empty((size, dim), dtype=np.float32)
    for start in range(0, size, 100_000):
        rows = np.arange(start, min(size, start + 100_000))
        i = rows % n
        j = rng.integers(0, n, len(rows))
        w = rng.uniform(0.0, 0.3, len(rows)).astype(np.float32)[:, None]
        sigma = rng.uniform(0.01, 0.04, len(rows)).astype(np.float32)[:, None]
        block = (1 - w) * base[i] + w * base[j] + sigma * rng.standard_normal((len(rows), dim), dtype=np.float32)
        block[rows < n] = base[i[rows < n]]
        out[rows] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def ensure_snapshot(root: Path, size: int, source: Path, vectors: str) -> dict:
    from bench.query_latency import build_synthetic

    index = root / "index"
    meta = root / "build.json"
    if (index / "CURRENT.json").exists() and meta.exists():
        return json.loads(meta.read_text())
    started = time.perf_counter()
    fts = build_synthetic(source, index, size, mixture_vectors if vectors == "mixture" else None)
    info = {"fts_build_s": fts, "snapshot_build_s": time.perf_counter() - started, "size": size, "vectors": vectors}
    meta.write_text(json.dumps(info))
    return info


def queries() -> list[str]:
    texts = []
    for name in ("queries.jsonl", "queries_train.jsonl"):
        path = SCIFACT / name
        if path.exists():
            texts += [json.loads(line)["text"] for line in path.open()]
    return texts or ["how do I reset the thermostat", "what does error E42 mean"] * 150


def ensure_vectors(root: Path) -> dict[str, Path]:
    """vectors.npy (row order of the snapshot), queries.npy, gt.npy (exact top-100 ids)."""
    paths = {"vectors": root / "vectors.npy", "queries": root / "queries.npy", "gt": root / "gt.npy"}
    if all(p.exists() for p in paths.values()):
        return paths
    import duckdb

    from knowledge_store.config.settings import Settings
    from knowledge_store.models.embeddings import query_embedder
    from knowledge_store.storage.index import read_pointer

    info = read_pointer(root / "index")
    conn = duckdb.connect(str(info.path(root / "index")), read_only=True)
    col = conn.execute("SELECT embedding FROM chunks ORDER BY rowid").arrow().column("embedding").combine_chunks()
    conn.close()
    M = np.ascontiguousarray(col.values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(col), -1))
    del col
    np.save(paths["vectors"], M)
    s = Settings()
    embedder = query_embedder(s.model_path, s.query_encoder, s.models_cache_dir, 2, s.embedding_dim)
    texts = queries()
    Q = np.concatenate([embedder.embed(texts[i:i + 64]) for i in range(0, len(texts), 64)]).astype(np.float32)
    np.save(paths["queries"], Q)
    np.save(paths["gt"], exact_top(M, Q, FETCH))
    return paths


def exact_top(M: np.ndarray, Q: np.ndarray, k: int) -> np.ndarray:
    gt = np.zeros((len(Q), k), dtype=np.int64)
    for start in range(0, len(Q), 64):
        S = Q[start:start + 64] @ M.T
        part = np.argpartition(-S, k, axis=1)[:, :k]
        rows = np.arange(len(S))[:, None]
        gt[start:start + 64] = part[rows, np.argsort(-S[rows, part], axis=1)]
    return gt


# --------------------------------------------------------------------------- library workers
def _build(lib: str, M: np.ndarray, threads: int):
    """(search(q, count, ef) -> ids, serialized bytes or None).  ``lib`` is a library name, for usearch
    with the graph's vector type and optionally -m<connectivity>-e<expansion at build>: usearch-i8-m32-e256."""
    n, dim = M.shape
    if lib.startswith("usearch"):
        from usearch.index import Index

        parts = lib.split("-")[1:]
        dtype = next((x for x in parts if x[0] in "fi" and x[1:].isdigit()), "f32")
        connectivity = next((int(x[1:]) for x in parts if x.startswith("m")), M_CONNECTIVITY)
        expansion = next((int(x[1:]) for x in parts if x.startswith("e")), EF_CONSTRUCTION)
        index = Index(ndim=dim, metric="cos", dtype=dtype, connectivity=connectivity,
                      expansion_add=expansion, expansion_search=EF_SEARCH[0])
        index.add(np.arange(n, dtype=np.uint64), M, threads=threads)

        def search(q, count, ef):
            index.expansion_search = ef
            return index.search(q, count, threads=1).keys

        return search, index.serialized_length
    if lib == "faiss":
        import faiss

        faiss.omp_set_num_threads(threads)
        index = faiss.IndexHNSWFlat(dim, M_CONNECTIVITY, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = EF_CONSTRUCTION
        index.add(M)
        faiss.omp_set_num_threads(1)

        def search(q, count, ef):
            index.hnsw.efSearch = max(ef, count)
            return index.search(q[None, :], count)[1][0]

        return search, None
    if lib == "hnswlib":
        import hnswlib

        index = hnswlib.Index(space="ip", dim=dim)
        index.init_index(max_elements=n, ef_construction=EF_CONSTRUCTION, M=M_CONNECTIVITY)
        index.add_items(M, np.arange(n), num_threads=threads)

        def search(q, count, ef):
            index.set_ef(max(ef, count))
            return index.knn_query(q, k=count, num_threads=1)[0][0]

        return search, None
    if lib == "duckdb-vss":
        import duckdb
        import pyarrow as pa

        from knowledge_store.storage.store import load_extensions

        con = duckdb.connect(config={"threads": threads})
        load_extensions(con, "vss")
        table = pa.table({"id": pa.array(np.arange(n)), "emb": pa.FixedSizeListArray.from_arrays(pa.array(M.ravel()), dim)})
        con.register("t_arrow", table)
        con.execute(f"CREATE TABLE t AS SELECT id, emb::FLOAT[{dim}] AS emb FROM t_arrow")
        con.unregister("t_arrow")
        del table
        con.execute(f"CREATE INDEX h ON t USING HNSW (emb) WITH (metric = 'cosine', ef_construction = {EF_CONSTRUCTION}, "
                    f"M = {M_CONNECTIVITY})")
        con.execute("SET threads = 1")
        con.execute("SET late_materialization_max_rows = 0")

        def search(q, count, ef):
            con.execute(f"SET hnsw_ef_search = {max(ef, count)}")
            sql = f"SELECT id FROM t ORDER BY array_cosine_distance(emb, ?::FLOAT[{dim}]) LIMIT {count}"
            return np.array([r[0] for r in con.execute(sql, [q.tolist()]).fetchall()])

        return search, None
    raise ValueError(lib)


def w_library(p: dict) -> dict:
    lib, threads = p["lib"], int(p["threads"])
    M = np.load(p["vectors"])
    Q = np.load(p["queries"])
    gt = np.load(p["gt"])
    rows = int(p.get("rows") or len(M))
    if rows < len(M):  # a prefix of the corpus (whole replicas), with its own exact ground truth
        M = np.ascontiguousarray(M[:rows])
        gt = exact_top(M, Q, FETCH)
    r0 = rss_mb()
    t0 = time.perf_counter()
    search, serialized = _build(lib, M, threads)
    build_s = time.perf_counter() - t0
    r1 = rss_mb()
    out = {"lib": lib, "build_s": build_s, "rss_delta_mb": r1 - r0, "serialized_mb": (serialized / 2**20) if serialized else None,
           "n": len(M), "queries": len(Q), "runs": []}
    for q in Q[:20]:
        search(q, 10, EF_SEARCH[0])
    for ef in EF_SEARCH:
        raw_times, raw_recall, times, recall10, recall100 = [], [], [], [], []
        for q, want in zip(Q, gt):
            t = time.perf_counter()
            ids = np.asarray(search(q, 10, ef), dtype=np.int64)
            raw_times.append((time.perf_counter() - t) * 1000)
            raw_recall.append(len(set(ids.tolist()) & set(want[:10].tolist())) / 10)
            t = time.perf_counter()
            ids = np.asarray(search(q, FETCH, ef), dtype=np.int64)
            ids = ids[ids >= 0]
            exact = M[ids] @ q  # the engine re-scores candidates with the stored float32 vectors
            best = ids[np.argsort(-exact, kind="stable")[:10]]
            times.append((time.perf_counter() - t) * 1000)
            recall10.append(len(set(best.tolist()) & set(want[:10].tolist())) / 10)
            recall100.append(len(set(ids.tolist()) & set(want.tolist())) / FETCH)
        out["runs"].append({
            "ef": ef, "raw_p50": pct(raw_times, 50), "raw_p95": pct(raw_times, 95), "raw_recall10": float(np.mean(raw_recall)),
            "p50": pct(times, 50), "p95": pct(times, 95), "recall10": float(np.mean(recall10)),
            "recall100": float(np.mean(recall100)), "min_recall10": float(np.min(recall10)),
        })
        print(json.dumps({"lib": lib, **out["runs"][-1]}), file=sys.stderr, flush=True)
    return out


def w_exact(p: dict) -> dict:
    """NumPy exact top-100 (1 BLAS thread), the baseline."""
    M = np.load(p["vectors"])
    Q = np.load(p["queries"])[: int(p.get("limit", 300))]
    times = []
    for q in Q[:10]:
        M @ q
    for q in Q:
        t = time.perf_counter()
        s = M @ q
        part = np.argpartition(-s, FETCH)[:FETCH]
        part[np.argsort(-s[part])]
        times.append((time.perf_counter() - t) * 1000)
    return {"lib": "numpy exact", "p50": pct(times, 50), "p95": pct(times, 95), "queries": len(Q)}


# --------------------------------------------------------------------------- engine worker
def w_engine(p: dict) -> dict:
    import resource

    from knowledge_store.config.settings import Settings
    from knowledge_store.retrieval.engine import RetrievalEngine

    root = Path(p["root"])
    texts = queries()[: int(p["queries"])]
    out: dict = {}
    results: dict[str, list[list[str]]] = {}
    for mode in ("ann", "exact"):
        overrides = {} if mode == "ann" else {"ann_min_chunks": 10**9}  # ANN: the default threshold (1M is above it)
        if mode == "ann":  # measure a build, not a cache load
            for side in (root / "index").glob("*.ann-*"):
                side.unlink()
        settings = Settings(data_dir=root, query_torch_threads=1, search_threads=1, query_cache_size=0,
                            ann_build_threads=int(p["build_threads"]), **overrides)
        engine = RetrievalEngine(settings)
        r0 = rss_mb()
        t = time.perf_counter()
        engine.warm_up()
        snapshot = engine.snapshots.current()
        load_s = time.perf_counter() - t
        ann_s = None
        r_loaded = rss_mb()
        if mode == "ann":
            t = time.perf_counter()
            ann = engine.snapshots.wait_for_ann(snapshot, timeout_s=3600)
            ann_s = time.perf_counter() - t
            out["ann_info"] = ann.describe() if ann is not None else None
            out["ann_vector"] = ann_vector_stats(ann, snapshot, p)
            # a restart: the same graph from its side file
            from knowledge_store.retrieval.ann import obtain

            t = time.perf_counter()
            again = obtain(snapshot.path, snapshot.info, snapshot.embeddings, ann.config)
            out["ann_restart"] = {"origin": again.origin, "seconds": time.perf_counter() - t}
            del again
        r1 = rss_mb()
        for q in texts[:20]:
            engine.search(q, k=5, min_relevance=0.0, log=False)
        totals, no_embed, stages, tops = [], [], {}, []
        for q in texts:
            response = engine.search(q, k=5, min_relevance=0.0)
            lat = response.latency_ms
            totals.append(lat["total"])
            no_embed.append(lat["total"] - lat["embed"])
            for key in ("embed", "bm25", "vector", "fuse", "format"):
                stages.setdefault(key, []).append(lat[key])
            tops.append([h.chunk_id for h in response.hits])
        results[mode] = tops
        if mode == "ann":
            from knowledge_store.retrieval import ann as ann_module

            out["pool_modes"] = dict(ann_module.STATS)
        engine.query_log.close()
        out[mode] = {
            "chunks": snapshot.size, "snapshot_load_s": snapshot.load_seconds, "warm_up_s": load_s, "ann_ready_s": ann_s,
            "rss_before_load_mb": r0, "rss_loaded_mb": r_loaded, "rss_ann_delta_mb": r1 - r_loaded, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "p50": pct(totals, 50), "p95": pct(totals, 95), "p99": pct(totals, 99),
            "ne_p50": pct(no_embed, 50), "ne_p95": pct(no_embed, 95),
            "stage_p50": {k: pct(v, 50) for k, v in stages.items()},
            "stage_p95": {k: pct(v, 95) for k, v in stages.items()},
        }
        print(json.dumps({mode: out[mode]}), file=sys.stderr, flush=True)
        snapshot.close()
        del engine, snapshot
        import gc

        gc.collect()
    same = [a == b for a, b in zip(results["ann"], results["exact"])]
    overlap = [len(set(a) & set(b)) / max(1, len(b)) for a, b in zip(results["ann"], results["exact"])]
    out["agreement"] = {"identical_top5": float(np.mean(same)), "top5_overlap": float(np.mean(overlap)), "queries": len(same)}
    return out


def ann_vector_stats(ann, snapshot, p: dict) -> dict:
    """The attached graph alone at 1M: recall@10 against exact over all queries, and its latency
    as the engine uses it (ask for max(pool, ef_search) rows, re-score them with the float32 vectors)."""
    Q = np.load(p["queries_path"])
    gt = np.load(p["gt_path"])
    M = snapshot.embeddings
    runs = []
    for ef in sorted({128, 256, 512, 1024, ann.config.ef_search}):
        ann.index.expansion_search = ef
        fetch = max(FETCH, ef)
        for q in Q[:20]:
            ann.search(q, fetch)
        times, raw, recall10, recall100 = [], [], [], []
        for q, want in zip(Q, gt):
            t = time.perf_counter()
            ids = ann.search(q, fetch)
            best = ids[np.argsort(-(M[ids] @ q), kind="stable")]
            times.append((time.perf_counter() - t) * 1000)
            raw.append(len(set(ids[:10].tolist()) & set(want[:10].tolist())) / 10)
            recall10.append(len(set(best[:10].tolist()) & set(want[:10].tolist())) / 10)
            recall100.append(len(set(best[:FETCH].tolist()) & set(want.tolist())) / FETCH)
        runs.append({"ef": ef, "queries": len(Q), "fetch": fetch, "p50": pct(times, 50), "p95": pct(times, 95),
                     "recall10_raw": float(np.mean(raw)), "recall10": float(np.mean(recall10)),
                     "recall100": float(np.mean(recall100)), "min_recall10": float(np.min(recall10))})
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    ann.index.expansion_search = ann.config.ef_search
    return runs


WORKERS = {"library": w_library, "exact": w_exact, "engine": w_engine}


def run_worker(name: str, params: dict, threads: int, timeout: int = 5400) -> dict:
    env = dict(os.environ)
    for var in THREAD_ENV:
        env[var] = str(threads)
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    fd, result = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--params", json.dumps(params), "--worker-out", result]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {name} {params.get('lib', '')} failed ({proc.returncode})")
    data = json.loads(Path(result).read_text())
    os.unlink(result)
    data["wall_s"] = time.perf_counter() - started
    return data


def uptime() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker")
    parser.add_argument("--params")
    parser.add_argument("--worker-out")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "groundwork-ann-1m")
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--source-index", type=Path, default=None)
    parser.add_argument("--libraries", nargs="*", default=["usearch-f32", "usearch-i8", "faiss", "hnswlib"])
    parser.add_argument("--build-threads", type=int, default=2)
    parser.add_argument("--library-rows", type=int, default=None, help="compare libraries on the first N rows only")
    parser.add_argument("--queries", type=int, default=300, help="engine part: SciFact test claims")
    parser.add_argument("--vectors", choices=("mixture", "replica"), default="mixture",
                        help="mixture: each replica mixes in another chunk (default); replica: base + isotropic noise "
                             "(bench/query_latency.py; 86 near-equidistant copies per chunk, a stress case for HNSW)")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-libraries", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "ann_1m.json")
    args = parser.parse_args()
    if args.worker:
        result = WORKERS[args.worker](json.loads(args.params))
        Path(args.worker_out).write_text(json.dumps(result))
        return 0

    from bench.ingest_throughput import machine

    report: dict = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                    "load_start": uptime(), "size": args.size}
    source = args.source_index
    if source is None:
        evals = sorted((ROOT / "data" / "eval").glob("scifact-*/store/index"))
        source = evals[0] if evals else ROOT / "data" / "index"
    args.root.mkdir(parents=True, exist_ok=True)
    report["snapshot"] = ensure_snapshot(args.root, args.size, source, args.vectors)
    paths = {k: str(v) for k, v in ensure_vectors(args.root).items()}
    if not args.skip_libraries:
        report["exact"] = run_worker("exact", {**paths}, 1)
        print(json.dumps(report["exact"]), flush=True)
    report["libraries"] = []
    for lib in [] if args.skip_libraries else args.libraries:
        try:
            result = run_worker("library", {**paths, "lib": lib, "threads": args.build_threads, "rows": args.library_rows},
                                args.build_threads)
        except Exception as error:  # noqa: BLE001 - one library failing must not lose the others
            result = {"lib": lib, "error": str(error)}
        report["libraries"].append(result)
        print(json.dumps(result), flush=True)
    if not args.skip_engine:
        report["engine"] = run_worker("engine", {"root": str(args.root), "queries": args.queries,
                                                 "queries_path": paths["queries"], "gt_path": paths["gt"],
                                                 "build_threads": args.build_threads}, 1)
        print(json.dumps(report["engine"]), flush=True)
    report["load_end"] = uptime()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
