"""Stage 1 for web sources: crawl a site and hand its pages to the versioning rules.

The crawler (``knowledge_store.ingest.web``) decides what to fetch; this module turns
its result into what the folder scan produces, so web pages follow exactly the
same re-sync rules as files:

- every fetched body is written to a content-addressed cache file
  (``<data_dir>/web/<source_id>/<sha256>.<ext>``) that the parse stage reads and
  checks like any file; the document's ``url`` is the page URL, so a citation
  links to ``page-url#section-anchor``;
- a page the sitemap says is unchanged (``<lastmod>``), or that answers 304 to
  a conditional request, costs no download: it is reported with the checksum
  and cache file of the version already stored, so it counts as unchanged;
- a page that answers 404/410, or that the crawl no longer reaches, is removed
  (soft-deleted); a page that failed transiently keeps its current version;
- a crawl that could not reach the site at all deletes nothing.

``web_pages`` keeps per-URL state between syncs (validators, lastmod, the
links the page had, so link following still works through skipped pages).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.raw_documents import (
    ScanFailure,
    ScanResult,
    SourceFile,
    SourceFolder,
    doc_id_for,
    record_raw_documents,
)
from knowledge_store.ingest.sources import WEB_DEFAULTS, Source, get_source
from knowledge_store.ingest.sync_runs import start_sync_run
from knowledge_store.ingest.web import CrawlConfig, CrawlResult, FetchedPage, PriorPage, crawl
from knowledge_store.ingest.web.content_types import charset_of
from knowledge_store.storage.store import store_connection, transaction, utcnow

EXTENSIONS = {"html": ".html", "markdown": ".md", "text": ".txt", "pdf": ".pdf"}

ProgressCallback = Callable[[str, dict[str, Any]], None]


@dataclass
class WebSourceOutcome:
    source: Source
    files: list[SourceFile] = field(default_factory=list)
    failures: list[ScanFailure] = field(default_factory=list)
    excluded: int = 0
    complete: bool = True
    aborted_reason: str | None = None
    pages: list[FetchedPage] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    excluded_preview: list[tuple[str, str]] = field(default_factory=list)
    transient_urls: set[str] = field(default_factory=set)  # failed for now: their state is kept
    partial: bool = False  # a retry of single URLs: forget nothing

    @property
    def capped(self) -> bool:
        """The page cap stopped the crawl: pages it did not reach are kept, not removed."""
        return bool(self.stats.get("capped"))


def cache_dir(settings: Settings, source_id: str) -> Path:
    return settings.data_dir / "web" / source_id


def crawl_config_for(source: Source, settings: Settings) -> CrawlConfig:
    """The crawler's configuration from the source's stored options (defaults filled in)."""
    options = {**WEB_DEFAULTS, **source.config}
    return CrawlConfig(
        base_url=source.location,
        depth=int(options["depth"]),
        include=tuple(options["include"]),
        exclude=tuple(options["exclude"]),
        respect_robots=bool(options["respect_robots"]),
        requests_per_second=float(options["requests_per_second"]),
        max_pages=int(options["max_pages"]),
        use_llms_txt=bool(options["use_llms_txt"]),
        use_sitemap=bool(options["use_sitemap"]),
        llms_full_max_bytes=int(float(options["llms_full_max_mb"]) * 1024 * 1024),
        max_page_bytes=settings.max_file_bytes,
        timeout_s=settings.web_timeout_s,
        max_retries=settings.web_max_retries,
        backoff_base_s=settings.web_backoff_base_s,
        max_backoff_s=settings.web_max_backoff_s,
        # a Dagster run and an API sync crawling at once share each host's request budget
        politeness_dir=str(settings.data_dir / "web" / ".hosts"),
        render_js=bool(options["render_js"]),
        render_timeout_s=settings.web_render_timeout_s,
        render_wait=settings.web_render_wait,
        chromium_path=str(settings.chromium_path),
    )


def load_prior_pages(
    conn: duckdb.DuckDBPyConnection, source_id: str, revalidate_days: float | None = None
) -> dict[str, PriorPage]:
    """What the last syncs know per canonical URL - only where the cached body is still on disk,
    so a skipped fetch can always be answered with a real file and checksum.

    A page not validated with the server for ``revalidate_days`` loses its sitemap
    ``<lastmod>`` here, so it is requested again (conditionally: a 304 costs no download):
    a sitemap whose dates lag behind the pages cannot hide a change for longer than that.
    """
    rows = conn.execute(
        "SELECT url, lastmod, etag, last_modified, links, checksum, body_path, content_type, fetched_at "
        "FROM web_pages WHERE source_id = ?",
        [source_id],
    ).fetchall()
    stale_before = utcnow() - timedelta(days=revalidate_days) if revalidate_days is not None else None
    prior: dict[str, PriorPage] = {}
    for url, lastmod, etag, last_modified, links, checksum, body_path, content_type, fetched_at in rows:
        if not checksum or not body_path or not os.path.isfile(body_path):
            continue
        if stale_before is not None and (fetched_at is None or fetched_at < stale_before):
            lastmod = None
        prior[url] = PriorPage(
            url=url, lastmod=lastmod, etag=etag, last_modified=last_modified,
            links=tuple(json.loads(links) if isinstance(links, str) else (links or [])), checksum=checksum,
            content_type=content_type,
        )
    return prior


_UTF8 = {"utf-8", "utf8", "us-ascii", "ascii"}


def utf8_body(body: bytes, content_type: str | None, kind: str) -> bytes:
    """Text bodies whose HTTP header declares another charset, re-encoded as UTF-8 with a BOM.

    The charset lives in the response header, which the cache file does not keep; the
    parsers would otherwise guess.  The BOM outranks any ``<meta charset>`` in the page
    (which would now be wrong), for BeautifulSoup and for the text decoder alike.
    """
    charset = (charset_of(content_type) or "").lower()
    if kind not in ("html", "markdown", "text") or not charset or charset in _UTF8:
        return body
    try:
        return b"\xef\xbb\xbf" + body.decode(charset).encode("utf-8")
    except (LookupError, UnicodeDecodeError):
        return body  # unknown or wrong charset: leave the bytes to the parser's own detection


def _write_body(directory: Path, body: bytes, kind: str) -> tuple[Path, str]:
    checksum = hashlib.sha256(body).hexdigest()
    path = directory / f"{checksum[:32]}{EXTENSIONS.get(kind, '.bin')}"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".part")
        with open(tmp, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    return path, checksum


def body_writer(settings: Settings, source_id: str) -> tuple[Callable[[FetchedPage], None], dict[str, tuple[Path, str, int]]]:
    """An ``on_page`` callback that writes each fetched body to the cache as it arrives and drops
    it from memory (a site of large PDFs must not sit in RAM), and the url -> (path, sha256, size) it fills."""
    written: dict[str, tuple[Path, str, int]] = {}
    directory = cache_dir(settings, source_id)

    def write(page: FetchedPage) -> None:
        if page.not_modified or page.body is None:
            return
        body = utf8_body(page.body, page.content_type, page.kind or "")
        path, checksum = _write_body(directory, body, page.kind or "")
        written[page.url] = (path, checksum, len(body))
        page.body = None

    return write, written


def outcome_from_crawl(
    settings: Settings, source: Source, result: CrawlResult, prior: dict[str, PriorPage], prior_paths: dict[str, str],
    written: dict[str, tuple[Path, str, int]] | None = None,
) -> WebSourceOutcome:
    """Express the crawl as scan files and failures (bodies cached by ``body_writer``, or here)."""
    written = {} if written is None else written
    outcome = WebSourceOutcome(source=source, complete=result.complete, aborted_reason=result.aborted_reason,
                               stats=dict(result.stats), excluded=len(result.excluded),
                               excluded_preview=list(result.excluded[:50]))
    directory = cache_dir(settings, source.source_id)
    for page in result.pages:
        if page.not_modified:
            known = prior.get(page.url)
            body_path = prior_paths.get(page.url)
            if known is None or not body_path:
                continue  # cannot happen unless the cache vanished mid-run; the next sync fetches it again
            path, checksum = Path(body_path), str(known.checksum)
            size = path.stat().st_size if path.exists() else 0
        elif page.url in written:
            path, checksum, size = written[page.url]
        else:
            if page.body is None:
                continue
            body = utf8_body(page.body, page.content_type, page.kind or "")
            path, checksum = _write_body(directory, body, page.kind or "")
            size = len(body)
        outcome.pages.append(page)
        outcome.files.append(SourceFile(
            source_id=source.source_id, path=path, relative_path=page.url, size_bytes=size,
            modified_at=None, checksum=checksum, url=page.url,
        ))
    for failure in result.failures:
        if not failure.permanent:
            outcome.transient_urls.add(failure.url)
        outcome.failures.append(ScanFailure(
            source_id=source.source_id, path=failure.url, relative_path=failure.url, kind=failure.kind,
            reason=failure.reason, identity="", stage="fetch", keeps_document=not failure.permanent,
            attempts=max(1, failure.attempts), failure_class="permanent" if failure.permanent else "transient",
        ))
    return outcome


def crawl_web_source(
    settings: Settings,
    source: Source,
    prior: dict[str, PriorPage],
    prior_paths: dict[str, str],
    progress: ProgressCallback | None = None,
    client: Any = None,
    only: list[str] | None = None,
) -> WebSourceOutcome:
    """Crawl one site (store closed: a crawl takes minutes) and cache what it fetched."""
    config = crawl_config_for(source, settings)
    last = [0.0]

    def report(state: Any) -> None:
        if progress is None:
            return
        now = time.monotonic()
        if now - last[0] >= settings.web_progress_interval_s:
            last[0] = now
            progress(source.name, _progress_dict(state))

    kwargs: dict[str, Any] = {"prior": prior, "progress": report}
    if client is not None:
        kwargs["client"] = client
    if only is not None:
        kwargs["only"] = only
    on_page, written = body_writer(settings, source.source_id)
    result = crawl(config, on_page=on_page, **kwargs)
    outcome = outcome_from_crawl(settings, source, result, prior, prior_paths, written)
    outcome.partial = only is not None
    if progress is not None:
        progress(source.name, {**_stats_progress(result.stats), "done": True})
    return outcome


def _progress_dict(state: Any) -> dict[str, Any]:
    fields = ("fetched", "not_modified", "queued", "excluded", "failed", "requests", "retries", "elapsed_s")
    return {name: getattr(state, name) for name in fields if hasattr(state, name)}


def _stats_progress(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: stats.get(k) for k in ("fetched", "not_modified", "excluded", "failed", "requests", "retries", "seconds")
            if k in stats}


def prior_body_paths(conn: duckdb.DuckDBPyConnection, source_id: str) -> dict[str, str]:
    return dict(conn.execute("SELECT url, body_path FROM web_pages WHERE source_id = ?", [source_id]).fetchall())


def _strings(values: list[str | None]) -> pa.Array:
    return pa.array(values, type=pa.string())


def record_web_pages(conn: duckdb.DuckDBPyConnection, outcome: WebSourceOutcome) -> None:
    """Upsert the per-URL crawl state; after a complete crawl, forget URLs it no longer reached."""
    now = utcnow()
    source_id = outcome.source.source_id
    by_url = {f.relative_path: f for f in outcome.files}
    validated = dict(conn.execute("SELECT url, fetched_at FROM web_pages WHERE source_id = ?", [source_id]).fetchall())
    pages = outcome.pages
    if pages:
        files = [by_url[page.url] for page in pages]
        rows = pa.table({
            "url": _strings([p.url for p in pages]),
            "doc_id": _strings([doc_id_for(source_id, p.url) for p in pages]),
            "final_url": _strings([p.final_url for p in pages]),
            "content_type": _strings([p.content_type for p in pages]),
            "http_status": pa.array([p.http_status for p in pages], type=pa.int32()),
            "etag": _strings([p.etag for p in pages]),
            "last_modified": _strings([p.last_modified for p in pages]),
            "lastmod": _strings([p.lastmod for p in pages]),
            "checksum": _strings([f.checksum for f in files]),
            "body_path": _strings([str(f.path) for f in files]),
            "links": _strings([json.dumps(list(p.links)) for p in pages]),
            "depth": pa.array([p.depth for p in pages], type=pa.int32()),
            "origin": _strings([p.origin for p in pages]),
            # the last time the server vouched for the body (a download or a 304), not a lastmod skip
            "fetched_at": pa.array([validated.get(p.url) if p.how == "lastmod" else now for p in pages],
                                   type=pa.timestamp("us")),
        })
        conn.execute("DELETE FROM web_pages WHERE source_id = ? AND list_contains(?, url)",
                     [source_id, rows.column("url").to_pylist()])
        conn.register("web_pages_df", rows)
        conn.execute(
            "INSERT INTO web_pages (source_id, url, doc_id, final_url, content_type, http_status, etag, last_modified, "
            "lastmod, checksum, body_path, links, depth, origin, fetched_at, seen_at) "
            "SELECT ?, url, doc_id, final_url, content_type, http_status, etag, last_modified, lastmod, checksum, "
            "body_path, links::JSON, depth, origin, fetched_at, ? FROM web_pages_df",
            [source_id, now],
        )
        conn.unregister("web_pages_df")
    if outcome.complete and not outcome.partial and not outcome.capped:
        conn.execute(
            "DELETE FROM web_pages WHERE source_id = ? AND NOT list_contains(?, url)",
            [source_id, list(by_url) + sorted(outcome.transient_urls)],
        )


def prune_body_cache(conn: duckdb.DuckDBPyConnection, settings: Settings, source_id: str) -> int:
    """Delete cached bodies no document version or crawl state refers to any more; returns files removed."""
    directory = cache_dir(settings, source_id)
    if not directory.is_dir():
        return 0
    referenced = {
        row[0] for row in conn.execute(
            "SELECT path FROM documents WHERE source_id = ? UNION SELECT body_path FROM web_pages WHERE source_id = ?",
            [source_id, source_id],
        ).fetchall() if row[0]
    }
    removed = 0
    for entry in directory.iterdir():
        if entry.is_file() and str(entry) not in referenced:
            entry.unlink(missing_ok=True)
            removed += 1
    return removed


def retry_page(settings: Settings, failure: dict[str, Any], progress: ProgressCallback | None = None,
               web_client: Any = None) -> str:
    """Fetch one failed URL again with its source's rules and record it (nothing else is
    touched or deleted); returns the sync run id for the remaining stages."""
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        source = get_source(conn, failure["source"])
        run_id = start_sync_run(conn, None, "retry", scope=[source.name])
        prior, paths = load_prior_pages(conn, source.source_id), prior_body_paths(conn, source.source_id)
    outcome = crawl_web_source(settings, source, prior, paths, progress=progress, client=web_client,
                               only=[failure["path"]])
    scan = ScanResult(folders=[SourceFolder(source.source_id, source.name, source.location, True, "web")],
                      files=outcome.files, failures=outcome.failures, partial=True)
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        record_raw_documents(conn, scan, run_id)
        with transaction(conn):
            record_web_pages(conn, outcome)
        if outcome.files or not outcome.failures:
            # fetched (or now excluded by the rules): this failure is over
            conn.execute("UPDATE ingestion_failures SET resolved_at = ? WHERE failure_id = ? AND resolved_at IS NULL",
                         [utcnow(), failure["failure_id"]])
    return run_id
