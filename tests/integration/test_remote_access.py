"""A server run for others: `groundwork serve` in remote mode (``GROUNDWORK_ALLOW_REMOTE=true``) on 127.0.0.1.

Two surfaces (public: ask, query, feedback, the widget, public documents' files; admin: the rest), the admin
token (generated into the data folder, mode 0600), source roots, per-source visibility, the public rate limit
per client address (trusted proxies' X-Forwarded-For), and TLS.  Every request goes to loopback; the Host header
names the docs site the server is configured for, as a reverse proxy or a reader's browser would send it.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.sample_corpus import write_sample_corpus
from knowledge_store.ingest.source_actions import update_source_now
from tests.helpers import MARKDOWN_FILLER, start_serve, stop, wait_healthy

pytestmark = pytest.mark.slow

SITE = "docs.example.com"
ORIGIN = f"https://{SITE}"
RUNBOOK_PHRASE = "rotate the vault unseal keys"
RUNBOOK = f"""# Incident runbook: vault unseal

When the vault seals itself after a restart, the on-call engineer must {RUNBOOK_PHRASE} with the break-glass
procedure: fetch the three key shares from the safe in room 4.12, enter them with `vault operator unseal`, and
page the security lead. Never paste the key shares into chat or tickets; the shares are rotated every quarter.
"""
QUESTION = "how do I reset the Aurora to factory settings"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, embedder):
    """The sample corpus (made public) and a runbooks folder (internal) in one index."""
    root = tmp_path_factory.mktemp("remote")
    write_sample_corpus(root / "docs")
    (root / "runbooks").mkdir()
    (root / "runbooks" / "vault-unseal.md").write_text(RUNBOOK)
    settings = Settings(data_dir=root / "data", sources=[root / "docs", root / "runbooks"])
    run_sync(settings, embedder)
    source, changed, _, published = update_source_now(settings, "docs", {"visibility": "public"})
    assert source.visibility == "public" and changed == ["visibility"] and published is not None
    return root, settings


def remote_env(settings: Settings, root: Path, **extra: str) -> dict[str, str]:
    return {"GROUNDWORK_DATA_DIR": str(settings.data_dir), "GROUNDWORK_SOURCES": f"{root / 'docs'}:{root / 'runbooks'}",
            "GROUNDWORK_ALLOW_REMOTE": "true", "GROUNDWORK_ALLOWED_HOSTS": SITE, "GROUNDWORK_CORS_ORIGINS": ORIGIN,
            **extra}


@pytest.fixture(scope="module")
def remote(corpus):
    """A remote-mode server with no token configured (it generates one) and a generous public rate, so the
    functional tests below are not limited (the limit has its own server)."""
    root, settings = corpus
    log = root / "remote.log"
    proc, base = start_serve(remote_env(settings, root, GROUNDWORK_PUBLIC_RATE="1000", GROUNDWORK_PUBLIC_BURST="1000"), log)
    try:
        wait_healthy(proc, base, log)
        token_file = settings.data_dir / "admin_token"
        yield {"base": base, "log": log, "token": token_file.read_text().strip(), "token_file": token_file,
               "settings": settings, "root": root}
    finally:
        stop(proc)


def site(remote: dict, token: str | None = None, **headers: str) -> httpx.Client:
    """A client addressing the docs site's host name (sent to loopback), with the admin token when given."""
    sent = {"Host": SITE, **headers}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=remote["base"], headers=sent, timeout=60)


def test_remote_mode_generates_a_private_token_and_says_where_not_what(remote):
    mode = stat.S_IMODE(remote["token_file"].stat().st_mode)
    assert mode == 0o600, oct(mode)
    assert len(remote["token"]) >= 32
    log = remote["log"].read_text()
    assert str(remote["token_file"]) in log and "remote mode" in log
    assert remote["token"] not in log  # where it is, never the token itself
    with site(remote) as client:
        assert set(client.get("/health").json()) == {"status", "services", "version"}  # nothing more, publicly
    with site(remote, token=remote["token"]) as admin:
        health = admin.get("/health").json()
    assert health["remote"] is True and health["admin_token_required"] is True and health["tls"] is False


def test_the_reported_curl_calls_get_401_without_token_and_422_outside_the_roots_with_it(remote, tmp_path):
    private = tmp_path / "private"
    private.mkdir()
    (private / "secret.md").write_text("# Secret\n\nThe payroll database password is in the blue folder.\n" + MARKDOWN_FILLER)
    stolen = {"name": "stolen", "kind": "folder", "folder": str(private), "sync": True}
    with site(remote) as client:
        refused = client.post("/api/sources", json=stolen)
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"] == "unauthorized" and refused.headers["www-authenticate"].startswith("Bearer")
        articles = client.get("/api/kb/articles", params={"limit": 5})
        assert articles.status_code == 401 and "payroll" not in articles.text and "vault" not in articles.text
    with site(remote, token="not-the-token") as client:
        wrong = client.post("/api/sources", json=stolen)
        assert wrong.status_code == 401 and wrong.json() == refused.json()  # nothing says why
    with site(remote, token=remote["token"]) as admin:
        outside = admin.post("/api/sources", json=stolen)
        assert outside.status_code == 422, outside.text
        assert [e["field"] for e in outside.json()["errors"]] == ["folder"]
        # a symbolic link inside a root that leads out is outside too
        link = remote["settings"].data_dir / "escape"
        link.symlink_to(private)
        via_link = admin.post("/api/sources", json={**stolen, "folder": str(link)})
        assert via_link.status_code == 422 and via_link.json()["errors"][0]["field"] == "folder"
        web_file = admin.post("/api/sources", json={"name": "stolen", "kind": "web", "url": f"file://{private}"})
        assert web_file.status_code == 422 and web_file.json()["errors"][0]["field"] == "url"
        names = [s["name"] for s in admin.get("/api/sources").json()["sources"]]
        assert "stolen" not in names  # nothing was registered by any of the refused calls
        assert admin.get("/api/kb/articles", params={"limit": 5}).status_code == 200


def test_every_admin_route_of_the_schema_refuses_without_the_token(remote):
    """Walks the served OpenAPI schema: each admin operation answers 401 without the token and with a wrong one;
    each public operation answers 401 to a wrong token (never silently public)."""
    with site(remote) as client:
        schema = client.get("/openapi.json").json()
    operations = [(method.upper(), path, op["x-surface"]) for path, item in schema["paths"].items()
                  for method, op in item.items()]
    assert {surface for _, _, surface in operations} == {"public", "admin"}
    for token in (None, "wrong-token"):
        with site(remote, token=token) as client:
            for method, path, surface in operations:
                if surface == "public" and token is None:
                    continue
                url = re.sub(r"\{[^}]+\}", "x", path)
                answer = client.request(method, url, json={} if method in ("POST", "PUT", "PATCH") else None)
                assert answer.status_code == 401, (method, path, token, answer.status_code, answer.text[:200])
    with site(remote) as client:  # MCP is admin too
        assert client.post("/mcp", json={}).status_code == 401
        assert client.get("/metrics").status_code == 401


def test_a_widget_question_from_the_allowed_origin_gets_its_cited_answer_without_a_token(remote):
    with site(remote, Origin=ORIGIN) as client:
        widget = client.get("/widget.js")
        assert widget.status_code == 200
        answer = client.post("/api/ask", json={"query": QUESTION})
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == ORIGIN
        body = answer.json()
        assert body["sources"] and "[1]" in body["answer"]
        original = client.get(body["sources"][0]["url"].replace(remote["base"], "").replace(f"http://{SITE}", ""))
        assert original.status_code == 200
        rated = client.post("/api/knowledge/feedback", json={"retrieval_request_id": body["retrieval_request_id"],
                                                             "rating": "up"})
        assert rated.status_code == 201, rated.text


def test_public_callers_are_answered_from_public_sources_only_and_admins_from_all(remote):
    question = f"how do I {RUNBOOK_PHRASE}"
    with site(remote) as public, site(remote, token=remote["token"]) as admin:
        seen_by_admin = admin.post("/api/knowledge/query", json={"query": question, "k": 3}).json()
        runbook = [r for r in seen_by_admin["results"] if r["title"].startswith("Incident runbook")]
        assert runbook, "the admin surface finds the internal runbook"
        doc_id = runbook[0]["doc_id"]

        seen_by_public = public.post("/api/knowledge/query", json={"query": question, "k": 10}).json()
        assert seen_by_public["params"]["filters"]["visibility"] == ["public"]
        assert all(r["doc_id"] != doc_id for r in seen_by_public["results"])
        assert "break-glass" not in str(seen_by_public["results"])
        # asking for internal sources explicitly changes nothing for a public caller
        explicit = public.post("/api/knowledge/query", json={"query": question, "filters": {"visibility": "internal"}})
        assert all(r["doc_id"] != doc_id for r in explicit.json()["results"])
        asked = public.post("/api/ask", json={"query": question}).json()
        assert "break-glass" not in str(asked) and all(s["doc_id"] != doc_id for s in asked["sources"])
        assert "break-glass" in admin.post("/api/ask", json={"query": question}).json()["answer"]

        # the internal document's file and ask-local on it: 404 and 422 as if it did not exist
        file_url = f"/api/knowledge/sources/{doc_id}/file"
        assert public.get(file_url).status_code == 404
        assert public.get(file_url).json()["message"] == f"unknown doc_id '{doc_id}'"  # as for an id that does not exist
        assert admin.get(file_url).status_code == 200
        local = {"query": "what does this mean?", "context": RUNBOOK_PHRASE, "source_file": "vault-unseal.md"}
        refused = public.post("/api/ask-local", json=local)
        assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "source_file"
        assert admin.post("/api/ask-local", json=local).status_code == 200

        # made public, the runbook is served to everyone at once; made internal again, it is gone again
        made_public = admin.patch("/api/sources/runbooks", json={"visibility": "public"})
        assert made_public.status_code == 200 and made_public.json()["snapshot_version"] is not None
        found = public.post("/api/knowledge/query", json={"query": question, "k": 3}).json()
        assert any(r["doc_id"] == doc_id for r in found["results"])
        assert public.get(file_url).status_code == 200
        assert admin.patch("/api/sources/runbooks", json={"visibility": "internal"}).status_code == 200
        gone = public.post("/api/knowledge/query", json={"query": question, "k": 10}).json()
        assert all(r["doc_id"] != doc_id for r in gone["results"])
        assert public.get(file_url).status_code == 404


def test_public_rate_limit_per_client_with_retry_after_and_trusted_proxies(corpus, tmp_path):
    """The defaults (5/s, burst 20); 127.0.0.2 is a trusted proxy whose X-Forwarded-For names the client, while
    the same header from 127.0.0.1 is ignored (it cannot buy a second bucket)."""
    root, settings = corpus
    log = tmp_path / "limited.log"
    proc, base = start_serve(remote_env(settings, root, GROUNDWORK_TRUSTED_PROXIES="127.0.0.2",
                                        GROUNDWORK_ADMIN_TOKEN="a-configured-admin-token-of-some-length"), log)
    try:
        wait_healthy(proc, base, log)
        body = {"query": "aurora", "k": 1}
        with httpx.Client(base_url=base, headers={"Host": SITE}, timeout=60) as client:
            # a request the limit counts before anything else runs (an empty feedback body: 422 in a millisecond),
            # so 30 of them come faster than the 5/s refill
            statuses = [client.post("/api/knowledge/feedback", json={},
                                    headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code for i in range(30)]
            assert statuses[:20] == [422] * 20, statuses  # the burst; a spoofed header changes nothing
            assert 429 in statuses[20:], statuses
            limited = client.post("/api/knowledge/query", json=body)
            assert limited.status_code == 429
            assert int(limited.headers["retry-after"]) >= 1 and limited.json()["error"] == "rate_limited"
            admin = client.post("/api/knowledge/query", json=body,
                                headers={"Authorization": "Bearer a-configured-admin-token-of-some-length"})
            assert admin.status_code == 200  # admin requests are never limited
            assert client.get("/health").status_code == 200  # nor /health
        proxy = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=base, headers={"Host": SITE}, timeout=60, transport=proxy) as via_proxy:
            for reader in ("203.0.113.7", "203.0.113.8"):
                answer = via_proxy.post("/api/knowledge/query", json=body, headers={"X-Forwarded-For": f"10.9.9.9, {reader}"})
                assert answer.status_code == 200, (reader, answer.text)
        health = httpx.get(f"{base}/health", headers={"Host": SITE, "Authorization": "Bearer a-configured-admin-token-"
                                                      "of-some-length"}).json()
        assert health["admin_token_required"] is True
        assert not (settings.data_dir / "admin_token").exists() or "generated" not in log.read_text()
    finally:
        stop(proc)


def test_serve_with_tls_answers_https_and_says_so_in_health(corpus, tmp_path):
    root, settings = corpus
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    log = tmp_path / "tls.log"
    proc, base = start_serve({"GROUNDWORK_DATA_DIR": str(settings.data_dir), "GROUNDWORK_SOURCES": str(root / "docs"),
                              "GROUNDWORK_SSL_CERTFILE": str(cert), "GROUNDWORK_SSL_KEYFILE": str(key)}, log)
    try:
        assert base.startswith("https://")
        wait_healthy(proc, base, log)
        answer = httpx.get(f"{base}/health", verify=False)
        health = answer.json()
        assert health["tls"] is True and health["remote"] is False and health["admin_token_required"] is False
        assert answer.headers["strict-transport-security"] == "max-age=31536000"  # over TLS: stay on HTTPS
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on that port
            httpx.get(base.replace("https://", "http://") + "/health", timeout=5)
    finally:
        stop(proc)


def test_serve_refuses_a_certificate_without_its_key(corpus, tmp_path):
    root, settings = corpus
    run = subprocess.run(["groundwork", "serve", "--ssl-certfile", str(tmp_path / "cert.pem")],
                         capture_output=True, text=True, timeout=120,
                         env={"PATH": str(Path(__import__("sys").executable).parent), "HOME": str(tmp_path),
                              "GROUNDWORK_DATA_DIR": str(settings.data_dir),
                              "GROUNDWORK_EMBEDDING_MODEL": os.environ["GROUNDWORK_EMBEDDING_MODEL"]})
    assert run.returncode != 0
    assert "ssl_certfile" in run.stderr and "ssl_keyfile" in run.stderr
