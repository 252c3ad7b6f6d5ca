"""The docs-site chat widget in a real browser (system Chromium via Playwright), embedded by one
``<script src=".../widget.js">`` tag in a documentation site served from *another* loopback port.

The site is real: a small "Nimbus" docs site (tests/doc_site.py) is crawled into the index as a web
source next to the sample corpus, and the same pages carry the widget's script tag.  The app serves
that index on its own port with ``GROUNDWORK_CORS_ORIGINS`` = the site's origin.  Covered:

- allowed origin: ask -> answer with cited sources (PDF pages ``#page=N`` from the API, site pages
  ``#anchor``); a same-page source scrolls there; select text -> "Ask about this selection" ->
  ``/api/ask-local`` scoped to the page's own document (derived from the page URL);
- keyboard: Tab reaches the button, Enter opens the labelled dialog, Escape closes it, focus returns;
- loading state, friendly errors with Retry (server down, HTTP 503), server text never as HTML;
- the host page's hostile CSS cannot hide or restyle the widget, and the widget adds no styles to it;
- mobile width (375 px): the panel takes the whole width;
- refused origin (the same page from a host name not in the allow-list): the browser's real CORS
  preflight is refused with 403, the widget says so kindly, the console says what to configure, and
  the API answered nothing.

Screenshots: test-artifacts/widget-*.png.  Request interception (``page.route``) is used only in
the error tests: while it is on, Playwright answers CORS preflights itself.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import CHROMIUM_ARGS as BROWSER_ARGS
from tests.helpers import (
    REPO_ROOT,
    TIMEOUT_MS,
    build_sample_index,
    chromium,
    free_port,
    require_browser,
    served_app,
)

pytestmark = pytest.mark.slow

expect = require_browser("the widget test")

from knowledge_store.ingest.run import run_sync  # noqa: E402  (after the skips: without a browser nothing loads)
from knowledge_store.ingest.sources import add_source  # noqa: E402
from knowledge_store.retrieval.engine import RetrievalEngine  # noqa: E402
from knowledge_store.storage.query_log import QueryLog  # noqa: E402
from knowledge_store.storage.store import store_connection  # noqa: E402
from tests.doc_site import DocSite, Reply, doc_page  # noqa: E402

ARTIFACTS = REPO_ROOT / "test-artifacts"
REFUSED_HOST = "docs.refused.test"  # resolved to 127.0.0.1 by Chromium only: a foreign origin on loopback
CHROMIUM_ARGS = [*BROWSER_ARGS, f"--host-resolver-rules=MAP {REFUSED_HOST} 127.0.0.1"]
TITLE = "Ask the Nimbus docs"

RESET = "how do I reset the Aurora to factory settings"
RETENTION = "how many weekly snapshots does Nimbus keep"
RESTORE_PARAGRAPH = ("To restore a snapshot, open the Vault tab, choose the snapshot by its date and press Restore; "
                     "the volume is rolled back in place while its previous state is kept as a safety copy for "
                     "seven days.")
BACKUPS = [
    ("schedule", "Backup schedule",
     "Nimbus takes an incremental snapshot of every volume each night at 02:00 and keeps fourteen daily snapshots, "
     "eight weekly snapshots and twelve monthly snapshots before pruning the oldest ones automatically."),
    ("restore", "Restoring a snapshot", RESTORE_PARAGRAPH),
    ("encryption", "Snapshot encryption",
     "Every snapshot is encrypted with AES-256 before it leaves the appliance, using a key derived from the vault "
     "passphrase, which never leaves the device."),
]
NETWORK = [
    ("ports", "Required ports",
     "The Nimbus appliance reaches the vault over TCP port 7443 and needs outbound DNS; a restore of a snapshot "
     "copies data over the same port, so keep it open while a restore runs."),
    ("proxy", "Using a proxy",
     "Set the proxy address on the Network tab; snapshot uploads and restores then go through it, and the safety "
     "copy is written locally either way."),
]
# a host page that tries to restyle or hide everything, including the widget by its element and class names
HOSTILE_CSS = """<style>
  html { font-size: 19px; }
  * { font-family: Georgia, serif !important; color: #7f1d1d !important; line-height: 2.2 !important; }
  button, section, .launcher, .panel, groundwork-chat-widget { display: none !important; }
  groundwork-chat-widget { transform: scale(0.1) !important; opacity: 0 !important; }
</style>"""


def _with_widget(page_html: str, api: str, **options: str) -> str:
    attributes = "".join(f' data-{name}="{value}"' for name, value in options.items())
    tag = f'<script src="{api}/widget.js" async{attributes}></script>'
    return page_html.replace("<html>", '<html lang="en">').replace("</head>", HOSTILE_CSS + "</head>").replace(
        "</body>", tag + "</body>")


@pytest.fixture(scope="module")
def live(tmp_path_factory, embedder):
    """The sample corpus plus the crawled Nimbus site in one index, served by the real app; the site keeps
    serving its pages (now with the widget) on its own port."""
    root = tmp_path_factory.mktemp("widget")
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    site = DocSite()
    site.routes["/docs/"] = Reply(body=_with_widget(doc_page(
        "Nimbus documentation", [("start", "Start here", "Nimbus backs up the volumes of your appliance to the vault. "
                                                         "These pages explain how backups and restores work and how "
                                                         "to set up the network the appliance uses.")],
        links=["/docs/backups", "/docs/network"]), api, title=TITLE))
    site.routes["/docs/backups"] = Reply(body=_with_widget(doc_page("Backups and restores", BACKUPS,
                                                                    links=["/docs/network"]), api, title=TITLE))
    site.routes["/docs/network"] = Reply(body=_with_widget(doc_page("Network settings", NETWORK,
                                                                    links=["/docs/backups"]), api, title=TITLE))
    site.start()
    settings = build_sample_index(root, embedder, query_torch_threads=2, cors_origins=[site.origin])
    with store_connection(settings.store_path) as conn:
        add_source(conn, "nimbus", "web", site.url("/docs/"), {"depth": 1, "requests_per_second": 500.0})
    report = run_sync(settings, embedder, names=["nimbus"])
    assert report.summary.startswith("3 added"), report.summary

    query_log = QueryLog(root / "logs.duckdb")
    engine = RetrievalEngine(settings, embedder=embedder, query_log=query_log)
    with served_app(settings, engine, port=api_port, name="widget-uvicorn"):
        yield {"api": api, "site": site, "query_log": query_log, "page": site.url("/docs/backups"),
               "refused_origin": f"http://{REFUSED_HOST}:{site.origin.rsplit(':', 1)[1]}"}
    site.stop()
    query_log.close()


@pytest.fixture(scope="module")
def browser():
    with chromium(CHROMIUM_ARGS) as browser:
        yield browser


class Visit:
    """One browser tab on a docs page: what it logged, which requests it made, and the widget's parts."""

    def __init__(self, browser, live, url: str, viewport=(1200, 860)) -> None:
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.console: list[str] = []
        self.errors: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.failed: list[tuple[str, str]] = []
        self.page.on("console", lambda message: self.console.append(f"{message.type}: {message.text}"))
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("request", lambda request: self.requests.append((request.method, request.url)))
        self.page.on("requestfailed", lambda request: self.failed.append((request.method, request.url)))
        self.page.goto(url)
        self.launcher = self.page.locator("groundwork-chat-widget .launcher")
        self.panel = self.page.get_by_role("dialog", name=TITLE)
        self.input = self.page.get_by_label("Your question")
        expect(self.launcher).to_be_visible()

    def ask(self, question: str) -> None:
        if not self.panel.is_visible():
            self.launcher.click()
        self.input.fill(question)
        self.input.press("Enter")

    def last_answer(self):
        answer = self.page.locator("groundwork-chat-widget .answer").last
        expect(answer).to_be_visible()
        return answer

    def close(self, allowed_hosts: tuple[str, ...]) -> None:
        self.context.close()
        outside = [url for _, url in self.requests if not url.startswith(allowed_hosts)]
        assert not outside, f"the page or widget loaded something from elsewhere: {outside}"
        assert not self.errors, f"JavaScript errors: {self.errors}"


@pytest.fixture()
def visit(browser, live):
    opened: list[Visit] = []

    def open_page(url: str | None = None, **kwargs) -> Visit:
        opened.append(Visit(browser, live, url or live["page"], **kwargs))
        return opened[-1]

    yield open_page
    for each in opened:
        each.close((live["api"], live["site"].origin, live["refused_origin"]))


def _shadow_focus(page) -> str:
    """The class of the element focused inside the widget ('' when focus is on the host page)."""
    return page.evaluate("""() => {
        const host = document.querySelector('groundwork-chat-widget');
        const inner = host && host.shadowRoot.activeElement;
        return document.activeElement === host && inner ? (inner.className || inner.id || inner.tagName) : '';
    }""")


# ------------------------------------------------------------------ allowed origin

def test_an_allowed_site_asks_and_gets_cited_sources_with_page_links(visit, live):
    tab = visit()
    page = tab.page
    expect(tab.launcher).to_have_attribute("aria-expanded", "false")
    expect(tab.panel).to_be_hidden()
    tab.ask(RESET)
    expect(tab.launcher).to_have_attribute("aria-expanded", "true")
    answer = tab.last_answer()
    expect(answer.locator(".sources li")).not_to_have_count(0)
    links = answer.locator(".sources a")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    manual = [h for h in hrefs if h.startswith(live["api"] + "/api/knowledge/sources/")]
    assert manual and any(h.endswith("#page=4") for h in manual), hrefs  # the PDF opens at its page
    first_pdf = answer.locator('.sources a[href$="#page=4"]').first
    assert first_pdf.get_attribute("target") == "_blank" and "noopener" in first_pdf.get_attribute("rel")
    expect(answer.locator(".sources")).to_contain_text("p. 4")
    assert answer.locator("a.cite").count() >= 1  # the answer's [n] markers link to their sources
    expect(answer).not_to_contain_text("No document mentions")
    record = live["query_log"].list(client="api-ask", limit=5)[0]
    assert record.query == RESET

    # a question about something no document mentions says which words
    tab.ask("can I run the Aurora on solar power")
    expect(tab.last_answer()).to_contain_text("No document mentions \u201csolar\u201d.")

    # a question about the docs site itself: its page with the section's anchor, in this tab
    tab.ask(RETENTION)
    answer = tab.last_answer()
    site_link = answer.locator(f'.sources a[href^="{live["page"]}#"]').first
    expect(site_link).to_be_visible()
    href = site_link.get_attribute("href")
    assert site_link.get_attribute("target") is None, "a page of this site opens in the same tab"
    expect(answer).to_contain_text("eight weekly")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "widget-answer.png"))

    # the source is this very page: clicking scrolls to the anchor instead of reloading
    page.evaluate("window.__notReloaded = true")
    site_link.click()
    page.wait_for_function("anchor => location.hash === anchor", arg="#" + href.split("#", 1)[1])
    assert page.evaluate("window.__notReloaded") is True


def test_ask_about_this_selection_is_scoped_to_the_page_s_own_document(visit, live):
    # the reader arrived by a tracked link to a section: the page's document is still found by its URL
    tab = visit(live["page"] + "?utm_source=widget-test#restore")
    page = tab.page
    paragraph = page.locator("main p", has_text="To restore a snapshot")
    paragraph.click(click_count=3)  # select the paragraph
    button = page.get_by_role("button", name="Ask about this selection")
    expect(button).to_be_visible()
    button_box, paragraph_box = button.bounding_box(), paragraph.bounding_box()
    assert abs(button_box["y"] - (paragraph_box["y"] + paragraph_box["height"])) < 80, "offered next to the selection"
    button.click()
    expect(tab.panel).to_be_visible()
    expect(page.locator("groundwork-chat-widget .context")).to_contain_text("To restore a snapshot")
    expect(tab.input).to_be_focused()
    tab.input.fill("how long is the safety copy kept")
    tab.input.press("Enter")
    answer = tab.last_answer()
    expect(answer).to_contain_text("seven days")
    hrefs = answer.locator(".sources a").evaluate_all("links => links.map(a => a.href)")
    assert hrefs and all(h.startswith(live["page"] + "#") for h in hrefs), hrefs  # only this page, at anchors

    record = live["query_log"].list(client="api-ask-local", limit=1)[0]
    assert record.query.startswith("how long is the safety copy kept")
    sent = record.params["filters"]["paths"]
    assert live["page"] + "?utm_source=widget-test" in sent and live["page"] in sent, sent
    expect(page.locator("groundwork-chat-widget .question").last).to_contain_text("About:")
    page.screenshot(path=str(ARTIFACTS / "widget-selection.png"))

    # too short a selection: the reader is asked for more instead of a question being sent
    asked = len(live["query_log"].list(client="api-ask-local", limit=100))
    page.locator("h2#encryption").click(click_count=3)
    page.get_by_role("button", name="Ask about this selection").click()
    expect(page.locator("groundwork-chat-widget .notice").last).to_contain_text("Please select more text")
    assert len(live["query_log"].list(client="api-ask-local", limit=100)) == asked


def test_keyboard_opens_the_labelled_dialog_and_escape_returns_focus(visit):
    tab = visit()
    page = tab.page
    for _ in range(12):  # the page's links, then the widget's button (it comes last on the page)
        page.keyboard.press("Tab")
        if _shadow_focus(page) == "launcher":
            break
    assert _shadow_focus(page) == "launcher", "Tab never reached the Ask button"
    expect(tab.launcher).to_have_accessible_name("Ask")
    outline = page.evaluate("getComputedStyle(document.querySelector('groundwork-chat-widget')"
                            ".shadowRoot.activeElement).outlineStyle")
    assert outline not in ("", "none"), "the focused button has no visible focus outline"

    page.keyboard.press("Enter")
    expect(tab.panel).to_be_visible()
    expect(tab.panel).to_have_attribute("aria-labelledby", "gw-title")
    expect(tab.input).to_be_focused()
    expect(page.get_by_role("button", name="Close")).to_be_visible()
    expect(page.get_by_role("log", name="Questions and answers")).to_be_visible()

    page.keyboard.type(RETENTION)
    # the log is busy while the answer is on its way; a fast answer can end that before any check looks, so
    # an observer records every change of aria-busy (its old value says the log had been busy)
    page.get_by_role("log", name="Questions and answers").evaluate(
        "el => { window.__busySeen = false; new MutationObserver(records => records.forEach(r => {"
        " if (r.oldValue === 'true' || r.target.getAttribute('aria-busy') === 'true') window.__busySeen = true; }))"
        ".observe(el, {attributes: true, attributeFilter: ['aria-busy'], attributeOldValue: true}); }")
    page.keyboard.press("Enter")
    tab.last_answer()
    expect(page.get_by_role("log", name="Questions and answers")).to_have_attribute("aria-busy", "false")
    assert page.evaluate("window.__busySeen"), "the log never said it was busy while the answer was on its way"
    expect(page.get_by_role("status")).to_contain_text("Answer ready")

    page.keyboard.press("Escape")
    expect(tab.panel).to_be_hidden()
    expect(tab.launcher).to_have_attribute("aria-expanded", "false")
    assert _shadow_focus(page) == "launcher", "focus did not return to the Ask button"

    # Close button by keyboard too
    page.keyboard.press("Enter")
    expect(tab.input).to_be_focused()
    for _ in range(30):  # back from the question field, past the answer's links, to the Close button
        page.keyboard.press("Shift+Tab")
        if _shadow_focus(page) == "close":
            break
    assert _shadow_focus(page) == "close"
    page.keyboard.press("Enter")
    expect(tab.panel).to_be_hidden()
    assert _shadow_focus(page) == "launcher"


def test_the_host_page_css_cannot_hide_or_restyle_the_widget_and_the_widget_adds_none(visit):
    tab = visit()
    page = tab.page
    styles = page.evaluate("document.querySelectorAll('style, link[rel=stylesheet]').length")
    assert styles == 1  # only the page's own hostile <style>
    launcher_style = tab.launcher.evaluate("b => { const s = getComputedStyle(b); "
                                           "return [s.display, s.fontSize, s.fontFamily, s.lineHeight]; }")
    assert launcher_style[0] == "flex" and launcher_style[1] == "15px", launcher_style  # fixed: blockified
    assert "Georgia" not in launcher_style[2] and launcher_style[3] != "2.2", launcher_style
    host_style = page.evaluate("(() => { const s = getComputedStyle(document.querySelector('groundwork-chat-widget'));"
                               " return [s.display, s.opacity, s.transform]; })()")
    assert host_style == ["inline", "1", "none"], host_style
    tab.launcher.click()
    expect(tab.panel).to_be_visible()
    assert page.locator("groundwork-chat-widget .panel").evaluate("p => getComputedStyle(p).display") == "flex"
    # the page's own text keeps the page's styles
    assert "Georgia" in page.locator("main h1").evaluate("h => getComputedStyle(h).fontFamily")
    assert page.evaluate("document.querySelectorAll('style, link[rel=stylesheet]').length") == 1


def test_on_a_phone_the_panel_takes_the_whole_width(visit):
    tab = visit(viewport=(375, 740))
    page = tab.page
    box = tab.launcher.bounding_box()
    assert box["x"] + box["width"] <= 375 and box["y"] + box["height"] <= 740
    tab.ask(RETENTION)
    tab.last_answer()
    panel = page.locator("groundwork-chat-widget .panel").bounding_box()
    assert panel["x"] == 0 and panel["width"] == 375, panel
    assert panel["height"] == 740, panel
    assert page.evaluate("document.documentElement.scrollWidth") <= 375, "the widget made the page scroll sideways"
    page.screenshot(path=str(ARTIFACTS / "widget-mobile.png"))
    page.keyboard.press("Escape")
    expect(tab.panel).to_be_hidden()


# ------------------------------------------------------------------ failures

def test_server_down_then_503_show_a_friendly_error_with_retry(visit, live):
    tab = visit()
    page = tab.page
    down = {"on": True}
    page.route(live["api"] + "/**", lambda route: route.abort("connectionrefused") if down["on"] else route.continue_())
    tab.ask(RETENTION)
    error = page.locator("groundwork-chat-widget .error")
    expect(error).to_be_visible()
    expect(error).to_have_attribute("role", "alert")
    expect(error.locator(".error-title")).to_have_text("Can\u2019t reach the assistant")
    expect(page.locator("groundwork-chat-widget .answer")).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "widget-error.png"))

    down["on"] = False
    error.get_by_role("button", name="Retry").click()
    expect(tab.last_answer()).to_contain_text("eight weekly")
    expect(page.locator("groundwork-chat-widget .error")).to_have_count(0)

    # an HTTP 503 with the API's {error, message}: the server's message, kindly, with Retry
    page.unroute(live["api"] + "/**")
    page.route(live["api"] + "/api/ask", lambda route: route.fulfill(
        status=503, content_type="application/json",
        body=json.dumps({"error": "index_not_built", "message": "no index yet: run groundwork sync"})))
    tab.ask(RETENTION)
    expect(error.locator(".error-title")).to_contain_text("HTTP 503")
    expect(error.locator(".error-detail")).to_contain_text("no index yet: run groundwork sync")
    page.unroute(live["api"] + "/api/ask")
    error.get_by_role("button", name="Retry").click()
    expect(page.locator("groundwork-chat-widget .answer")).to_have_count(2)
    expect(page.locator("groundwork-chat-widget .error")).to_have_count(0)


def test_server_text_is_never_rendered_as_html(visit, live):
    tab = visit()
    page = tab.page
    evil = '<img src=x onerror="window.__pwned=1">'
    payload = {"answer": f"Keep it {evil} [1] and [2].", "sources": [
        {"n": 1, "file": "x.md", "title": f"Manual {evil}", "section": f"Reset {evil}", "url": "javascript:alert(1)",
         "pages": [4, 5]},
        {"n": 2, "file": "y.md", "title": "Good", "section": "", "url": live["page"] + "#schedule", "pages": []}]}
    page.route(live["api"] + "/api/ask", lambda route: route.fulfill(status=200, content_type="application/json",
                                                                     body=json.dumps(payload)))
    tab.ask("anything")
    answer = tab.last_answer()
    expect(answer.locator("p").first).to_have_text(f"Keep it {evil} [1] and [2].")
    assert page.locator("groundwork-chat-widget img").count() == 0
    expect(answer.locator(".sources li").first).to_contain_text(f"Manual {evil}")
    expect(answer.locator(".sources li").first).to_contain_text("pp. 4\u20135")
    assert answer.locator('a[href^="javascript"]').count() == 0  # never linked
    assert answer.locator("a.cite").count() == 1  # [2] only
    assert page.evaluate("window.__pwned") is None


# ------------------------------------------------------------------ refused origin

def test_a_site_not_in_the_allow_list_gets_a_friendly_refusal_and_no_answer(visit, live):
    question = "how many daily snapshots are kept on the refused site"
    tab = visit(live["refused_origin"] + "/docs/backups")
    page = tab.page
    tab.ask(question)
    error = page.locator("groundwork-chat-widget .error")
    expect(error.locator(".error-title")).to_have_text("This site isn\u2019t connected to the assistant")
    expect(error.locator(".error-detail")).to_contain_text(live["refused_origin"])
    expect(error.get_by_role("button", name="Retry")).to_be_visible()
    expect(page.locator("groundwork-chat-widget .answer")).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "widget-refused.png"))

    # the browser's real preflight was refused (403), so the question itself was never sent
    assert ("POST", live["api"] + "/api/ask") in tab.failed
    assert all(record.query != question for record in live["query_log"].list(limit=200))
    said = "\n".join(tab.console)
    assert "GROUNDWORK_CORS_ORIGINS=" + live["refused_origin"] in said, said
    assert "CORS policy" in said, said  # Chromium's own explanation is in the console too
