"""The docs-site chat widget's server side (issue 14 item 3): ``GET /widget.js``, which origins may call
``/api/ask`` and ``/api/ask-local`` from it, and how a page URL names its document for ``/api/ask-local``.

The widget in a real browser, on a page of another origin, is tests/integration/test_widget_browser.py.

The parts that need no model, store or server are in tests/unit/test_widget.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.app import STATIC_DIR, create_app
from knowledge_store.storage.query_log import QueryLog

API = "http://127.0.0.1:8080"
DOCS_SITE = "https://docs.example.org"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}


def _client(tmp_path: Path, embedder, **settings: object) -> TestClient:
    """The app over an empty data folder: origin checks and static files run before any index is needed."""
    config = Settings(data_dir=tmp_path / "data", sources=[tmp_path], **settings)
    engine = RetrievalEngine(config, embedder=embedder, query_log=QueryLog(config.logs_path))
    return TestClient(create_app(config, engine, mount_mcp=False), base_url=API, raise_server_exceptions=False)


@pytest.fixture()
def client(tmp_path, embedder) -> TestClient:
    return _client(tmp_path, embedder, cors_origins=[DOCS_SITE])


def test_widget_js_is_served_as_cacheable_javascript_to_a_cross_site_script_tag(client):
    # what a <script src> on another site sends: no Origin, Sec-Fetch-Site: cross-site
    response = client.get("/widget.js", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors",
                                                 "Sec-Fetch-Dest": "script", "Referer": "https://elsewhere.example/"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/javascript; charset=utf-8"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "max-age=" in response.headers["cache-control"] and "public" in response.headers["cache-control"]
    assert response.headers["etag"]
    assert response.headers["cross-origin-resource-policy"] == "cross-origin"
    assert response.content == (STATIC_DIR / "widget.js").read_bytes()
    revalidated = client.get("/widget.js", headers={"If-None-Match": response.headers["etag"]})
    assert revalidated.status_code == 304


def test_a_refused_origin_gets_403_from_ask_and_ask_local(client):
    for path, body in (("/api/ask", {"query": "reset"}),
                       ("/api/ask-local", {"query": "reset", "context": "hold the button", "source_file": "a.md"})):
        refused = client.post(path, json=body, headers={"Origin": "https://evil.example"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "origin_not_allowed"
        assert "GROUNDWORK_CORS_ORIGINS" in refused.json()["message"]
        assert "access-control-allow-origin" not in refused.headers
        preflight = client.options(path, headers={"Origin": "https://evil.example", **PREFLIGHT})
        assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


def test_the_widget_s_json_post_preflight_passes_for_an_allowed_origin(client):
    for path in ("/api/ask", "/api/ask-local"):
        preflight = client.options(path, headers={"Origin": DOCS_SITE, **PREFLIGHT})
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == DOCS_SITE
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "content-type" in preflight.headers["access-control-allow-headers"].lower()


def test_cors_origins_are_empty_by_default_so_no_page_elsewhere_can_read_answers(tmp_path, embedder, monkeypatch):
    monkeypatch.delenv("GROUNDWORK_CORS_ORIGINS", raising=False)
    assert Settings(_env_file=None).cors_origins == []
    client = _client(tmp_path, embedder)
    # a docs site on the internet: refused outright
    assert client.options("/api/ask", headers={"Origin": DOCS_SITE, **PREFLIGHT}).status_code == 403
    # a page on another local port is another origin: refused as well, and never given CORS permission
    local_page = client.options("/api/ask", headers={"Origin": "http://127.0.0.1:3000", **PREFLIGHT})
    assert local_page.status_code == 403 and "access-control-allow-origin" not in local_page.headers
