"""A small documentation web site on 127.0.0.1 for crawler and sync tests (never the internet).

``DocSite`` serves ``routes`` (path -> reply spec) from a thread and records
every request in ``hits``.  Routes are a plain dict that may be changed between
two crawls (a page edited, removed, a new link) - that is how end-to-end sync
tests simulate a site changing.  A route is one of:

- a :class:`Reply` (status, body, content type, headers, optional delay or
  endless stream);
- a list of replies, served in order, the last one repeating ("429, then 200");
- a callable ``(Request) -> Reply`` for anything conditional (ETags, 304s).

Lookup is by path *with* query first, then by path alone; anything else is 404.

``default_site()`` builds a site exercising every crawler rule; see its
docstring for the map.  For re-sync tests: edit ``site.lastmods`` (what the
sitemap says changed), ``site.page(...)``/``site.remove(...)`` (a page edited or
gone), ``etagged(reply)`` (a page answering 304 to a matching If-None-Match),
and ``site.clear_hits()`` between crawls.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Union
from urllib.parse import urlsplit

HTML = "text/html; charset=utf-8"


@dataclass
class Reply:
    status: int = 200
    body: bytes | str = b""
    content_type: str | None = HTML
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # wait before answering (client timeouts)
    stream: Callable[[], Iterable[bytes]] | None = None  # body without Content-Length, until the client hangs up

    def body_bytes(self) -> bytes:
        return self.body.encode("utf-8") if isinstance(self.body, str) else self.body


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # with query string
    headers: dict[str, str]  # lower-cased names


@dataclass(frozen=True)
class Hit:
    method: str
    path: str  # with query string
    headers: dict[str, str]  # lower-cased names
    at: float  # time.monotonic() when the request arrived


Route = Union[Reply, list[Reply], Callable[[Request], Reply]]


def redirect(location: str, status: int = 301) -> Reply:
    return Reply(status=status, content_type=None, headers={"Location": location})


def markdown(text: str, content_type: str = "text/markdown; charset=utf-8") -> Reply:
    return Reply(body=text, content_type=content_type)


def not_found() -> Reply:
    return Reply(status=404, body="not found", content_type="text/plain")


def doc_page(
    title: str,
    sections: Iterable[tuple[str, str, str]] = (),
    links: Iterable[str | tuple[str, str]] = (),
    canonical: str | None = None,
    base_href: str | None = None,
) -> str:
    """An HTML docs page: ``sections`` are (anchor id, heading, paragraph); ``links`` are hrefs
    or (href, text) pairs, put in a nav list *and* the article so both kinds of markup are seen."""
    head = f"<title>{html.escape(title)}</title>"
    if canonical:
        head += f'<link rel="canonical" href="{html.escape(canonical)}">'
    if base_href:
        head += f'<base href="{html.escape(base_href)}">'
    parts = [f"<!doctype html><html><head>{head}</head><body><main><h1 id=\"top\">{html.escape(title)}</h1>"]
    for anchor, heading, text in sections:
        parts.append(f'<h2 id="{html.escape(anchor)}">{html.escape(heading)}</h2><p>{html.escape(text)}</p>')
    items = []
    for link in links:
        href, text = (link, link) if isinstance(link, str) else link
        items.append(f'<li><a href="{html.escape(href)}">{html.escape(text)}</a></li>')
    parts.append(f"<ul>{''.join(items)}</ul></main></body></html>")
    return "".join(parts)


def etagged(reply: Reply) -> Callable[[Request], Reply]:
    """A route that supports conditional requests: ETag from the body's hash, 304 on a matching
    ``If-None-Match``.  Wrap a page with it to exercise the crawler's 304 path; change the page
    (assign a new ``etagged(...)``) and the ETag changes with it."""
    tag = '"' + hashlib.sha256(reply.body_bytes()).hexdigest()[:16] + '"'

    def answer(request: Request) -> Reply:
        if request.headers.get("if-none-match") == tag:
            return Reply(status=304, body=b"", content_type=None, headers={"ETag": tag})
        return Reply(status=reply.status, body=reply.body, content_type=reply.content_type,
                     headers={**reply.headers, "ETag": tag})

    return answer


def sitemap_xml(entries: Iterable[tuple[str, str | None]], index: bool = False) -> str:
    tag, item = ("sitemapindex", "sitemap") if index else ("urlset", "url")
    rows = []
    for loc, lastmod in entries:
        stamp = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
        rows.append(f"<{item}><loc>{html.escape(loc)}</loc>{stamp}</{item}>")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{tag} xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(rows) + f"</{tag}>")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    site: DocSite


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection: the simplest thing that works

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - silence the default stderr log
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        site = self.server.site
        headers = {name.lower(): value for name, value in self.headers.items()}
        request = Request(self.command, self.path, headers)
        reply = site._answer(request)
        if reply.delay_s:
            time.sleep(reply.delay_s)
        self.send_response(reply.status)
        if reply.content_type:
            self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.stream is not None:
            self.end_headers()
            self._stream(site, reply.stream())
            return
        body = reply.body_bytes()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _stream(self, site: DocSite, chunks: Iterable[bytes]) -> None:
        sent = 0
        try:
            for chunk in chunks:
                self.wfile.write(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with site._lock:
                site.streamed[urlsplit(self.path).path] = sent


class DocSite:
    """A loopback HTTP site.  The port is bound on construction, so ``url()`` works
    before the server starts; ``with DocSite() as site:`` serves until the block ends."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: list[Hit] = []
        self.streamed: dict[str, int] = {}  # path -> bytes written before the client hung up
        # path -> <lastmod> (or None) of the pages the default site's /sitemap-docs.xml lists; the
        # sitemap is rendered from it on every request, so tests edit this dict to "publish" a change
        self.lastmods: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.site = self
        self._thread: threading.Thread | None = None
        host, port = self._server.server_address[:2]
        self.origin = f"http://{host}:{port}"

    def url(self, path: str = "/") -> str:
        return self.origin + path

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> DocSite:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> DocSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- routes ---------------------------------------------------------------------------------

    def page(self, path: str, title: str, sections: Iterable[tuple[str, str, str]] = (),
             links: Iterable[str | tuple[str, str]] = (), **headers: str) -> None:
        """Serve a docs page at ``path`` (replacing whatever was there)."""
        self.routes[path] = Reply(body=doc_page(title, sections, links), headers=dict(headers))

    def sitemap_route(self, lastmods: dict[str, str | None] | None = None) -> Callable[[Request], Reply]:
        """A route rendering a urlset from ``lastmods`` (path -> lastmod) at request time
        (``self.lastmods`` when not given)."""

        def answer(request: Request) -> Reply:
            entries = (self.lastmods if lastmods is None else lastmods).items()
            return Reply(body=sitemap_xml([(self.url(path), lastmod) for path, lastmod in entries]),
                         content_type="application/xml")

        return answer

    def remove(self, path: str) -> None:
        """The page disappears (404 from now on)."""
        self.routes.pop(path, None)

    def _answer(self, request: Request) -> Reply:
        with self._lock:
            self.hits.append(Hit(request.method, request.path, request.headers, time.monotonic()))
            route = self.routes.get(request.path)
            if route is None:
                route = self.routes.get(urlsplit(request.path).path)
            if isinstance(route, list):
                reply = route.pop(0) if len(route) > 1 else route[0]
            else:
                reply = route
        if reply is None:
            return not_found()
        if callable(reply) and not isinstance(reply, Reply):
            return reply(request)
        return reply

    # -- assertions -----------------------------------------------------------------------------

    def paths(self) -> list[str]:
        """Requested paths (with query), in arrival order."""
        with self._lock:
            return [hit.path for hit in self.hits]

    def count(self, path: str) -> int:
        return sum(1 for hit in self.paths() if hit == path)

    def requested(self, path: str) -> bool:
        return self.count(path) > 0

    def clear_hits(self) -> None:
        with self._lock:
            self.hits.clear()
            self.streamed.clear()


def endless(chunk_size: int = 64 * 1024) -> Callable[[], Iterator[bytes]]:
    """A stream factory for a body that never ends (the client must stop reading)."""

    def chunks() -> Iterator[bytes]:
        block = b"x" * chunk_size
        while True:
            yield block

    return chunks


def default_site() -> DocSite:
    """A docs site under ``/docs/`` exercising every crawler rule (not started; use ``with``).

    =============================  ==========================================================
    ``/robots.txt``                disallows ``/docs/private/``; Sitemap: /sitemap.xml and
                                   /sitemap-extra.xml.gz
    ``/sitemap.xml``               a sitemap *index* -> ``/sitemap-docs.xml``
    ``/sitemap-docs.xml``          rendered from ``site.lastmods``: /docs/, install (2024-05-01), configure
                                   (2024-05-02T10:00:00+00:00), reference/api (2024-05-03),
                                   orphan (only listed here), private/secret, /blog/post
    ``/sitemap-extra.xml.gz``      gzipped urlset: /docs/faq (2024-04-01)
    ``/llms.txt``                  quickstart.md, reference/api, /blog/ (out of scope)
    ``/llms-full.txt``             one Markdown file with two H2 sections
    ``/docs/``                     index linking to everything below (+ mailto:, an external site)
    ``/docs/quickstart.md``        Markdown, links to guide/install
    ``/docs/guide/install``        headings with ids; links to configure (with utm_/fbclid
                                   params and a fragment) and guide/advanced
    ``/docs/guide/advanced``       links to guide/deep (one hop deeper)
    ``/docs/guide/configure``      ``rel=canonical`` to itself
    ``/docs/reference/api``        the API page; ``/docs/reference/api.html`` is a copy whose
                                   ``rel=canonical`` points at it
    ``/docs/changelog/``           tests exclude it by regex
    ``/docs/old``                  301 -> ``/docs/new``
    ``/docs/flaky``                429 (Retry-After: 1) once, then 200
    ``/docs/missing``              404 (not in routes)
    ``/docs/logo.png``             image/png (unsupported)
    ``/docs/private/secret``       disallowed by robots.txt
    =============================  ==========================================================
    """
    site = DocSite()
    u = site.url
    site.lastmods.update({
        "/docs/": None,
        "/docs/guide/install": "2024-05-01",
        "/docs/guide/configure": "2024-05-02T10:00:00+00:00",
        "/docs/reference/api": "2024-05-03",
        "/docs/orphan": "2024-05-03",
        "/docs/private/secret": None,
        "/blog/post": None,
    })
    site.routes.update({
        "/robots.txt": Reply(
            body=(
                "# test robots\nUser-agent: *\nDisallow: /docs/private/\n\n"
                f"Sitemap: {u('/sitemap.xml')}\nSitemap: {u('/sitemap-extra.xml.gz')}\n"
            ),
            content_type="text/plain",
        ),
        "/sitemap.xml": Reply(body=sitemap_xml([(u("/sitemap-docs.xml"), "2024-05-03")], index=True),
                              content_type="application/xml"),
        "/sitemap-docs.xml": site.sitemap_route(),
        "/sitemap-extra.xml.gz": Reply(body=gzip.compress(sitemap_xml([(u("/docs/faq"), "2024-04-01")]).encode()),
                                       content_type="application/gzip"),
        "/llms.txt": markdown(
            "# Example Docs\n\n> Documentation for Example.\n\n## Docs\n\n"
            "- [Quickstart](/docs/quickstart.md): start here\n"
            f"- [API reference]({u('/docs/reference/api')}): every call\n\n"
            "## Optional\n\n- [Blog](/blog/): news, not docs\n",
            content_type="text/plain; charset=utf-8",
        ),
        "/llms-full.txt": markdown(
            "# Example Docs\n\n## Quickstart\n\nInstall it and run it.\n\n## API\n\nCall `example.run()`.\n",
            content_type="text/plain; charset=utf-8",
        ),
        "/docs/": Reply(body=doc_page("Example Docs", [("intro", "Introduction", "Welcome to the docs.")], [
            "guide/install", "guide/configure", "reference/api", "reference/api.html", "changelog/", "old",
            "flaky", "missing", "logo.png", "private/secret", "mailto:team@example.com", "javascript:void(0)",
            "https://example.com/elsewhere", "/blog/",
        ])),
        "/docs/quickstart.md": markdown(
            "# Quickstart\n\nFirst [install](guide/install), then read the [API](reference/api).\n"
            "![diagram](diagram.png)\n",
        ),
        "/docs/guide/install": Reply(body=doc_page(
            "Install", [("requirements", "Requirements", "Python 3.11."), ("steps", "Steps", "pip install example.")],
            ["configure?utm_source=docs&utm_medium=link#options", "configure?fbclid=abc", "advanced", "../"],
        )),
        "/docs/guide/advanced": Reply(body=doc_page("Advanced", [("tuning", "Tuning", "Turn the knobs.")],
                                                    ["deep"])),
        "/docs/guide/deep": Reply(body=doc_page("Deep", [("depths", "Depths", "Three hops from the index.")])),
        "/docs/guide/configure": Reply(body=doc_page(
            "Configure", [("options", "Options", "Set EXAMPLE_HOME.")], canonical=u("/docs/guide/configure"),
        )),
        "/docs/reference/api": Reply(body=doc_page("API", [("run", "run()", "Runs the example.")])),
        "/docs/reference/api.html": Reply(body=doc_page(
            "API", [("run", "run()", "Runs the example.")], canonical="/docs/reference/api",
        )),
        "/docs/orphan": Reply(body=doc_page("Orphan", [("alone", "Alone", "Only the sitemap knows me.")])),
        "/docs/faq": Reply(body=doc_page("FAQ", [("why", "Why?", "Because.")])),
        "/docs/changelog/": Reply(body=doc_page("Changelog", [("v1", "1.0", "First release.")])),
        "/docs/old": redirect("/docs/new"),
        "/docs/new": Reply(body=doc_page("New home", [("moved", "Moved", "This page moved here.")])),
        "/docs/flaky": [
            Reply(status=429, body="slow down", content_type="text/plain", headers={"Retry-After": "1"}),
            Reply(body=doc_page("Flaky", [("ok", "OK", "Eventually served.")])),
        ],
        "/docs/logo.png": Reply(body=b"\x89PNG\r\n\x1a\n" + b"\0" * 64, content_type="image/png"),
        "/docs/private/secret": Reply(body=doc_page("Secret", [("s", "Secret", "Robots say no.")])),
    })
    return site
