"""The HTTP API under concurrent store access, hostile origins and schema-bending input (issue 11).

Over a real index of the sample corpus; every test here failed on the code before the fix.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.app import create_app
from knowledge_store.storage.query_log import QueryLog
from tests.helpers import MARKDOWN_FILLER, build_sample_index

pytestmark = pytest.mark.slow
LOCAL = "http://127.0.0.1:8080"


@pytest.fixture(scope="module")
def env(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("hardening")
    settings = build_sample_index(root, embedder, cors_origins=["https://app.example"], allowed_hosts=["kb.internal:*"])
    log = QueryLog(settings.logs_path)
    engine = RetrievalEngine(settings, embedder=embedder, query_log=log)
    engine.snapshots.check_interval_s = 0.0
    app = create_app(settings, engine)
    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as client:
        yield {"client": client, "settings": settings, "engine": engine, "app": app}


# ------------------------------------------------------------------ one connection policy per process

def test_reads_and_source_listing_at_once_never_fail(env):
    client = env["client"]

    def call(path: str) -> int:
        return client.get(path).status_code

    paths = ["/api/knowledge/documents", "/api/sources", "/api/failures", "/api/sources/docs"] * 30
    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(call, paths))
    assert codes.count(200) == len(paths), {code: codes.count(code) for code in set(codes)}


def test_an_upload_job_succeeds_while_clients_keep_reading(env):
    client = env["client"]
    stop = threading.Event()
    codes: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            for path in ("/api/knowledge/documents", "/api/sources"):
                codes.append(client.get(path).status_code)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        body = (b"# Descaling under load\n\nRun the descaling cycle monthly while clients keep reading the store.\n"
                + MARKDOWN_FILLER.encode())
        accepted = client.post("/api/knowledge/ingest", files={"file": ("under-load.md", body, "text/markdown")})
        assert accepted.status_code == 202, accepted.text
        job_url = f"/api/knowledge/jobs/{accepted.json()['job_id']}"
        deadline = time.monotonic() + 120
        job = client.get(job_url).json()
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
            job = client.get(job_url).json()
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert job["status"] == "succeeded", job
    # the job showed its stages' counts (parse/chunk/embed/embed sentences: done, total, rate, ETA) while it ran
    stage = job["progress"]["stage"]
    assert stage in ("parse", "chunk", "embed", "embed sentences") and job["progress"]["stages"][stage]["finished"] is True
    assert {"done", "total", "rate", "unit", "eta_s"} <= set(job["progress"]["stages"]["embed"])
    assert codes and set(codes) == {200}, {code: codes.count(code) for code in set(codes)}
    docs = client.get("/api/knowledge/documents").json()["documents"]
    assert any(d.get("relative_path", d.get("path", "")).endswith("under-load.md") and d["status"] == "active" for d in docs)


# ------------------------------------------------------------------ origin policy

def test_a_foreign_origin_cannot_upload_or_register_a_source(env):
    client = env["client"]
    upload = client.post("/api/knowledge/ingest", headers={"Origin": "https://evil.example"},
                         files={"file": ("x.md", b"# pwned\n\ntext", "text/markdown")})
    assert upload.status_code == 403 and upload.json()["error"] == "origin_not_allowed"
    source = client.post("/api/sources", headers={"Origin": "null"}, json={"name": "etc", "kind": "folder", "folder": "/etc"})
    assert source.status_code == 403
    names = [s["name"] for s in client.get("/api/sources").json()["sources"]]
    assert "etc" not in names


def test_a_cross_site_form_post_without_origin_is_refused(env):
    response = env["client"].post("/api/knowledge/feedback", headers={"Sec-Fetch-Site": "cross-site"},
                                  json={"retrieval_request_id": "x", "rating": "up"})
    assert response.status_code == 403


def test_dns_rebinding_hosts_are_refused_on_every_route(env):
    client = env["client"]
    for method, path in (("GET", "/api/knowledge/config"), ("GET", "/api/knowledge/sources/abc/file"),
                         ("POST", "/api/sources"), ("GET", "/")):
        response = client.request(method, path, headers={"Host": "evil.example:8080"})
        assert response.status_code == 421, (method, path, response.status_code)
        assert response.json()["error"] == "host_not_allowed"


def test_another_port_of_this_machine_is_another_origin_and_cannot_upload_or_sync(env):
    """Issue 14 item 3: only this server's own origin and GROUNDWORK_CORS_ORIGINS may call the API - a dev
    server or any page on another loopback port included (a multipart upload needs no preflight)."""
    client = env["client"]
    for other in ("http://127.0.0.1:5173", "http://localhost:8081", "http://[::1]:3000", "http://localhost:8080"):
        upload = client.post("/api/knowledge/ingest", headers={"Origin": other},
                             files={"file": ("other-port.md", b"# pwned\n\nfrom another port" + MARKDOWN_FILLER.encode(),
                                              "text/markdown")})
        assert upload.status_code == 403 and upload.json()["error"] == "origin_not_allowed", (other, upload.text)
        assert client.post("/api/sources/docs/sync", headers={"Origin": other}).status_code == 403, other
        assert client.get("/api/knowledge/config", headers={"Origin": other}).status_code == 403, other
    docs = client.get("/api/knowledge/documents").json()["documents"]
    assert not any(d.get("relative_path", "").endswith("other-port.md") for d in docs)
    # the console is served by this server: its own origin (by any of the names it is served under) is served
    for own, host in ((LOCAL, "127.0.0.1:8080"), ("http://localhost:8080", "localhost:8080"),
                      ("http://kb.internal:9000", "kb.internal:9000")):
        same = client.post("/api/knowledge/feedback", headers={"Origin": own, "Host": host},
                           json={"retrieval_request_id": "not-logged", "rating": "up"})
        assert same.status_code != 403, (own, same.text)


def test_local_and_configured_origins_and_hosts_are_served(env):
    client = env["client"]
    assert client.get("/api/knowledge/config", headers={"Origin": "http://localhost:5173"}).status_code == 403
    assert client.get("/api/knowledge/config", headers={"Origin": LOCAL}).status_code == 200
    assert client.get("/api/knowledge/config", headers={"Host": "kb.internal:9000"}).status_code == 200
    cors = client.get("/api/knowledge/config", headers={"Origin": "https://app.example"})
    assert cors.status_code == 200 and cors.headers["access-control-allow-origin"] == "https://app.example"
    preflight = client.options("/api/knowledge/query", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 200 and "POST" in preflight.headers["access-control-allow-methods"]
    foreign = client.get("/api/knowledge/config", headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and "access-control-allow-origin" not in foreign.headers


def test_mcp_uses_the_same_allow_list(env):
    client = env["client"]
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    ok = client.post("/mcp", json=init, headers={**headers, "Host": "kb.internal:9000"})
    assert ok.status_code == 200, ok.text
    # /mcp keeps the MCP SDK's local-client allowance (its tools only read): a local origin on any port
    local = client.post("/mcp", json=init, headers={**headers, "Origin": "http://localhost:6274"})
    assert local.status_code == 200, local.text
    assert client.post("/mcp", json=init, headers={**headers, "Origin": "https://evil.example"}).status_code == 403


def test_original_files_are_served_sandboxed(env):
    client = env["client"]
    doc = client.get("/api/knowledge/documents").json()["documents"][0]
    response = client.get(f"/api/knowledge/sources/{doc['doc_id']}/file")
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == "sandbox"
    assert response.headers["x-content-type-options"] == "nosniff"


# ------------------------------------------------------------------ the schema is the contract

@pytest.mark.parametrize("body,field", [
    ({"query": "reset", "min_relevance": False}, "min_relevance"),
    ({"query": "reset", "k": True}, "k"),
    ({"query": "reset", "k": "3"}, "k"),
    ({"query": "reset", "alpha": "0.5"}, "alpha"),
    ({"query": "reset", "filters": {"include_superseded": 0}}, "filters.include_superseded"),
])
def test_values_of_the_wrong_json_type_are_refused(env, body, field):
    response = env["client"].post("/api/knowledge/query", json=body)
    assert response.status_code == 422, response.text
    assert field in [e["field"] for e in response.json()["errors"]]


def test_the_schema_states_what_the_server_enforces_about_the_query(env):
    spec = env["client"].get("/openapi.json").json()
    query = spec["components"]["schemas"]["QueryBody"]["properties"]["query"]
    assert query["minLength"] == 1 and query["maxLength"] == env["settings"].max_query_chars and query["pattern"] == r"\S"
    rerankers = spec["components"]["schemas"]["QueryBody"]["properties"]["reranker"]
    enum = next(option["enum"] for option in rerankers["anyOf"] if "enum" in option)
    assert "cross-encoder" not in enum  # no local cross-encoder configured here
    assert enum == env["client"].get("/api/knowledge/config").json()["rerankers"]


@pytest.mark.parametrize("path,param", [("/api/knowledge/feedback", "since"), ("/api/kb/articles", "updated_since")])
def test_datetimes_must_be_iso_8601(env, path, param):
    bad = env["client"].get(path, params={param: "0.5"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == param
    assert env["client"].get(path, params={param: "2026-01-01T00:00:00Z"}).status_code == 200


def test_every_route_documents_its_errors_with_one_shape(env):
    spec = env["client"].get("/openapi.json").json()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"403", "421", "422", "500", "503"} <= codes, (method, path, codes)
            ref = operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorBody"), (method, path)
            ok = next(code for code in codes if code.startswith("2"))
            assert operation["responses"][ok].get("content"), (method, path, "no documented success body")
    assert "404" in spec["paths"]["/api/knowledge/jobs/{job_id}"]["get"]["responses"]
    assert {"409", "413"} <= set(spec["paths"]["/api/knowledge/ingest"]["post"]["responses"])
    file_types = spec["paths"]["/api/knowledge/sources/{doc_id}/file"]["get"]["responses"]["200"]["content"]
    assert "application/json" not in file_types and "application/pdf" in file_types


def test_a_405_lists_every_method_of_the_path(env):
    response = env["client"].request("OPTIONS", "/api/knowledge/feedback")
    assert response.status_code == 405
    assert {m.strip() for m in response.headers["allow"].split(",")} == {"GET", "POST"}
    assert response.json()["error"] == "method_not_allowed"
    put = env["client"].put("/api/sources/docs")
    assert {m.strip() for m in put.headers["allow"].split(",")} == {"GET", "PATCH", "DELETE"}


def test_malformed_json_names_the_body_and_the_position(env):
    response = env["client"].post("/api/knowledge/query", content=b'{"query": "reset",,}',
                                  headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    error = response.json()["errors"][0]
    assert error["field"] == "body" and "not valid JSON at character" in error["message"]


def test_an_unexpected_error_is_a_json_500_without_a_traceback(env, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(env["engine"], "ranking_defaults", broken)
    response = env["client"].get("/api/knowledge/config")
    assert response.status_code == 500
    body = response.json()
    assert body["error"] == "internal_error" and "ZeroDivisionError" in body["message"] and "Traceback" not in body["message"]


def test_an_update_with_nothing_to_change_or_null_values_is_refused_by_the_schema(env):
    client = env["client"]
    spec = client.get("/openapi.json").json()
    assert spec["components"]["schemas"]["SourceUpdateBody"]["minProperties"] == 1
    null = client.patch("/api/sources/docs", json={"use_sitemap": None})
    assert null.status_code == 422 and null.json()["errors"][0]["field"] == "use_sitemap"


# ------------------------------------------------------------------ files

def test_a_file_swapped_for_a_link_out_of_its_folder_is_not_served(env, tmp_path):
    client = env["client"]
    doc = next(d for d in client.get("/api/knowledge/documents").json()["documents"] if d["status"] == "active")
    snapshot_doc = next(d for d in env["engine"].snapshots.current().documents if d["doc_id"] == doc["doc_id"])
    original = Path(snapshot_doc["path"])
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    saved = original.read_bytes()
    original.unlink()
    original.symlink_to(secret)
    try:
        response = client.get(f"/api/knowledge/sources/{doc['doc_id']}/file")
        assert response.status_code == 410 and "outside its source folder" in response.json()["message"]
        assert b"root:x" not in response.content
    finally:
        original.unlink()
        original.write_bytes(saved)
    assert client.get(f"/api/knowledge/sources/{doc['doc_id']}/file").status_code == 200
