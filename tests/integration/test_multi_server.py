"""Serving past one process: two `groundwork serve` processes read the same published snapshots.

Both answer the same queries while a `groundwork ingest` process re-syncs and publishes
a new snapshot; neither fails a request, both switch to the new snapshot without a
restart, and both log into the same query log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from knowledge_store.storage.query_log import QueryLog
from tests.helpers import MARKDOWN_FILLER, build_sample_index, start_serve, stop, wait_healthy

pytestmark = pytest.mark.slow
QUESTION = "how do I reset the Aurora to factory settings"


def test_two_server_processes_answer_the_same_queries_during_a_resync(tmp_path, embedder):
    settings = build_sample_index(tmp_path, embedder)
    docs = tmp_path / "docs"
    env = {"GROUNDWORK_DATA_DIR": str(settings.data_dir), "GROUNDWORK_SOURCES": str(docs)}
    servers = [start_serve(env, tmp_path / f"server-{i}.log") for i in range(2)]
    try:
        for (proc, base), i in zip(servers, range(2)):
            wait_healthy(proc, base, tmp_path / f"server-{i}.log")
        before = {base: httpx.get(f"{base}/health").json()["index"]["snapshot_version"] for _, base in servers}
        assert len(set(before.values())) == 1

        first = [httpx.post(f"{base}/api/knowledge/query", json={"query": QUESTION, "k": 3}, timeout=30).json()
                 for _, base in servers]
        assert [r["chunk_id"] for r in first[0]["results"]] == [r["chunk_id"] for r in first[1]["results"]]

        (docs / "gateway-relay.md").write_text(
            "# Gateway relay interval\n\nThe Aurora gateway relays sensor readings to the hub every ninety seconds.\n"
            + MARKDOWN_FILLER)
        statuses: dict[str, list[int]] = {base: [] for _, base in servers}
        done = threading.Event()

        def hammer(base: str) -> None:
            with httpx.Client(timeout=30) as client:
                while not done.is_set():
                    statuses[base].append(client.post(f"{base}/api/knowledge/query",
                                                      json={"query": QUESTION, "k": 3}).status_code)

        threads = [threading.Thread(target=hammer, args=(base,)) for _, base in servers]
        for t in threads:
            t.start()
        sync = subprocess.run(
            [sys.executable, "-m", "knowledge_store.cli", "ingest", "--json", "--data-dir", str(settings.data_dir),
             "--sources", str(docs)],
            env={**os.environ, "DAGSTER_HOME": "", "GROUNDWORK_TORCH_THREADS": "1"},
            capture_output=True, text=True, timeout=600)
        time.sleep(1.0)  # let both servers notice the new snapshot while still being queried
        done.set()
        for t in threads:
            t.join()
        assert sync.returncode == 0, sync.stderr[-2000:]
        for base, codes in statuses.items():
            assert codes and set(codes) == {200}, (base, {c: codes.count(c) for c in set(codes)})

        after = {}
        for _, base in servers:
            answer = httpx.post(f"{base}/api/knowledge/query", json={
                "query": "how often does the gateway relay sensor readings", "k": 3}, timeout=30).json()
            after[base] = answer["snapshot_version"]
            assert "gateway-relay.md" in answer["results"][0]["url"], (base, answer["results"][0]["url"])
        assert len(set(after.values())) == 1 and set(after.values()) != set(before.values())
    finally:
        for proc, _ in servers:
            stop(proc)
    # both processes logged into the one query log (spooled lines are imported by the next writer)
    log = QueryLog(settings.logs_path)
    try:
        clients = log.list(limit=100000)
        assert len(clients) >= sum(len(codes) for codes in statuses.values())
    finally:
        log.close()
