"""The OpenAPI schema and the server agree on both surfaces: bounded schemathesis runs against a real server.

``groundwork serve`` runs in its own process in remote mode (an admin token configured, as a server run
for others has) over the sample-corpus index, and schemathesis (fixed seed, every check, the
examples/coverage/fuzzing/stateful phases) sends it schema-valid and schema-violating requests twice:
with the admin token (every operation, tests/schemathesis/schemathesis.toml) and without it
(tests/schemathesis/public-surface.toml: the public operations as a docs site's reader calls them, and
every admin operation must answer 401).  Each run must end with 0 server errors and 0 schema violations:
undocumented statuses or content types, bodies that do not match the response models, invalid input
accepted or valid input refused.  The toml files list the operations whose acceptance depends on the
world (files, folders, URLs, earlier responses) and why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import build_sample_index, start_serve, stop, wait_healthy

pytestmark = pytest.mark.slow
CONFIGS = Path(__file__).resolve().parents[1] / "schemathesis"
SEED = 20261123
TIME_BOUND_S = 180
TOKEN = "conformance-admin-token-0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("conformance")
    settings = build_sample_index(root, embedder)
    log_path = root / "server.log"
    # a generous public rate: the 429 path has its own test (test_remote_access.py), here every request counts
    proc, base = start_serve({
        "GROUNDWORK_DATA_DIR": str(settings.data_dir), "GROUNDWORK_SOURCES": str(root / "docs"),
        "GROUNDWORK_WEB_TIMEOUT_S": "2", "GROUNDWORK_WEB_MAX_RETRIES": "0", "GROUNDWORK_ALLOW_REMOTE": "true",
        "GROUNDWORK_ADMIN_TOKEN": TOKEN, "GROUNDWORK_PUBLIC_RATE": "10000", "GROUNDWORK_PUBLIC_BURST": "10000",
    }, log_path, cwd=root)
    try:
        wait_healthy(proc, base, log_path)
        yield {"base": base, "log": log_path, "root": root}
    finally:
        stop(proc)


@pytest.mark.parametrize("surface, config, headers", [
    ("admin", "schemathesis.toml", ["-H", f"Authorization: Bearer {TOKEN}"]),
    ("public", "public-surface.toml", []),
])
def test_schemathesis_finds_no_server_errors_and_no_schema_violations(server, surface, config, headers):
    report = server["root"] / f"schemathesis-{surface}.json"
    command = [
        str(Path(sys.executable).with_name("st")), "--config-file", str(CONFIGS / config), "run",
        f"{server['base']}/openapi.json", *headers,
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
    assert TOKEN not in server_log  # the token never reaches the log
    assert seconds < TIME_BOUND_S + 30, f"the conformance run took {seconds:.0f} s"
    print(f"schemathesis ({surface} surface): {seconds:.0f} s; " + " ".join(output.split("Test cases:")[-1].split()[:6]))
    if report.exists():
        json.loads(report.read_text())  # the report is valid JSON (kept for debugging a failure)
