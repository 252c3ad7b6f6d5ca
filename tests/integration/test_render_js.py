"""Web pages whose content is built by JavaScript: with a source's render_js off such a page
is a needs_js_rendering failure row (not an empty document); with it on, the page is rendered in the system
Chromium and its text is indexed, searched and cited by the page URL."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from knowledge_store.cli import main
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import InvalidSourceError
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.source_actions import update_source_now
from knowledge_store.ingest.sources import add_source, check_renderer, get_source
from knowledge_store.ingest.web import CrawlConfig, crawl
from knowledge_store.ingest.web_sources import crawl_config_for
from knowledge_store.storage.store import store_connection
from tests.doc_site import DocSite, Reply, doc_page

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"the system Chromium is not at {CHROMIUM} "
                                    "(apt-get install chromium); rendering is never done with a downloaded browser")

SHELL = """<!doctype html><html><head><title>Pump manual</title></head>
<body><noscript>You need to enable JavaScript to run this app.</noscript><div id="root">Loading...</div>
<script src="/static/app.js"></script></body></html>"""
# the page's content arrives in a second request the script makes, as on a real single-page app
APP_JS = """fetch('/api/content.json').then(function (r) { return r.json(); }).then(function (doc) {
  var root = document.getElementById('root'); root.textContent = '';
  var h = document.createElement('h1'); h.id = 'impeller'; h.textContent = doc.title; root.appendChild(h);
  doc.paragraphs.forEach(function (text) { var p = document.createElement('p'); p.textContent = text; root.appendChild(p); });
});"""
CONTENT = {"title": "Replacing the impeller", "paragraphs": [
    "The zirconium impeller of the centrifugal pump wears after about four thousand hours of service.",
    "Close both isolation valves, drain the casing and remove the seven flange bolts before lifting the cover.",
    "Fit the new impeller with the keyway aligned and torque the retaining nut to ninety newton metres.",
]}


def spa_site() -> DocSite:
    site = DocSite()
    site.routes["/robots.txt"] = Reply(body="User-agent: *\nAllow: /\n", content_type="text/plain")
    site.routes["/docs/"] = Reply(body=doc_page("Docs", [("intro", "Introduction", "The static index page of the "
                                                          "pump documentation, served as plain HTML with a "
                                                          "link to the manual page that scripts build.")],
                                                ["manual"]))
    site.routes["/docs/manual"] = Reply(body=SHELL)
    site.routes["/static/app.js"] = Reply(body=APP_JS, content_type="application/javascript")
    site.routes["/api/content.json"] = Reply(body=json.dumps(CONTENT), content_type="application/json")
    return site


def rows(settings: Settings, sql: str, params=None):
    with store_connection(settings.store_path, read_only=True) as conn:
        return conn.execute(sql, params or []).fetchall()


def make_settings(tmp_path: Path, **overrides) -> Settings:
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "local.md").write_text("# Local\n\n" + "A local note about the garden hose and its fittings. " * 8)
    return Settings(data_dir=tmp_path / "data", sources=[base], web_backoff_base_s=0.05, web_progress_interval_s=0.0,
                    **overrides)


def test_script_built_page_is_a_failure_row_without_render_js(tmp_path, embedder):
    settings = make_settings(tmp_path)
    with spa_site() as site:
        with store_connection(settings.store_path) as conn:
            source = add_source(conn, "spa", "web", site.url("/docs/"), {"requests_per_second": 500.0})
        assert source.config["render_js"] is False  # off by default
        report = run_sync(settings, embedder, names=["spa"])
        manual = site.url("/docs/manual")
        failures = rows(settings, "SELECT path, stage, kind, reason FROM ingestion_failures WHERE resolved_at IS NULL")
        assert [(path, stage, kind) for path, stage, kind, _ in failures] == [(manual, "parse", "needs_js_rendering")]
        assert "Enable render_js for source 'spa'" in failures[0][3] and "--render-js" in failures[0][3]
        assert report.parse.failed == 1
        # no document is indexed for the page: the index page only
        active = rows(settings, "SELECT url FROM documents WHERE status = 'active' AND url LIKE 'http%'")
        assert active == [(site.url("/docs/"),)]
        assert rows(settings, "SELECT count(*) FROM documents WHERE url = ? AND status = 'active'", [manual])[0][0] == 0
        assert not site.requested("/static/app.js")  # nothing ran the page's scripts


def test_check_turns_off_with_zero_words(tmp_path, embedder):
    settings = make_settings(tmp_path, web_js_min_words=0)
    with spa_site() as site:
        with store_connection(settings.store_path) as conn:
            add_source(conn, "spa", "web", site.url("/docs/"), {"requests_per_second": 500.0})
        run_sync(settings, embedder, names=["spa"])
        assert rows(settings, "SELECT count(*) FROM ingestion_failures WHERE kind = 'needs_js_rendering'")[0][0] == 0
        # the shell ("Loading...") is indexed as it was served: what the check exists to prevent
        assert rows(settings, "SELECT count(*) FROM documents WHERE url = ? AND status = 'active'",
                    [site.url("/docs/manual")])[0][0] == 1


@needs_chromium
def test_render_js_indexes_the_rendered_text_and_cites_the_page(tmp_path, embedder, monkeypatch, capsys):
    settings = make_settings(tmp_path)
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("GROUNDWORK_SOURCES", str(tmp_path / "base"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with spa_site() as site:
        # first without the option: the failure row; then the option turned on, as a user would after reading it
        assert main(["sources", "add", "spa", "--url", site.url("/docs/"), "--requests-per-second", "500"]) == 0
        run_sync(settings, embedder, names=["spa"])
        manual = site.url("/docs/manual")
        assert rows(settings, "SELECT kind FROM ingestion_failures WHERE path = ? AND resolved_at IS NULL",
                    [manual]) == [("needs_js_rendering",)]
        capsys.readouterr()
        assert main(["sources", "update", "spa", "--render-js"]) == 0
        assert "re-sync needed" in capsys.readouterr().out
        with store_connection(settings.store_path, read_only=True) as conn:
            assert get_source(conn, "spa").config["render_js"] is True
        started = time.perf_counter()
        report = run_sync(settings, embedder, names=["spa"])
        seconds = time.perf_counter() - started
        crawl_stats = report.raw.crawls["spa"]
        assert crawl_stats["rendered"] == 2 and crawl_stats["render_timeouts"] == 0  # both HTML pages
        assert site.requested("/static/app.js") and site.requested("/api/content.json")
        # the manual page is fetched once by the crawler, not again by the browser
        assert site.count("/docs/manual") == 2  # once per sync
        print(f"render: {crawl_stats['render_seconds_per_page']} s/page, browser start "
              f"{crawl_stats['browser_launch_seconds']} s, whole sync {seconds:.1f} s")

        assert rows(settings, "SELECT count(*) FROM ingestion_failures WHERE resolved_at IS NULL")[0][0] == 0
        assert rows(settings, "SELECT count(*) FROM documents WHERE status = 'active' AND url LIKE 'http%'")[0][0] == 2
        text = rows(settings, "SELECT string_agg(b.text, ' ') FROM blocks b JOIN documents d USING (doc_id, version) "
                              "WHERE d.url = ? AND d.status = 'active'", [manual])[0][0]
        assert "torque the retaining nut to ninety newton metres" in text and "Loading" not in text

        from knowledge_store.retrieval.engine import RetrievalEngine

        engine = RetrievalEngine(settings, embedder=embedder)
        hit = engine.search("impeller retaining nut torque", k=3, answer="none", min_relevance=0.0).results[0]
        assert hit.url == manual + "#impeller"


@needs_chromium
def test_a_render_that_hangs_is_cut_at_the_time_limit(tmp_path):
    # the script builds the content, then never returns: the DOM as it stands at the limit is kept
    page = ("<html><body><div id='root'></div><script>document.getElementById('root').textContent = "
            "'Inserted by the script before it hung.'; while (true) {}</script></body></html>")
    site = DocSite()
    site.routes["/robots.txt"] = Reply(body="", content_type="text/plain")
    site.routes["/hang"] = Reply(body=page)
    with site:
        config = CrawlConfig(base_url=site.url("/hang"), depth=0, use_llms_txt=False, use_sitemap=False,
                             requests_per_second=500.0, render_js=True, render_timeout_s=2.0, render_wait="load")
        started = time.perf_counter()
        result = crawl(config)
        seconds = time.perf_counter() - started
    assert seconds < 15
    assert result.stats["render_timeouts"] == 1 and result.stats["rendered"] == 1
    (fetched,) = result.pages
    assert b"<div id=\"root\">Inserted by the script before it hung.</div>" in fetched.body


def test_missing_chromium_is_a_clear_error(tmp_path, embedder):
    settings = make_settings(tmp_path, chromium_path=tmp_path / "no-chromium")
    with pytest.raises(InvalidSourceError) as error:
        check_renderer(settings, {"render_js": True})
    assert "GROUNDWORK_CHROMIUM_PATH" in str(error.value) and "no-chromium" in str(error.value)
    with spa_site() as site:
        with store_connection(settings.store_path) as conn:
            add_source(conn, "spa", "web", site.url("/docs/"), {"requests_per_second": 500.0})
        with pytest.raises(InvalidSourceError, match="GROUNDWORK_CHROMIUM_PATH"):
            update_source_now(settings, "spa", {"render_js": True})
        # set anyway (e.g. Chromium removed later): the crawl stops as incomplete, deletes nothing, says why
        with store_connection(settings.store_path) as conn:
            conn.execute("UPDATE sources SET config = json_merge_patch(config, '{\"render_js\": true}')")
        run_sync(settings, embedder, names=["spa"])
        failures = rows(settings, "SELECT kind, reason FROM ingestion_failures WHERE resolved_at IS NULL")
        assert len(failures) == 1 and failures[0][0] == "source_unreachable"
        assert "render_js" in failures[0][1] and "GROUNDWORK_CHROMIUM_PATH" in failures[0][1]
        assert not site.requested("/docs/")


def test_sources_stored_before_the_option_read_it_as_off(tmp_path):
    settings = make_settings(tmp_path)
    with store_connection(settings.store_path) as conn:
        add_source(conn, "old", "web", "http://127.0.0.1:9/docs/", {})
        # a row written before render_js existed: its stored options lack the key
        conn.execute("UPDATE sources SET config = json_object('depth', 3) WHERE name = 'old'")
        source = get_source(conn, "old")
    assert "render_js" not in source.config
    config = crawl_config_for(source, settings)
    assert config.render_js is False and config.depth == 3
