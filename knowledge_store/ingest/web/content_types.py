"""Which responses become documents, and as which parser's input.

Decided from the declared Content-Type first; the URL's extension (and a
sniff of the first bytes) only settles the vague cases servers send for static
files (no type, ``application/octet-stream``).  Anything else is refused
before its body is downloaded.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from knowledge_store.ingest.web.results import PageKind

_BY_TYPE: dict[str, PageKind] = {
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "application/pdf": "pdf",
}
_VAGUE = {"", "application/octet-stream", "binary/octet-stream", "application/unknown"}
_BY_EXTENSION: dict[str, PageKind] = {
    ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html", ".xhtml": "html",
    ".pdf": "pdf", ".txt": "text",
}


def media_type(content_type: str | None) -> str:
    """``text/html; charset=utf-8`` -> ``text/html``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def charset_of(content_type: str | None) -> str | None:
    for param in (content_type or "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip("\"'")
    return None


def decode_declared(body: bytes, charset: str | None) -> str:
    """Body text in its declared charset (UTF-8 when none or unknown); undecodable bytes become U+FFFD."""
    try:
        return body.decode(charset or "utf-8", "replace")
    except LookupError:
        return body.decode("utf-8", "replace")


def _extension(url: str) -> str:
    last = urlsplit(url).path.rsplit("/", 1)[-1].lower()
    return last[last.rfind("."):] if "." in last else ""


def is_refused(content_type: str | None, url: str) -> bool:
    """True when the declared type can never become a document (checked before reading the body)."""
    mime = media_type(content_type)
    if mime in _BY_TYPE or mime == "text/plain":
        return False
    return mime not in _VAGUE  # vague types are decided after reading, by extension or sniffing


def content_kind(content_type: str | None, url: str, head: bytes = b"") -> PageKind | None:
    """The parser a body needs, or ``None`` when it is not a supported document.

    ``text/plain`` is Markdown when the path says so (``.md``/``.markdown``):
    many servers and llms.txt-linked files serve Markdown that way.
    """
    mime = media_type(content_type)
    if mime in _BY_TYPE:
        return _BY_TYPE[mime]
    extension = _extension(url)
    if mime == "text/plain":
        return "markdown" if extension in (".md", ".markdown") else "text"
    if mime not in _VAGUE:
        return None
    if extension in _BY_EXTENSION:
        return _BY_EXTENSION[extension]
    start = head[:1024].lstrip().lower()
    if start.startswith(b"%pdf-"):
        return "pdf"
    if start.startswith((b"<!doctype html", b"<html")) or b"<html" in start:
        return "html"
    return None
