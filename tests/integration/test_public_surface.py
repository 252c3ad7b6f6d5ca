"""What the public surface reveals about internal sources: nothing.  An outside tester's findings, each replayed
against a real `groundwork serve` in remote mode on 127.0.0.1 (traffic to loopback only).

The index holds a public source (a gardening handbook) and an internal one (runbooks with unique ids such as
SOP-4471 and a secret word); a generated admin token; ``GROUNDWORK_ALLOWED_HOSTS=docs.example.com``.  Every request
names the docs site's host, as a reverse proxy or a reader's browser would send it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.source_actions import update_source_now
from tests.helpers import start_serve, stop, wait_healthy

pytestmark = pytest.mark.slow

SITE = "docs.example.com"
ORIGIN = f"https://{SITE}"
INTERNAL_ID, UNKNOWN_ID = "SOP-4471", "SOP-9917"
SECRET = "zebracorn"
GARDEN = {
    "tomatoes.md": "# Growing tomatoes\n\nWater tomato plants deeply twice a week in the morning, at the roots and never "
                   "on the leaves. Mulch with straw to keep the soil moist and cool, and tie the stems to stakes as "
                   "they grow. Pinch out the side shoots of cordon varieties every week so the plant puts its "
                   "strength into the fruit; stop the top once six trusses have set.\n",
    "compost.md": "# Making compost\n\nMix green waste such as grass cuttings and vegetable peelings with brown waste "
                  "such as dry leaves, straw and shredded cardboard, roughly one part green to two parts brown. Turn "
                  "the heap every two weeks so air reaches the middle, and keep it as damp as a wrung-out sponge. "
                  "Compost is ready when it is dark, crumbly and smells of earth.\n",
    "pruning.md": "# Pruning roses\n\nPrune bush roses in late winter, just as the buds begin to swell. Cut out dead, "
                  "damaged and crossing stems first, then shorten the strongest canes to an outward-facing bud about "
                  "a hand's width above the ground. Always use clean, sharp secateurs and slope each cut away from "
                  "the bud so rain runs off.\n",
}
RUNBOOK = (f"# Runbook {INTERNAL_ID}: vault unseal\n\n{INTERNAL_ID} says the on-call engineer rotates the {SECRET} "
           "unseal keys with the break-glass procedure after every restart: fetch the three key shares from the "
           "safe in room 4.12, enter them one by one, then page the security lead. Never paste the key shares into "
           "chat or tickets; the shares themselves are rotated every quarter by two people together.\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("public-surface")
    (root / "garden").mkdir()
    for name, text in GARDEN.items():
        (root / "garden" / name).write_text(text)
    (root / "runbooks").mkdir()
    (root / "runbooks" / "vault.md").write_text(RUNBOOK)
    settings = Settings(data_dir=root / "data", sources=[root / "garden", root / "runbooks"])
    run_sync(settings, embedder)
    assert update_source_now(settings, "garden", {"visibility": "public"})[3] is not None
    return root, settings


@pytest.fixture(scope="module")
def server(corpus):
    root, settings = corpus
    log = root / "server.log"
    proc, base = start_serve({
        "GROUNDWORK_DATA_DIR": str(settings.data_dir), "GROUNDWORK_SOURCES": f"{root / 'garden'}:{root / 'runbooks'}",
        "GROUNDWORK_ALLOW_REMOTE": "true", "GROUNDWORK_ALLOWED_HOSTS": SITE, "GROUNDWORK_CORS_ORIGINS": ORIGIN,
        "GROUNDWORK_PUBLIC_RATE": "1000", "GROUNDWORK_PUBLIC_BURST": "1000"}, log)
    try:
        wait_healthy(proc, base, log)
        token = (settings.data_dir / "admin_token").read_text().strip()
        yield {"base": base, "log": log, "token": token, "settings": settings, "root": root,
               "port": int(urlsplit(base).port)}
    finally:
        stop(proc)


def site(server: dict, admin: bool = False, **headers: str) -> httpx.Client:
    sent = {"Host": SITE, **headers}
    if admin:
        sent["Authorization"] = f"Bearer {server['token']}"
    return httpx.Client(base_url=server["base"], headers=sent, timeout=60)


def raw(server: dict, request: bytes, body_chunks: list[bytes] = (), timeout_s: float = 10.0) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 exchange over a plain socket (what httpx would not send: two Host headers, a body that never
    comes): (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=timeout_s) as sock:
        sock.sendall(request)
        for chunk in body_chunks:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):  # the server answered and closed: what we wait for
                break
        data = b""
        while b"\r\n\r\n" not in data:
            try:
                piece = sock.recv(65536)
            except ConnectionResetError:
                break
            if not piece:
                break
            data += piece
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            piece = sock.recv(65536)
            if not piece:
                break
            rest += piece
    return int(lines[0].split()[1]), headers, rest


def comparable(body: dict, question_id: str) -> str:
    """A public response as compared: request id, timings and the echoed question's id taken out."""
    body = json.loads(json.dumps(body))
    body.pop("retrieval_request_id", None)
    id_words = set(re.split(r"[^a-z0-9]+", question_id.lower()))
    body["missing_terms"] = ["<id>" if word in id_words else word for word in body.get("missing_terms", [])]
    body.pop("latency_ms", None)
    return json.dumps(body, sort_keys=True).replace(question_id, "<id>")


def test_an_internal_only_id_and_an_unknown_id_get_byte_identical_public_answers(server):
    """The entity oracle: the query form (and with it alpha), entity tables, BM25 statistics and coverage are the
    public view's, so naming an id only an internal runbook holds changes nothing a public caller sees."""
    question = "what does {} say?"
    with site(server) as public, site(server, admin=True) as admin:
        # the admin's search knows the id: it is an entity of the index, and the runbook answers
        seen = admin.post("/api/knowledge/query", json={"query": question.format(INTERNAL_ID)}).json()
        assert seen["params"]["query_form"] == "named_entity" and SECRET in json.dumps(seen["results"])
        assert admin.post("/api/knowledge/query", json={"query": question.format(UNKNOWN_ID)}).json()["params"][
            "query_form"] == "question"
        for route in ("/api/knowledge/query", "/api/ask"):
            known, unknown = (public.post(route, json={"query": question.format(i)}) for i in (INTERNAL_ID, UNKNOWN_ID))
            assert known.status_code == unknown.status_code == 200, (known.text, unknown.text)
            assert comparable(known.json(), INTERNAL_ID) == comparable(unknown.json(), UNKNOWN_ID), route
            assert SECRET not in known.text
            # a word only the internal runbook holds is missing for the public caller, as a made-up one is
            assert INTERNAL_ID.split("-")[1] in known.json()["missing_terms"]
        assert INTERNAL_ID.split("-")[1] not in seen["missing_terms"]  # the admin's search reads the runbook
        form = public.post("/api/knowledge/query", json={"query": question.format(INTERNAL_ID)}).json()["params"]
        assert form["query_form"] == "question" and form["filters"] == {"visibility": ["public"]}
        # an entity filter naming it matches nothing publicly, exactly as a made-up one
        by_entity = [public.post("/api/knowledge/query", json={"query": "keys", "filters": {"entities": [i]}}).json()
                     for i in (INTERNAL_ID, UNKNOWN_ID)]
        assert comparable(by_entity[0], INTERNAL_ID) == comparable(by_entity[1], UNKNOWN_ID)


def test_the_public_view_has_the_statistics_of_an_index_of_the_public_documents_alone(corpus, embedder, tmp_path):
    """What makes public answers independent of internal sources: the view a public search runs on scores BM25,
    sections, entities and the query form exactly as an index built from the public documents alone."""
    import numpy as np

    from knowledge_store.retrieval.query_form import query_form
    from knowledge_store.retrieval.snapshot_reader import load_snapshot

    root, _ = corpus
    mixed = Settings(data_dir=tmp_path / "mixed", sources=[root / "garden", root / "runbooks"])
    alone = Settings(data_dir=tmp_path / "alone", sources=[root / "garden"])
    for settings in (mixed, alone):
        run_sync(settings, embedder)
    update_source_now(mixed, "garden", {"visibility": "public"})
    full, only = load_snapshot(mixed.index_dir), load_snapshot(alone.index_dir)
    try:
        view = full.view(["public"])
        assert view.size == only.size < full.size and view.num_docs == only.num_docs
        assert view.avgdl == pytest.approx(only.avgdl) and set(view.term_ids) == set(only.term_ids)
        assert set(view.entity_rows) == set(only.entity_rows) and view.sections.count == only.sections.count
        for query in ("water tomato plants deeply", f"what does {INTERNAL_ID} say about {SECRET} keys?", "prune roses"):
            seen, alone_terms = view.query_terms(query), only.query_terms(query)
            assert (seen.known, seen.unknown) == (alone_terms.known, alone_terms.unknown)
            np.testing.assert_allclose(seen.idf, alone_terms.idf)
            assert seen.total_weight == pytest.approx(alone_terms.total_weight)
            for scores in (lambda s, t: s.bm25_scores(t)[0], lambda s, t: s.bm25_scores(t)[1],
                           lambda s, t: s.section_bm25_scores(t)):
                by_chunk = dict(zip(view.chunk_ids, scores(view, seen).tolist()))
                np.testing.assert_allclose([by_chunk[c] for c in only.chunk_ids], scores(only, alone_terms), rtol=1e-5)
            assert query_form(query, view) == query_form(query, only)
        assert query_form(f"what does {INTERNAL_ID} say?", full) == "named_entity"  # the whole index knows it
        assert full.view(["public", "internal"]) is full  # every document qualifies: no copy
    finally:
        full.close()
        only.close()


def test_a_request_with_two_host_headers_is_400_and_links_name_the_allowed_host(server):
    spoofed = (f"GET /api/sources/ HTTP/1.1\r\nHost: evil.example\r\nHost: {SITE}\r\n"
               f"Authorization: Bearer {server['token']}\r\nConnection: close\r\n\r\n").encode()
    status, _, body = raw(server, spoofed)
    assert status == 400 and b"Host" in body, body
    status, headers, _ = raw(server, (f"GET /api/sources/ HTTP/1.1\r\nHost: {SITE}\r\nAuthorization: Bearer "
                                      f"{server['token']}\r\nConnection: close\r\n\r\n").encode())
    assert status == 307 and urlsplit(headers["location"]).netloc == SITE
    body = json.dumps({"query": "how often should I water tomatoes"})
    status, _, answer = raw(server, (f"POST /api/knowledge/query HTTP/1.1\r\nHost: evil.example\r\nHost: {SITE}\r\n"
                                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                                     f"Connection: close\r\n\r\n{body}").encode())
    assert status == 400 and b"evil.example" not in answer
    with site(server) as public:
        results = public.post("/api/knowledge/query", json={"query": "how often should I water tomatoes"}).json()["results"]
    assert results and all(urlsplit(r["source_url"]).netloc == SITE for r in results)


def test_public_health_says_status_services_and_version_only(server):
    with site(server) as public, site(server, admin=True) as admin:
        admin.post("/api/ask", json={"query": f"what does {INTERNAL_ID} say?"})
        first = public.get("/health")
        public.post("/api/ask", json={"query": f"what does {INTERNAL_ID} say?"})  # the admin's question again
        again = public.get("/health")
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json()
        assert set(first.json()) == {"status", "services", "version"}
        assert first.json()["services"]["model"] == "up" and first.json()["services"]["index"] == "up"
        detail = public.get("/health", params={"detail": "1"})
        assert detail.status_code == 401
        full = admin.get("/health", params={"detail": "1"}).json()
        assert full["index"]["documents"] >= 4 and "hits" in full["query_cache"] and full["remote"] is True


def test_no_public_response_names_a_folder_of_the_server(server):
    data = server["settings"].data_dir
    folders = {str(data), str(data.resolve()), str(server["root"]), str(server["root"].resolve())}
    with site(server) as public:
        answers = [
            public.post("/api/knowledge/query", json={"query": "how do I prune roses", "k": 3}),
            public.post("/api/ask", json={"query": "how do I prune roses"}),
            public.post("/api/ask-local", json={"query": "what does this mean?", "context": "outward-facing bud",
                                                "source_file": "pruning.md"}),
            public.post("/api/ask-local", json={"query": "what?", "context": "x", "source_file": "vault.md"}),
            public.get("/health"),
            public.get("/api/knowledge/sources/nope/file"),
            public.post("/api/knowledge/feedback", json={"retrieval_request_id": "nope", "rating": "up"}),
        ]
        query, ask, local = (a.json() for a in answers[:3])
        assert query["results"] and ask["sources"] and local["sources"]
        for answer in answers:
            assert not any(folder in answer.text for folder in folders), answer.text[:500]
            assert "file://" not in answer.text
        first = query["results"][0]
        assert first["url"] == first["source_path"] == first["source_url"] and first["url"].startswith(f"http://{SITE}/")
        assert (first["source"], first["file"]) == ("garden", "pruning.md")
        assert ask["sources"][0]["source_path"] == ask["sources"][0]["url"] and ask["sources"][0]["source"] == "garden"
        # a path filter matches paths relative to their source only: the place on disk is no oracle
        absolute = public.post("/api/knowledge/query", json={"query": "roses", "filters": {"paths": str(server["root"]) + "/*"}})
        relative = public.post("/api/knowledge/query", json={"query": "roses", "filters": {"paths": "pruning.md"}})
        assert absolute.json()["results"] == [] and relative.json()["results"]
        assert public.post("/api/ask-local", json={"query": "what?", "context": "bud", "source_file": str(
            server["root"] / "garden" / "pruning.md")}).status_code == 422
    with site(server, admin=True) as admin:  # the admin surface keeps the paths
        assert "file://" in admin.post("/api/knowledge/query", json={"query": "how do I prune roses", "k": 1}).text


def test_five_ratings_of_one_result_by_one_client_count_once(server):
    with site(server) as public:
        asked = public.post("/api/knowledge/query", json={"query": "when is compost ready", "k": 2}).json()
        rid, chunk = asked["retrieval_request_id"], asked["results"][0]["chunk_id"]
        stored = [public.post("/api/knowledge/feedback", json={"retrieval_request_id": rid, "chunk_id": chunk,
                                                               "rating": rating}) for rating in ["up"] * 4 + ["down"]]
        assert [s.status_code for s in stored] == [201] * 5
        assert [s.json()["replaced"] for s in stored] == [0, 1, 1, 1, 1]
    proxy = httpx.HTTPTransport(local_address="127.0.0.2")  # another client, from another address
    with httpx.Client(base_url=server["base"], headers={"Host": SITE}, transport=proxy, timeout=60) as other:
        assert other.post("/api/knowledge/feedback", json={"retrieval_request_id": rid, "chunk_id": chunk,
                                                           "rating": "up"}).json()["replaced"] == 0
    with site(server, admin=True) as admin:
        rows = [r for r in admin.get("/api/knowledge/feedback").json()["feedback"] if r["retrieval_request_id"] == rid]
        assert sorted(r["rating"] for r in rows) == ["down", "up"]  # one row per client: the last rating wins
        assert len({r["client"] for r in rows}) == 2 and "127.0.0" not in json.dumps(rows)  # pseudonyms, no address


def test_a_body_over_the_limit_is_413_before_it_is_read(server):
    declared = 2 * 1024 * 1024
    head = (f"POST /api/ask HTTP/1.1\r\nHost: {SITE}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\nConnection: close\r\n\r\n").encode()
    began = time.monotonic()
    status, _, body = raw(server, head)  # not one byte of the body is sent: the answer comes anyway
    assert status == 413 and json.loads(body)["error"] == "too_large", body
    assert time.monotonic() - began < 5
    # chunked, no length: refused once the bytes received pass the limit, the rest unread
    chunked = (f"POST /api/knowledge/query HTTP/1.1\r\nHost: {SITE}\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    piece = b"x" * 65536
    chunks = [f"{len(piece):x}\r\n".encode() + piece + b"\r\n"] * 40  # 2.5 MB offered
    status, _, body = raw(server, chunked, chunks)
    assert status == 413, body
    # an upload keeps its own limit (GROUNDWORK_MAX_FILE_MB): 2 MB is read whole, and refused for what it is
    with site(server, admin=True) as admin:
        upload = admin.post("/api/knowledge/ingest", files={"file": ("big.pdf", b"not a pdf " * 210_000, "application/pdf")})
        assert upload.status_code == 422 and upload.json()["errors"][0]["field"] == "file", upload.text


def test_a_folder_swapped_for_a_link_outside_the_roots_is_refused_at_sync_and_its_files_are_not_served(server,
                                                                                                       tmp_path):
    data = server["settings"].data_dir
    folder = data / "extra"
    folder.mkdir()
    (folder / "hedges.md").write_text("# Hedges\n\nTrim beech hedges in late summer " + "and feed them in spring. " * 12)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "leak.md").write_text(f"# Leak\n\nThe {SECRET} vault master password is hunter2. " + "Secret. " * 60)
    with site(server, admin=True) as admin, site(server) as public:
        added = admin.post("/api/sources", json={"name": "extra", "kind": "folder", "folder": str(folder),
                                                 "visibility": "public", "sync": True})
        assert added.status_code == 202, added.text
        wait_for_job(admin, added.json()["status_url"])
        hedge = public.post("/api/ask", json={"query": "when do I trim beech hedges"}).json()["sources"]
        hedge_file = next(s["url"] for s in hedge if s["file"] == "hedges.md")
        assert public.get(urlsplit(hedge_file).path).status_code == 200
        folder.rename(tmp_path / "moved")
        folder.symlink_to(outside)  # the registered folder now leads out of every root
        assert public.get(urlsplit(hedge_file).path).status_code == 410  # checked on every file served
        synced = admin.post("/api/sources/extra/sync")
        assert synced.status_code == 202
        wait_for_job(admin, synced.json()["status_url"])
        failures = [f for f in admin.get("/api/failures").json()["failures"] if f["kind"] == "outside_source_roots"]
        assert [f["path"] for f in failures] == [str(folder)] and str(outside) in failures[0]["reason"]
        for route in ("/api/ask", "/api/knowledge/query"):
            assert "hunter2" not in public.post(route, json={"query": f"{SECRET} vault master password"}).text
        assert "hunter2" not in admin.post("/api/knowledge/query", json={"query": f"{SECRET} master password"}).text


def wait_for_job(client: httpx.Client, status_url: str, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    job = client.get(urlsplit(status_url).path).json()
    while job["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.3)
        job = client.get(urlsplit(status_url).path).json()
    assert job["status"] == "succeeded", job
    return job


def test_nul_in_a_folder_is_422_naming_the_field(server):
    with site(server, admin=True) as admin:
        answer = admin.post("/api/sources", json={"name": "nul", "kind": "folder", "folder": "/tmp/a\u0000b"})
    assert answer.status_code == 422 and [e["field"] for e in answer.json()["errors"]] == ["folder"], answer.text


def test_public_pages_and_json_carry_the_security_headers_and_no_cdn_docs(server):
    with site(server) as public:
        for answer in (public.get("/"), public.get("/health"), public.post("/api/ask", json={"query": "compost"}),
                       public.get("/openapi.json")):
            assert answer.headers["x-content-type-options"] == "nosniff", answer.request.url
            assert answer.headers["referrer-policy"] == "no-referrer"
            assert answer.headers["x-frame-options"] == "DENY"
            assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
            assert "strict-transport-security" not in answer.headers  # plain HTTP: HSTS means nothing here
        assert public.get("/docs").status_code == 404 and public.get("/redoc").status_code == 404


def test_a_private_network_preflight_from_the_allowed_origin_is_answered(server):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type", "Access-Control-Request-Private-Network": "true"}
    with site(server) as public:
        answer = public.options("/api/ask", headers=preflight)
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-private-network"] == "true"
        assert answer.headers["access-control-allow-origin"] == ORIGIN
        assert public.options("/api/ask", headers={**preflight, "Origin": "https://evil.example"}).status_code == 403


def test_data_files_are_the_server_users_alone(server):
    data = server["settings"].data_dir
    checked = {"store.duckdb": data / "store.duckdb", "logs.duckdb": data / "logs.duckdb",
               "query.log": data / "logs" / "query.log", "admin_token": data / "admin_token"}
    checked |= {p.name: p for p in (data / "index").glob("*.duckdb")}
    assert len(checked) > 4
    for name, path in checked.items():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (name, oct(path.stat().st_mode))
    for folder in (data, data / "index", data / "logs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, (folder, oct(folder.stat().st_mode))


def test_an_admin_answer_is_logged_by_request_id_not_by_its_text(server):
    with site(server, admin=True) as admin:
        asked = admin.post("/api/ask", json={"query": f"what does {INTERNAL_ID} say about the keys?"}).json()
    assert SECRET in asked["answer"]
    deadline = time.monotonic() + 10
    query_log = server["settings"].data_dir / "logs" / "query.log"
    while asked["retrieval_request_id"] not in query_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = [json.loads(line) for line in query_log.read_text().splitlines()]
    line = next(x for x in lines if x["retrieval_request_id"] == asked["retrieval_request_id"])
    assert line["answer"] is None
    printed = [json.loads(x) for x in server["log"].read_text().splitlines() if x.startswith('{"timestamp"')]
    assert any(x["retrieval_request_id"] == asked["retrieval_request_id"] and x["answer"] is None for x in printed)
    assert asked["answer"] not in server["log"].read_text() and asked["answer"] not in query_log.read_text()


def test_a_short_admin_token_is_refused_in_remote_mode_saying_why(corpus, tmp_path):
    root, settings = corpus
    run = subprocess.run([sys.executable, "-m", "knowledge_store.cli", "serve"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path,
                         env={**os.environ, "GROUNDWORK_DATA_DIR": str(tmp_path / "data"), "GROUNDWORK_ALLOW_REMOTE": "true",
                              "GROUNDWORK_ADMIN_TOKEN": "letmein", "GROUNDWORK_SERVER_PORT": "1"})
    assert run.returncode != 0
    assert "admin_token" in run.stderr and "16 characters" in run.stderr and "letmein" not in run.stderr + run.stdout


def test_a_public_answer_does_not_change_when_internal_documents_do(server):
    """The same question, with results, before and after the internal runbook stops naming the id: the public
    answer is the same (apart from request ids, timings and the snapshot version it was served from)."""
    question = f"what does {INTERNAL_ID} say about watering tomatoes?"

    def asked() -> list[str]:
        with site(server) as public:
            out = []
            for route in ("/api/knowledge/query", "/api/ask"):
                body = public.post(route, json={"query": question}).json()
                assert route == "/api/ask" or body["results"], body
                body.pop("snapshot_version")
                out.append(comparable(body, INTERNAL_ID))
            return out

    before = asked()
    (server["root"] / "runbooks" / "vault.md").write_text(RUNBOOK.replace(INTERNAL_ID, "the vault runbook"))
    with site(server, admin=True) as admin:
        synced = admin.post("/api/sources/runbooks/sync")
        wait_for_job(admin, synced.json()["status_url"])
        now = admin.post("/api/knowledge/query", json={"query": f"{SECRET} unseal keys"}).json()["results"]
        assert now and INTERNAL_ID not in json.dumps(now)  # the runbook's active version no longer names it
    assert asked() == before
