"""What a crawl hands back, and what the caller tells it about the previous sync.

Plain dataclasses: the caller (the ingestion stage) turns pages into versioned
documents and failures into failure rows; nothing here knows about the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

PageKind = Literal["html", "markdown", "text", "pdf"]
How = Literal["fetched", "lastmod", "304"]
Origin = Literal["base", "llms.txt", "llms-full", "sitemap", "link"]


@dataclass(frozen=True)
class PriorPage:
    """What the last sync knew about one canonical URL.

    ``links`` lets link following continue through a page that is not
    downloaded again (unchanged per sitemap ``<lastmod>`` or answered 304, or
    failing transiently), so its children are not mistaken for removed pages.
    ``content_type`` is optional; when given, a not-modified page reports it
    (and its kind) instead of ``None``.
    """

    url: str
    lastmod: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    links: tuple[str, ...] = ()
    checksum: str | None = None
    content_type: str | None = None


@dataclass
class FetchedPage:
    """One page of the site.  ``url`` is its identity (canonical form of the
    final URL after redirects, or its in-scope ``rel=canonical``); ``body`` is
    ``None`` when ``not_modified`` (``how`` says why: sitemap ``lastmod`` or a
    304 answer) and the caller reuses what it stored.  ``kind`` is ``None`` only
    for a not-modified page whose prior content type is unknown."""

    url: str
    final_url: str
    kind: PageKind | None
    content_type: str | None
    body: bytes | None
    not_modified: bool
    how: How
    lastmod: str | None
    etag: str | None
    last_modified: str | None
    links: list[str]
    depth: int
    origin: Origin
    http_status: int | None


@dataclass
class CrawlFailure:
    """A URL that could not be fetched.  ``permanent`` failures (404, 410, other
    4xx, unsupported type, too large) are observations: the page is gone or
    unusable.  Transient ones (timeouts, connection errors, 429, 5xx after
    retries) say nothing about the page, so the caller keeps what it had."""

    url: str
    kind: str
    reason: str
    permanent: bool
    http_status: int | None
    attempts: int


@dataclass
class CrawlProgress:
    """Counters after each request; cheap to build, the caller throttles logging."""

    fetched: int
    not_modified: int
    queued: int
    excluded: int
    failed: int
    requests: int
    retries: int
    elapsed_s: float


@dataclass
class CrawlResult:
    """``complete`` is False when the crawl could not observe the whole site
    (site unreachable, robots.txt unavailable, a sitemap or llms.txt failing
    transiently, the site going down mid-crawl): the caller must then not treat
    missing pages as deleted.  ``aborted_reason`` says why in plain words."""

    pages: list[FetchedPage] = field(default_factory=list)
    failures: list[CrawlFailure] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = True
    aborted_reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
