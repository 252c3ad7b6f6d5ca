"""The contracts other systems build on, over HTTP, with their own field names: ``GET /api/kb/articles``
and ``POST /api/ask`` / ``POST /api/ask-local`` (questions, answers and their sources).

One real index per module: the sample corpus, plus a Markdown article shaped like the articles contract's example
(intent/device/author front matter) and one page of a local web site (served by tests/doc_site.py).
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from fastapi.testclient import TestClient

from knowledge_store.core.text import sentence_spans
from knowledge_store.ingest.sources import add_source
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server import kb_articles
from knowledge_store.server.app import create_app
from knowledge_store.storage.query_log import QueryLog
from knowledge_store.storage.store import store_connection
from tests.doc_site import DocSite, Reply
from tests.helpers import build_sample_index

pytestmark = pytest.mark.slow
BASE = "http://127.0.0.1:8080"
APOLLO = """---
title: Apollo Not Hashing Troubleshooting
intent: [not_hashing, performance_issue]
device: [Apollo, Apollo II, Apollo III]
author: FutureBit Support
---
# Apollo Not Hashing Troubleshooting

If your Apollo shows 0 H/s, first check that your pool configuration is correct. The pool URL, the worker
name and the password must match what your pool's dashboard shows.

## The node is still syncing

Apollo II devices may show 0 H/s if the Bitcoin node is not fully synced. Mining starts on its own once
the node has caught up; the dashboard shows the sync progress in percent.

## Restarting the miner

Restart the miner from the dashboard, not by pulling the power cable. If the hashrate stays at 0 H/s after
a restart, collect the debug log and contact support.
"""
WEB_PAGE = """# Resetting the Gizmo

Hold the side button for twelve seconds to reset the Gizmo. The light blinks blue while it resets.
"""


def words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def sentences(text: str) -> Counter:
    """How often each sentence (of more than a few words) occurs in ``text``."""
    return Counter(words(text[start:end]) for start, end in sentence_spans(text) if end - start > 20)


@pytest.fixture(scope="module")
def env(tmp_path_factory, embedder):
    from knowledge_store.ingest.run import run_sync

    root = tmp_path_factory.mktemp("kb_contract")
    (root / "docs").mkdir()
    (root / "docs" / "apollo-not-hashing.md").write_text(APOLLO)
    settings = build_sample_index(root, embedder)
    with DocSite() as site:
        site.routes["/help/gizmo-reset.md"] = Reply(body=WEB_PAGE.encode(), content_type="text/markdown; charset=utf-8")
        web_url = site.url("/help/gizmo-reset.md")
        with store_connection(settings.store_path) as conn:
            add_source(conn, "helpsite", "web", web_url, {"depth": 0, "requests_per_second": 500.0})
        run_sync(settings, embedder, names=["helpsite"])
    engine = RetrievalEngine(settings, embedder=embedder, query_log=QueryLog(settings.logs_path))
    engine.snapshots.check_interval_s = 0.0
    app = create_app(settings, engine)
    with TestClient(app, base_url=BASE) as client:
        yield {"client": client, "settings": settings, "engine": engine, "web_url": web_url}


def get_articles(client, **params) -> dict:
    response = client.get("/api/kb/articles", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def store_text(settings, doc_id: str, version: int) -> str:
    with store_connection(settings.store_path, read_only=True) as conn:
        pages = conn.execute("SELECT text FROM pages WHERE doc_id = ? AND version = ? ORDER BY page_number",
                             [doc_id, version]).fetchall()
    return "\n\n".join(text.strip() for (text,) in pages)


# ------------------------------------------------------------------ GET /api/kb/articles

def test_articles_have_the_contract_shape(env):
    data = get_articles(env["client"])
    assert {"articles", "total", "updated_at"} <= set(data)
    assert data["total"] == 10 and len(data["articles"]) == 10 and data["limit"] == 100  # default limit 100
    datetime.fromisoformat(data["updated_at"].replace("Z", "+00:00"))
    for article in data["articles"]:
        assert {"id", "title", "url", "content", "metadata"} <= set(article)
        meta = article["metadata"]
        assert isinstance(meta["intent"], list) and isinstance(meta["device"], list)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", meta["last_updated"])  # always present
        assert article["url"].startswith("http://") and article["content"].strip()
    by_path = {a["path"]: a for a in data["articles"]}
    assert by_path["aurora-installation-manual.pdf"]["metadata"]["author"] == "Corvane Climate Systems"
    assert "author" not in by_path["aurora-faq.md"]["metadata"]  # optional: absent when unknown, never null
    assert by_path["aurora-api-guide.md"]["metadata"]["device"] == ["aurora-hub"]


def test_the_seed_example_article_round_trips(env):
    (article,) = get_articles(env["client"], intent="not_hashing")["articles"]
    assert article["title"] == "Apollo Not Hashing Troubleshooting"
    assert article["metadata"]["intent"] == ["not_hashing", "performance_issue"]
    assert article["metadata"]["device"] == ["Apollo", "Apollo II", "Apollo III"]
    assert article["metadata"]["author"] == "FutureBit Support"
    assert article["content"].startswith("# Apollo Not Hashing Troubleshooting\n\nIf your Apollo shows 0 H/s")
    assert "collect the debug log and contact support." in article["content"]


def test_urls_are_absolute_links_to_the_original(env):
    client = env["client"]
    articles = get_articles(client)["articles"]
    web = [a for a in articles if a["type"] == "markdown" and a["path"].startswith("http")]
    assert [a["url"] for a in web] == [env["web_url"]]  # a web page: its own URL
    for article in articles:
        if article not in web:
            assert article["url"] == f"{BASE}/api/knowledge/sources/{article['id']}/file"
            assert client.get(article["url"]).status_code == 200  # the file itself


def test_content_is_the_full_text_once_not_overlapping_chunks(env):
    settings, engine = env["settings"], env["engine"]
    snapshot = engine.snapshots.current()
    repeated_by_chunks = 0
    for article in get_articles(env["client"])["articles"]:
        full = store_text(settings, article["id"], article["version"])
        assert article["content"] == full  # the stored page text, every page, once
        cursor = snapshot.conn.cursor()
        chunks = [t for (t,) in cursor.execute("SELECT text FROM chunks WHERE doc_id = ? AND status = 'active' "
                                               "ORDER BY chunk_index", [article["id"]]).fetchall()]
        cursor.close()
        # what concatenating chunks gave before: overlap repeats sentences
        naive, once = sentences("\n\n".join(chunks)), sentences(article["content"])
        repeated_by_chunks += any(naive[s] > once[s] for s in naive)
        assert all(words(chunk) in words(article["content"]) for chunk in chunks), article["path"]  # nothing lost
    assert repeated_by_chunks >= 3  # the overlap is real in this corpus; the articles do not carry it


def test_content_rebuilt_from_the_snapshot_equals_the_pages_when_the_store_is_busy(env, monkeypatch):
    from_pages = {a["id"]: a["content"] for a in get_articles(env["client"])["articles"]}
    monkeypatch.setattr(kb_articles, "_from_store", lambda settings, keys: {})  # e.g. a sync in another process
    data = get_articles(env["client"])
    assert data["content_source"] == "chunks"
    for article in data["articles"]:
        assert words(article["content"]) == words(from_pages[article["id"]]), article["path"]


def test_intent_filter(env):
    client = env["client"]
    assert [a["path"] for a in get_articles(client, intent="faq")["articles"]] == ["aurora-faq.md"]
    assert [a["path"] for a in get_articles(client, intent="Performance Issue")["articles"]] == ["apollo-not-hashing.md"]
    assert [a["path"] for a in get_articles(client, intent="webhooks")["articles"]] == ["aurora-api-guide.md"]
    # no intent metadata: all the intent's words in the title
    assert sorted(a["path"] for a in get_articles(client, intent="troubleshooting")["articles"]) == [
        "apollo-not-hashing.md", "aurora-troubleshooting.html"]
    none = get_articles(client, intent="billing")
    assert none["total"] == 0 and none["articles"] == [] and none["next_offset"] is None


def test_device_and_updated_since_filters(env):
    client = env["client"]
    assert [a["path"] for a in get_articles(client, device="Apollo II")["articles"]] == ["apollo-not-hashing.md"]
    assert [a["path"] for a in get_articles(client, device="aurora_hub")["articles"]] == ["aurora-api-guide.md"]
    both = get_articles(client, intent="not_hashing", device="aurora-hub")
    assert both["total"] == 0
    future = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
    past = (datetime.now(timezone.utc) - timedelta(days=1)).isoformat()
    assert get_articles(client, updated_since=future)["total"] == 0
    assert get_articles(client, updated_since=past)["total"] == 10


def test_pagination_beyond_limit_visits_every_article_once(env):
    client = env["client"]
    seen: list[str] = []
    offset, pages = 0, 0
    while offset is not None:
        page = get_articles(client, limit=4, offset=offset)
        assert page["total"] == 10 and len(page["articles"]) <= 4
        seen += [a["id"] for a in page["articles"]]
        offset, pages = page["next_offset"], pages + 1
    assert pages == 3 and len(seen) == len(set(seen)) == 10
    assert client.get("/api/kb/articles", params={"limit": 0}).status_code == 422


def test_an_unavailable_knowledge_base_is_the_contract_error(env, monkeypatch):
    from knowledge_store.core.errors import IndexNotBuiltError

    def no_index():
        raise IndexNotBuiltError(env["settings"].index_dir)

    monkeypatch.setattr(env["engine"].snapshots, "current", no_index)
    response = env["client"].get("/api/kb/articles")
    assert response.status_code == 500
    assert response.json() == {"error": "Internal server error", "message": "Knowledge base unavailable"}
    spec = env["client"].get("/openapi.json").json()["paths"]["/api/kb/articles"]["get"]
    assert spec["responses"]["500"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert spec["parameters"][-2]["name"] == "limit" and spec["parameters"][-2]["schema"]["default"] == 100


# ------------------------------------------------------------------ POST /api/ask, /api/ask-local

def test_ask_answers_with_three_cited_sources(env):
    response = env["client"].post("/api/ask", json={"query": "How do I reset the Aurora to factory settings?"})
    assert response.status_code == 200, response.text
    data = response.json()
    assert set(data) >= {"answer", "sources"} and data["answer_method"] == "extractive"
    assert len(data["sources"]) == 3 and data["candidates"] == 10  # 3 from the top 10
    for source in data["sources"]:
        assert {"file", "section", "url", "pages"} <= set(source)
    top = data["sources"][0]
    assert top["file"] == "aurora-installation-manual.pdf" and top["section"] == "Commissioning > Restoring factory settings"
    assert top["pages"] == [4] and top["url"] == f"{BASE}/api/knowledge/sources/{top['doc_id']}/file#page=4"
    assert "press and hold the dial" in data["answer"] and "[1]" in data["answer"]
    assert not re.findall(r"\[(\d+)\]", data["answer"]) or max(int(n) for n in re.findall(r"\[(\d+)\]", data["answer"])) <= 3
    feedback = env["client"].post("/api/knowledge/feedback", json={
        "retrieval_request_id": data["retrieval_request_id"], "chunk_id": top["chunk_id"], "rating": "up"})
    assert feedback.status_code == 201  # an ask is a logged retrieval like any other


def test_ask_sources_of_a_web_page_link_to_the_page(env):
    data = env["client"].post("/api/ask", json={"query": "how do I reset the Gizmo", "max_sources": 1}).json()
    (source,) = data["sources"]
    assert source["file"] == env["web_url"] and source["url"].startswith(env["web_url"])
    assert "twelve seconds" in data["answer"]


def test_ask_without_relevant_content_says_so(env):
    data = env["client"].post("/api/ask", json={"query": "what is the capital of France"}).json()
    assert data["sources"] == [] and data["answer"] == "No relevant content found." and data["coverage"] == "none"


def test_ask_names_the_words_of_the_question_no_document_mentions(env):
    client = env["client"]
    data = client.post("/api/ask", json={"query": "Can I install the Aurora on a solar-powered system?"}).json()
    assert data["missing_terms"] == ["solar"]  # "powered" is there as "power"; stopwords are never listed
    assert data["sources"]  # the passages about installing still come back: the note is what says they cannot answer
    answered = client.post("/api/ask", json={"query": "How do I reset the Aurora to factory settings?"}).json()
    assert answered["missing_terms"] == []
    searched = client.post("/api/knowledge/query", json={"query": "solar panels for the Aurora"}).json()
    assert searched["missing_terms"] == ["solar", "panels"]


def test_ask_local_stays_in_the_source_file_and_uses_the_selection(env):
    client = env["client"]
    selection = ("E42 means the thermostat expects a wired remote sensor on terminals S1 and S2 but measures an open "
                 "circuit there")
    response = client.post("/api/ask-local", json={"query": "What should I check first?", "context": selection,
                                                   "source_file": "aurora-troubleshooting.html"})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["sources"] and all(s["file"] == "aurora-troubleshooting.html" for s in data["sources"])
    assert "E42" in data["sources"][0]["section"]  # the selection finds its own passage first
    assert "sensor wires" in data["answer"]
    # "what does this mean?" is about the selection itself: the answer comes from its words
    meaning = client.post("/api/ask-local", json={
        "query": "What does this mean?", "context": "it must not be connected to line-voltage (120/240 V) heating",
        "source_file": "aurora-installation-manual.pdf"}).json()
    assert all(s["file"] == "aurora-installation-manual.pdf" for s in meaning["sources"])
    assert "line-voltage" in meaning["answer"] or "mains" in meaning["answer"]


def test_ask_local_errors_name_the_field(env):
    client = env["client"]
    unknown = client.post("/api/ask-local", json={"query": "why", "context": "some text", "source_file": "nope.md"})
    assert unknown.status_code == 422 and unknown.json()["errors"][0]["field"] == "source_file"
    blank = client.post("/api/ask-local", json={"query": "why", "context": "  ", "source_file": "aurora-faq.md"})
    assert blank.status_code == 422 and blank.json()["errors"][0]["field"] == "context"
    missing = client.post("/api/ask-local", json={"query": "why", "context": "text"})
    assert missing.status_code == 422 and missing.json()["errors"][0]["field"] == "source_file"
    llm = client.post("/api/ask", json={"query": "why", "answer": "llm"})  # no LLM configured here
    assert llm.status_code == 422 and llm.json()["errors"][0]["field"] == "answer"
    extra = client.post("/api/ask", json={"query": "why", "surprise": 1})
    assert extra.status_code == 422 and extra.json()["error"] == "validation_error"


def test_ask_follows_the_origin_policy(env):
    refused = env["client"].post("/api/ask", json={"query": "reset"}, headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403 and set(refused.json()) >= {"error", "message"}
