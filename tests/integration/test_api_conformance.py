"""The OpenAPI schema and the server agree: a bounded schemathesis run against a real server.

``groundwork serve`` runs in its own process over the sample-corpus index, and
schemathesis (fixed seed, every check, the examples/coverage/fuzzing/stateful
phases, ~1-2 minutes here; the bound is 3) sends it schema-valid and
schema-violating requests.  The run must end with 0 server errors and 0 schema
violations: undocumented statuses or content types, bodies that do not match the
response models, invalid input accepted or valid input refused.
tests/schemathesis/schemathesis.toml lists the four operations whose acceptance
depends on the world (files, folders, URLs, earlier responses) and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import build_sample_index, free_port

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).resolve().parents[1] / "schemathesis" / "schemathesis.toml"
SEED = 20261123
TIME_BOUND_S = 180


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("conformance")
    settings = build_sample_index(root, embedder)
    port = free_port()
    env = {**os.environ, "GROUNDWORK_DATA_DIR": str(settings.data_dir), "GROUNDWORK_SOURCES": str(root / "docs"),
           "GROUNDWORK_SERVER_PORT": str(port), "GROUNDWORK_WEB_TIMEOUT_S": "2", "GROUNDWORK_WEB_MAX_RETRIES": "0",
           "HF_HUB_OFFLINE": "1", "GROUNDWORK_TORCH_THREADS": "1"}
    log_path = root / "server.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "knowledge_store.cli", "serve"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"server did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"base": base, "log": log_path, "root": root}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_schemathesis_finds_no_server_errors_and_no_schema_violations(server):
    report = server["root"] / "schemathesis.json"
    command = [
        str(Path(sys.executable).with_name("st")), "--config-file", str(CONFIG), "run", f"{server['base']}/openapi.json",
        "--seed", str(SEED), "--max-examples", "80", "--phases", "examples,coverage,fuzzing,stateful",
        "--checks", "all", "--workers", "1", "--request-timeout", "30",
        "--report", "json", "--report-json-path", str(report), "--no-color",
    ]
    began = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, timeout=TIME_BOUND_S + 60, cwd=server["root"])
    seconds = time.monotonic() - began
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert "passed" in output and " failed" not in output.split("SUMMARY")[-1], output[-3000:]
    server_log = server["log"].read_text()
    assert "Traceback" not in server_log, server_log[-4000:]
    assert seconds < TIME_BOUND_S + 30, f"the conformance run took {seconds:.0f} s"
    print(f"schemathesis: {seconds:.0f} s; " + " ".join(output.split("Test cases:")[-1].split()[:6]))
    if report.exists():
        json.loads(report.read_text())  # the report is valid JSON (kept for debugging a failure)
