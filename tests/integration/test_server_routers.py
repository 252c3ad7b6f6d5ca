"""The server's layout (issue 15 item 3): routers per domain over one per-app state, ingestion jobs in their
own module, upload types from the parsers' list.  The API's behaviour is covered by test_api*.py; these
tests pin what the restructuring promised.

The parts that need no model, store or server are in tests/unit/test_server_routers.py.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.parsers import detect
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.app import create_app
from knowledge_store.server.errors import _leaf_routes
from knowledge_store.server.routes import knowledge
from knowledge_store.server.state import ServerState
from knowledge_store.storage.query_log import QueryLog


def _app(tmp_path: Path, embedder, **settings: object):
    config = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"], **settings)
    engine = RetrievalEngine(config, embedder=embedder, query_log=QueryLog(config.logs_path))
    return create_app(config, engine, mount_mcp=False)


def _client(app) -> TestClient:
    return TestClient(app, base_url="http://127.0.0.1:8080", raise_server_exceptions=False)


def test_create_app_only_assembles_and_every_api_route_comes_from_a_domain_router(tmp_path, embedder):
    source = inspect.getsource(create_app)
    assert len(source.splitlines()) < 100, "create_app builds state, app, middleware, handlers and includes routers"
    app = _app(tmp_path, embedder)
    api_routes = [route for route in _leaf_routes(app.router.routes) if isinstance(route, APIRoute)]
    assert len(api_routes) >= 26
    modules = {route.endpoint.__module__ for route in api_routes}
    assert modules <= {"knowledge_store.server.routes.knowledge", "knowledge_store.server.routes.ingestion",
                       "knowledge_store.server.routes.sources", "knowledge_store.server.routes.documents",
                       "knowledge_store.server.routes.operations", "knowledge_store.server.routes.console",
                       "knowledge_store.server.admin_api"}, modules
    assert isinstance(app.state.server, ServerState)


def test_two_apps_in_one_process_state_and_enforce_their_own_request_limits(tmp_path, embedder):
    short = _app(tmp_path / "a", embedder, max_query_chars=40, max_note_chars=10)
    long = _app(tmp_path / "b", embedder, max_query_chars=400, max_note_chars=100)
    for app, limit in ((short, 40), (long, 400)):
        schema = app.openapi()["components"]["schemas"]
        assert schema["QueryBody"]["properties"]["query"]["maxLength"] == limit
        assert schema["AskBody"]["properties"]["query"]["maxLength"] == limit
    question = {"query": "x" * 100}
    short_answer = _client(short).post("/api/ask", json=question)
    assert short_answer.status_code == 422 and short_answer.json()["errors"][0]["field"] == "query"
    # the longer limit lets the same question through validation (no index yet: 503, not 422)
    assert _client(long).post("/api/ask", json=question).status_code == 503
    # the handler itself is untouched: each app got its own typed wrapper
    assert inspect.signature(knowledge.ask_book).parameters["body"].annotation.__name__ == "AskBody"
    assert inspect.signature(knowledge.ask_book).parameters["body"].annotation is knowledge.AskBody


def test_upload_types_are_the_parsers_supported_types(tmp_path, embedder, monkeypatch):
    """One list: a type the parsers learn is offered by the config and accepted by the upload check."""
    monkeypatch.setitem(detect.EXTENSION_TYPES, ".mdown", "markdown")
    client = _client(_app(tmp_path, embedder))
    assert client.get("/api/knowledge/config").json()["upload_types"] == sorted(detect.EXTENSION_TYPES)
    empty = client.post("/api/knowledge/ingest", files={"file": ("notes.mdown", b"", "text/markdown")})
    # past the type check (the parsers know .mdown now), stopped by the content check
    assert empty.status_code == 422 and empty.json()["message"] == "file: is empty (got 'notes.mdown')", empty.json()
    refused = client.post("/api/knowledge/ingest", files={"file": ("notes.rtf", b"{\\rtf1}", "text/rtf")})
    assert refused.status_code == 422 and ".mdown" in refused.json()["message"]
