"""The documentation-site crawler (knowledge_store.ingest.web) against a loopback site; never the internet.

Most tests inject a fake clock and sleep, so politeness waits, backoff and
Retry-After are asserted exactly without really waiting.

The parts that need no model, store or server are in tests/unit/test_web_crawl.py.
"""

from __future__ import annotations

import hashlib
import time
from email.utils import formatdate

import httpx
import pytest

from knowledge_store.ingest.web import CrawlConfig, CrawlProgress, CrawlResult, PriorPage, crawl
from tests.doc_site import DocSite, Reply, Request, default_site, doc_page, endless, etagged, markdown, redirect
from tests.helpers import FakeTime, free_port


@pytest.fixture
def site():
    with default_site() as running:
        yield running


def run(site: DocSite, path: str = "/docs/", fake: FakeTime | None = None, prior=None, progress=None,
        client=None, **options) -> CrawlResult:
    fake = fake or FakeTime()
    config = CrawlConfig(site.url(path), **options)
    return crawl(config, prior=prior, progress=progress, client=client, sleep=fake.sleep, clock=fake.clock)


def urls(result: CrawlResult) -> list[str]:
    return [page.url for page in result.pages]


def page(result: CrawlResult, url: str):
    matches = [p for p in result.pages if p.url == url]
    assert len(matches) == 1, f"{url} appears {len(matches)} times in {urls(result)}"
    return matches[0]


def failure(result: CrawlResult, url: str):
    matches = [f for f in result.failures if f.url == url]
    assert len(matches) == 1, f"{url} failed {len(matches)} times: {result.failures}"
    return matches[0]


def prior_from(result: CrawlResult) -> dict[str, PriorPage]:
    """What an ingestion stage would have stored after ``result``."""
    return {
        p.url: PriorPage(
            url=p.url, lastmod=p.lastmod, etag=p.etag, last_modified=p.last_modified, links=tuple(p.links),
            checksum=hashlib.sha256(p.body).hexdigest() if p.body is not None else "unchanged",
            content_type=p.content_type,
        )
        for p in result.pages
    }


# -- a whole crawl -----------------------------------------------------------------------------


def test_full_crawl_returns_every_reachable_page_with_kinds_origins_and_depths(site):
    result = run(site, exclude=(r"/changelog/",))
    u = site.url
    assert result.complete and result.aborted_reason is None
    assert set(urls(result)) == {
        u("/llms-full.txt"), u("/docs/"), u("/docs/quickstart.md"), u("/docs/reference/api"), u("/docs/faq"),
        u("/docs/guide/configure"), u("/docs/guide/install"), u("/docs/orphan"), u("/docs/flaky"),
        u("/docs/guide/advanced"), u("/docs/new"), u("/docs/guide/deep"),
    }
    assert len(urls(result)) == len(set(urls(result)))
    assert page(result, u("/docs/")).origin == "base"
    assert page(result, u("/docs/quickstart.md")).kind == "markdown"
    assert page(result, u("/docs/quickstart.md")).origin == "llms.txt"
    assert page(result, u("/docs/orphan")).origin == "sitemap"
    assert page(result, u("/docs/guide/advanced")).origin == "link"
    assert page(result, u("/docs/guide/advanced")).depth == 1
    assert page(result, u("/docs/guide/deep")).depth == 2
    install = page(result, u("/docs/guide/install"))
    assert install.kind == "html" and install.how == "fetched" and not install.not_modified
    assert install.lastmod == "2024-05-01" and install.http_status == 200
    assert b'id="requirements"' in install.body  # heading anchors survive for citations
    assert u("/docs/guide/advanced") in install.links
    assert u("/docs/guide/configure") in install.links  # tracking params and fragment gone
    assert page(result, u("/docs/faq")).lastmod == "2024-04-01"  # from the gzipped sitemap robots.txt lists
    assert result.stats["sitemap_urls"] == 8 and result.stats["llms_links"] == 3
    assert result.stats["fetched"] == len(result.pages)
    assert result.stats["out_of_scope"] == 3  # /blog/, /blog/post, https://example.com/elsewhere
    assert not site.requested("/blog/") and not site.requested("/blog/post")


def test_crawl_is_deterministic(site):
    first = run(site, max_pages=6)
    second = run(site, max_pages=6)
    assert urls(first) == urls(second)


def test_base_llms_links_and_sitemap_urls_are_fetched_before_link_following(site):
    run(site, exclude=(r"/changelog/",))
    pages = [p for p in site.paths() if p.startswith("/docs/") and not p.endswith((".xml", ".txt"))]
    assert pages[:3] == ["/docs/", "/docs/quickstart.md", "/docs/reference/api"]
    # then the sitemap URLs, sorted; then depth-1 links, sorted
    assert pages[3:7] == ["/docs/faq", "/docs/guide/configure", "/docs/guide/install", "/docs/orphan"]
    assert pages.index("/docs/guide/advanced") > pages.index("/docs/orphan")
    assert pages.index("/docs/guide/deep") == len(pages) - 1
    discovery = site.paths()[: site.paths().index("/docs/")]
    assert discovery[0] == "/robots.txt"
    assert {"/llms.txt", "/docs/llms.txt", "/sitemap.xml", "/sitemap-docs.xml", "/sitemap-extra.xml.gz"} <= set(
        discovery)


# -- robots.txt --------------------------------------------------------------------------------


def test_robots_disallow_is_respected_and_counted_as_excluded(site):
    result = run(site)
    secret = site.url("/docs/private/secret")
    assert not site.requested("/docs/private/secret")
    assert (secret, "disallowed by robots.txt") in result.excluded
    assert result.stats["excluded"] == len(result.excluded)


def test_robots_are_ignored_when_respect_robots_is_false(site):
    result = run(site, respect_robots=False)
    assert site.requested("/docs/private/secret")
    assert page(result, site.url("/docs/private/secret")).kind == "html"
    assert all(reason != "disallowed by robots.txt" for _, reason in result.excluded)


def test_robots_4xx_allows_everything(site):
    site.routes["/robots.txt"] = Reply(status=403, body="no", content_type="text/plain")
    result = run(site)
    assert result.complete
    assert site.requested("/docs/private/secret")


def test_robots_5xx_means_disallow_all_and_an_incomplete_crawl(site):
    site.routes["/robots.txt"] = Reply(status=503, body="down", content_type="text/plain")
    fake = FakeTime()
    result = run(site, fake=fake)
    assert not result.complete
    assert "robots.txt" in result.aborted_reason and "503" in result.aborted_reason
    assert result.pages == []
    assert site.paths() == ["/robots.txt"] * 4  # three retries, nothing else
    assert fake.sleeps == [0.5, 1.0, 2.0]  # exponential backoff


def test_robots_crawl_delay_slows_every_request_down(site):
    site.routes["/robots.txt"] = Reply(body="User-agent: *\nCrawl-delay: 2\n", content_type="text/plain")
    times: list[float] = []
    fake = FakeTime()
    transport = httpx.HTTPTransport()

    class Recording(httpx.BaseTransport):
        def handle_request(self, request):
            times.append(fake.now)
            return transport.handle_request(request)

    with httpx.Client(transport=Recording(), follow_redirects=False) as client:
        run(site, fake=fake, client=client, depth=0, use_llms_txt=False, use_sitemap=False)
    assert len(times) == 2  # robots.txt, /docs/
    assert times[1] - times[0] >= 2.0


# -- llms.txt and llms-full.txt ----------------------------------------------------------------


def test_llms_full_is_one_markdown_document_from_the_most_specific_location(site):
    result = run(site, depth=0)
    full = page(result, site.url("/llms-full.txt"))
    assert full.origin == "llms-full" and full.kind == "markdown" and full.depth == 0
    assert full.body.startswith(b"# Example Docs") and b"## API" in full.body
    site.routes["/docs/llms-full.txt"] = markdown("# Docs only\n\n## Part\n\nText.\n")
    site.clear_hits()
    result = run(site, depth=0)
    assert page(result, site.url("/docs/llms-full.txt")).body.startswith(b"# Docs only")
    assert not site.requested("/llms-full.txt")


def test_llms_full_over_the_size_limit_is_a_permanent_too_large_failure(site):
    result = run(site, depth=0, llms_full_max_bytes=20)
    bad = failure(result, site.url("/llms-full.txt"))
    assert bad.kind == "too_large" and bad.permanent
    assert "20" in bad.reason and str(len(site.routes["/llms-full.txt"].body.encode())) in bad.reason
    assert site.url("/llms-full.txt") not in urls(result)
    assert result.complete


def test_html_served_for_llms_files_is_treated_as_missing(site):
    spa = Reply(body=doc_page("App shell", links=["/docs/guide/deep"]))
    site.routes["/llms.txt"] = spa
    site.routes["/llms-full.txt"] = spa
    result = run(site, depth=0, use_sitemap=False)
    assert urls(result) == [site.url("/docs/")]
    assert result.failures == [] and result.complete


def test_llms_txt_is_skipped_when_disabled(site):
    result = run(site, depth=0, use_llms_txt=False, use_sitemap=False)
    assert not site.requested("/llms.txt") and not site.requested("/llms-full.txt")
    assert urls(result) == [site.url("/docs/")]


# -- sitemaps and re-sync ----------------------------------------------------------------------


def test_sitemap_lastmod_not_newer_skips_the_request_and_keeps_following_its_links(site):
    first = run(site, exclude=(r"/changelog/",))
    site.clear_hits()
    second = run(site, prior=prior_from(first), exclude=(r"/changelog/",))
    install = page(second, site.url("/docs/guide/install"))
    assert install.not_modified and install.how == "lastmod" and install.body is None
    assert install.links == page(first, site.url("/docs/guide/install")).links
    assert install.content_type == "text/html; charset=utf-8" and install.kind == "html"
    assert not site.requested("/docs/guide/install")
    assert site.requested("/docs/guide/advanced")  # only install links to it
    assert page(second, site.url("/docs/guide/advanced")).depth == 1
    assert second.stats["not_modified"] == 5  # install, configure, api, orphan, faq: all with a sitemap lastmod
    assert set(urls(second)) == set(urls(first))
    assert second.complete


def test_sitemap_lastmod_newer_fetches_the_page_again(site):
    first = run(site, exclude=(r"/changelog/",))
    site.lastmods["/docs/guide/install"] = "2024-06-01"
    site.clear_hits()
    second = run(site, prior=prior_from(first), exclude=(r"/changelog/",))
    install = page(second, site.url("/docs/guide/install"))
    assert install.how == "fetched" and install.lastmod == "2024-06-01"
    assert site.requested("/docs/guide/install")
    assert page(second, site.url("/docs/orphan")).how == "lastmod"


def test_etagged_page_answers_304_and_a_changed_page_is_fetched_again(site):
    site.routes["/docs/orphan"] = etagged(Reply(body=doc_page("Orphan v1")))
    first = run(site, depth=0, use_llms_txt=False)
    site.lastmods["/docs/orphan"] = "2024-07-01"  # the sitemap says it changed, the server says 304
    site.clear_hits()
    second = run(site, depth=0, use_llms_txt=False, prior=prior_from(first))
    assert page(second, site.url("/docs/orphan")).how == "304"
    site.routes["/docs/orphan"] = etagged(Reply(body=doc_page("Orphan v2")))
    site.lastmods["/docs/orphan"] = "2024-08-01"
    third = run(site, depth=0, use_llms_txt=False, prior=prior_from(second))
    changed = page(third, site.url("/docs/orphan"))
    assert changed.how == "fetched" and b"Orphan v2" in changed.body


def test_conditional_request_answered_304_is_not_modified_with_prior_links(site):
    def with_etag(request: Request) -> Reply:
        if request.headers.get("if-none-match") == '"v1"':
            return Reply(status=304, body=b"", content_type=None, headers={"ETag": '"v1"'})
        validators = {"ETag": '"v1"', "Last-Modified": "Wed, 01 May 2024 10:00:00 GMT"}
        return Reply(body=doc_page("Tagged", links=["guide/deep"]), headers=validators)

    site.routes["/docs/"] = with_etag
    first = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    assert page(first, site.url("/docs/")).etag == '"v1"'
    site.clear_hits()
    second = run(site, depth=1, use_sitemap=False, use_llms_txt=False, prior=prior_from(first))
    base = page(second, site.url("/docs/"))
    assert base.not_modified and base.how == "304" and base.http_status == 304 and base.body is None
    assert base.etag == '"v1"' and base.last_modified == "Wed, 01 May 2024 10:00:00 GMT"
    hit = next(h for h in site.hits if h.path == "/docs/")
    assert hit.headers["if-none-match"] == '"v1"'
    assert hit.headers["if-modified-since"] == "Wed, 01 May 2024 10:00:00 GMT"
    assert site.url("/docs/guide/deep") in urls(second)  # followed through the 304's prior links


def test_sitemap_index_and_gzipped_sitemaps_are_followed(site):
    result = run(site, depth=0, use_llms_txt=False)
    assert site.url("/docs/orphan") in urls(result)  # via index -> /sitemap-docs.xml
    assert site.url("/docs/faq") in urls(result)  # via robots.txt Sitemap: .xml.gz
    assert result.stats["sitemaps_read"] == 3


def test_a_sitemap_failing_transiently_makes_the_crawl_incomplete(site):
    site.routes["/sitemap-docs.xml"] = Reply(status=503, body="busy", content_type="text/plain")
    result = run(site, depth=0, max_retries=1)
    assert not result.complete and "sitemap" in result.aborted_reason
    assert site.url("/docs/") in urls(result)  # the crawl still ran
    assert not failure(result, site.url("/sitemap-docs.xml")).permanent


def test_a_declared_sitemap_that_is_missing_or_broken_is_a_permanent_failure(site):
    site.remove("/sitemap-extra.xml.gz")
    site.routes["/sitemap-docs.xml"] = Reply(body="<html><body>not a sitemap</body></html>")
    result = run(site, depth=0, use_llms_txt=False)
    missing = failure(result, site.url("/sitemap-extra.xml.gz"))
    assert missing.kind == "http_404" and missing.permanent and missing.reason.startswith("sitemap:")
    assert failure(result, site.url("/sitemap-docs.xml")).kind == "bad_sitemap"
    assert result.complete


# -- include / exclude -------------------------------------------------------------------------


def test_exclude_regex_is_applied_to_the_full_url_and_reported(site):
    result = run(site, exclude=(r"/changelog/", r"\?"))
    assert not site.requested("/docs/changelog/")
    assert (site.url("/docs/changelog/"), "matches exclude pattern '/changelog/'") in result.excluded


def test_include_regex_limits_pages_but_the_base_url_is_still_crawled(site):
    result = run(site, include=(r"/docs/guide/",), use_llms_txt=False)
    assert set(urls(result)) == {site.url(p) for p in (
        "/docs/", "/docs/guide/install", "/docs/guide/configure", "/docs/guide/advanced", "/docs/guide/deep")}
    assert (site.url("/docs/orphan"), "matches no include pattern") in result.excluded
    assert not site.requested("/docs/orphan")


# -- redirects ---------------------------------------------------------------------------------


def test_redirect_is_followed_and_the_page_identity_is_the_final_url(site):
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    new = page(result, site.url("/docs/new"))
    assert new.final_url == site.url("/docs/new")
    assert site.url("/docs/old") not in urls(result)
    assert site.count("/docs/old") == 1 and site.count("/docs/new") == 1


def test_redirect_out_of_scope_is_excluded_and_not_followed(site):
    site.routes["/docs/old"] = redirect("/blog/moved")
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    reason = dict(result.excluded)[site.url("/docs/old")]
    assert reason.startswith("redirect out of scope")
    assert not site.requested("/blog/moved")


def test_redirect_to_a_robots_disallowed_page_is_excluded(site):
    site.routes["/docs/old"] = redirect("/docs/private/secret")
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    assert "disallowed by robots.txt" in dict(result.excluded)[site.url("/docs/old")]
    assert not site.requested("/docs/private/secret")


def test_redirect_chains_stop_after_five_hops_and_loops_are_detected(site):
    for n in range(8):
        site.routes[f"/docs/hop{n}"] = redirect(f"/docs/hop{n + 1}", status=302)
    site.routes["/docs/ping"] = redirect("/docs/pong", status=307)
    site.routes["/docs/pong"] = redirect("/docs/ping", status=308)
    site.routes["/docs/"] = Reply(body=doc_page("Index", links=["hop0", "ping"]))
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    kinds = {f.kind for f in result.failures}
    assert kinds == {"too_many_redirects", "redirect_loop"}
    assert site.count("/docs/hop5") == 1 and not site.requested("/docs/hop6")
    assert all(f.permanent for f in result.failures)


def test_redirect_to_a_page_already_fetched_is_a_duplicate(site):
    site.routes["/docs/old"] = redirect("/docs/guide/install")
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    assert urls(result).count(site.url("/docs/guide/install")) == 1
    assert site.count("/docs/guide/install") == 1
    assert result.stats["duplicates"] >= 1


def test_base_url_without_trailing_slash_is_followed_to_the_directory(site):
    site.routes["/docs"] = redirect("/docs/")
    result = run(site, path="/docs", depth=1, use_sitemap=False, use_llms_txt=False, include=(r"/guide/",))
    base = page(result, site.url("/docs/"))
    assert base.origin == "base"  # the redirect target of the base is exempt from include, like the base
    assert site.url("/docs/guide/install") in urls(result)
    assert site.url("/docs/new") not in urls(result)


def test_an_injected_client_that_follows_redirects_is_still_checked_hop_by_hop(site):
    site.routes["/docs/old"] = redirect("/blog/moved")
    with httpx.Client(follow_redirects=True) as client:
        result = run(site, client=client, depth=1, use_sitemap=False, use_llms_txt=False)
    assert dict(result.excluded)[site.url("/docs/old")].startswith("redirect out of scope")
    assert not site.requested("/blog/moved")


def test_base_url_redirecting_out_of_scope_leaves_the_crawl_incomplete(site):
    site.routes["/docs/"] = redirect("/elsewhere/")
    result = run(site, use_sitemap=False, use_llms_txt=False)
    assert not result.complete and "redirects out of scope" in result.aborted_reason


# -- failures and retries ----------------------------------------------------------------------


def test_429_then_success_waits_for_retry_after(site):
    fake = FakeTime()
    result = run(site, fake=fake, depth=1, use_sitemap=False, use_llms_txt=False)
    assert page(result, site.url("/docs/flaky")).http_status == 200
    assert site.count("/docs/flaky") == 2
    assert 1.0 in fake.sleeps  # Retry-After: 1, not the 0.5 s backoff
    assert result.stats["retries"] == 1
    assert not [f for f in result.failures if "flaky" in f.url]


def test_retry_after_as_an_http_date_is_honoured(site):
    site.routes["/docs/flaky"] = [
        Reply(status=503, content_type=None, headers={"Retry-After": formatdate(time.time() + 3, usegmt=True)}),
        Reply(body=doc_page("OK")),
    ]
    fake = FakeTime()
    run(site, fake=fake, depth=1, use_sitemap=False, use_llms_txt=False)
    assert any(1.5 <= s <= 3.5 for s in fake.sleeps), fake.sleeps


def test_backoff_wins_over_a_shorter_retry_after(site):
    site.routes["/docs/flaky"] = [Reply(status=503, content_type=None, headers={"Retry-After": "0"}),
                                  Reply(body=doc_page("OK"))]
    fake = FakeTime()
    run(site, fake=fake, depth=1, use_sitemap=False, use_llms_txt=False)
    assert 0.5 in fake.sleeps and site.count("/docs/flaky") == 2


def test_retry_after_longer_than_max_backoff_gives_up_for_this_crawl(site):
    site.routes["/docs/flaky"] = Reply(status=429, content_type=None, headers={"Retry-After": "3600"})
    fake = FakeTime()
    result = run(site, fake=fake, depth=1, use_sitemap=False, use_llms_txt=False, max_backoff_s=60)
    bad = failure(result, site.url("/docs/flaky"))
    assert bad.kind == "http_429" and not bad.permanent and bad.attempts == 1
    assert "3600" in bad.reason
    assert max(fake.sleeps) < 60


def test_5xx_exhausting_retries_is_a_transient_failure_and_the_crawl_goes_on(site):
    site.routes["/docs/flaky"] = Reply(status=503, body="down", content_type="text/plain")
    fake = FakeTime()
    result = run(site, fake=fake, depth=1, use_sitemap=False, use_llms_txt=False, max_retries=3)
    bad = failure(result, site.url("/docs/flaky"))
    assert (bad.kind, bad.http_status, bad.permanent, bad.attempts) == ("http_503", 503, False, 4)
    assert site.count("/docs/flaky") == 4
    backoffs = [s for s in fake.sleeps if s in (0.5, 1.0, 2.0)]
    assert backoffs == [0.5, 1.0, 2.0]
    assert result.complete and site.url("/docs/new") in urls(result)


def test_backoff_is_capped_by_max_backoff(site):
    site.routes["/docs/flaky"] = Reply(status=500, content_type=None)
    fake = FakeTime()
    run(site, fake=fake, depth=1, use_sitemap=False, use_llms_txt=False, max_retries=4, backoff_base_s=1.0,
        max_backoff_s=3.0)
    assert [s for s in fake.sleeps if s >= 1.0] == [1.0, 2.0, 3.0, 3.0]


def test_404_is_a_permanent_failure_after_one_attempt(site):
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    missing = failure(result, site.url("/docs/missing"))
    assert (missing.kind, missing.http_status, missing.permanent, missing.attempts) == ("http_404", 404, True, 1)
    assert "does not exist" in missing.reason
    assert site.count("/docs/missing") == 1
    assert result.complete


def test_410_and_403_are_permanent(site):
    site.routes["/docs/missing"] = Reply(status=410, content_type=None)
    site.routes["/docs/flaky"] = Reply(status=403, content_type=None)
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    assert failure(result, site.url("/docs/missing")).kind == "http_410"
    assert failure(result, site.url("/docs/flaky")).permanent


def test_unsupported_content_type_is_a_permanent_failure_naming_the_type(site):
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    logo = failure(result, site.url("/docs/logo.png"))
    assert logo.kind == "unsupported_content_type" and logo.permanent and "image/png" in logo.reason


def test_text_markdown_and_pdf_bodies_get_their_kinds(site):
    site.routes["/docs/notes.md"] = markdown("# Notes\n\n[deep](guide/deep)\n", content_type="text/plain")
    site.routes["/docs/readme.txt"] = markdown("plain words", content_type="text/plain")
    site.routes["/docs/manual.pdf"] = Reply(body=b"%PDF-1.4\n...", content_type="application/pdf")
    site.routes["/docs/"] = Reply(body=doc_page("Index", links=["notes.md", "readme.txt", "manual.pdf"]))
    result = run(site, depth=2, use_sitemap=False, use_llms_txt=False)
    assert page(result, site.url("/docs/notes.md")).kind == "markdown"
    assert page(result, site.url("/docs/readme.txt")).kind == "text"
    assert page(result, site.url("/docs/manual.pdf")).kind == "pdf"
    assert site.url("/docs/guide/deep") in urls(result)  # links of a markdown page are followed


def test_body_over_max_page_bytes_is_too_large_without_downloading_it(site):
    site.routes["/docs/big"] = Reply(body=b"x" * 5000)
    site.routes["/docs/endless"] = Reply(stream=endless())
    site.routes["/docs/"] = Reply(body=doc_page("Index", links=["big", "endless"]))
    started = time.monotonic()
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False, max_page_bytes=4096)
    big = failure(result, site.url("/docs/big"))
    assert big.kind == "too_large" and big.permanent and "5000" in big.reason and "4096" in big.reason
    endless_failure = failure(result, site.url("/docs/endless"))
    assert endless_failure.kind == "too_large" and "stopped reading" in endless_failure.reason
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 3
    while "/docs/endless" not in site.streamed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert site.streamed["/docs/endless"] < 32 * 1024 * 1024  # stopped early, not gigabytes


def test_timeouts_are_transient_failures(site):
    site.routes["/docs/flaky"] = Reply(body=doc_page("Slow"), delay_s=0.6)
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False, timeout_s=0.15, max_retries=1)
    slow = failure(result, site.url("/docs/flaky"))
    assert (slow.kind, slow.permanent, slow.attempts) == ("timeout", False, 2)


def test_a_transient_page_failure_keeps_its_prior_links_in_play(site):
    first = run(site, exclude=(r"/changelog/",), use_sitemap=False)
    site.routes["/docs/guide/install"] = Reply(status=503, content_type=None)
    site.clear_hits()
    second = run(site, exclude=(r"/changelog/",), use_sitemap=False, prior=prior_from(first), max_retries=0)
    assert not failure(second, site.url("/docs/guide/install")).permanent
    assert site.url("/docs/guide/advanced") in urls(second)  # reached only through install's prior links
    assert second.complete


def test_many_consecutive_transient_failures_stop_the_crawl_as_incomplete(site):
    names = [f"p{n}" for n in range(10)]
    for name in names:
        site.routes[f"/docs/{name}"] = Reply(status=502, content_type=None)
    site.routes["/docs/"] = Reply(body=doc_page("Index", links=names))
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False, max_retries=0, max_consecutive_failures=3)
    assert not result.complete and "3 pages in a row" in result.aborted_reason
    assert len(result.failures) == 3
    assert not site.requested("/docs/p3")


def test_base_unreachable_means_incomplete_and_nothing_else_is_tried():
    port = free_port()
    fake = FakeTime()
    config = CrawlConfig(f"http://127.0.0.1:{port}/docs/", max_retries=2)
    result = crawl(config, sleep=fake.sleep, clock=fake.clock)
    assert not result.complete
    assert "unreachable" in result.aborted_reason
    assert result.pages == [] and result.stats["requests"] == 3
    assert fake.sleeps[-2:] == [0.5, 1.0]


def test_base_url_failing_transiently_means_incomplete(site):
    site.routes["/docs/"] = Reply(status=503, content_type=None)
    result = run(site, max_retries=1)
    assert not result.complete and "base URL" in result.aborted_reason
    assert not failure(result, site.url("/docs/")).permanent


def test_base_url_404_is_a_complete_observation(site):
    site.remove("/docs/")
    result = run(site)
    assert result.complete
    assert failure(result, site.url("/docs/")).kind == "http_404"
    assert site.url("/docs/orphan") in urls(result)  # seeds still crawled


# -- de-duplication ----------------------------------------------------------------------------


def test_tracking_params_fragments_and_rel_canonical_collapse_to_one_page(site):
    result = run(site, exclude=(r"/changelog/",))
    assert urls(result).count(site.url("/docs/guide/configure")) == 1
    assert urls(result).count(site.url("/docs/reference/api")) == 1
    assert site.url("/docs/reference/api.html") not in urls(result)  # its rel=canonical is the API page
    assert not any("utm_" in url or "fbclid" in url or "#" in url for url in urls(result))
    assert result.stats["duplicates"] >= 1
    assert site.count("/docs/guide/configure") == 1  # the tracking variants were never requested


def test_rel_canonical_inside_scope_becomes_the_page_identity(site):
    site.routes["/docs/alias"] = Reply(body=doc_page("Alias", canonical="/docs/target?utm_campaign=x"))
    site.routes["/docs/"] = Reply(body=doc_page("Index", links=["alias"]))
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    target = page(result, site.url("/docs/target"))
    assert target.final_url == site.url("/docs/alias")
    assert not site.requested("/docs/target")


def test_rel_canonical_outside_scope_is_ignored(site):
    site.routes["/docs/alias"] = Reply(body=doc_page("Alias", canonical="https://example.com/alias"))
    site.routes["/docs/"] = Reply(body=doc_page("Index", links=["alias"]))
    result = run(site, depth=1, use_sitemap=False, use_llms_txt=False)
    assert page(result, site.url("/docs/alias")).final_url == site.url("/docs/alias")


# -- limits ------------------------------------------------------------------------------------


def test_page_cap_stops_the_crawl_and_counts_what_was_left(site):
    result = run(site, max_pages=3, exclude=(r"/changelog/",))
    crawled = [p for p in result.pages if p.origin != "llms-full"]
    assert [p.url for p in crawled] == [site.url("/docs/"), site.url("/docs/quickstart.md"),
                                         site.url("/docs/reference/api")]
    # the rest of level 0 (faq, configure, install, orphan) and the new links already found on the
    # three pages (reference/api.html, old, flaky, missing, logo.png)
    assert result.stats["capped"] == 9
    assert result.complete


def test_depth_zero_fetches_only_the_base_and_the_seeds(site):
    result = run(site, depth=0)
    crawled = {p.url for p in result.pages if p.origin != "llms-full"}
    assert crawled == {site.url(p) for p in ("/docs/", "/docs/quickstart.md", "/docs/reference/api", "/docs/faq",
                                             "/docs/guide/configure", "/docs/guide/install", "/docs/orphan")}
    assert not site.requested("/docs/guide/advanced")
    only_base = run(site, depth=0, use_sitemap=False, use_llms_txt=False)
    assert urls(only_base) == [site.url("/docs/")]


def test_depth_counts_link_hops_from_the_base(site):
    one = run(site, depth=1, use_sitemap=False, use_llms_txt=False, exclude=(r"/changelog/",))
    assert site.url("/docs/guide/install") in urls(one)
    assert site.url("/docs/guide/advanced") not in urls(one)
    two = run(site, depth=2, use_sitemap=False, use_llms_txt=False, exclude=(r"/changelog/",))
    assert site.url("/docs/guide/advanced") in urls(two)
    assert site.url("/docs/guide/deep") not in urls(two)
    three = run(site, depth=3, use_sitemap=False, use_llms_txt=False, exclude=(r"/changelog/",))
    assert site.url("/docs/guide/deep") in urls(three)


# -- politeness and progress -------------------------------------------------------------------


def test_requests_to_one_host_are_spaced_by_the_rate_limit_in_real_time(site):
    crawl(CrawlConfig(site.url("/docs/"), depth=1, requests_per_second=25, use_sitemap=False, use_llms_txt=False,
                      exclude=(r"/changelog/", r"/flaky")))
    times = [hit.at for hit in site.hits]
    assert len(times) >= 8
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    # Arrival times at the server jitter under load (one request late makes the next gap short),
    # so check the rate over the whole run and allow jitter per gap; exact spacing is asserted
    # with injected time in the next test.
    assert times[-1] - times[0] >= (len(times) - 1) * 0.04 * 0.95, gaps
    assert min(gaps) >= 0.04 / 2, gaps


def test_every_request_including_discovery_and_retries_waits_its_turn(site):
    fake = FakeTime()
    result = run(site, fake=fake, requests_per_second=5)
    requests = result.stats["requests"]
    waits = [s for s in fake.sleeps if abs(s - 0.2) < 1e-9]
    # every request after the first waits 0.2 s, except the one right after the 1 s Retry-After pause
    assert len(waits) == requests - 2
    assert fake.now - 1000.0 >= (requests - 2) * 0.2 + 1.0


def test_progress_is_reported_after_every_request(site):
    seen: list[CrawlProgress] = []
    result = run(site, progress=seen.append, exclude=(r"/changelog/",))
    assert len(seen) >= result.stats["requests"]
    assert [s.requests for s in seen] == sorted(s.requests for s in seen)
    last = seen[-1]
    assert (last.requests, last.retries, last.fetched, last.failed) == (
        result.stats["requests"], result.stats["retries"], result.stats["fetched"], result.stats["failed"])
    assert last.excluded == result.stats["excluded"] and last.queued == 0
    assert last.elapsed_s > 0


def test_user_agent_is_sent_on_every_request(site):
    run(site, depth=0)
    assert all(hit.headers["user-agent"].startswith("GroundworkBot/") for hit in site.hits)
