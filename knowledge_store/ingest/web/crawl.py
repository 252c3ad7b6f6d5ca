"""Crawl one documentation site: decide what to fetch, fetch it politely, report what was seen.

Order of work, so that a page cap always keeps the same pages:

1. ``robots.txt`` (its rules, ``Crawl-delay`` and ``Sitemap:`` lines);
2. ``llms.txt`` at the site root and at the base path (the pages the site
   itself recommends), ``llms-full.txt`` (the most specific one) as one
   Markdown document;
3. sitemaps (``/sitemap.xml``, the base path's ``sitemap.xml`` and the ones
   robots.txt declares, indexes followed), which also give ``<lastmod>``;
4. pages, breadth first: level 0 is the base URL, then llms.txt links (file
   order), then sitemap URLs (sorted); level *n+1* is every new in-scope link
   found on level *n* pages (sorted), up to ``depth`` hops.

What the crawl observed is only trustworthy as a whole when it could read the
site: if robots.txt, a sitemap or llms.txt fail transiently, the base URL
cannot be fetched, or the site stops answering, the result is marked
incomplete so the caller deletes nothing.  A 404 on a page is a complete
observation (that page is gone); a transient failure on a page keeps its
previous links in play, so pages only reachable through it are not lost.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import httpx

from knowledge_store.core.errors import ChromiumNotFoundError
from knowledge_store.ingest.web.config import CrawlConfig
from knowledge_store.ingest.web.content_types import charset_of, content_kind, decode_declared, is_refused, media_type
from knowledge_store.ingest.web.errors import BadSitemapError, InvalidUrlError
from knowledge_store.ingest.web.fetch import Fetcher, FetchError, Response, status_error
from knowledge_store.ingest.web.links import canonical_from_link_header, html_links, markdown_link_urls
from knowledge_store.ingest.web.llms_txt import parse_llms_txt
from knowledge_store.ingest.web.politeness import RateLimiter, SharedRateLimiter
from knowledge_store.ingest.web.render import ChromiumRenderer, check_chromium
from knowledge_store.ingest.web.results import (
    CrawlFailure,
    CrawlProgress,
    CrawlResult,
    FetchedPage,
    How,
    Origin,
    PageKind,
    PriorPage,
)
from knowledge_store.ingest.web.robots import MAX_ROBOTS_BYTES, RobotsRules, parse_robots
from knowledge_store.ingest.web.sitemaps import MAX_SITEMAP_BYTES, is_newer, parse_sitemap
from knowledge_store.ingest.web.urls import Scope, canonical_url, host_key, origin_of

MAX_REDIRECTS = 5
MAX_SITEMAP_FILES = 50
MAX_SITEMAP_NESTING = 3
MAX_LLMS_TXT_BYTES = 5 * 1024 * 1024
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_GONE = (404, 410)

ProgressCallback = Callable[[CrawlProgress], None]
logger = logging.getLogger(__name__)


def crawl(
    config: CrawlConfig,
    prior: Mapping[str, PriorPage] | None = None,
    progress: ProgressCallback | None = None,
    client: httpx.Client | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    only: Sequence[str] | None = None,
    on_page: Callable[[FetchedPage], None] | None = None,
    renderer: ChromiumRenderer | None = None,
) -> CrawlResult:
    """Crawl ``config.base_url`` and return every page seen (fetched or known unchanged),
    every failure, every excluded URL and whether the observation is complete.

    ``on_page`` is called with each page as soon as it is seen, so a caller can write the body
    to disk and drop it (``page.body = None``) instead of holding a whole site in memory.
    ``only`` fetches just those URLs (same scope, robots, rules and politeness; no
    llms.txt, sitemaps or link following): how a single failed page is retried.

    ``prior`` maps canonical page URLs to what the last sync stored, enabling
    sitemap-``lastmod`` skips and conditional requests.  ``client`` defaults to
    an ``httpx.Client`` that does not follow redirects; an injected one is not
    closed.  ``sleep``/``clock`` are injectable so tests need not really wait.
    With ``config.render_js`` every HTML page is rendered in headless Chromium (``render.py``) before its
    links and content are read; ``renderer`` defaults to one started for this crawl and closed after it.
    """
    own_client = client is None
    if client is None:
        client = httpx.Client(timeout=config.timeout_s, follow_redirects=False,
                              headers={"User-Agent": config.user_agent})
    own_renderer = renderer is None and config.render_js
    if own_renderer:
        renderer = ChromiumRenderer(config.chromium_path, config.render_timeout_s, config.render_wait,
                                    config.user_agent)
    try:
        if only is not None:
            config = dataclasses.replace(config, depth=0, use_llms_txt=False, use_sitemap=False)
        return _Crawl(config, prior or {}, progress, client, sleep, clock, only=only, on_page=on_page,
                      renderer=renderer if config.render_js else None).run()
    finally:
        if own_client:
            client.close()
        if own_renderer and renderer is not None:
            renderer.close()


def _unique(urls: list[str]) -> list[str]:
    return list(dict.fromkeys(urls))


def _safe_canonical(url: str, base: str | None = None) -> str | None:
    try:
        return canonical_url(url, base)
    except InvalidUrlError:
        return None


def _is_html(answer: Response) -> bool:
    if content_kind(answer.headers.get("content-type"), "", b"") == "html":
        return True
    return (answer.body or b"")[:512].lstrip().lower().startswith((b"<!doctype html", b"<html"))


def _conditional_headers(prior: PriorPage | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if prior is not None and prior.etag:
        headers["If-None-Match"] = prior.etag
    if prior is not None and prior.last_modified:
        headers["If-Modified-Since"] = prior.last_modified
    return headers


class _Crawl:
    """The state of one crawl; ``run`` is the only entry point."""

    def __init__(
        self,
        config: CrawlConfig,
        prior: Mapping[str, PriorPage],
        progress: ProgressCallback | None,
        client: httpx.Client,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
        only: Sequence[str] | None = None,
        on_page: Callable[[FetchedPage], None] | None = None,
        renderer: ChromiumRenderer | None = None,
    ) -> None:
        self.only = list(only) if only is not None else None
        self.renderer = renderer
        self.on_page = on_page
        self.config = config
        self.prior = prior
        self.progress = progress
        self.clock = clock
        self.started = clock()
        self.base = config.canonical_base
        self.scope = Scope.from_base(self.base)
        self.origin = origin_of(self.base)
        self.includes = [re.compile(pattern) for pattern in config.include]
        self.excludes = [re.compile(pattern) for pattern in config.exclude]
        self.robots = RobotsRules.allow_everything()
        self.robots_sitemaps: list[str] = []
        self.limiter = (
            SharedRateLimiter(config.politeness_dir, 1.0 / config.requests_per_second, sleep)
            if config.politeness_dir else RateLimiter(1.0 / config.requests_per_second, sleep, clock)
        )
        self.fetcher = Fetcher(
            client, self.limiter, user_agent=config.user_agent, max_retries=config.max_retries,
            backoff_base_s=config.backoff_base_s, max_backoff_s=config.max_backoff_s, sleep=sleep,
            on_request=self._report,
        )
        self.pages: list[FetchedPage] = []
        self.identities: set[str] = set()  # page identities in the result
        self.done: set[str] = set()  # every URL requested (or skipped as unchanged): never twice
        self.seen: set[str] = set()  # every in-scope URL admitted or excluded
        self.failures: list[CrawlFailure] = []
        self.excluded: dict[str, str] = {}
        self.out_of_scope: set[str] = set()
        self.lastmods: dict[str, str | None] = {}
        self.counts = {"fetched": 0, "not_modified": 0, "duplicates": 0, "capped": 0, "sitemap_urls": 0,
                       "llms_links": 0, "sitemaps_read": 0, "sitemaps_skipped": 0, "rendered": 0,
                       "render_timeouts": 0}
        self.render_seconds = 0.0
        self.visits = 0
        self.queued = 0
        self.consecutive_transient = 0
        self.aborted_reason: str | None = None
        self.incomplete: list[str] = []

    # -- driver ---------------------------------------------------------------------------------

    def run(self) -> CrawlResult:
        config = self.config
        if self.renderer is not None:
            try:
                check_chromium(config.chromium_path)
            except ChromiumNotFoundError as error:
                self._abort(f"render_js is on but pages cannot be rendered: {error}")
        if not self.aborted and self._read_robots():
            llms_links = self._read_llms_txt() if config.use_llms_txt else []
            if config.use_llms_txt and not self.aborted:
                self._read_llms_full()
            sitemap_urls = self._read_sitemaps() if config.use_sitemap and not self.aborted else []
            if not self.aborted:
                seeds: list[tuple[str, Origin]] = [(self.base, "base")] if self.only is None else \
                    [(u, "link") for u in (_safe_canonical(url) for url in self.only) if u]
                seeds += [(url, "llms.txt") for url in llms_links]
                seeds += [(url, "sitemap") for url in sitemap_urls]
                self._crawl_levels(seeds)
        self.queued = 0
        self._report()
        return self._result()

    @property
    def aborted(self) -> bool:
        return self.aborted_reason is not None

    def _abort(self, reason: str) -> None:
        if self.aborted_reason is None:
            self.aborted_reason = reason

    def _crawl_levels(self, seeds: list[tuple[str, Origin]]) -> None:
        level = [(url, origin) for url, origin in seeds if self._admit(url)]
        depth = 0
        while level:
            found: set[str] = set()
            for index, (url, origin) in enumerate(level):
                if self.aborted:
                    return
                self.queued = len(level) - index - 1
                if url in self.done:  # reached earlier as a redirect target or declared canonical
                    if url in self.identities:
                        self.counts["duplicates"] += 1
                    continue
                if self.visits >= self.config.max_pages:
                    waiting = [u for u, _ in level[index:] if u not in self.done]
                    waiting += [u for u in sorted(found) if self._admit(u)]
                    self.counts["capped"] += len(waiting)
                    return
                self.visits += 1
                links = self._visit(url, depth, origin)
                if depth < self.config.depth:
                    found.update(links)
            if depth >= self.config.depth:
                return
            depth += 1
            level = [(url, "link") for url in sorted(found) if self._admit(url)]

    def _admit(self, url: str) -> bool:
        """Should ``url`` be queued?  Counts it as out of scope or excluded when not."""
        if url in self.seen or url in self.done:
            return False
        if not self.scope.contains(url):
            self.out_of_scope.add(url)
            return False
        self.seen.add(url)
        reason = self._filter_reason(url)
        if reason is not None:
            self._exclude(url, reason)
            return False
        return True

    def _filter_reason(self, url: str, *, is_base: bool = False) -> str | None:
        """Why an in-scope URL must not be fetched (robots.txt, exclude, include), or None.
        The base URL (and where it redirects) is exempt from ``include``: the crawl starts there."""
        if self.config.respect_robots and not self.robots.allows(url):
            return "disallowed by robots.txt"
        for pattern in self.excludes:
            if pattern.search(url):
                return f"matches exclude pattern {pattern.pattern!r}"
        if self.includes and not (is_base or url == self.base):
            if not any(pattern.search(url) for pattern in self.includes):
                return "matches no include pattern"
        return None

    def _exclude(self, url: str, reason: str) -> None:
        self.excluded.setdefault(url, reason)

    # -- discovery: robots.txt, llms.txt, llms-full.txt, sitemaps ------------------------------

    def _get_discovery(self, url: str, max_bytes: int, *, truncate: bool = False) -> Response | FetchError:
        """GET a site file, following redirects on the same host (robots.txt moves to https, etc.)."""
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            answer = self.fetcher.get(current, max_bytes=max_bytes, truncate=truncate)
            if isinstance(answer, FetchError) or answer.status not in REDIRECT_STATUSES:
                return answer
            target = _safe_canonical(answer.headers.get("location", ""), current)
            if target is None or not self.scope.same_host(target) or target == current:
                return answer
            current = target
        return FetchError(url, "too_many_redirects", f"more than {MAX_REDIRECTS} redirects", True, None, 1)

    def _discovery_ok(self, answer: Response | FetchError, what: str, *, guessed: bool) -> bool:
        """True for a 2xx answer; records real problems (a guessed file being absent is not one)."""
        if isinstance(answer, Response):
            if 200 <= answer.status < 300:
                return True
            if answer.status in REDIRECT_STATUSES or (guessed and answer.status in _GONE):
                return False
            answer = status_error(answer.url, answer.status, answer.attempts)
        if not answer.permanent and not self.fetcher.reached:
            self._abort(f"site unreachable: {what} {answer.url}: {answer.reason}")
            return False
        self.failures.append(CrawlFailure(answer.url, answer.kind, f"{what}: {answer.reason}", answer.permanent,
                                          answer.http_status, answer.attempts))
        if not answer.permanent:
            self.incomplete.append(f"{what} {answer.url} could not be read ({answer.reason}); "
                                   "pages only it lists may be missing")
        return False

    def _read_robots(self) -> bool:
        """Load robots.txt per RFC 9309 2.3.1: 2xx = its rules; 4xx = no rules; 5xx or
        unreachable = everything disallowed, which here means: crawl nothing, report incomplete.
        Returns False when the crawl must stop."""
        config = self.config
        if not config.respect_robots and not config.use_sitemap:
            return True
        url = self.origin + "/robots.txt"
        answer = self._get_discovery(url, MAX_ROBOTS_BYTES, truncate=True)
        if isinstance(answer, FetchError) and not answer.permanent or (
            isinstance(answer, Response) and answer.status >= 500
        ):
            reason = answer.reason if isinstance(answer, FetchError) else f"HTTP {answer.status}"
            if not self.fetcher.reached:
                self._abort(f"site unreachable: {url}: {reason}")
                return False
            if config.respect_robots:
                self._abort(f"{url} could not be read ({reason}); RFC 9309 says to assume everything is "
                            "disallowed until it can be read, so nothing was crawled")
                return False
            return True
        if isinstance(answer, Response) and 200 <= answer.status < 300:
            rules = parse_robots((answer.body or b"").decode("utf-8", "replace"), config.robots_token)
        else:  # 4xx, redirect elsewhere, too many redirects: "unavailable", no restrictions
            rules = RobotsRules.allow_everything()
        self.robots_sitemaps = rules.sitemaps
        if config.respect_robots:
            self.robots = rules
            if rules.crawl_delay:
                self.limiter.slow_down(host_key(self.base), rules.crawl_delay)
        return True

    def _site_files(self, name: str) -> list[str]:
        """``name`` at the site root and at the base path (when that is not the root)."""
        return _unique([f"{self.origin}/{name}", f"{self.origin}{self.scope.prefix}{name}"])

    def _read_llms_txt(self) -> list[str]:
        links: list[str] = []
        for url in self._site_files("llms.txt"):
            if self.config.respect_robots and not self.robots.allows(url):
                self._exclude(url, "disallowed by robots.txt")
                continue
            answer = self._get_discovery(url, MAX_LLMS_TXT_BYTES)
            if not self._discovery_ok(answer, "llms.txt", guessed=True):
                if self.aborted:
                    return []
                continue
            assert isinstance(answer, Response)
            if _is_html(answer):  # a single-page app's catch-all, not an llms.txt
                continue
            listed = parse_llms_txt(decode_declared(answer.body or b"", charset_of(answer.headers.get("content-type"))),
                                    answer.url)
            self.counts["llms_links"] += len(listed)
            links.extend(link.url for link in listed)
        return _unique(links)

    def _read_llms_full(self) -> None:
        """The most specific ``llms-full.txt`` (base path first, then root) as one Markdown page."""
        for url in reversed(self._site_files("llms-full.txt")):
            reason = self._filter_reason(url)
            if reason is not None:
                self._exclude(url, reason)
                continue
            missing = self._fetch(url, 0, "llms-full", max_bytes=self.config.llms_full_max_bytes,
                                  force_kind="markdown", missing_ok=True) is None
            if not missing or self.aborted:
                return

    def _read_sitemaps(self) -> list[str]:
        """Every page URL the sitemaps list (sorted), remembering each ``<lastmod>``."""
        queue: deque[tuple[str, int, bool]] = deque()
        for declared in self.robots_sitemaps:
            url = _safe_canonical(declared, self.origin + "/robots.txt")
            if url is not None and self.scope.same_host(url):
                queue.append((url, 0, False))
            elif url is not None:
                self.out_of_scope.add(url)
        for guess in self._site_files("sitemap.xml"):
            queue.append((guess, 0, True))
        visited: set[str] = set()
        found: dict[str, str | None] = {}
        while queue and not self.aborted:
            url, nesting, guessed = queue.popleft()
            if url in visited:
                continue
            visited.add(url)
            if len(visited) > MAX_SITEMAP_FILES:  # a sanity cap, like max_pages: not a failure
                self.counts["sitemaps_skipped"] = len(queue) + 1
                break
            if guessed and self.config.respect_robots and not self.robots.allows(url):
                continue
            answer = self._get_discovery(url, MAX_SITEMAP_BYTES)
            if not self._discovery_ok(answer, "sitemap", guessed=guessed):
                continue
            assert isinstance(answer, Response)
            try:
                sitemap = parse_sitemap(answer.body or b"")
            except BadSitemapError as exc:
                if not guessed:  # a guessed /sitemap.xml answering with an HTML page is common, not an error
                    self.failures.append(CrawlFailure(url, "bad_sitemap", f"sitemap: {exc.reason}", True,
                                                      answer.status, answer.attempts))
                continue
            self.counts["sitemaps_read"] += 1
            for entry in sitemap.entries:
                loc = _safe_canonical(entry.loc, answer.url)
                if loc is None:
                    continue
                if sitemap.kind == "index":
                    if nesting < MAX_SITEMAP_NESTING and self.scope.same_host(loc):
                        queue.append((loc, nesting + 1, False))
                elif loc not in found or is_newer(entry.lastmod, found[loc]):
                    found[loc] = entry.lastmod
        self.lastmods = found
        self.counts["sitemap_urls"] = len(found)
        return sorted(found)

    # -- pages ----------------------------------------------------------------------------------

    def _visit(self, url: str, depth: int, origin: Origin) -> list[str]:
        """Skip (sitemap says unchanged) or fetch one queued page; returns the links to follow."""
        prior = self.prior.get(url)
        lastmod = self.lastmods.get(url)
        if prior is not None and lastmod and prior.lastmod and not is_newer(lastmod, prior.lastmod):
            self.done.add(url)
            self._add_page(self._unchanged(url, prior, depth, origin, "lastmod", None))
            self._report()
            return list(self._prior_links(prior))
        links = self._fetch(url, depth, origin, max_bytes=self.config.max_page_bytes)
        return links or []

    def _fetch(
        self,
        url: str,
        depth: int,
        origin: Origin,
        *,
        max_bytes: int,
        force_kind: PageKind | None = None,
        missing_ok: bool = False,
    ) -> list[str] | None:
        """GET a page, following redirects hop by hop (each hop checked against scope, filters
        and pages already seen).  Returns the links to follow; ``None`` only when ``missing_ok``
        and the page does not exist (404/410), so the caller can try another location."""
        chain = [url]
        current = url
        while True:
            self.done.add(current)
            prior = self.prior.get(current)
            refuse = None if force_kind else (lambda response, at=current: self._refuse(response, at))
            answer = self.fetcher.get(current, max_bytes=max_bytes, headers=_conditional_headers(prior),
                                      refuse=refuse)
            if isinstance(answer, FetchError):
                return self._failed(answer, url)
            status = answer.status
            if status in REDIRECT_STATUSES:
                target = _safe_canonical(answer.headers.get("location", ""), current)
                problem = self._redirect_problem(url, chain, target, answer, scoped=force_kind is None)
                if problem is not None:
                    return problem
                assert target is not None
                chain.append(target)
                current = target
                continue
            if status == 304 and prior is not None:
                self._add_page(self._unchanged(current, prior, depth, origin, "304", answer))
                return list(self._prior_links(prior))
            if 200 <= status < 300 and force_kind is not None and _is_html(answer):
                # a single-page app answering every path with its index.html: there is no such file
                if missing_ok:
                    return None
                return self._failed(FetchError(current, "unsupported_content_type", "an HTML page was served "
                                               f"where {force_kind} was expected", True, status, answer.attempts), url)
            if 200 <= status < 300:
                return self._received(answer, url, depth, origin, force_kind)
            if missing_ok and status in _GONE:
                return None
            return self._failed(status_error(current, status, answer.attempts), url)

    def _redirect_problem(
        self, url: str, chain: list[str], target: str | None, answer: Response, *, scoped: bool
    ) -> list[str] | None:
        """Links to return (none) when a redirect must not be followed, or None to follow it."""
        status = answer.status
        if target is None:
            return self._failed(FetchError(answer.url, "bad_redirect", f"HTTP {status} without a usable Location "
                                           "header", True, status, answer.attempts), url)
        if target in chain:
            return self._failed(FetchError(answer.url, "redirect_loop", "redirect loop: " + " -> ".join(
                chain + [target]), True, status, answer.attempts), url)
        if len(chain) > MAX_REDIRECTS:
            return self._failed(FetchError(answer.url, "too_many_redirects", f"more than {MAX_REDIRECTS} "
                                           f"redirects: {' -> '.join(chain + [target])}", True, status,
                                           answer.attempts), url)
        inside = self.scope.contains(target) if scoped else self.scope.same_host(target)
        if not inside:
            self._exclude(url, f"redirect out of scope (to {target})")
            if url == self.base:
                self._abort(f"the base URL {url} redirects out of scope to {target}; change the source's URL "
                            "to where the site now lives")
            return []
        reason = self._filter_reason(target, is_base=url == self.base)
        if reason is not None:
            self._exclude(url, f"redirects to {target}, which is excluded: {reason}")
            return []
        if target in self.done:
            if target in self.identities:
                self.counts["duplicates"] += 1
            return []
        return None

    def _refuse(self, response: httpx.Response, url: str) -> FetchError | None:
        content_type = response.headers.get("content-type")
        if not is_refused(content_type, url):
            return None
        return FetchError(url, "unsupported_content_type",
                          f"content type {media_type(content_type)!r} is not a document type we index "
                          "(HTML, Markdown, plain text, PDF); the body was not downloaded",
                          True, response.status_code, 1)

    def _received(
        self, answer: Response, requested: str, depth: int, origin: Origin, force_kind: PageKind | None
    ) -> list[str]:
        content_type = answer.headers.get("content-type")
        body = answer.body or b""
        kind = force_kind or content_kind(content_type, answer.url, body[:1024])
        if kind is None:
            return self._failed(FetchError(
                answer.url, "unsupported_content_type",
                f"content type {media_type(content_type) or 'missing'!r} and the body do not look like a document "
                "type we index (HTML, Markdown, plain text, PDF)", True, answer.status, answer.attempts), requested)
        if kind == "html" and self.renderer is not None and force_kind is None:
            rendered = self._render(answer, body, content_type)
            if rendered is None:
                return []
            body, content_type = rendered, "text/html; charset=utf-8"
        canonical = None
        if kind == "html":
            found = html_links(body, answer.url, charset_of(content_type))
            links, canonical = found.links, found.canonical
        elif kind == "markdown":
            links = markdown_link_urls(decode_declared(body, charset_of(content_type)), answer.url)
        else:
            links = []
        if force_kind is None:
            canonical = canonical or canonical_from_link_header(answer.headers.get("link"), answer.url)
        identity = answer.url
        if canonical and canonical != identity and self.scope.contains(canonical) and (
            self._filter_reason(canonical) is None
        ):
            identity = canonical
        if identity in self.identities:
            self.counts["duplicates"] += 1
            self.consecutive_transient = 0
            return []
        self.done.add(identity)
        self._add_page(FetchedPage(
            url=identity, final_url=answer.url, kind=kind, content_type=content_type, body=body,
            not_modified=False, how="fetched",
            lastmod=self.lastmods.get(identity) or self.lastmods.get(answer.url) or self.lastmods.get(requested),
            etag=answer.headers.get("etag"), last_modified=answer.headers.get("last-modified"), links=links,
            depth=depth, origin=origin, http_status=answer.status,
        ))
        follow = kind in ("html", "markdown") and origin != "llms-full"
        return links if follow else []

    def _render(self, answer: Response, body: bytes, content_type: str | None) -> bytes | None:
        """The page's DOM after its scripts ran, or None (a failure recorded, or the crawl stopped)."""
        assert self.renderer is not None
        try:
            rendered = self.renderer.render(answer.url, body, content_type)
        except ChromiumNotFoundError as error:
            self._abort(f"render_js is on but pages cannot be rendered: {error}")
            return None
        except Exception as error:  # noqa: BLE001 - a browser crash or protocol error fails this page, not the crawl
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            self.failures.append(CrawlFailure(answer.url, "render_failed", f"Chromium could not render the page: "
                                              f"{detail[:300]}", False, answer.status, answer.attempts))
            return None
        self.counts["rendered"] += 1
        self.render_seconds += rendered.seconds
        if rendered.timed_out:
            self.counts["render_timeouts"] += 1
            logger.warning("rendering %s did not reach %r within %g s: its scripts were stopped and the DOM as it "
                           "stood is indexed", answer.url, self.config.render_wait, self.config.render_timeout_s)
        return rendered.html

    def _unchanged(
        self, url: str, prior: PriorPage, depth: int, origin: Origin, how: How, answer: Response | None
    ) -> FetchedPage:
        headers = answer.headers if answer is not None else httpx.Headers()
        content_type = prior.content_type
        return FetchedPage(
            url=url, final_url=url, kind=content_kind(content_type, url) if content_type else None,
            content_type=content_type, body=None, not_modified=True, how=how,
            lastmod=self.lastmods.get(url) or prior.lastmod,
            etag=headers.get("etag") or prior.etag,
            last_modified=headers.get("last-modified") or prior.last_modified,
            links=list(self._prior_links(prior)), depth=depth, origin=origin,
            http_status=answer.status if answer is not None else None,
        )

    @staticmethod
    def _prior_links(prior: PriorPage) -> list[str]:
        return _unique([url for url in (_safe_canonical(link) for link in prior.links) if url])

    def _add_page(self, page: FetchedPage) -> None:
        self.pages.append(page)
        self.identities.add(page.url)
        self.counts["not_modified" if page.not_modified else "fetched"] += 1
        self.consecutive_transient = 0
        if self.on_page is not None:
            self.on_page(page)

    def _failed(self, error: FetchError, requested: str) -> list[str]:
        """Record a failure; a transient one on the base URL (or before the site ever
        answered, or too many in a row) stops the crawl as incomplete."""
        reason = error.reason
        if error.url != requested:
            reason += f" (reached by redirect from {requested})"
        self.failures.append(CrawlFailure(error.url, error.kind, reason, error.permanent, error.http_status,
                                          error.attempts))
        if error.permanent:
            self.consecutive_transient = 0
            return []
        self.consecutive_transient += 1
        if not self.fetcher.reached:
            self._abort(f"site unreachable: {error.url}: {reason}")
        elif requested == self.base:
            self._abort(f"the base URL {self.base} could not be fetched: {reason}")
        elif self.consecutive_transient >= self.config.max_consecutive_failures:
            self._abort(f"{self.consecutive_transient} pages in a row failed transiently (last: {error.url}: "
                        f"{reason}); the site seems to be down")
        prior = self.prior.get(error.url) or self.prior.get(requested)
        return self._prior_links(prior) if prior is not None else []

    # -- reporting ------------------------------------------------------------------------------

    def _report(self) -> None:
        if self.progress is None:
            return
        self.progress(CrawlProgress(
            fetched=self.counts["fetched"], not_modified=self.counts["not_modified"], queued=self.queued,
            excluded=len(self.excluded), failed=len(self.failures), requests=self.fetcher.requests,
            retries=self.fetcher.retries, elapsed_s=self.clock() - self.started,
        ))

    def _result(self) -> CrawlResult:
        reasons = ([self.aborted_reason] if self.aborted_reason else []) + self.incomplete
        stats = {
            "requests": self.fetcher.requests,
            "retries": self.fetcher.retries,
            "fetched": self.counts["fetched"],
            "not_modified": self.counts["not_modified"],
            "excluded": len(self.excluded),
            "out_of_scope": len(self.out_of_scope),
            "capped": self.counts["capped"],
            "duplicates": self.counts["duplicates"],
            "failed": len(self.failures),
            "seconds": round(self.clock() - self.started, 3),
            "sitemap_urls": self.counts["sitemap_urls"],
            "sitemaps_read": self.counts["sitemaps_read"],
            "sitemaps_skipped": self.counts["sitemaps_skipped"],
            "llms_links": self.counts["llms_links"],
        }
        if self.renderer is not None:
            stats.update(rendered=self.counts["rendered"], render_timeouts=self.counts["render_timeouts"],
                         render_seconds=round(self.render_seconds, 3),
                         render_seconds_per_page=round(self.render_seconds / self.counts["rendered"], 3)
                         if self.counts["rendered"] else None,
                         browser_launch_seconds=round(self.renderer.launch_seconds, 3))
        return CrawlResult(
            pages=self.pages, failures=self.failures, excluded=list(self.excluded.items()),
            complete=not reasons, aborted_reason="; ".join(reasons) or None, stats=stats,
        )
