"""How soon `groundwork serve` answers, and how long its model takes to load, on a fresh data folder.

Starts ``python -m knowledge_store.cli serve`` (the way `groundwork serve` runs) with ``GROUNDWORK_DATA_DIR`` a new
temporary folder, so the embedding model's derived files (ONNX export, int8 graph) are not there yet, and times from
the process start:

* ``bind_s``: the port accepts a TCP connection;
* ``health_s``: ``/health`` first answers (any status), with what it said;
* ``model_s``: ``/health`` says the model service is ``up`` (or ``error``), after the export and quantisation.

The model is the configured one (the environment's ``GROUNDWORK_EMBEDDING_MODEL``, all-mpnet-base-v2 by default).
Prints one JSON line with the times, the model states ``/health`` reported on the way, and the load average.

    .venv/bin/python bench/time_to_bind.py [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    args = parser.parse_args()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    port = free_port()
    result: dict = {"model": os.environ.get("GROUNDWORK_EMBEDDING_MODEL", "mpnet (default)"), "load_before": load_before}
    with tempfile.TemporaryDirectory(prefix="gw-bind-") as data:
        env = {**os.environ, "GROUNDWORK_DATA_DIR": data, "GROUNDWORK_SERVER_PORT": str(port)}
        log = Path(data) / "serve.log"
        started = time.perf_counter()
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "knowledge_store.cli", "serve"], env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        states: list[tuple[float, str]] = []
        try:
            while time.perf_counter() - started < args.timeout and proc.poll() is None:
                now = time.perf_counter() - started
                if "bind_s" not in result:
                    if accepts(port):
                        result["bind_s"] = round(time.perf_counter() - started, 2)
                    else:
                        time.sleep(0.05)
                        continue
                try:
                    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
                except httpx.HTTPError:
                    time.sleep(0.2)
                    continue
                now = time.perf_counter() - started
                if "health_s" not in result:
                    result["health_s"] = round(now, 2)
                    result["first_health"] = {"status": health["status"], "model": health["services"]["model"],
                                              "reason": health["reasons"].get("model")}
                model = health["services"]["model"]
                detail = (health.get("model_load") or {}).get("phase")
                label = f"{model}:{detail}" if detail else model
                if not states or states[-1][1] != label:
                    states.append((round(now, 2), label))
                if model in ("up", "error", "failed"):
                    result["model_s"] = round(now, 2)
                    break
                time.sleep(0.5)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        result["model_states"] = states
        result["exit_code"] = proc.returncode
        result["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        if "bind_s" not in result:
            result["log_tail"] = log.read_text()[-2000:]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
