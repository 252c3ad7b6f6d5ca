"""Links out of a page, canonicalised, so the crawler can decide what to follow.

HTML: ``<a href>``/``<area href>`` resolved against ``<base href>`` when the
page has one; ``<link rel=canonical>`` reported separately (it names the page
itself, it is not a link to follow).  Markdown: inline links and reference
definitions, images excluded.  Every http(s) link is returned, in document
order without repeats: scope is the crawler's decision, not the parser's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import lxml.html
from lxml import etree

from knowledge_store.ingest.web.errors import InvalidUrlError
from knowledge_store.ingest.web.urls import canonical_url

_SKIPPED_SCHEMES = ("mailto:", "javascript:", "tel:", "data:", "ftp:", "file:", "sms:")
_MD_INLINE = re.compile(
    r"(?<!!)\[(?:[^\[\]\n]|\[[^\]\n]*\])*\]\(\s*(?:<([^>\n]*)>|([^)\s]+))(?:\s+[\"'(][^)\n]*)?\s*\)"
)
_MD_REFERENCE = re.compile(r"^ {0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_MD_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.MULTILINE | re.DOTALL)
_LINK_HEADER = re.compile(r"<([^>]*)>\s*((?:;\s*[^;,]*)*)")


@dataclass
class PageLinks:
    links: list[str] = field(default_factory=list)
    canonical: str | None = None


def _resolve(href: str | None, base: str) -> str | None:
    if not href:
        return None
    href = href.strip()
    if not href or href.startswith("#") or href.lower().startswith(_SKIPPED_SCHEMES):
        return None
    try:
        return canonical_url(href, base)
    except (InvalidUrlError, ValueError):
        return None


def _unique(urls: list[str | None]) -> list[str]:
    return list(dict.fromkeys(url for url in urls if url))


def html_links(body: bytes, page_url: str, charset: str | None = None) -> PageLinks:
    """Links and ``rel=canonical`` of an HTML page; an unparseable page has none."""
    if not body.strip():
        return PageLinks()
    try:
        parser = lxml.html.HTMLParser(encoding=charset) if charset else None
        root = lxml.html.document_fromstring(body, parser=parser)
    except (etree.ParserError, etree.XMLSyntaxError, LookupError, ValueError):
        return PageLinks()
    base = page_url
    for element in root.iter("base"):
        resolved = _resolve(element.get("href"), page_url)
        if resolved:
            base = resolved
        break
    canonical = None
    for element in root.iter("link"):
        rel = (element.get("rel") or "").lower().split()
        if "canonical" in rel:
            canonical = _resolve(element.get("href"), base)
            if canonical:
                break
    hrefs = [_resolve(element.get("href"), base) for element in root.iter("a", "area")]
    return PageLinks(links=_unique(hrefs), canonical=canonical)


def markdown_link_urls(text: str, page_url: str) -> list[str]:
    """Inline ``[text](url)`` links and ``[ref]: url`` definitions, outside fenced code."""
    text = _MD_FENCE.sub("", text)
    found: list[tuple[int, str]] = [(m.start(), m.group(1) or m.group(2)) for m in _MD_INLINE.finditer(text)]
    found += [(m.start(), m.group(1)) for m in _MD_REFERENCE.finditer(text)]
    found.sort()
    return _unique([_resolve(url, page_url) for _, url in found])


def canonical_from_link_header(value: str | None, page_url: str) -> str | None:
    """``Link: <url>; rel="canonical"`` (how PDFs and other non-HTML bodies declare their canonical URL)."""
    if not value:
        return None
    for match in _LINK_HEADER.finditer(value):
        params = match.group(2).lower()
        if re.search(r"rel\s*=\s*\"?[^\";]*\bcanonical\b", params):
            return _resolve(match.group(1), page_url)
    return None
