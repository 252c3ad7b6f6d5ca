"""Exact cosine of one query against every row, shared by the query's thread and helper threads.

Below ``settings.ann_min_chunks`` vector search is one matrix-vector product over the
snapshot's L2-normalised float32 rows.  It reads the whole matrix (153 MB at 100k
chunks x 384 dims), so it is bound by memory bandwidth, and it was the largest step of a
query at 100k chunks (16-18 ms p95 of ~37: docs/BENCHMARKS.md).  By the time it runs the
other core is free - BM25 ran there while the query was embedded - so the rows are split
into blocks that the query's thread and ``threads - 1`` helpers take in turn.

Why blocks taken in turn rather than one half each (or OpenBLAS's own threads): on a
shared machine a core can be busy with another process for a few milliseconds; with
fixed halves the query would wait for the late half, with OpenBLAS it would wait at its
barrier.  Here the thread that is running keeps taking blocks, so a busy core makes the
scan no slower than the single-threaded one, only less faster.

Each block is NumPy's own ``matmul`` (the GIL is released inside), so the result is the
same product row for row.
"""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np

# below this many rows one call is cheaper than handing out blocks (a 20k x 384 scan takes ~2 ms)
PARALLEL_MIN_ROWS = 20_000
BLOCK_ROWS = 12_500  # ~19 MB of float32 at 384 dims: several blocks per thread, each long enough to stream

_helpers: concurrent.futures.ThreadPoolExecutor | None = None
_helpers_lock = threading.Lock()


def _helper_pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """One process-wide pool of ``threads - 1`` helpers (grown if a later caller asks for more)."""
    global _helpers
    with _helpers_lock:
        if _helpers is None or _helpers._max_workers < threads - 1:  # noqa: SLF001 - size check only
            _helpers = concurrent.futures.ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="vector-scan")
        return _helpers


def cosine_scan(embeddings: np.ndarray, query: np.ndarray, threads: int = 1) -> np.ndarray:
    """``embeddings @ query`` as float32, computed by up to ``threads`` threads taking row blocks in turn."""
    query = np.ascontiguousarray(query, dtype=np.float32)
    n = len(embeddings)
    if threads <= 1 or n < PARALLEL_MIN_ROWS:
        return embeddings @ query
    out = np.empty(n, dtype=np.float32)
    starts = list(range(0, n, BLOCK_ROWS))
    lock = threading.Lock()
    position = [0]

    def take_blocks() -> None:
        while True:
            with lock:
                i = position[0]
                position[0] += 1
            if i >= len(starts):
                return
            start = starts[i]
            stop = min(start + BLOCK_ROWS, n)
            np.matmul(embeddings[start:stop], query, out=out[start:stop])

    pool = _helper_pool(threads)
    helpers = [pool.submit(take_blocks) for _ in range(min(threads, len(starts)) - 1)]
    take_blocks()
    for helper in helpers:
        helper.result()
    return out
