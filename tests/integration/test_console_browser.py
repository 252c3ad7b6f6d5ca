"""The Knowledge Grounding Console in a real browser (system Chromium via Playwright)
against the real app (uvicorn, real index of the sample corpus, real query log):
search -> cited results with highlighting -> thumbs/notes stored in the log; the
empty, unreachable-server (Retry) and validation states; keyboard order; and that
server text is never rendered as HTML.  Saves test-artifacts/console.png."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.helpers import (
    REPO_ROOT,
    build_sample_index,
    require_browser,
    served_app,
)

pytestmark = pytest.mark.slow

expect = require_browser("the console test")

from knowledge_store.retrieval.engine import RetrievalEngine  # noqa: E402
from knowledge_store.storage.query_log import QueryLog  # noqa: E402  (after the skips: without a browser nothing loads)

RESET = "how do I reset the Aurora to factory settings"
OFF_TOPIC = "what is the capital of France"
SAVED = "Thanks \u2014 feedback saved"
SCREENSHOT = REPO_ROOT / "test-artifacts" / "console.png"


@pytest.fixture(scope="module")
def live(tmp_path_factory, embedder):
    """A real index of the sample corpus served by the real app on a free loopback port."""
    root = tmp_path_factory.mktemp("console")
    settings = build_sample_index(root, embedder, query_torch_threads=2)
    query_log = QueryLog(root / "logs.duckdb")
    engine = RetrievalEngine(settings, embedder=embedder, query_log=query_log)
    with served_app(settings, engine, name="console-uvicorn") as base:
        yield {"base": base, "query_log": query_log, "settings": settings}
    query_log.close()


def search(page, text: str) -> None:
    page.fill("#q", text)
    page.press("#q", "Enter")


def first_result(page):
    page.wait_for_selector("#results > li")
    return page.locator("#results > li").first


# ------------------------------------------------------------------ the happy path

def test_query_shows_cited_results_and_stores_feedback(page, live):
    expect(page.locator("html")).to_have_attribute("lang", "en")
    expect(page.locator("#alpha-value")).to_have_text("server default")
    search(page, RESET)
    first = first_result(page)

    expect(first.locator(".title-text")).to_contain_text("Installation Manual")
    href = first.locator("a.source-link").get_attribute("href")
    assert href.endswith("#page=4"), href
    assert first.locator("a.source-link").get_attribute("target") == "_blank"
    assert "noopener" in first.locator("a.source-link").get_attribute("rel")
    expect(first.locator(".result-where")).to_contain_text("p. 4")
    assert page.locator("#results .snippet mark").count() > 0
    marked = {t.lower() for t in page.locator("#results .snippet mark").all_inner_texts()}
    assert marked & {"reset", "resets", "resetting", "factory", "aurora", "settings", "setting"}, marked
    expect(first.locator(".scores")).to_contain_text("BM25")
    expect(first.locator(".scores")).to_contain_text("Relevance")

    # the extractive answer with [n] markers, coverage and latency
    expect(page.locator("#answer-panel")).to_be_visible()
    assert page.locator("#answer-text a.cite").count() >= 1
    expect(page.locator("#answer-meta")).to_contain_text("Coverage:")
    expect(page.locator("#meta-line")).to_contain_text("Latency")
    expect(page.locator("#missing-note")).to_be_hidden()  # every word of the question is in some document
    # "how do I ..." is a question: it ran at the question alpha, and the line says so
    expect(page.locator("#meta-line")).to_contain_text(f"alpha {live['settings'].question_alpha:.2f} (a question)")
    expect(page.locator("#status")).to_contain_text("results in")

    # thumbs up on the first result -> a stored feedback row for that chunk
    chunk_id = first.get_attribute("data-chunk-id")
    up = first.get_by_role("button", name="Helpful:", exact=False).first
    assert up.get_attribute("aria-label").startswith("Helpful: ") and "Installation Manual" in up.get_attribute("aria-label")
    up.click()
    expect(first.locator(".feedback-status")).to_have_text(SAVED)
    expect(up).to_have_attribute("aria-pressed", "true")
    expect(first.locator(".thumb-down")).to_have_attribute("aria-pressed", "false")
    rows = live["query_log"].list_feedback()
    assert any(r["rating"] == "up" and r["chunk_id"] == chunk_id for r in rows), rows

    # an optional note, saved with the rating
    first.locator("summary").click()
    first.locator("textarea").fill("Step 3 is the one that matters.")
    first.get_by_role("button", name="Save note").click()
    expect(first.locator(".feedback-status")).to_have_text(SAVED)
    rows = live["query_log"].list_feedback()
    assert any(r["chunk_id"] == chunk_id and r.get("note") == "Step 3 is the one that matters." for r in rows), rows

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    # the server's own error message for a note that is too long
    first.locator("textarea").fill("x" * 1001)
    expect(first.locator(".note-count")).to_have_text("1001/1000")
    first.get_by_role("button", name="Save note").click()
    expect(first.locator(".feedback-status")).to_contain_text("at most 1000 characters")
    expect(first.locator(".feedback-status")).to_have_class("feedback-status error")


def test_off_topic_query_says_nothing_relevant(page):
    search(page, OFF_TOPIC)
    expect(page.locator("#empty")).to_be_visible()
    expect(page.locator("#empty")).to_have_text("No relevant content found.")
    assert page.locator("#results > li").count() == 0


def test_a_question_about_something_no_document_mentions_says_which_words(page):
    search(page, "can I install the Aurora on a solar-powered system")
    first_result(page)  # passages about installing still rank
    expect(page.locator("#missing-note")).to_be_visible()
    expect(page.locator("#missing-note")).to_have_text(
        "No document mentions \u201csolar\u201d: the passages cannot answer about it.")
    search(page, RESET)  # the next answer's note is its own
    expect(page.locator("#missing-note")).to_be_hidden()


def test_entity_chips_filter_the_search_to_passages_mentioning_them(page):
    search(page, "circulation pump inspection")
    first = first_result(page)
    chip = first.get_by_role("button", name="Filter by equipment EQP-P101")
    expect(chip).to_have_text("EQP-P101")
    with page.expect_request(lambda r: r.url.endswith("/api/knowledge/query")) as sent:
        chip.click()
    assert json.loads(sent.value.post_data)["filters"] == {"entities": ["EQP-P101"]}
    remove = page.get_by_role("button", name="Remove the filter EQP-P101")
    expect(page.locator("#entity-filters")).to_be_visible()
    expect(remove).to_be_focused()  # the clicked chip was re-rendered away; focus stays in the search controls
    expect(page.locator("#status")).to_contain_text("result")
    results = page.locator("#results > li")
    assert results.count() >= 1
    for i in range(results.count()):  # every passage shown mentions the entity, and says so
        expect(results.nth(i).get_by_role("button", name="Filter by equipment EQP-P101")).to_have_attribute(
            "aria-pressed", "true")
    with page.expect_request(lambda r: r.url.endswith("/api/knowledge/query")) as sent:
        remove.click()
    assert "filters" not in json.loads(sent.value.post_data)
    expect(page.locator("#entity-filters")).to_be_hidden()


# ------------------------------------------------------------------ failure states

def test_unreachable_server_offers_retry(page):
    page.route("**/api/knowledge/query", lambda route: route.abort("connectionrefused"))
    search(page, RESET)
    expect(page.locator("#error-panel")).to_be_visible()
    expect(page.locator("#error-title")).to_have_text("Cannot reach the server")
    expect(page.locator("#status")).to_have_attribute("aria-live", "polite")
    retry = page.get_by_role("button", name="Retry")
    expect(retry).to_be_visible()
    assert page.locator("#results > li").count() == 0

    page.unroute("**/api/knowledge/query")
    retry.click()
    first = first_result(page)
    expect(first.locator(".title-text")).to_contain_text("Installation Manual")
    expect(page.locator("#error-panel")).to_be_hidden()

    # a 5xx is "cannot reach" too, with the server's message
    page.route("**/api/knowledge/query", lambda route: route.fulfill(
        status=503, content_type="application/json",
        body=json.dumps({"error": "index_not_built", "message": "no index yet: run groundwork sync"})))
    search(page, RESET)
    expect(page.locator("#error-message")).to_have_text("no index yet: run groundwork sync")
    expect(page.locator("#error-title")).to_contain_text("HTTP 503")
    expect(page.get_by_role("button", name="Retry")).to_be_visible()


def test_validation_errors_show_next_to_the_form(page):
    search(page, "   ")  # only whitespace: the server answers 422
    expect(page.locator("#form-error")).to_be_visible()
    expect(page.locator("#form-error")).to_contain_text("must not be empty")
    expect(page.locator("#q")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#error-panel")).to_be_hidden()

    page.fill("#k", "50")
    search(page, RESET)
    expect(page.locator("#form-error")).to_contain_text("from 1 to 20")
    page.fill("#k", "3")
    search(page, RESET)
    expect(page.locator("#form-error")).to_be_hidden()
    expect(page.locator("#results > li")).to_have_count(3)


def test_reranker_choices_are_the_ones_the_server_can_run(page, live):
    with urllib.request.urlopen(live["base"] + "/api/knowledge/config", timeout=10) as response:
        config = json.loads(response.read())
    assert "cross-encoder" not in config["rerankers"]  # this server has no GROUNDWORK_CROSS_ENCODER_PATH
    expect(page.locator("#ranking-defaults")).to_contain_text("Server ranking defaults")  # the config has arrived
    offered = page.locator("#reranker option").evaluate_all("options => options.map(o => o.value)")
    assert offered == config["rerankers"]
    expect(page.locator("#reranker")).to_have_value(config["default_reranker"])


def test_a_stored_query_adapter_is_shown_with_its_held_out_evidence_and_searches_go_through_it(page, live):
    import numpy as np

    from knowledge_store.retrieval.query_adapter import QueryAdapter, reset_adapter, save_adapter

    expect(page.locator("#ranking-defaults")).to_contain_text("Server ranking defaults")
    expect(page.locator("#adapter-panel")).to_be_hidden()  # none stored
    info = {"trained_at": "2026-11-24T23:50:00+00:00", "rated_queries": 40, "held_out_queries": 11, "l2": 0.1,
            "held_out_without": {"ndcg@10": 0.61, "recall@5": 0.72},
            "held_out_with": {"ndcg@10": 0.68, "recall@5": 0.81}, "seconds": 12.5}
    index_dir = live["settings"].index_dir
    save_adapter(index_dir, QueryAdapter(np.zeros((384, 384), np.float32), info))
    try:
        page.reload()
        panel = page.locator("#adapter-summary")
        expect(panel).to_contain_text("On 11 held-out of 40 rated queries: nDCG@10 0.610 → 0.680")
        expect(panel).to_contain_text("Recall@5 0.720 → 0.810")
        expect(panel).to_contain_text("in use for every search")
        # as trained now: every rated query held out once, with the paired gain and its standard error
        save_adapter(index_dir, QueryAdapter(np.zeros((384, 384), np.float32), {
            **info, "held_out_queries": 40, "folds": 4,
            "decision": {"gain": 0.07, "standard_error": 0.021, "required": 0.042, "adopted": True}}))
        page.reload()
        expect(panel).to_contain_text("On 40 rated queries, each held out once (4-fold): nDCG@10 0.610 → 0.680 "
                                      "(paired gain 0.070 ± 0.021), Recall@5 0.720 → 0.810")
        with urllib.request.urlopen(urllib.request.Request(
                live["base"] + "/api/knowledge/query", data=json.dumps({"query": RESET, "k": 3}).encode(),
                headers={"Content-Type": "application/json"}), timeout=30) as response:
            assert json.loads(response.read())["params"]["query_adapter"] is True
    finally:
        reset_adapter(index_dir)
    page.reload()
    expect(page.locator("#ranking-defaults")).to_contain_text("Server ranking defaults")
    expect(page.locator("#adapter-panel")).to_be_hidden()


def test_server_text_is_never_rendered_as_html(page):
    evil = '<img src=x onerror="window.__pwned=1">'
    payload = {
        "retrieval_request_id": "r1", "query": "reset", "coverage": "high", "message": None, "snapshot_version": 1,
        "reranker_status": "fallback: timed out", "latency_ms": {"total": 5.0, "embed": 1.0},
        "answer": {"text": f"Reset it {evil} [1].", "citations": [1], "method": "extractive"},
        "results": [{"n": 1, "chunk_id": "c1", "doc_id": "d1", "version": 1, "title": f"Manual {evil}",
                     "section": "Reset", "pages": [4, 5], "url": "javascript:alert(1)", "source_url": "javascript:alert(1)",
                     "snippet": f"To reset {evil} hold the button", "score": 0.9, "bm25_score": 3.2, "vector_score": 0.7,
                     "relevance": 0.8, "rerank_score": None}],
    }
    page.route("**/api/knowledge/query", lambda route: route.fulfill(status=200, content_type="application/json",
                                                                      body=json.dumps(payload)))
    search(page, "reset")
    first = first_result(page)
    assert page.locator("main img").count() == 0
    expect(first.locator(".title-text")).to_have_text(f"Manual {evil}")
    expect(first.locator(".snippet mark").first).to_have_text("reset")
    expect(first.locator(".result-where")).to_contain_text("pp. 4\u20135")
    assert first.locator("a.source-link").count() == 0  # a javascript: URL is never linked
    expect(page.locator("#reranker-note")).to_contain_text("fallback: timed out")
    assert page.evaluate("window.__pwned") is None


# ------------------------------------------------------------------ keyboard

def test_keyboard_order_and_alpha_slider(page, live):
    with urllib.request.urlopen(live["base"] + "/api/knowledge/config", timeout=10) as response:
        effective_alpha = json.loads(response.read())["default_alpha"]
    # the slider starts where the server's config puts it, so the keys are pressed after it has arrived
    expect(page.locator("#ranking-defaults")).to_contain_text("Server ranking defaults")
    page.focus("#q")
    order = []
    for _ in range(3):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.id"))
    assert order == ["k", "alpha", "reranker"]

    page.focus("#alpha")
    expect(page.locator("#alpha-value")).to_have_text("server default")
    page.keyboard.press("ArrowRight")
    # the slider starts at the server's effective default alpha (self-tuned or set); one step right is +0.05
    expect(page.locator("#alpha-value")).to_have_text(f"{effective_alpha + 0.05:.2f}")
    for control in ("q", "k", "alpha", "reranker"):
        assert page.locator(f"label[for={control}]").count() == 1, control
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none"), "the focused control has no visible focus outline"


# ------------------------------------------------------------------ sources


def test_sources_page_lists_counts_and_syncs_a_source_with_progress(page):
    page.get_by_role("link", name="Sources", exact=True).click()  # the Sources page of the console's navigation
    row = page.locator("#sources-body tr", has=page.locator("th", has_text="docs"))
    expect(row).to_have_count(1)
    cells = row.locator("td")
    assert cells.nth(0).inner_text() == "folder" and cells.nth(1).inner_text() in ("public", "internal")
    assert int(cells.nth(3).inner_text()) >= 5 and int(cells.nth(4).inner_text()) > int(cells.nth(3).inner_text())
    assert "added" in cells.nth(6).inner_text()  # the last sync summary
    expect(page.locator("#sources-summary")).to_contain_text("sources,")

    row.get_by_role("button", name="Sync docs now").click()
    expect(page.locator("#sources-status")).to_contain_text("Synced docs: 0 added, 0 updated, 0 removed", timeout=60_000)
    expect(row.get_by_role("button", name="Sync docs now")).to_be_enabled()
