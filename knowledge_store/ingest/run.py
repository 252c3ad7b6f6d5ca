"""All ingestion stages in one call, in-process: for tests, the API and scripts.

The Dagster assets in ``pipelines/`` call the same stage functions one asset
at a time; ``groundwork ingest`` runs those assets headless.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from knowledge_store.embeddings import Embedder, token_counter
from knowledge_store.ingest.chunk import ChunkResult, chunk_parsed
from knowledge_store.ingest.embed import EmbedResult, embed_missing
from knowledge_store.ingest.parse import ParseResult, parse_pending
from knowledge_store.ingest.publish import PublishResult, publish_index
from knowledge_store.ingest.raw_documents import RawDocumentsResult, record_raw_documents, scan_sources
from knowledge_store.ingest.sync_runs import start_sync_run
from knowledge_store.sample_corpus import write_sample_corpus
from knowledge_store.settings import Settings
from knowledge_store.store import store_connection


@dataclass
class SyncReport:
    raw: RawDocumentsResult
    parse: ParseResult
    chunk: ChunkResult
    embed: EmbedResult
    publish: PublishResult
    seconds: float

    @property
    def summary(self) -> str:
        return str(self.publish.sync_run.get("summary", ""))


def ensure_default_corpus(settings: Settings) -> None:
    """The generated sample documents exist whenever the default corpus is in use."""
    if settings.uses_default_corpus:
        write_sample_corpus(settings.sample_corpus_dir)


def record_sources(settings: Settings, sync_run_id: str | None = None, trigger: str = "manual") -> RawDocumentsResult:
    ensure_default_corpus(settings)
    scan = scan_sources(settings)
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        run_id = start_sync_run(conn, sync_run_id, trigger)
        return record_raw_documents(conn, scan, run_id)


def run_sync(settings: Settings, embedder: Embedder | None = None, trigger: str = "manual") -> SyncReport:
    started = time.perf_counter()
    embedder = embedder or Embedder(settings.model_path, settings.embed_batch_size, settings.torch_threads, settings.embedding_dim)
    raw = record_sources(settings, trigger=trigger)
    run_id = raw.sync_run_id
    parse = parse_pending(settings, run_id)
    chunk = chunk_parsed(settings, token_counter(str(settings.model_path)), run_id)
    embed = embed_missing(settings, embedder, run_id)
    publish = publish_index(settings, embedder.model_id, run_id)
    return SyncReport(raw, parse, chunk, embed, publish, time.perf_counter() - started)
