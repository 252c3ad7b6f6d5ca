"""The ingestion sequence: sources -> parse -> chunk -> embed -> publish -> checks.

``INGEST_STAGES`` names the stages in order and each has one function here (``record_sources``,
``parse_stage``, ``chunk_stage``, ``embed_stage``, ``publish_stage``; the checks are ``checks.INDEX_CHECKS``).
``run_sync`` runs them in-process (the API's uploads and syncs, retries, evaluations, tests); the Dagster
assets in ``pipelines/`` are thin calls to the same functions, one asset per stage, with the embed stage
split into shards that a multiprocess executor runs at once (``groundwork ingest`` runs that job headless).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knowledge_store.config.settings import Settings
from knowledge_store.core.progress import Sink
from knowledge_store.ingest.checks import IndexCheck, run_index_checks
from knowledge_store.ingest.chunk import ChunkResult, chunk_parsed
from knowledge_store.ingest.embed import EmbedResult, embed_missing
from knowledge_store.ingest.parse import ParseResult, parse_pending
from knowledge_store.ingest.publish import PublishResult, publish_index
from knowledge_store.ingest.raw_documents import RawDocumentsResult, SourceFolder, record_raw_documents, scan_sources
from knowledge_store.ingest.sample_corpus import write_sample_corpus
from knowledge_store.ingest.sources import outside_roots, record_source_sync, sources_to_sync
from knowledge_store.ingest.sync_runs import end_sync_run, start_sync_run
from knowledge_store.ingest.web_sources import (
    ProgressCallback,
    WebSourceOutcome,
    crawl_web_source,
    load_prior_pages,
    prior_body_paths,
    prune_body_cache,
    record_web_pages,
)
from knowledge_store.models.embeddings import Embedder, TokenCounter, document_embedder, token_counter
from knowledge_store.models.serving import serving_model_id, serving_model_path
from knowledge_store.storage.store import store_connection, transaction, utcnow

logger = logging.getLogger(__name__)


# the stages in the order they run (Dagster: one asset each, the same names)
INGEST_STAGES = ("raw_documents", "parsed_documents", "chunks", "embeddings", "search_index")


@dataclass
class SyncReport:
    raw: RawDocumentsResult
    parse: ParseResult
    chunk: ChunkResult
    embed: EmbedResult
    publish: PublishResult
    seconds: float
    checks: list[IndexCheck] = field(default_factory=list)

    @property
    def failed_checks(self) -> list[IndexCheck]:
        return [c for c in self.checks if not c.passed]

    @property
    def summary(self) -> str:
        return str(self.publish.sync_run.get("summary", ""))


def ensure_default_corpus(settings: Settings) -> None:
    """The generated sample documents exist whenever the default corpus is in use, or its folder is named among
    the sources (``GROUNDWORK_SOURCES=data/sample_corpus:docs`` on a fresh checkout)."""
    if settings.uses_default_corpus or settings.sample_corpus_dir.resolve() in settings.source_dirs:
        write_sample_corpus(settings.sample_corpus_dir)


def record_sources(
    settings: Settings,
    sync_run_id: str | None = None,
    trigger: str = "manual",
    names: list[str] | None = None,
    kinds: list[str] | None = None,
    progress: ProgressCallback | None = None,
    web_client: Any = None,
    refresh: bool = False,
) -> RawDocumentsResult:
    """Stage 1 for the chosen sources (default: all enabled): scan folders, crawl sites, record versions.

    The store is closed while folders are hashed and sites crawled (a crawl can
    take minutes); the versions are then recorded in one transaction.
    """
    ensure_default_corpus(settings)
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        sources = sources_to_sync(conn, settings, names=names, kinds=kinds)
        scope = [s.name for s in sources] if (names or kinds) else None
        run_id = start_sync_run(conn, sync_run_id, trigger, scope=scope)
        web = [s for s in sources if s.kind == "web"]
        # refresh: download every page again (a site whose <lastmod>/ETag cannot be trusted); the
        # checksums still decide, so unchanged pages stay unchanged
        priors = {s.source_id: ({} if refresh else load_prior_pages(conn, s.source_id, settings.web_revalidate_days),
                                prior_body_paths(conn, s.source_id))
                  for s in web}
    # a folder that now leads outside every source root (replaced by a symbolic link since it was registered) is
    # not read: a failure row names it, and its documents are kept as a missing folder's are
    roots = settings.source_roots_in_force
    reasons: dict[str, str] = {}
    for s in sources:
        outside = outside_roots(s.location, roots) if s.kind != "web" else None
        if outside is not None:
            reasons[s.source_id] = outside
            logger.warning("source %s not synced: %s", s.name, outside)
    folders = [
        SourceFolder(s.source_id, s.name, Path(s.location), Path(s.location).is_dir() and s.source_id not in reasons,
                     s.kind)
        for s in sources if s.kind != "web"
    ]
    scan = scan_sources(settings, folders)
    outcomes: list[WebSourceOutcome] = []
    for source in web:
        prior, paths = priors[source.source_id]
        outcome = crawl_web_source(settings, source, prior, paths, progress=progress, client=web_client)
        outcomes.append(outcome)
        scan.folders.append(SourceFolder(source.source_id, source.name, source.location, outcome.complete, "web"))
        scan.files.extend(outcome.files)
        scan.failures.extend(outcome.failures)
        scan.excluded[source.source_id] = outcome.excluded
        scan.excluded_items[source.source_id] = [(str(url), str(reason)) for url, reason in outcome.excluded_preview[:20]]
        if outcome.capped:
            scan.keep_unseen.add(source.source_id)
        if outcome.aborted_reason:
            reasons[source.source_id] = outcome.aborted_reason
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        gone = _deleted_meanwhile(conn, sources)
        if gone:  # deleted while we crawled: record nothing for them
            sources = [s for s in sources if s.source_id not in gone]
            outcomes = [o for o in outcomes if o.source.source_id not in gone]
            scan.folders = [f for f in scan.folders if f.source_id not in gone]
            scan.files = [f for f in scan.files if f.source_id not in gone]
            scan.failures = [f for f in scan.failures if f.source_id not in gone]
        result = record_raw_documents(conn, scan, run_id, unreachable_reasons=reasons)
        by_id = {o.source.source_id: o for o in outcomes}
        with transaction(conn):
            for outcome in outcomes:
                record_web_pages(conn, outcome)
            for source in sources:
                counts = dict(result.per_source.get(source.source_id, {}))
                crawl = by_id.get(source.source_id)
                summary: dict[str, Any] = {"sync_run_id": run_id, "at": utcnow().isoformat() + "Z", **counts}
                if result.excluded_items.get(source.source_id):
                    summary["excluded_items"] = result.excluded_items[source.source_id]
                if crawl is not None:
                    summary["crawl"] = {**crawl.stats, "complete": crawl.complete, "aborted_reason": crawl.aborted_reason}
                elif source.source_id in reasons:
                    summary["outside_source_roots"] = reasons[source.source_id]
                elif not Path(source.location).is_dir():
                    summary["missing"] = True
                record_source_sync(conn, source.source_id, summary)
        for outcome in outcomes:
            prune_body_cache(conn, settings, outcome.source.source_id)
    result.crawls = {o.source.name: {**o.stats, "complete": o.complete, "aborted_reason": o.aborted_reason,
                                     "excluded_preview": o.excluded_preview[:20]} for o in outcomes}
    result.sources = [s.name for s in sources]
    return result


def _deleted_meanwhile(conn, sources) -> set[str]:
    ids = [s.source_id for s in sources]
    rows = conn.execute(
        "SELECT source_id FROM sources WHERE list_contains(?, source_id) AND deleted_at IS NOT NULL", [ids]
    ).fetchall()
    return {row[0] for row in rows}


def run_sync(
    settings: Settings,
    embedder: Embedder | None = None,
    trigger: str = "manual",
    names: list[str] | None = None,
    kinds: list[str] | None = None,
    progress: ProgressCallback | None = None,
    web_client: Any = None,
    sync_run_id: str | None = None,
    refresh: bool = False,
) -> SyncReport:
    """Every stage for the chosen sources (default all), then publish the whole index and run the checks
    (``SyncReport.checks``; a failing one is logged, the published index stays).

    A stage that raises leaves the run 'failed' (Ctrl-C: 'interrupted'), not 'running'."""
    started = time.perf_counter()
    embedder = embedder or document_embedder(settings, model_path=serving_model_path(settings))
    sync_run_id = sync_run_id or uuid.uuid4().hex
    try:
        raw = record_sources(settings, sync_run_id=sync_run_id, trigger=trigger, names=names, kinds=kinds,
                             progress=progress, web_client=web_client, refresh=refresh)
        parse, chunk, embed, publish = process_pending(settings, embedder, raw.sync_run_id, progress=progress)
        checks = run_index_checks(settings)
    except BaseException as error:
        stopped = isinstance(error, (KeyboardInterrupt, SystemExit))
        _close_run(settings, sync_run_id, "interrupted" if stopped else "failed",
                   f"stopped by {type(error).__name__}" if stopped else f"{type(error).__name__}: {error}")
        raise
    for check in checks:
        if not check.passed:
            logger.warning("ingestion check %s failed: %d offending rows (%s)", check.name, check.offending_rows,
                           check.description)
    return SyncReport(raw, parse, chunk, embed, publish, time.perf_counter() - started, checks)


def _close_run(settings: Settings, sync_run_id: str, status: str, reason: str) -> None:
    """Best effort: the error being raised matters more than this bookkeeping."""
    try:
        with store_connection(settings.store_path, timeout_s=min(settings.lock_timeout_s, 5.0)) as conn:
            end_sync_run(conn, sync_run_id, status, reason[:500])
    except Exception:  # noqa: BLE001 - no store, locked, or the run was never opened
        pass


def parse_stage(settings: Settings, sync_run_id: str, progress: Sink | None = None) -> ParseResult:
    """Stage 2: parse every pending version into pages and blocks."""
    return parse_pending(settings, sync_run_id, progress=progress)


def chunk_stage(settings: Settings, sync_run_id: str, progress: Sink | None = None,
                counter: TokenCounter | None = None) -> ChunkResult:
    """Stage 3: chunk the parsed versions, counting word-pieces with the model's tokenizer (``counter``: another
    model's, when a caller embeds with one)."""
    return chunk_parsed(settings, counter or token_counter(str(settings.model_path)), sync_run_id, progress=progress)


def embed_stage(settings: Settings, embedder: Embedder, sync_run_id: str, progress: Sink | None = None,
                shard: int = 0, shards: int = 1) -> EmbedResult:
    """Stage 4: vectors for the texts that have none for ``embedder``'s model (one shard of them when ``shards`` > 1)."""
    return embed_missing(settings, embedder, sync_run_id, shard=shard, shards=shards, progress=progress)


def publish_stage(settings: Settings, embedder: Embedder, sync_run_id: str, follow_serving: bool = False,
                  progress: Sink | None = None) -> PublishResult:
    """Stage 5: publish the snapshot with ``embedder``'s model.

    ``follow_serving``: the embedder stands for the serving model, not for a model the caller chose.  A fine-tuned
    model adopted (or rolled back) while the run embedded is then what the snapshot is published with: texts
    without its vectors are embedded first (a no-op query when none are missing)."""
    if follow_serving:
        changed = embedder.model_id != serving_model_id(settings)
        if changed:
            embedder = document_embedder(settings, model_path=serving_model_path(settings))
        embed_missing(settings, embedder, sync_run_id, progress=progress if changed else None)
    return publish_index(settings, embedder.model_id, sync_run_id)


def process_pending(
    settings: Settings, embedder: Embedder, sync_run_id: str, progress: ProgressCallback | None = None
) -> tuple[ParseResult, ChunkResult, EmbedResult, PublishResult]:
    """Stages 2-5 over whatever is pending (after a scan, a crawl or a retry), then publish;
    ``progress(stage, figures)`` hears each stage's counts, rate and ETA (knowledge_store.core.progress).

    An ``embedder`` of the serving model follows the serving model (``publish_stage``); any other embedder is
    the caller's choice."""
    follows = embedder.model_id == serving_model_id(settings)
    parse = parse_stage(settings, sync_run_id, progress)
    chunk = chunk_stage(settings, sync_run_id, progress)
    embed = embed_stage(settings, embedder, sync_run_id, progress)
    publish = publish_stage(settings, embedder, sync_run_id, follow_serving=follows, progress=progress)
    return parse, chunk, embed, publish
