"""Web sources end to end: a loopback documentation site crawled into the versioned store,
re-synced after it changes, retried, and served with page-url#anchor citations."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from knowledge_store.cli import main
from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.source_actions import retry_failure
from knowledge_store.ingest.sources import add_source
from knowledge_store.storage.index import read_pointer
from knowledge_store.storage.store import store_connection
from tests.doc_site import Reply, default_site, doc_page
from tests.helpers import MARKDOWN_FILLER

pytestmark = pytest.mark.slow

FAST = {"requests_per_second": 500.0}  # politeness is tested in test_web_crawl; keep these quick


def make_settings(tmp_path: Path) -> Settings:
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "local.md").write_text("# Local\n\nA local note about the garden hose.\n" + MARKDOWN_FILLER)
    return Settings(data_dir=tmp_path / "data", sources=[base], web_backoff_base_s=0.05, web_progress_interval_s=0.0)


def rows(settings: Settings, sql: str, params=None):
    with store_connection(settings.store_path, read_only=True) as conn:
        return conn.execute(sql, params or []).fetchall()


def web_docs(settings: Settings, status: str = "active") -> dict[str, int]:
    """path part of each web document's URL -> version."""
    found = rows(settings, "SELECT url, version FROM documents WHERE url LIKE 'http%' AND status = ?", [status])
    return {url.split("//", 1)[1].split("/", 1)[1]: version for url, version in found}


def assert_index_consistent(settings: Settings) -> None:
    """No duplicate versions, and the published snapshot holds exactly the active chunks."""
    assert rows(settings, "SELECT count(*) FROM (SELECT doc_id FROM documents WHERE status = 'active' "
                          "GROUP BY doc_id HAVING count(*) > 1)")[0][0] == 0
    active_chunks = rows(settings, "SELECT count(*) FROM chunks c JOIN documents d USING (doc_id, version) "
                                   "WHERE d.status = 'active'")[0][0]
    assert read_pointer(settings.index_dir).chunk_count == active_chunks


def open_failures(settings: Settings) -> dict[str, tuple[str, str]]:
    return {path: (stage, kind) for path, stage, kind in rows(
        settings, "SELECT path, stage, kind FROM ingestion_failures WHERE resolved_at IS NULL")}


EXPECTED_FIRST = {
    "docs/", "docs/quickstart.md", "docs/guide/install", "docs/guide/advanced", "docs/guide/deep",
    "docs/guide/configure", "docs/reference/api", "docs/orphan", "docs/faq", "docs/new", "docs/flaky",
    "llms-full.txt",
}


def test_crawl_sync_then_resync_follows_the_site(tmp_path, embedder, monkeypatch, capsys):
    settings = make_settings(tmp_path)
    with default_site() as site:
        monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(settings.data_dir))
        monkeypatch.setenv("GROUNDWORK_SOURCES", str(tmp_path / "base"))
        monkeypatch.setenv("GROUNDWORK_WEB_BACKOFF_BASE_S", "0.05")
        monkeypatch.delenv("DAGSTER_HOME", raising=False)
        assert main(["sources", "add", "site", "--url", site.url("/docs/"), "--depth", "3",
                     "--exclude", "/changelog/", "--requests-per-second", "500"]) == 0
        capsys.readouterr()
        assert main(["sync", "site", "--json"]) == 0
        first = json.loads(capsys.readouterr().out)

        # what was indexed: every reachable page once, under its canonical URL
        assert set(web_docs(settings)) == EXPECTED_FIRST
        assert first["added"] == len(EXPECTED_FIRST) and first["updated"] == first["removed"] == 0
        assert first["excluded"] >= 2  # /docs/changelog/ by regex, /docs/private/secret by robots.txt
        assert not site.requested("/docs/private/secret") and not site.requested("/docs/changelog/")
        assert first["crawl"]["complete"] is True and first["crawl"]["retries"] >= 1  # the 429
        failures = open_failures(settings)
        assert failures[site.url("/docs/missing")] == ("fetch", "http_404")
        assert failures[site.url("/docs/logo.png")] == ("fetch", "unsupported_content_type")
        assert first["failed"] == 2
        # llms.txt links are fetched before pages found by following links
        order = [hit.path for hit in site.hits]
        assert order.index("/docs/quickstart.md") < order.index("/docs/guide/advanced")
        # llms-full.txt is one document split by its headings
        sections = {tuple(s) for s, in rows(settings, "SELECT b.section_path FROM blocks b JOIN documents d "
                                                      "USING (doc_id, version) WHERE d.url LIKE '%/llms-full.txt'")}
        assert any("Quickstart" in s for s in sections) and any("API" in s for s in sections)
        assert_index_consistent(settings)
        # every crawled page is remembered for the next sync
        assert rows(settings, "SELECT count(*) FROM web_pages")[0][0] == len(EXPECTED_FIRST)

        # citations point at page-url#anchor
        from knowledge_store.retrieval.engine import RetrievalEngine

        engine = RetrievalEngine(settings, embedder=embedder)
        hit = engine.search("Set EXAMPLE_HOME", k=3, answer="none", min_relevance=0.0).results[0]
        assert hit.url == site.url("/docs/guide/configure#options")

        # ---- the site changes: install is rewritten (sitemap lastmod bumped), deep disappears,
        # orphan is dropped from the sitemap (no longer reachable), faq's sitemap lastmod is unchanged
        site.page("/docs/guide/install", "Install", [
            ("requirements", "Requirements", "Python 3.12 or newer."), ("steps", "Steps", "pip install example."),
        ], ["configure", "advanced"])
        site.lastmods["/docs/guide/install"] = "2024-06-01"
        site.remove("/docs/guide/deep")
        del site.lastmods["/docs/orphan"]
        site.clear_hits()
        report = run_sync(settings, embedder, names=["site"])
        raw = report.raw
        assert (raw.added, raw.updated, raw.removed) == (0, 1, 2)
        assert raw.unchanged == len(EXPECTED_FIRST) - 3
        # pages the sitemap says are unchanged were not downloaded again
        for path in ("/docs/guide/configure", "/docs/reference/api", "/docs/faq"):
            assert not site.requested(path), path
        docs = web_docs(settings)
        assert docs["docs/guide/install"] == 2 and "docs/guide/deep" not in docs and "docs/orphan" not in docs
        assert set(web_docs(settings, "deleted")) == {"docs/guide/deep", "docs/orphan"}
        assert open_failures(settings)[site.url("/docs/guide/deep")] == ("fetch", "http_404")
        assert_index_consistent(settings)
        engine.snapshots.refresh()  # a server notices the new snapshot within a second; do it now
        hit = engine.search("Python 3.12 requirement", k=1, answer="none", min_relevance=0.0).results[0]
        assert hit.url == site.url("/docs/guide/install#requirements") and hit.version == 2

        # a third sync with no change costs no downloads of unchanged pages and changes nothing
        site.clear_hits()
        report = run_sync(settings, embedder, names=["site"])
        assert (report.raw.added, report.raw.updated, report.raw.removed) == (0, 0, 0)
        assert report.publish.snapshot_built is False
        assert not site.requested("/docs/faq")  # validated less than web_revalidate_days ago
        # pages not validated for web_revalidate_days are requested again despite their <lastmod>
        site.clear_hits()
        report = run_sync(settings.model_copy(update={"web_revalidate_days": 0.0}), embedder, names=["site"])
        assert site.requested("/docs/faq") and site.requested("/docs/reference/api")
        assert (report.raw.added, report.raw.updated, report.raw.removed) == (0, 0, 0)

        # --refresh downloads every page again (for sites whose lastmod lies); checksums still decide
        site.clear_hits()
        assert main(["sync", "site", "--refresh", "--json"]) == 0
        refreshed = json.loads(capsys.readouterr().out)
        assert site.requested("/docs/faq") and site.requested("/docs/reference/api")
        assert (refreshed["added"], refreshed["updated"], refreshed["removed"]) == (0, 0, 0)
        assert refreshed["unchanged"] == len(EXPECTED_FIRST) - 2


def test_unreachable_site_deletes_nothing_and_a_failed_page_can_be_retried(tmp_path, embedder):
    settings = make_settings(tmp_path)
    site = default_site()
    with store_connection(settings.store_path) as conn:
        add_source(conn, "site", "web", site.url("/docs/"), {"depth": 1, **FAST})
    with site:
        run_sync(settings, embedder, names=["site"])
        before = web_docs(settings)
        assert "docs/reference/api" in before
        (failure_id,) = rows(settings, "SELECT failure_id FROM ingestion_failures WHERE path = ?",
                             [site.url("/docs/missing")])[0]
        # the page appears; retrying fetches just that URL
        site.routes["/docs/missing"] = Reply(body=doc_page("Found", [("here", "Here", "The gasket spec is 4 mm.")]))
        site.clear_hits()
        outcome = retry_failure(settings, failure_id, embedder)
        assert outcome["resolved"], outcome
        assert [h.path for h in site.hits if not h.path.endswith("robots.txt")] == ["/docs/missing"]
        assert "docs/missing" in web_docs(settings)
        assert_index_consistent(settings)

        # a page failing transiently (503 after every retry) keeps its indexed version and gets a failure row
        # (a page the sitemap gives no <lastmod> for, so it is requested on every sync)
        site.routes["/docs/quickstart.md"] = Reply(status=503, body="maintenance", content_type="text/plain")
        site.clear_hits()
        report = run_sync(settings, embedder, names=["site"])
        assert report.raw.removed == 0 and "docs/quickstart.md" in web_docs(settings)
        assert open_failures(settings)[site.url("/docs/quickstart.md")] == ("fetch", "http_503")
        assert site.count("/docs/quickstart.md") == 1 + settings.web_max_retries
    # the server is gone: the crawl cannot observe the site, so nothing is deleted
    report = run_sync(settings, embedder, names=["site"])
    assert report.raw.removed == 0
    assert set(web_docs(settings)) == set(before) | {"docs/missing"}
    kinds = {kind for _, kind in open_failures(settings).values()}
    assert "source_unreachable" in kinds


def test_api_sync_job_reports_crawl_progress(tmp_path, embedder):
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app

    settings = make_settings(tmp_path)
    run_sync(settings, embedder)
    with default_site() as site, TestClient(create_app(settings, engine=RetrievalEngine(settings, embedder=embedder),
                                                       mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
        slow = site.routes["/docs/faq"]

        def slow_faq(request):  # keeps the crawl busy long enough to be watched mid-way
            time.sleep(1.5)
            return slow

        site.routes["/docs/faq"] = slow_faq
        created = client.post("/api/sources", json={"name": "site", "url": site.url("/docs/"), "depth": 1,
                                                    "exclude": ["/changelog/"], **FAST, "sync": True})
        assert created.status_code == 202, created.text
        job = created.json()
        seen_running: list[dict] = []
        for _ in range(600):
            job = client.get(f"/api/knowledge/jobs/{job['job_id']}").json()
            if job["status"] == "running" and job["progress"] and not job["progress"].get("done"):
                seen_running.append(job["progress"])
            if job["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.1)
        assert job["status"] == "succeeded", job
        # progress was visible while the crawl ran: counters, queue, growing
        assert seen_running and seen_running[0]["source"] == "site"
        assert {"fetched", "queued", "excluded", "failed", "requests"} <= set(seen_running[-1])
        assert seen_running[-1]["requests"] >= seen_running[0]["requests"] >= 1
        assert job["progress"]["source"] == "site" and job["progress"]["done"] is True
        assert job["progress"]["fetched"] >= 5 and job["crawl"]["complete"] is True
        assert job["added"] >= 5 and job["excluded"] >= 1
        hits = client.post("/api/knowledge/query", json={"query": "Set EXAMPLE_HOME", "k": 3, "answer": "none",
                                                         "min_relevance": 0}).json()["results"]
        assert hits[0]["url"] == site.url("/docs/guide/configure#options")


def test_dagster_partition_of_a_web_source_logs_progress_and_reports_the_crawl(tmp_path, embedder):
    import dagster as dg

    from pipelines.definitions import SYNC_SOURCE_JOB_NAME, build_definitions
    from pipelines.resources import KnowledgeStoreResource

    settings = make_settings(tmp_path)
    with default_site() as site:
        with store_connection(settings.store_path) as conn:
            add_source(conn, "site", "web", site.url("/docs/"), {"depth": 1, "exclude": ["/changelog/"], **FAST})
        store = KnowledgeStoreResource(data_dir=str(settings.data_dir), sources=str(tmp_path / "base"))
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions("sources", ["site"])
        result = build_definitions(store=store).resolve_job_def(SYNC_SOURCE_JOB_NAME).execute_in_process(
            instance=instance, partition_key="site")
    assert result.success
    (event,) = result.get_asset_materialization_events()
    meta = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    assert meta["kind"] == "web" and meta["added"] >= 5 and meta["excluded"] >= 1 and meta["failed"] >= 1
    assert meta["crawl"]["complete"] is True and meta["crawl"]["requests"] >= meta["added"]
    logs = [e.message for e in instance.all_logs(result.run_id) if e.user_message]
    assert any(m.startswith("crawl site") and "fetched" in m for m in logs)
    assert any(m.startswith("crawl site (done)") for m in logs)
    observations = [e.asset_observation_data.asset_observation for e in result.all_events
                    if e.event_type_value == "ASSET_OBSERVATION"]
    assert observations and observations[-1].partition == "site"
    assert observations[-1].metadata["crawl_done"].value is True
    assert observations[-1].metadata["crawl_fetched"].value >= 5


def test_a_page_whose_charset_is_only_in_the_http_header_is_read_in_that_charset(tmp_path, embedder):
    """A Markdown page in windows-1251: the bytes alone would be decoded as windows-1252 (mojibake)."""
    from tests.doc_site import DocSite

    settings = make_settings(tmp_path)
    page = "# Давление\n\nДавление в системе 4 бар; проверка ежегодно.\n"
    with DocSite() as site:
        site.routes["/docs/guide.md"] = Reply(body=page.encode("windows-1251"),
                                              content_type="text/markdown; charset=windows-1251")
        with store_connection(settings.store_path) as conn:
            add_source(conn, "ru", "web", site.url("/docs/guide.md"), {"depth": 0, **FAST})
        run_sync(settings, embedder, names=["ru"])
    (text,) = rows(settings, "SELECT c.text FROM chunks c JOIN documents d USING (doc_id, version) "
                             "WHERE d.url LIKE 'http%'")[0]
    assert "Давление в системе 4 бар; проверка ежегодно." in text
    assert rows(settings, "SELECT title FROM documents WHERE url LIKE 'http%'")[0][0] == "Давление"


def test_a_pdf_linked_from_the_site_is_indexed_with_page_links(tmp_path, embedder):
    import pymupdf

    from tests.doc_site import DocSite

    settings = make_settings(tmp_path)
    pdf = pymupdf.open()
    for number, text in ((1, "Unpack the pump and check the crate for transport damage. " * 12),
                         (2, "Bleed the hydraulic circuit before the first start of the pump. " * 12)):
        page = pdf.new_page()
        page.insert_text((72, 72), f"Chapter {number}", fontsize=18)
        page.insert_textbox(pymupdf.Rect(72, 100, 520, 700), text, fontsize=11)
    body = pdf.tobytes()
    with DocSite() as site:
        site.page("/docs/", "Manuals", [("pdfs", "PDFs", "Download the manual.")], ["manual.pdf"])
        site.routes["/docs/manual.pdf"] = Reply(body=body, content_type="application/pdf")
        with store_connection(settings.store_path) as conn:
            add_source(conn, "manuals", "web", site.url("/docs/"), {"depth": 1, **FAST})
        run_sync(settings, embedder, names=["manuals"])
    assert rows(settings, "SELECT doc_type, page_count FROM documents WHERE url LIKE '%manual.pdf'") == [("pdf", 2)]
    from knowledge_store.retrieval.engine import RetrievalEngine

    hit = RetrievalEngine(settings, embedder=embedder).search(
        "bleed the hydraulic circuit", k=1, answer="none", min_relevance=0.0).results[0]
    assert hit.url == site.url("/docs/manual.pdf#page=2") and hit.pages == [2]


def test_full_ingest_job_syncs_web_sources_too_and_reports_them(tmp_path, monkeypatch, capsys):
    settings = make_settings(tmp_path)
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("GROUNDWORK_SOURCES", str(tmp_path / "base"))
    monkeypatch.setenv("GROUNDWORK_WEB_PROGRESS_INTERVAL_S", "0")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with default_site() as site:
        with store_connection(settings.store_path) as conn:
            add_source(conn, "site", "web", site.url("/docs/"), {"depth": 1, "exclude": ["/changelog/"], **FAST})
        assert main(["ingest", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["success"] and all(report["checks"].values())
    assert report["excluded"] >= 1 and report["added"] == 1 + len(web_docs(settings))  # local.md + the pages
    assert "docs/guide/install" in web_docs(settings)


def test_an_incomplete_crawl_still_versions_the_pages_it_fetched_and_deletes_nothing(tmp_path, embedder):
    settings = make_settings(tmp_path)
    site = default_site()
    with store_connection(settings.store_path) as conn:
        add_source(conn, "site", "web", site.url("/docs/"), {"depth": 1, "exclude": ["/changelog/"], **FAST})
    with site:
        run_sync(settings, embedder, names=["site"])
        before = web_docs(settings)
        # the sitemap index fails transiently (so pages only it lists cannot be judged) and a page changes
        site.routes["/sitemap.xml"] = Reply(status=503, body="busy", content_type="text/plain")
        site.page("/docs/guide/install", "Install", [("requirements", "Requirements", "Python 3.13 only.")])
        report = run_sync(settings, embedder, names=["site"])
    assert report.raw.crawls["site"]["complete"] is False
    assert report.raw.removed == 0 and report.raw.updated == 1 and report.raw.added == 0
    after = web_docs(settings)
    assert set(after) == set(before) and after["docs/guide/install"] == 2
    assert_index_consistent(settings)
    kinds = {kind for _, kind in open_failures(settings).values()}
    assert "source_unreachable" in kinds
