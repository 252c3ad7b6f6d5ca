"""Typed errors of the web crawler.  Each carries the offending input so the
caller can show exactly which setting or URL was wrong, without a traceback.

They also subclass ``ValueError``: every one of them is "this value cannot
work", and callers that validate user input generically can catch that.
"""

from __future__ import annotations

from knowledge_store.core.errors import GroundworkError


class WebError(GroundworkError):
    """Base class for errors raised on purpose by ``knowledge_store.ingest.web``."""


class InvalidCrawlConfig(WebError, ValueError):
    """A crawl setting has a value that cannot work (depth out of range, a
    regex that does not compile, a base URL that is not http(s)...)."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")


class InvalidUrlError(WebError, ValueError):
    """A URL cannot be canonicalised (not http(s), no host, bad port)."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url!r}: {reason}")


class BadSitemapError(WebError, ValueError):
    """A sitemap body is not a sitemap we can read (broken gzip, too big once unpacked)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
