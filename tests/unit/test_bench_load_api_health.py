"""bench/load_api.py waits for a server through the health contract's shape: services model and index "up"."""

from __future__ import annotations

import importlib.util

from tests.helpers import REPO_ROOT as ROOT


def _load_bench():
    spec = importlib.util.spec_from_file_location("load_api_bench", ROOT / "bench" / "load_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthy_reads_the_services_map_of_seed_004():
    healthy = _load_bench().healthy
    up = {"store": "up", "index": "up", "model": "up", "query_log": "up", "dagster_home": "up"}
    assert healthy({"status": "healthy", "services": up, "version": "0.1.0"})
    # no DAGSTER_HOME for a bench server: degraded, but model and index are up
    assert healthy({"status": "degraded", "services": {**up, "dagster_home": "not_configured"}})
    assert not healthy({"status": "degraded", "services": {**up, "model": "loading"}})
    assert not healthy({"status": "unhealthy", "services": {**up, "index": "missing"}})
    # the flat fields alone (no services map) are not taken for a loaded server
    assert not healthy({"status": "ok", "model_loaded": True, "index": {"snapshot_version": 1}})
