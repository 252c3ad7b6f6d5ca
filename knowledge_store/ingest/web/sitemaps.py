"""Sitemaps (sitemaps.org protocol): page URLs with their ``<lastmod>``, and nested sitemap indexes.

``<lastmod>`` is what lets a re-sync skip unchanged pages without a single
request, so it is parsed leniently (every W3C datetime precision, with or
without a timezone) and compared as an instant.  XML is parsed with entity
resolution and network access off, and gzip is unpacked with a size cap, so a
hostile sitemap cannot blow up memory.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Literal

from lxml import etree

from knowledge_store.ingest.web.errors import BadSitemapError

MAX_SITEMAP_BYTES = 50 * 1024 * 1024  # the protocol's own limit for one uncompressed file

_LASTMOD = re.compile(
    r"^(\d{4})(?:-(\d{2})(?:-(\d{2})"
    r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?\s*(Z|[+-]\d{2}(?::?\d{2})?)?)?)?)?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class SitemapEntry:
    loc: str
    lastmod: str | None


@dataclass
class Sitemap:
    """One sitemap file: ``urlset`` (pages) or ``index`` (more sitemaps); a plain-text sitemap is a ``urlset``."""

    kind: Literal["urlset", "index"]
    entries: list[SitemapEntry] = field(default_factory=list)


def gunzip_if_needed(body: bytes, max_bytes: int = MAX_SITEMAP_BYTES) -> bytes:
    """Unpack ``.xml.gz`` bodies (recognised by the gzip magic, whatever the URL or headers say)."""
    if not body.startswith(b"\x1f\x8b"):
        return body
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise BadSitemapError(f"broken gzip data: {exc}") from None
    if len(data) > max_bytes:
        raise BadSitemapError(f"unpacks to more than {max_bytes} bytes")
    return data


def _local(tag: object) -> str:
    return etree.QName(tag).localname.lower() if isinstance(tag, str) else ""


def _child_text(element: etree._Element, name: str) -> str | None:
    for child in element:
        if _local(child.tag) == name:
            text = (child.text or "").strip()
            return text or None
    return None


def parse_sitemap(body: bytes) -> Sitemap:
    """Parse an XML (urlset or sitemapindex, any namespace) or plain-text sitemap; gzip is unpacked first."""
    data = gunzip_if_needed(body)
    stripped = data.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not stripped.startswith(b"<"):
        lines = (line.strip() for line in stripped.decode("utf-8", "replace").splitlines())
        urls = [line for line in lines if line.startswith(("http://", "https://"))]
        return Sitemap("urlset", [SitemapEntry(url, None) for url in urls])
    parser = etree.XMLParser(resolve_entities=False, no_network=True, recover=True, huge_tree=False)
    try:
        root = etree.fromstring(stripped, parser=parser)
    except etree.XMLSyntaxError as exc:
        raise BadSitemapError(f"not readable XML: {exc}") from None
    if root is None:
        raise BadSitemapError("not readable XML")
    kind = _local(root.tag)
    if kind not in ("urlset", "sitemapindex"):
        raise BadSitemapError(f"root element is <{kind}>, not <urlset> or <sitemapindex>")
    item = "url" if kind == "urlset" else "sitemap"
    entries = []
    for element in root:
        if _local(element.tag) != item:
            continue
        loc = _child_text(element, "loc")
        if loc:
            entries.append(SitemapEntry(loc, _child_text(element, "lastmod")))
    return Sitemap("urlset" if kind == "urlset" else "index", entries)


def parse_lastmod(value: str | None) -> datetime | None:
    """A W3C datetime (``2024``, ``2024-05``, ``2024-05-01``, ``2024-05-01T10:00Z``,
    ``2024-05-01T10:00:00.5+02:00``...) as an aware UTC instant; no timezone
    means UTC.  ``None`` when it cannot be read."""
    if not value:
        return None
    match = _LASTMOD.match(value.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        moment = datetime(
            int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0), int(second or 0),
            int((fraction or "0")[:6].ljust(6, "0")), tzinfo=timezone.utc,
        )
    except ValueError:
        return None
    if zone and zone.upper() != "Z":
        digits = zone[1:].replace(":", "")
        offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0))
        moment = moment - offset if zone[0] == "+" else moment + offset
    return moment


def is_newer(lastmod: str | None, prior_lastmod: str | None) -> bool:
    """True unless both dates are readable and ``lastmod`` is not after ``prior_lastmod``.
    When in doubt the page is fetched: a wasted request beats a stale document."""
    new, old = parse_lastmod(lastmod), parse_lastmod(prior_lastmod)
    if new is None or old is None:
        return True
    return new > old
