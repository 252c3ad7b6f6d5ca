"""URL identity and crawl scope.

Two spellings of the same page must map to one key, or a re-sync would see a
"new" document every time a link gains a ``utm_source`` or a ``#section``.
:func:`canonical_url` is that key: it only applies rewrites that do not change
which resource a server returns (RFC 3986 normalisation plus dropping
fragments and well-known tracking parameters).  It does *not* strip trailing
slashes or ``index.html``: servers treat those differently, and redirects or
``<link rel=canonical>`` settle them with the server's own answer.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit

from knowledge_store.ingest.web.errors import InvalidUrlError

_DEFAULT_PORTS = {"http": 80, "https": 443}
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_STRIPPED_CHARS = re.compile(r"[\t\r\n]")
# Parameters that only say where a click came from; the page is the same without them.
_TRACKING_EXACT = frozenset({
    "gclid", "gclsrc", "dclid", "gbraid", "wbraid", "fbclid", "msclkid", "yclid", "twclid", "ttclid",
    "mc_cid", "mc_eid", "_ga", "_gl", "_hsenc", "_hsmi", "mkt_tok", "igshid", "ref_src", "ref_url",
    "oly_anon_id", "oly_enc_id", "vero_id", "vero_conv", "wickedid", "__s", "s_kwcid", "ef_id",
})
_TRACKING_PREFIXES = ("utm_", "pk_", "mtm_")
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_PART_SAFE = "/?%:@!$'()*+,;=-._~"


def is_tracking_param(name: str) -> bool:
    key = unquote(name).lower()
    return key in _TRACKING_EXACT or key.startswith(_TRACKING_PREFIXES)


def _normalize_escapes(text: str) -> str:
    """Upper-case percent escapes and decode the ones that encode unreserved characters (RFC 3986 6.2.2)."""

    def fix(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else "%" + match.group(1).upper()

    return _ESCAPE.sub(fix, text)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4, so ``/docs/a/../b`` and ``/docs/b`` are one page."""
    if "." not in path:
        return path
    output: list[str] = []
    segments = path.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == ".":
            if last:
                output.append("")
            continue
        if segment == "..":
            if len(output) > 1:
                output.pop()
            if last:
                output.append("")
            continue
        output.append(segment)
    result = "/".join(output)
    return result if result.startswith("/") else "/" + result


def _canonical_query(query: str) -> str:
    parts = [part for part in query.split("&") if part and not is_tracking_param(part.split("=", 1)[0])]
    parts = [quote(_normalize_escapes(part), safe=_QUERY_PART_SAFE) for part in parts]
    # Sort by name only (stable): repeated parameters keep their order, which some servers rely on.
    parts.sort(key=lambda part: part.split("=", 1)[0])
    return "&".join(parts)


def _canonical_host(url: str, host: str) -> str:
    host = host.rstrip(".").lower()
    if not host:
        raise InvalidUrlError(url, "has no host")
    if ":" in host:  # IPv6 literal; urlsplit removed the brackets
        return f"[{host}]"
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise InvalidUrlError(url, f"host is not a valid international domain name ({exc})") from None
    return host


def canonical_url(url: str, base: str | None = None) -> str:
    """The identity of a page URL: resolved against ``base``, scheme and host
    lower-cased, default port dropped, dot segments removed, percent escapes
    normalised, fragment and tracking parameters dropped, remaining query
    parameters sorted by name, empty path written as ``/``.

    Raises :class:`InvalidUrlError` for anything that is not an absolute
    http(s) URL after resolution.
    """
    cleaned = _STRIPPED_CHARS.sub("", url.strip())
    if base is not None:
        cleaned = urljoin(base, cleaned)
    parts = urlsplit(cleaned)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise InvalidUrlError(url, "is not an absolute http(s) URL")
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidUrlError(url, f"has an invalid port ({exc})") from None
    host = _canonical_host(url, parts.hostname or "")
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    if parts.username is not None:
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{netloc}"
    path = quote(_normalize_escapes(_remove_dot_segments(parts.path or "/")), safe=_PATH_SAFE)
    return urlunsplit((scheme, netloc, path, _canonical_query(parts.query), ""))


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a canonical URL (where robots.txt, llms.txt and sitemap.xml live)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def host_key(url: str) -> str:
    """The politeness key: one rate limit per host and port, whatever the scheme."""
    return urlsplit(url).netloc.lower()


@dataclass(frozen=True)
class Scope:
    """Which URLs a crawl may follow: the base URL's host and everything under its path prefix.

    ``https://h/docs/`` covers ``https://h/docs/...`` (and ``/docs`` itself, which
    usually redirects there).  A base without a trailing slash covers its
    directory when its last segment looks like a file (``/docs/index.html``
    covers ``/docs/``), otherwise the path as a directory (``/docs`` covers
    ``/docs/...``).  http and https on the same host are the same site: an
    ``http://`` link on an https site is not "another site".
    """

    netloc: str
    prefix: str

    @classmethod
    def from_base(cls, base_url: str) -> Scope:
        parts = urlsplit(canonical_url(base_url))
        path = parts.path
        if path.endswith("/"):
            prefix = path
        elif "." in path.rsplit("/", 1)[-1]:
            prefix = path[: path.rfind("/") + 1]
        else:
            prefix = path + "/"
        return cls(netloc=parts.netloc, prefix=prefix)

    def contains(self, url: str) -> bool:
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS or parts.netloc != self.netloc:
            return False
        path = parts.path or "/"
        return path.startswith(self.prefix) or path == self.prefix.rstrip("/")

    def same_host(self, url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme in _DEFAULT_PORTS and parts.netloc == self.netloc
