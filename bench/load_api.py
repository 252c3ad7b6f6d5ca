"""Bounded load run against the HTTP API: N concurrent clients for T seconds on a 10k-chunk index.

    .venv/bin/python bench/load_api.py [--clients 50] [--seconds 30] [--size 10000] [--think-ms 0]
        [--out docs/benchmarks/load_api.md]

Starts `groundwork serve` in its own process on 127.0.0.1 (a free port) over a
synthetic snapshot (real SciFact chunks replicated, see bench/query_latency.py),
waits until /health reports the model and index loaded, then runs closed-loop
clients (each sends POST /api/knowledge/query, waits for the answer, optionally
thinks, repeats) until the time is up.  Queries are distinct SciFact claims with
the query-embedding cache off, so no answer comes from a cache.  Loopback only;
the run stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import publish  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def client_loop(client, url: str, queries: list[str], stop_at: float, think: float, out: list, errors: list, rng):
    while time.perf_counter() < stop_at:
        query = rng.choice(queries)
        started = time.perf_counter()
        try:
            response = await client.post(url, json={"query": query, "k": 5})
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code == 200:
                out.append(elapsed)
            else:
                errors.append(f"HTTP {response.status_code}")
        except Exception as error:  # noqa: BLE001 - every failure is counted, none stops the run
            errors.append(type(error).__name__)
        if think:
            await asyncio.sleep(think)


async def run_load(base: str, queries: list[str], clients: int, seconds: float, think_ms: float) -> dict:
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        await asyncio.gather(*[
            client_loop(client, f"{base}/api/knowledge/query", queries, stop_at, think_ms / 1000, latencies, errors,
                        random.Random(i))
            for i in range(clients)
        ])
        wall = time.perf_counter() - started
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * (len(latencies) - 1)))] if latencies else float("nan")

    return {"clients": clients, "seconds": round(wall, 1), "think_ms": think_ms, "requests": len(latencies) + len(errors),
            "ok": len(latencies), "errors": len(errors), "error_kinds": sorted(set(errors)),
            "throughput_rps": round(len(latencies) / wall, 1), "p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--size", type=int, default=10000)
    parser.add_argument("--think-ms", type=float, nargs="+", default=[0.0])
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "load_api.md")
    args = parser.parse_args()
    from bench.ingest_throughput import machine
    from bench.query_latency import build_synthetic

    evals = sorted((ROOT / "data" / "eval").glob("scifact-*/store/index"))
    source = evals[0] if evals else ROOT / "data" / "index"
    qdir = ROOT.parent / "shared" / "datasets" / "scifact"
    queries = []
    for name in ("queries.jsonl", "queries_train.jsonl"):
        if (qdir / name).exists():
            queries += [json.loads(line)["text"] for line in (qdir / name).open()]
    queries = queries or [f"question {i} about thermostat wiring" for i in range(1000)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        build_synthetic(source, data_dir / "index", args.size)
        port = free_port()
        env = {**os.environ, "GROUNDWORK_DATA_DIR": str(data_dir), "GROUNDWORK_SERVER_PORT": str(port),
               "GROUNDWORK_QUERY_CACHE_SIZE": "0", "GROUNDWORK_QUERY_TORCH_THREADS": str(args.torch_threads),
               "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        server = subprocess.Popen([sys.executable, "-m", "knowledge_store.cli", "serve"], env=env, cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        base = f"http://127.0.0.1:{port}"
        try:
            import httpx

            deadline = time.time() + 120
            while time.time() < deadline:
                try:
                    health = httpx.get(f"{base}/health", timeout=2).json()
                    if health.get("model_loaded") and health.get("index"):
                        break
                except Exception:  # noqa: BLE001 - not up yet
                    pass
                time.sleep(0.5)
            else:
                raise SystemExit(f"server did not become healthy: {server.stderr.read()[-2000:] if server.poll() is not None else ''}")
            load_avg = os.getloadavg()[0]
            for think in args.think_ms:
                result = asyncio.run(run_load(base, queries, args.clients, args.seconds, think))
                result["load_avg_before"] = round(load_avg, 2)
                results.append(result)
                print(json.dumps(result), flush=True)
                load_avg = os.getloadavg()[0]
        finally:
            server.terminate()
            server.wait(timeout=30)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## API load: concurrent clients against a 10k-chunk index (issue 4)",
        "",
        f"Date: {date}. Machine: {machine()}. Server: `groundwork serve` (uvicorn, one process) with "
        f"{args.torch_threads} torch thread(s), query-embedding cache off, over {args.size:,} chunks; "
        f"client: {args.clients} closed-loop httpx clients on the same 2 cores, POST /api/knowledge/query k=5 with distinct "
        "SciFact claims. Reproduce: `.venv/bin/python bench/load_api.py`.",
        "",
        "| clients | think time ms | seconds | requests | errors | throughput req/s | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['clients']} | {r['think_ms']:g} | {r['seconds']} | {r['requests']} | {r['errors']} | "
                     f"{r['throughput_rps']} | {r['p50']:.0f} | {r['p95']:.0f} | {r['p99']:.0f} |")
    lines += ["", "Target: no errors, p95 under 150 ms.", ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
