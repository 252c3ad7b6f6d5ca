"""`groundwork serve` binds its port at once and loads its embedding model in the background.

Real server processes (``python -m knowledge_store.cli serve``) over a copy of one sample index whose vectors were
made with torch, so the data folder holds no ONNX export yet: the server's own export of all-MiniLM-L6-v2 really
runs (a few seconds), after waiting for the lock the test holds as another process building the same graphs
would - so the checks below run while the model is certainly not ready.  Meanwhile the port answers, ``/health`` is degraded with the model loading, the routes that
embed a query answer 503 ``model_loading`` with ``Retry-After`` and the routes that need no model answer as usual;
once the model is loaded, ``/health`` is healthy and the same query is answered.  A model whose weights are damaged
(a real failed export and torch load): ``/health`` says ``error`` with the reason, and queries answer 503
``model_load_failed`` with it (503, not 500: the request is fine, the server cannot serve it; no Retry-After,
since waiting does not repair the model).
"""

from __future__ import annotations

import shutil
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from knowledge_store.core.files import exclusive_lock
from knowledge_store.models.artifacts import ModelArtifacts
from tests.helpers import build_sample_index, start_serve, stop

pytestmark = pytest.mark.slow

QUESTION = "how do I reset the Aurora to factory settings"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def sample(tmp_path_factory, embedder):
    """The sample corpus indexed once for this module (torch vectors: no ONNX export made for it)."""
    return build_sample_index(tmp_path_factory.mktemp("serve-startup"), embedder)


def data_copy(sample, tmp_path: Path) -> dict[str, str]:
    """The environment of a server over a private copy of the sample's data folder, with an empty model cache of
    its own (as on a machine that never built the model's graphs)."""
    data = tmp_path / "data"
    shutil.copytree(sample.data_dir, data)
    home = tmp_path / "dagster_home"
    home.mkdir()
    return {"GROUNDWORK_DATA_DIR": str(data), "GROUNDWORK_SOURCES": ":".join(str(p) for p in sample.sources),
            "DAGSTER_HOME": str(home), "GROUNDWORK_QUERY_ENCODER": "onnx",
            "GROUNDWORK_MODELS_CACHE_DIR": str(tmp_path / "model-cache")}


def first_health(proc, base: str, log: Path, timeout_s: float = 60.0) -> tuple[float, httpx.Response]:
    """When ``/health`` first answered (``time.monotonic()``) and its answer; polls every 50 ms."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base}/health", timeout=2)
            return time.monotonic(), response
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"the server did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")


def health_until(base: str, log: Path, done, timeout_s: float = 180.0) -> dict:
    """``/health`` polled until ``done(body)``; the body."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = httpx.get(f"{base}/health", timeout=5).json()
        if done(body):
            return body
        time.sleep(0.2)
    raise AssertionError(f"/health never got there; last: {body}\n{log.read_text()[-3000:]}")


def mcp_search(base: str) -> dict:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search", "arguments": {"query": QUESTION}}}
    return httpx.post(f"{base}/mcp", headers=MCP_HEADERS, json=call, timeout=30).json()["result"]


def builder_lock(model_path: Path, cache_dir: Path):
    """The lock a process holds while it builds the model's graphs in ``cache_dir``: held here, it keeps the
    server's load waiting as another process's export would, for as long as the checks take on any machine."""
    artifacts = ModelArtifacts(model_path, cache_dir)
    artifacts.folder.mkdir(parents=True, exist_ok=True)
    return exclusive_lock(artifacts.folder / ".lock", threading.Lock())


def test_the_port_answers_while_the_model_exports_and_queries_get_503_until_it_is_ready(sample, tmp_path,
                                                                                        model_path):
    log = tmp_path / "serve.log"
    env = data_copy(sample, tmp_path)
    started = time.monotonic()
    waiting = ExitStack()
    waiting.enter_context(builder_lock(model_path, Path(env["GROUNDWORK_MODELS_CACHE_DIR"])))
    proc, base = start_serve(env, log)
    try:
        answered, response = first_health(proc, base, log)
        health = response.json()
        print(f"port answered {answered - started:.1f} s after the process started; /health: {health['reasons']}")
        # bound before the model: the export alone takes longer than the start on any machine
        assert response.status_code == 200 and health["status"] == "degraded", health
        assert health["services"]["model"] == "loading" and health["services"]["index"] == "up", health
        load = health["model_load"]
        assert load["state"] == "loading" and load["phase"] in ("starting", "waiting", "exporting"), load
        assert load["retry_after_s"] >= 1 and load["seconds"] >= 0 and "loading" in health["reasons"]["model"]
        # ~3 s of Python imports on an idle machine (docs/BENCHMARKS.md); 22 s was seen at load 12 on two cores: the
        # bound only catches a start that waits for something slow again, the check above that it came first
        assert answered - started < 60

        query = httpx.post(f"{base}/api/knowledge/query", json={"query": QUESTION, "k": 3}, timeout=10)
        assert query.status_code == 503, query.text
        assert query.json()["error"] == "model_loading" and "still loading" in query.json()["message"]
        assert int(query.headers["Retry-After"]) >= 1 and query.json()["retry_after_s"] >= 1
        ask = httpx.post(f"{base}/api/ask", json={"query": QUESTION}, timeout=10)
        assert ask.status_code == 503 and ask.json()["error"] == "model_loading" and "Retry-After" in ask.headers
        tool = mcp_search(base)  # an agent reads why, and when to come back
        assert tool["isError"] and "still loading" in tool["content"][0]["text"]
        # what needs no model is served as usual meanwhile
        for path in ("/", "/static/console.js", "/api/knowledge/config", "/api/sources", "/api/knowledge/documents",
                     "/api/kb/articles"):
            assert httpx.get(f"{base}{path}", timeout=10).status_code == 200, path
        still = health_until(base, log, lambda body: body["model_load"]["phase"] == "waiting")
        assert still["services"]["model"] == "loading", still  # it says why it waits: the lock's holder builds
        waiting.close()  # the other builder is done (without building): this server exports the model itself

        ready = health_until(base, log, lambda body: body["services"]["model"] != "loading")
        assert ready["status"] == "healthy" and ready["services"]["model"] == "up", ready
        assert ready["model_load"]["state"] == "ready" and ready["model_load"]["seconds"] > 0
        answer = httpx.post(f"{base}/api/knowledge/query", json={"query": QUESTION, "k": 3}, timeout=30)
        assert answer.status_code == 200 and answer.json()["results"], answer.text
        assert not mcp_search(base)["isError"]
        # the graph went to the machine's model cache, not into the data folder
        assert any((tmp_path / "model-cache").rglob("*.onnx")) and not any((tmp_path / "data").rglob("*.onnx"))
    finally:
        waiting.close()
        stop(proc)
    text = log.read_text()
    assert "waiting for another process that is building its graphs" in text
    assert "exporting it to ONNX" in text and "is ready (loaded in" in text, text[-3000:]  # the log says it too


def broken_model(model_path: Path, root: Path) -> Path:
    """A copy of the model whose weights file is zeros of the same size: the same model id (the index's), weights
    that no loader can read."""
    copy = root / model_path.parent.name / model_path.name
    copy.mkdir(parents=True)
    for item in model_path.iterdir():
        if item.name != "model.safetensors":
            (copy / item.name).symlink_to(item)
    with (copy / "model.safetensors").open("wb") as weights:
        weights.truncate((model_path / "model.safetensors").stat().st_size)
    return copy


def test_a_model_that_cannot_load_is_an_error_in_health_and_queries_say_why(sample, tmp_path, model_path):
    from knowledge_store.models.embeddings import model_id_for

    broken = broken_model(model_path, tmp_path / "broken")
    assert model_id_for(broken) == model_id_for(model_path)  # the index's model: queries need this one
    log = tmp_path / "serve.log"
    proc, base = start_serve({**data_copy(sample, tmp_path), "GROUNDWORK_MODEL_PATH": str(broken)}, log)
    try:
        first_health(proc, base, log)
        health = health_until(base, log, lambda body: body["services"]["model"] not in ("loading", "not_loaded"))
        assert health["services"]["model"] == "error" and health["status"] == "unhealthy", health
        reason = health["reasons"]["model"]
        error = health["model_load"]["error"]  # the loader's own words: the weights file's header is unreadable
        assert health["model_load"]["state"] == "failed" and "deserializing header" in error, health["model_load"]
        assert f"could not be loaded: {error}" in reason and "restart" in reason
        assert httpx.get(f"{base}/health", timeout=5).status_code == 503

        query = httpx.post(f"{base}/api/knowledge/query", json={"query": QUESTION, "k": 3}, timeout=10)
        assert query.status_code == 503 and query.json()["error"] == "model_load_failed", query.text
        assert error in query.json()["message"] and "Retry-After" not in query.headers
        assert httpx.get(f"{base}/api/sources", timeout=10).status_code == 200  # the rest still answers
    finally:
        stop(proc)
    assert "could not be loaded" in log.read_text()
