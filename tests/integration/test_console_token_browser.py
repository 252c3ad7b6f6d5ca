"""The console against a server that wants its admin token (remote mode), in a real browser (system Chromium via
Playwright): the search page works without the token; an admin page asks for it once, in a dialog; a wrong one
is asked for again; the token lives in sessionStorage and travels as a header, never in a URL; the Sources page
shows and sets a source's visibility."""

from __future__ import annotations

import pytest

from tests.helpers import build_sample_index, console_page, require_browser, served_app

pytestmark = pytest.mark.slow

expect = require_browser("the console token test")

from knowledge_store.ingest.source_actions import update_source_now  # noqa: E402  (after the skips)
from knowledge_store.retrieval.engine import RetrievalEngine  # noqa: E402

TOKEN = "console-admin-token-0123456789abcdef"


@pytest.fixture(scope="module")
def live(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("console_token")
    settings = build_sample_index(root, embedder, allow_remote=True, admin_token=TOKEN, public_rate=0)
    update_source_now(settings, "docs", {"visibility": "public"})  # what the widget and the search page answer from
    engine = RetrievalEngine(settings, embedder=embedder)
    with served_app(settings, engine, name="console-token-uvicorn") as base:
        yield {"base": base, "settings": settings}


def go(page, route: str) -> None:
    page.get_by_role("navigation", name="Console pages").get_by_role("link", name=route, exact=True).click()
    expect(page.locator('.console-nav a[aria-current="page"]')).to_have_text(route)


def test_admin_pages_ask_for_the_token_once_and_never_put_it_in_a_url(page, live):
    requests: list[tuple[str, str | None]] = []
    page.on("request", lambda request: requests.append((request.url, request.headers.get("authorization"))))

    # the search page is public: a question is answered without the token (no dialog)
    page.get_by_label("Question or keywords").fill("how do I reset the Aurora to factory settings")
    page.keyboard.press("Enter")
    expect(page.locator("#results .result").first).to_be_visible(timeout=20_000)
    expect(page.locator("#token-dialog")).not_to_be_visible()

    go(page, "Sources")
    dialog = page.get_by_role("dialog", name="Admin token")
    expect(dialog).to_be_visible()
    dialog.get_by_label("Admin token").fill("not-the-token")
    dialog.get_by_role("button", name="Continue").click()
    expect(dialog).to_be_visible()
    expect(page.locator("#token-text")).to_contain_text("not accepted")
    dialog.get_by_label("Admin token").fill(TOKEN)
    dialog.get_by_role("button", name="Continue").click()
    expect(dialog).not_to_be_visible()
    expect(page.locator("#sources-body tr").first).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('groundwork.adminToken')") == TOKEN

    # asked once: the other admin pages use the stored token
    go(page, "Failures")
    expect(page.locator("#failures-status, #failures-body").first).to_be_attached()
    go(page, "Settings")
    expect(page.locator("#ranking-alpha, [name=alpha]").first).to_be_attached()
    expect(dialog).not_to_be_visible()

    assert all(TOKEN not in url for url, _ in requests), "the token appeared in a URL"
    assert TOKEN not in page.url
    sent = [auth for url, auth in requests if "/api/sources" in url]
    assert sent and sent[-1] == f"Bearer {TOKEN}"


def test_a_source_made_internal_on_the_sources_page_leaves_the_public_search_at_once(page, live):
    page.evaluate(f"sessionStorage.setItem('groundwork.adminToken', '{TOKEN}')")
    go(page, "Sources")
    row = page.locator("#sources-body tr").filter(has_text="docs").first
    expect(row).to_contain_text("public", timeout=20_000)  # the list counts every source's chunks first
    row.get_by_role("button", name="Edit").click()
    page.get_by_label("Visibility").select_option("internal")
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator("#sources-status")).to_contain_text("changed visibility", timeout=20_000)
    expect(page.locator("#sources-body tr").filter(has_text="docs").first).to_contain_text("internal", timeout=20_000)
    try:
        # a reader without the token (the stored one dropped) is no longer answered from it; an admin is
        page.evaluate("sessionStorage.removeItem('groundwork.adminToken')")
        go(page, "Search")
        page.get_by_label("Question or keywords").fill("how do I reset the Aurora to factory settings")
        page.keyboard.press("Enter")
        expect(page.locator("#status")).to_contain_text("No relevant content found", timeout=20_000)
        page.evaluate(f"sessionStorage.setItem('groundwork.adminToken', '{TOKEN}')")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("#results .result").first).to_be_visible(timeout=20_000)
    finally:
        update_source_now(live["settings"], "docs", {"visibility": "public"})


def test_a_token_stored_while_a_refused_request_is_on_its_way_is_kept_and_used(browser, live):
    # the search page asks for the ranking config (an admin route) as it opens, without a token; the token
    # arrives (the dialog of another request, or here the test) before that 401 does: the 401 refused no token,
    # so the stored one stays, the config is fetched again with it, and the admin pages do not ask for it
    held = []
    hold_first = {"**/api/knowledge/config": lambda route: held.append(route) if not held else route.continue_()}
    with console_page(browser, live["base"], routes=hold_first) as page:
        for _ in range(200):
            if held:
                break
            page.wait_for_timeout(50)
        assert held, "the console did not ask for its config"
        page.evaluate(f"sessionStorage.setItem('groundwork.adminToken', '{TOKEN}')")
        with page.expect_response(lambda r: r.url.endswith("/api/knowledge/config") and r.status == 200):
            held[0].continue_()
        assert page.evaluate("sessionStorage.getItem('groundwork.adminToken')") == TOKEN
        go(page, "Sources")
        expect(page.locator("#sources-body tr").filter(has_text="docs").first).to_be_visible(timeout=20_000)
        expect(page.get_by_role("dialog", name="Admin token")).not_to_be_visible()
