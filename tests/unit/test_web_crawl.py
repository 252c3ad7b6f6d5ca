"""The crawler's pure parts (knowledge_store.ingest.web): URL identity and scope, robots.txt, sitemaps, llms.txt, links,
content types, Retry-After, politeness and the configuration (crawls of a loopback site:
tests/integration/test_web_crawl.py)."""

from __future__ import annotations

import gzip

import pytest

from knowledge_store.core.errors import GroundworkError
from knowledge_store.ingest.web import CrawlConfig, InvalidCrawlConfig, InvalidUrlError, Scope, canonical_url
from knowledge_store.ingest.web.content_types import content_kind
from knowledge_store.ingest.web.fetch import parse_retry_after
from knowledge_store.ingest.web.links import canonical_from_link_header, html_links, markdown_link_urls
from knowledge_store.ingest.web.llms_txt import parse_llms_txt
from knowledge_store.ingest.web.politeness import RateLimiter
from knowledge_store.ingest.web.robots import parse_robots
from knowledge_store.ingest.web.sitemaps import is_newer, parse_lastmod, parse_sitemap
from tests.doc_site import doc_page, sitemap_xml
from tests.helpers import FakeTime

# -- URL identity and scope --------------------------------------------------------------------


def test_canonical_url_drops_fragment_tracking_params_default_port_and_sorts_query():
    assert canonical_url("HTTPS://Docs.Example.COM:443/Guide?b=2&utm_source=x&a=1&gclid=9&fbclid=f#part") == \
        "https://docs.example.com/Guide?a=1&b=2"
    assert canonical_url("http://h:80") == "http://h/"
    assert canonical_url("http://h:8080/x") == "http://h:8080/x"
    assert canonical_url("https://h/p?mc_cid=1&mc_eid=2&_ga=3&msclkid=4&ref_src=twsrc&ref=main") == \
        "https://h/p?ref=main"
    assert canonical_url("https://h/docs?utm_medium=a") == "https://h/docs"


def test_canonical_url_resolves_relative_links_dot_segments_and_escapes():
    assert canonical_url("../api?x=1#top", "https://h/docs/guide/install") == "https://h/docs/api?x=1"
    assert canonical_url("https://h/docs/./a/../b") == "https://h/docs/b"
    assert canonical_url("https://h/%7euser/caf%c3%a9 page") == "https://h/~user/caf%C3%A9%20page"
    assert canonical_url("https://h/p?z=1&a=2&a=1") == "https://h/p?a=2&a=1&z=1"  # repeated names keep their order


def test_canonical_url_rejects_non_http_urls():
    for bad in ("mailto:a@b.c", "ftp://h/x", "/relative/only", "https:///nohost"):
        with pytest.raises(InvalidUrlError) as caught:
            canonical_url(bad)
        assert caught.value.url == bad


def test_scope_is_host_and_path_prefix():
    scope = Scope.from_base("https://h/docs/")
    assert scope.contains("https://h/docs/guide/x")
    assert scope.contains("https://h/docs")
    assert scope.contains("http://h/docs/a")  # same site over http
    assert not scope.contains("https://h/docsearch")
    assert not scope.contains("https://h/blog/")
    assert not scope.contains("https://other/docs/")
    assert Scope.from_base("https://h/docs").prefix == "/docs/"
    assert Scope.from_base("https://h/docs/index.html").prefix == "/docs/"
    assert Scope.from_base("https://h").prefix == "/"


# -- small parsers -----------------------------------------------------------------------------


def test_robots_uses_longest_match_wildcards_and_our_own_group():
    rules = parse_robots(
        "User-agent: *\nDisallow: /\n\n"
        "User-agent: GroundworkBot\nUser-agent: other\nDisallow: /docs/\nAllow: /docs/public/\n"
        "Disallow: /*.pdf$\nDisallow: /docs/public/tmp\nAllow: /docs/public/tmp$\nCrawl-delay: 2.5\n"
        "Sitemap: https://h/s.xml\n",
        "GroundworkBot",
    )
    assert rules.allows("https://h/")  # our group has no rule for /, the * group does not apply
    assert not rules.allows("https://h/docs/x")
    assert rules.allows("https://h/docs/public/x")  # longer Allow wins although it comes later
    assert not rules.allows("https://h/files/manual.pdf")  # * matches any run of characters
    assert rules.allows("https://h/files/manual.pdf?x")  # $ anchors the end
    assert rules.allows("https://h/docs/public/manual.pdf")  # /docs/public/ is longer than /*.pdf$
    assert not rules.allows("https://h/docs/public/tmpfile")
    assert rules.allows("https://h/docs/public/tmp")  # equal length: Allow wins
    assert rules.allows("https://h/robots.txt")
    assert rules.crawl_delay == 2.5
    assert rules.sitemaps == ["https://h/s.xml"]
    star = parse_robots("User-agent: *\nDisallow: /private/\nDisallow:\n", "GroundworkBot")
    assert not star.allows("https://h/private/a") and star.allows("https://h/public")


def test_lastmod_parses_every_w3c_precision_with_and_without_timezone():
    assert parse_lastmod("2024-05-01").isoformat() == "2024-05-01T00:00:00+00:00"
    assert parse_lastmod("2024-05").isoformat() == "2024-05-01T00:00:00+00:00"
    assert parse_lastmod("2024-05-01T10:30+02:00").isoformat() == "2024-05-01T08:30:00+00:00"
    assert parse_lastmod("2024-05-01T10:30:15.25Z").isoformat() == "2024-05-01T10:30:15.250000+00:00"
    assert parse_lastmod("2024-05-01T10:30:15") == parse_lastmod("2024-05-01T10:30:15Z")
    assert parse_lastmod("2024-05-01 10:30:15-0500").isoformat() == "2024-05-01T15:30:15+00:00"
    assert parse_lastmod("yesterday") is None and parse_lastmod("2024-13-01") is None
    assert not is_newer("2024-05-01T00:00:00Z", "2024-05-01")
    assert is_newer("2024-05-02", "2024-05-01T23:59:59+00:00")
    assert is_newer("2024-05-01T12:00:00+02:00", "2024-05-01T09:00:00Z")
    assert is_newer("garbage", "2024-05-01")  # when unsure, fetch


def test_sitemap_parser_reads_urlsets_indexes_gzip_and_text():
    urlset = parse_sitemap(sitemap_xml([("https://h/a", "2024-01-01"), ("https://h/b", None)]).encode())
    assert urlset.kind == "urlset"
    assert [(e.loc, e.lastmod) for e in urlset.entries] == [("https://h/a", "2024-01-01"), ("https://h/b", None)]
    index = parse_sitemap(gzip.compress(sitemap_xml([("https://h/s1.xml", None)], index=True).encode()))
    assert index.kind == "index" and index.entries[0].loc == "https://h/s1.xml"
    text = parse_sitemap(b"https://h/a\n\nhttps://h/b\n")
    assert [e.loc for e in text.entries] == ["https://h/a", "https://h/b"]


def test_llms_txt_parser_reads_the_link_list_and_resolves_relative_links():
    links = parse_llms_txt(
        "# Site\n\n> About.\n\n## Docs\n\n- [Start](/docs/start.md): begin here\n"
        "- [API](api.html)\n* [Dup](/docs/start.md#x)\n\n```\n- [Not](/in/code)\n```\n"
        "## Optional\n\n- [Mail](mailto:a@b.c)\n- [Far](https://other.example/x): elsewhere\n",
        "https://h/docs/llms.txt",
    )
    assert [(link.url, link.title, link.notes, link.section) for link in links] == [
        ("https://h/docs/start.md", "Start", "begin here", "Docs"),
        ("https://h/docs/api.html", "API", "", "Docs"),
        ("https://other.example/x", "Far", "elsewhere", "Optional"),
    ]


def test_html_links_honour_base_href_skip_non_web_schemes_and_report_rel_canonical():
    body = doc_page("T", links=["a", "/b?utm_source=x", "#frag", "mailto:x@y.z", "javascript:go()", "tel:123",
                                "data:text/plain,hi", "https://other/x", "a#again"],
                    canonical="/c", base_href="https://h/docs/sub/").encode()
    found = html_links(body, "https://h/docs/page")
    assert found.links == ["https://h/docs/sub/a", "https://h/b", "https://other/x"]
    assert found.canonical == "https://h/c"


def test_markdown_links_include_inline_and_reference_links_but_not_images():
    text = "See [a](a.md) and [b](<b c.md> \"title\").\n![img](pic.png)\n\n[ref]: /r\n```\n[code](x)\n```\n"
    assert markdown_link_urls(text, "https://h/docs/") == [
        "https://h/docs/a.md", "https://h/docs/b%20c.md", "https://h/r",
    ]


def test_canonical_link_header_is_read():
    assert canonical_from_link_header('<https://h/x.pdf>; rel="canonical"', "https://h/y.pdf") == "https://h/x.pdf"
    assert canonical_from_link_header('<https://h/n>; rel="next"', "https://h/y") is None


def test_content_kind_maps_types_and_refuses_everything_else():
    assert content_kind("text/html; charset=utf-8", "https://h/a") == "html"
    assert content_kind("application/xhtml+xml", "https://h/a") == "html"
    assert content_kind("text/markdown", "https://h/a") == "markdown"
    assert content_kind("text/x-markdown", "https://h/a") == "markdown"
    assert content_kind("text/plain", "https://h/notes.md") == "markdown"
    assert content_kind("text/plain", "https://h/notes.markdown") == "markdown"
    assert content_kind("text/plain", "https://h/notes.txt") == "text"
    assert content_kind("application/pdf", "https://h/a") == "pdf"
    assert content_kind("application/octet-stream", "https://h/a.pdf") == "pdf"
    assert content_kind(None, "https://h/a", b"<!DOCTYPE html><html>") == "html"
    assert content_kind("image/png", "https://h/a.png") is None
    assert content_kind("application/json", "https://h/a.md") is None


def test_retry_after_accepts_seconds_and_http_dates():
    assert parse_retry_after("3", now=0) == 3
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0
    assert parse_retry_after("soon", now=0) is None
    assert parse_retry_after(None, now=0) is None


def test_rate_limiter_spaces_requests_per_host_and_crawl_delay_only_slows_down():
    fake = FakeTime()
    limiter = RateLimiter(0.2, fake.sleep, fake.clock)
    assert limiter.wait("h") == 0
    assert limiter.wait("h") == pytest.approx(0.2)
    assert limiter.wait("other") == 0  # another host has its own budget
    fake.now += 1.0
    assert limiter.wait("h") == 0  # enough time passed by itself
    limiter.slow_down("h", 2.0)
    limiter.slow_down("h", 0.5)
    assert limiter.wait("h") == pytest.approx(2.0)


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field", "value"),
    [
        ({"depth": 6}, "depth", 6),
        ({"depth": -1}, "depth", -1),
        ({"depth": True}, "depth", True),
        ({"include": ("[unclosed",)}, "include", "[unclosed"),
        ({"exclude": ("ok", "(bad")}, "exclude", "(bad"),
        ({"include": "/docs/"}, "include", "/docs/"),
        ({"requests_per_second": 0}, "requests_per_second", 0),
        ({"requests_per_second": float("inf")}, "requests_per_second", float("inf")),
        ({"max_pages": 0}, "max_pages", 0),
        ({"max_retries": -1}, "max_retries", -1),
        ({"llms_full_max_bytes": 0}, "llms_full_max_bytes", 0),
        ({"timeout_s": 0}, "timeout_s", 0),
    ],
)
def test_invalid_config_is_refused_with_the_field_and_value(options, field, value):
    with pytest.raises(InvalidCrawlConfig) as caught:
        CrawlConfig("https://h/docs/", **options)
    assert caught.value.field == field
    assert caught.value.value == value
    assert isinstance(caught.value, GroundworkError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("base", ["ftp://h/docs/", "/docs/", "https://", "not a url", "https://h:99999/"])
def test_invalid_base_url_is_refused(base):
    with pytest.raises(InvalidCrawlConfig) as caught:
        CrawlConfig(base)
    assert caught.value.field == "base_url" and caught.value.value == base


def test_config_accepts_lists_for_patterns_and_names_the_robots_token():
    config = CrawlConfig("https://h/docs/", include=["/docs/"])
    assert config.include == ("/docs/",)
    assert config.robots_token == "GroundworkBot"
    assert "GroundworkBot/" in config.user_agent


def test_shared_rate_limiter_spaces_requests_from_separate_crawlers_on_one_host(tmp_path):
    """Two limiters on one folder stand for two processes (each open() is its own flock)."""
    import threading
    import time as real_time

    from knowledge_store.ingest.web.politeness import SharedRateLimiter

    interval = 0.05
    starts: list[float] = []
    lock = threading.Lock()

    def crawler() -> None:
        limiter = SharedRateLimiter(tmp_path, interval, real_time.sleep)
        for _ in range(8):
            limiter.wait("docs.example.org")
            with lock:
                starts.append(real_time.time())

    threads = [threading.Thread(target=crawler) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starts.sort()
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # one budget for both, not two (independent limiters would interleave with gaps near 0);
    # the times are taken after wait() returns, so allow thread-scheduling jitter per gap
    assert len(starts) == 16 and min(gaps) >= interval * 0.5
    assert starts[-1] - starts[0] >= 15 * interval * 0.95
    # another host has its own budget
    other = SharedRateLimiter(tmp_path, 10.0, real_time.sleep)
    assert other.wait("other.example.org") == 0.0
