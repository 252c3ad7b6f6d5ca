"""The console while the server's embedding model loads, in a real browser (system Chromium via Playwright) against
the real app (uvicorn) whose model load waits until the test lets it finish: the notice says the model is loading,
the search box explains, a search started meanwhile runs by itself once /health has the model ready, and the notice
goes.  A model that failed to load: the notice says why."""

from __future__ import annotations

import pytest

from tests.helpers import CorruptModel, GatedModel, console_page, require_browser, served_app

pytestmark = pytest.mark.slow

expect = require_browser("the console's model-loading test")

from knowledge_store.retrieval.engine import RetrievalEngine  # noqa: E402
from knowledge_store.storage.query_log import QueryLog  # noqa: E402  (after the skips: without a browser nothing loads)

RESET = "how do I reset the Aurora to factory settings"


def test_the_console_says_the_model_is_loading_and_runs_the_search_once_it_is_ready(browser, shared_sample_index,
                                                                                      embedder, tmp_path):
    model = GatedModel(embedder)
    try:
        engine = RetrievalEngine(shared_sample_index, embedder=model, query_log=QueryLog(tmp_path / "log.duckdb"))
        # served_app waits for /health 200: degraded while the model loads
        with served_app(shared_sample_index, engine, name="model-loading-uvicorn") as base, \
                console_page(browser, base) as page:
            notice = page.locator("#model-notice")
            expect(notice).to_contain_text("Model loading \u2014 answers available in about")
            expect(notice).to_have_attribute("aria-live", "polite")
            expect(page.locator("#query-hint")).to_contain_text("still loading")
            page.fill("#q", RESET)
            page.press("#q", "Enter")
            expect(page.locator("#status")).to_contain_text("your search will run as soon as it is ready")
            expect(page.locator("#error-panel")).to_be_hidden()  # not a failure: the server is up
            assert page.locator("#results > li").count() == 0
            model.release.set()
            # the waiting search ran: /health is polled every 2 s while it waits, then the search itself (a slow CI)
            expect(page.locator("#results > li").first).to_be_visible(timeout=20_000)
            expect(notice).to_have_text("The model is ready.", timeout=10_000)
            expect(page.locator("#query-hint")).to_have_text("Press Enter to search.")
            expect(notice).to_be_hidden(timeout=10_000)
    finally:
        model.release.set()


def test_the_console_says_why_the_model_could_not_load(browser, shared_sample_index, embedder, tmp_path):
    engine = RetrievalEngine(shared_sample_index, embedder=CorruptModel(embedder),
                             query_log=QueryLog(tmp_path / "log.duckdb"))
    with served_app(shared_sample_index, engine, name="failed-model-uvicorn", until_healthy=False) as base, \
            console_page(browser, base) as page:
        notice = page.locator("#model-notice")
        expect(notice).to_contain_text("The model could not be loaded")
        expect(notice).to_contain_text("model weights are corrupt")
        expect(page.locator("#query-hint")).to_contain_text("refused")
        page.fill("#q", RESET)
        page.press("#q", "Enter")
        expect(page.locator("#error-title")).to_have_text("The model could not be loaded")
        expect(page.locator("#error-message")).to_contain_text("model weights are corrupt")
