"""What one crawl of a documentation site may do, checked before any request is sent."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from knowledge_store.ingest.web.errors import InvalidCrawlConfig, InvalidUrlError
from knowledge_store.ingest.web.render import WAIT_CONDITIONS
from knowledge_store.ingest.web.urls import canonical_url

USER_AGENT = "GroundworkBot/0.1 (+https://github.com/groundwork; local docs indexer)"
MAX_DEPTH = 5


@dataclass(frozen=True)
class CrawlConfig:
    """One web source's crawl settings.

    ``include``/``exclude`` are regular expressions searched (``re.search``) in
    the full canonical URL.  ``exclude`` wins over ``include``; the base URL is
    exempt from ``include`` (the crawl has to start somewhere) but not from
    ``exclude`` or robots.txt.  ``requests_per_second`` applies to every request
    to the host, robots.txt, sitemaps and retries included; a robots.txt
    ``Crawl-delay`` that asks for more wins.  ``max_pages`` caps the page URLs
    visited (fetched, known unchanged, or failed; not ``llms-full.txt``); what
    is left over is counted as ``capped``.  ``max_consecutive_failures``
    transient page failures in a row stop the crawl as incomplete: the site is
    down and retrying every remaining page would only hammer it.
    """

    base_url: str
    depth: int = 2
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    respect_robots: bool = True
    requests_per_second: float = 5.0
    max_pages: int = 500
    use_llms_txt: bool = True
    use_sitemap: bool = True
    llms_full_max_bytes: int = 10 * 1024 * 1024
    max_page_bytes: int = 50 * 1024 * 1024
    timeout_s: float = 20.0
    max_retries: int = 3
    backoff_base_s: float = 0.5
    max_backoff_s: float = 60.0
    max_consecutive_failures: int = 5
    user_agent: str = USER_AGENT
    # folder where request times per host are shared between processes (None: this crawl only)
    politeness_dir: str | None = None
    # HTML pages rendered in headless Chromium (render.py) before their links and content are read
    render_js: bool = False
    render_timeout_s: float = 30.0
    render_wait: str = "networkidle"
    chromium_path: str = "/usr/bin/chromium"

    def __post_init__(self) -> None:
        self._check_base_url()
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or not 0 <= self.depth <= MAX_DEPTH:
            raise InvalidCrawlConfig("depth", self.depth, f"must be an integer from 0 to {MAX_DEPTH}")
        for name in ("include", "exclude"):
            object.__setattr__(self, name, _check_patterns(name, getattr(self, name)))
        _check_number("requests_per_second", self.requests_per_second, minimum=0.0, exclusive=True)
        _check_number("timeout_s", self.timeout_s, minimum=0.0, exclusive=True)
        _check_number("backoff_base_s", self.backoff_base_s, minimum=0.0)
        _check_number("max_backoff_s", self.max_backoff_s, minimum=0.0)
        _check_number("render_timeout_s", self.render_timeout_s, minimum=0.0, exclusive=True)
        if not isinstance(self.render_js, bool):
            raise InvalidCrawlConfig("render_js", self.render_js, "must be true or false")
        if self.render_wait not in WAIT_CONDITIONS:
            raise InvalidCrawlConfig("render_wait", self.render_wait, f"must be one of {', '.join(WAIT_CONDITIONS)}")
        for name, minimum in (("max_pages", 1), ("llms_full_max_bytes", 1), ("max_page_bytes", 1),
                              ("max_retries", 0), ("max_consecutive_failures", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidCrawlConfig(name, value, f"must be an integer >= {minimum}")
        if not isinstance(self.user_agent, str) or not self.user_agent.strip():
            raise InvalidCrawlConfig("user_agent", self.user_agent, "must be a non-empty string")

    def _check_base_url(self) -> None:
        if not isinstance(self.base_url, str):
            raise InvalidCrawlConfig("base_url", self.base_url, "must be a string")
        try:
            canonical_url(self.base_url)
        except InvalidUrlError as exc:
            raise InvalidCrawlConfig("base_url", self.base_url, exc.reason) from None

    @property
    def canonical_base(self) -> str:
        return canonical_url(self.base_url)

    @property
    def robots_token(self) -> str:
        """The product token robots.txt groups are matched against (``GroundworkBot``)."""
        return self.user_agent.split("/", 1)[0].split()[0]


def _check_patterns(name: str, patterns: object) -> tuple[str, ...]:
    if isinstance(patterns, str) or not isinstance(patterns, (tuple, list)):
        raise InvalidCrawlConfig(name, patterns, "must be a list of regular expressions")
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise InvalidCrawlConfig(name, pattern, "must be a regular expression string")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidCrawlConfig(name, pattern, f"is not a valid regular expression: {exc}") from None
    return tuple(patterns)


def _check_number(name: str, value: object, *, minimum: float, exclusive: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = value > minimum if exclusive else value >= minimum
    if not ok:
        relation = ">" if exclusive else ">="
        raise InvalidCrawlConfig(name, value, f"must be a finite number {relation} {minimum:g}")
