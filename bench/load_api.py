"""Bounded load runs against the HTTP API on a 10k-chunk index: closed-loop clients, or an open-loop profile.

    .venv/bin/python bench/load_api.py [--clients 50] [--seconds 30] [--size 10000] [--think-ms 0]
        [--out docs/benchmarks/load_api.md]
    .venv/bin/python bench/load_api.py --profile seed [--replicas 1 2] [--sweep 20 40 60 80 100 120 160]
        [--out docs/benchmarks/load_api_seed.md]

``--profile seed`` is the product's load target: 100 users x 10 queries/s for 5 minutes (1,000 queries/s offered),
p95 under 500 ms.  Arrivals are open-loop (Poisson at the offered rate, whatever the server's speed, so a slow
server is not flattered by clients that wait for it) and bounded (``--max-in-flight`` requests at once; an arrival
over the bound is counted as dropped, not sent); latency is measured from each request's scheduled arrival.  It
runs against one server and against ``--replicas`` servers on the same snapshot (arrivals spread round-robin), then
a short ``--sweep`` of lower offered rates finds the saturation point: the highest rate served with p95 under the
bound and no drops or errors.

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


def load_queries() -> list[str]:
    """SciFact's claims (distinct queries), or generated ones without ../shared."""
    qdir = ROOT.parent / "shared" / "datasets" / "scifact"
    queries = []
    for name in ("queries.jsonl", "queries_train.jsonl"):
        if (qdir / name).exists():
            queries += [json.loads(line)["text"] for line in (qdir / name).open()]
    return queries or [f"question {i} about thermostat wiring" for i in range(1000)]


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


async def run_open_loop(bases: list[str], queries: list[str], rate: float, seconds: float, max_in_flight: int,
                        seed: int = 0) -> dict:
    """Poisson arrivals at ``rate`` per second for ``seconds``, spread round-robin over ``bases``; at most
    ``max_in_flight`` requests outstanding (arrivals over it are dropped and counted)."""
    import httpx

    rng = random.Random(seed)
    latencies: list[float] = []
    errors: list[str] = []
    dropped = 0
    in_flight = 0
    tasks: set[asyncio.Task] = set()
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)

    async def one(client, url: str, query: str, due: float) -> None:
        nonlocal in_flight
        try:
            response = await client.post(url, json={"query": query, "k": 5})
            if response.status_code == 200:
                latencies.append((time.perf_counter() - due) * 1000)
            else:
                errors.append(f"HTTP {response.status_code}")
        except Exception as error:  # noqa: BLE001 - every failure is counted, none stops the run
            errors.append(type(error).__name__)
        finally:
            in_flight -= 1

    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        started = time.perf_counter()
        due = started
        sent = 0
        while True:
            due += rng.expovariate(rate)
            if due - started >= seconds:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if in_flight >= max_in_flight:
                dropped += 1
                continue
            in_flight += 1
            url = f"{bases[sent % len(bases)]}/api/knowledge/query"
            sent += 1
            task = asyncio.create_task(one(client, url, rng.choice(queries), due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * (len(latencies) - 1)))] if latencies else float("nan")

    arrivals = sent + dropped
    return {"replicas": len(bases), "offered_rps": rate, "seconds": round(wall, 1), "arrivals": arrivals, "sent": sent,
            "ok": len(latencies), "errors": len(errors), "error_kinds": sorted(set(errors)), "dropped": dropped,
            "achieved_rps": round(len(latencies) / wall, 1), "p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99)}


def start_servers(data_dir: Path, count: int, torch_threads: int) -> tuple[list[subprocess.Popen], list[str]]:
    """``count`` ``groundwork serve`` processes on free loopback ports over one data folder, each healthy."""
    import httpx

    servers, bases = [], []
    for _ in range(count):
        port = free_port()
        env = {**os.environ, "GROUNDWORK_DATA_DIR": str(data_dir), "GROUNDWORK_SERVER_PORT": str(port),
               "GROUNDWORK_QUERY_CACHE_SIZE": "0", "GROUNDWORK_QUERY_TORCH_THREADS": str(torch_threads),
               "GROUNDWORK_QUERY_LOG_STDOUT": "false", "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        servers.append(subprocess.Popen([sys.executable, "-m", "knowledge_store.cli", "serve"], env=env, cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        bases.append(f"http://127.0.0.1:{port}")
    deadline = time.time() + 180
    for server, base in zip(servers, bases):
        while time.time() < deadline:
            try:
                if healthy(httpx.get(f"{base}/health", timeout=2).json()):
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.5)
        else:
            stop_servers(servers)
            raise SystemExit(f"server {base} did not become healthy: "
                             f"{server.stderr.read()[-2000:] if server.poll() is not None else ''}")
    return servers, bases


def healthy(health: dict) -> bool:
    """The model and the index are loaded: ``/health``'s ``services`` (its contract's shape) say both are ``up``; the
    status may be ``degraded`` for an optional part (no DAGSTER_HOME here), never ``unhealthy``."""
    services = health.get("services")
    if not isinstance(services, dict) or health.get("status") not in ("healthy", "degraded"):
        return False
    return all(services.get(name) == "up" for name in ("model", "index"))


def stop_servers(servers: list[subprocess.Popen]) -> None:
    for server in servers:
        server.terminate()
    for server in servers:
        server.wait(timeout=30)


def seed_profile(args, queries: list[str]) -> int:
    """The product's load target against 1 and ``--replicas`` servers, then the saturation sweep; to ``--out``."""
    from bench.ingest_throughput import machine
    from bench.query_latency import build_synthetic

    rate = args.users * args.user_rps
    runs: list[dict] = []
    evals = sorted((ROOT / "data" / "eval").glob("scifact-*/store/index"))
    source = args.source_index or (evals[0] if evals else ROOT / "data" / "index")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        build_synthetic(source, data_dir / "index", args.size)
        for replicas in args.replicas:
            servers, bases = start_servers(data_dir, replicas, args.torch_threads)
            try:
                load = os.getloadavg()
                result = asyncio.run(run_open_loop(bases, queries, rate, args.seconds, args.max_in_flight))
                result.update(kind="seed profile", load_avg_before=[round(x, 2) for x in load])
                runs.append(result)
                print(json.dumps(result), flush=True)
                for offered in args.sweep:
                    load = os.getloadavg()
                    result = asyncio.run(run_open_loop(bases, queries, offered, args.sweep_seconds, args.max_in_flight))
                    result.update(kind="sweep", load_avg_before=[round(x, 2) for x in load])
                    runs.append(result)
                    print(json.dumps(result), flush=True)
            finally:
                stop_servers(servers)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    bound = args.p95_bound_ms
    lines = [
        "## API load at the target's scale: 100 users x 10 queries/s (the product's load target)",
        "",
        f"Date: {date}. Machine: {machine()}. Servers: `groundwork serve` (uvicorn, one process each, "
        f"{args.torch_threads} ONNX thread(s), query-embedding cache off) over one {args.size:,}-chunk snapshot; the "
        f"load generator (open-loop Poisson arrivals, at most {args.max_in_flight} requests in flight, POST "
        "/api/knowledge/query k=5 with distinct SciFact claims) runs on the same cores. Latency counts from each "
        "request's scheduled arrival. Reproduce: `.venv/bin/python bench/load_api.py --profile seed`.",
        "",
        "| replicas | run | offered req/s | seconds | load avg before | sent | dropped (over bound) | errors | achieved req/s "
        "| p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(f"| {r['replicas']} | {r['kind']} | {r['offered_rps']:g} | {r['seconds']} | "
                     f"{' '.join(str(x) for x in r['load_avg_before'])} | {r['sent']} | {r['dropped']} | {r['errors']} | "
                     f"{r['achieved_rps']} | {r['p50']:.0f} | {r['p95']:.0f} | {r['p99']:.0f} |")
    for replicas in args.replicas:
        served = [r for r in runs if r["replicas"] == replicas and r["kind"] == "sweep" and r["p95"] < bound
                  and not r["dropped"] and not r["errors"]]
        best = max(served, key=lambda r: r["offered_rps"], default=None)
        lines.append("")
        lines.append(f"Saturation, {replicas} replica(s): "
                     + (f"{best['offered_rps']:g} req/s offered served with p95 {best['p95']:.0f} ms (bound {bound:g} ms)."
                        if best else f"no swept rate met p95 < {bound:g} ms without drops."))
    publish(lines, args.out)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--size", type=int, default=10000)
    parser.add_argument("--think-ms", type=float, nargs="+", default=[0.0])
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", choices=["closed", "seed"], default="closed")
    parser.add_argument("--source-index", type=Path, default=None,
                        help="seed profile: the published index whose chunks are replicated (default: the SciFact "
                             "evaluation store under data/eval, else data/index)")
    parser.add_argument("--users", type=int, default=100, help="seed profile: users")
    parser.add_argument("--user-rps", type=float, default=10.0, help="seed profile: queries per second per user")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--sweep", type=float, nargs="*", default=[20, 40, 60, 80, 100, 120, 160])
    parser.add_argument("--sweep-seconds", type=float, default=30.0)
    parser.add_argument("--p95-bound-ms", type=float, default=500.0)
    args = parser.parse_args()
    if args.profile == "seed":
        if args.seconds == 30.0:
            args.seconds = 300.0  # the target's five minutes unless asked otherwise
        args.out = args.out or ROOT / "docs" / "benchmarks" / "load_api_seed.md"
        return seed_profile(args, load_queries())
    args.out = args.out or ROOT / "docs" / "benchmarks" / "load_api.md"
    from bench.ingest_throughput import machine
    from bench.query_latency import build_synthetic

    evals = sorted((ROOT / "data" / "eval").glob("scifact-*/store/index"))
    source = evals[0] if evals else ROOT / "data" / "index"
    queries = load_queries()
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
                    if healthy(health):
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
