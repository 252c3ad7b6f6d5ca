"""Web source crawl and re-sync cost on a generated loopback documentation site.

    .venv/bin/python bench/web_crawl.py [--pages 300] [--threads 2] [--out docs/benchmarks/web_crawl.md]

Serves N generated HTML pages (a link tree, a sitemap with <lastmod>) from
127.0.0.1 and measures:
1. the crawler alone at the default politeness (5 requests/s per host): pages/min
   and the smallest gap between two requests the server saw;
2. the crawler alone with politeness off (its own overhead);
3. a first sync of the site as a web source (crawl, parse, chunk, embed, publish);
4. a no-change re-sync (sitemap lastmod skips: requests made, seconds);
5. a re-sync after 10 pages changed (their lastmod bumped).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest_throughput import machine  # noqa: E402
from bench.report import publish  # noqa: E402

WORDS = ("valve pressure gasket torque sensor relay firmware calibration bracket manifold pump filter "
         "coupling thermostat actuator controller harness bearing seal nozzle").split()


class GeneratedSite:
    """N pages under /docs/: page i links to its children 3i+1..3i+3; a sitemap lists all with lastmod."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self.version = {i: 1 for i in range(pages)}
        self.hits: list[tuple[float, str]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # silence
                pass

            def do_GET(self):  # noqa: N802
                site.hits.append((time.monotonic(), self.path))
                status, ctype, body = site.answer(self.path)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page(self, i: int) -> str:
        words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(60)]
        sections = "".join(
            f'<h2 id="s{s}">Section {s} of page {i}</h2><p>Step {s}: check the {" ".join(words[s * 12:(s + 1) * 12])} '
            f"before revision {self.version[i]} of procedure {i}.</p>" for s in range(4)
        )
        links = "".join(f'<li><a href="/docs/p{c}">page {c}</a></li>' for c in range(3 * i + 1, 3 * i + 4) if c < self.pages)
        return f"<!doctype html><html><head><title>Page {i}</title></head><body><main><h1>Page {i}</h1>{sections}<ul>{links}</ul></main></body></html>"

    def answer(self, path: str) -> tuple[int, str, str]:
        if path == "/robots.txt":
            return 200, "text/plain", f"User-agent: *\nAllow: /\nSitemap: {self.origin}/sitemap.xml\n"
        if path == "/sitemap.xml":
            urls = "".join(
                f"<url><loc>{self.origin}/docs/p{i}</loc><lastmod>2024-01-{min(28, self.version[i]):02d}</lastmod></url>"
                for i in range(self.pages)
            )
            return 200, "application/xml", f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
        if path in ("/docs/", "/docs"):
            return 200, "text/html", '<html><body><main><h1>Docs</h1><a href="/docs/p0">start</a></main></body></html>'
        if path.startswith("/docs/p") and path[7:].isdigit() and int(path[7:]) < self.pages:
            return 200, "text/html", self.page(int(path[7:]))
        return 404, "text/plain", "not found"

    def min_gap_ms(self) -> float:
        times = sorted(t for t, _ in self.hits)
        gaps = [b - a for a, b in zip(times, times[1:])]
        return 1000 * min(gaps) if gaps else 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "web_crawl.md")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"

    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest.run import run_sync
    from knowledge_store.ingest.sources import add_source
    from knowledge_store.ingest.web import CrawlConfig, crawl
    from knowledge_store.models.embeddings import Embedder
    from knowledge_store.storage.store import store_connection

    site = GeneratedSite(args.pages)
    base = f"{site.origin}/docs/"
    depth = 5  # the tree is ~log3(N) deep; the sitemap lists every page anyway

    started = time.perf_counter()
    polite = crawl(CrawlConfig(base_url=base, depth=depth, max_pages=args.pages + 10))
    polite_s = time.perf_counter() - started
    polite_gap = site.min_gap_ms()
    site.hits.clear()
    started = time.perf_counter()
    fast = crawl(CrawlConfig(base_url=base, depth=depth, max_pages=args.pages + 10, requests_per_second=10_000))
    fast_s = time.perf_counter() - started

    embedder = Embedder(Settings().model_path, batch_size=32, torch_threads=args.threads).load()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "empty").mkdir()
        settings = Settings(data_dir=tmp / "data", sources=[tmp / "empty"])
        with store_connection(settings.store_path) as conn:
            add_source(conn, "bench", "web", base, {"depth": depth, "max_pages": args.pages + 10, "requests_per_second": 10_000})
        started = time.perf_counter()
        first = run_sync(settings, embedder, names=["bench"])
        first_s = time.perf_counter() - started
        site.hits.clear()
        started = time.perf_counter()
        noop = run_sync(settings, embedder, names=["bench"])
        noop_s = time.perf_counter() - started
        noop_requests = len(site.hits)
        for i in range(0, args.pages, max(1, args.pages // 10)):
            site.version[i] += 1
        site.hits.clear()
        started = time.perf_counter()
        changed = run_sync(settings, embedder, names=["bench"])
        changed_s = time.perf_counter() - started
        changed_requests = len(site.hits)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    pages = polite.stats["fetched"]
    lines = [
        "## Web sources: crawl and re-sync (issue 6)",
        "",
        f"Date: {date}. Machine: {machine()}. Torch threads: {args.threads}. Site: {args.pages} generated HTML "
        "pages on a loopback server (a link tree plus a sitemap with `<lastmod>`). "
        "Reproduce: `.venv/bin/python bench/web_crawl.py`.",
        "",
        "| measurement | result |",
        "|---|---|",
        f"| crawl alone, default politeness (5 requests/s per host) | {pages} pages in {polite_s:.1f} s = "
        f"{60 * pages / polite_s:,.0f} pages/min; {polite.stats['requests']} requests = "
        f"{polite.stats['requests'] / polite_s:.2f} requests/s; smallest gap between two arrivals at the server "
        f"{polite_gap:.0f} ms (the client spaces request starts 200 ms apart; arrivals jitter by a few ms) |",
        f"| crawl alone, politeness off (crawler overhead) | {fast.stats['fetched']} pages in {fast_s:.2f} s = "
        f"{fast.stats['fetched'] / fast_s:,.0f} pages/s |",
        f"| first sync of the site (crawl + parse + chunk + embed + publish) | {first_s:.1f} s: {first.summary}; "
        f"{first.chunk.chunks} chunks = {60 * first.raw.added / first_s:,.0f} pages/min |",
        f"| no-change re-sync (sitemap `<lastmod>` skips) | {noop_s:.2f} s, {noop_requests} HTTP requests "
        f"(robots.txt, sitemap, the base page; 0 page downloads); {noop.summary} |",
        f"| re-sync after {changed.raw.updated} pages changed | {changed_s:.1f} s, {changed_requests} HTTP requests; "
        f"{changed.summary} |",
        f"| peak RSS of the benchmark process | {rss_mb:,.0f} MB (model loaded; page bodies go to the cache as they arrive, not held in memory) |",
        "",
    ]
    publish(lines, args.out)
    site.server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
