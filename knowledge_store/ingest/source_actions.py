"""What the CLI and the API do to one source or one failure, as plain functions.

Both front ends call these, so ``groundwork sources delete docs`` and
``DELETE /api/sources/docs`` behave identically: delete publishes a snapshot
at once (the source's chunks leave the index before the call returns), and a
retry re-runs exactly the failed item, not the whole source.
"""

from __future__ import annotations

import time
from typing import Any

import duckdb

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import GroundworkError
from knowledge_store.ingest.publish import publish_index
from knowledge_store.ingest.run import process_pending, run_sync
from knowledge_store.ingest.sources import (
    Source,
    check_renderer,
    delete_source,
    get_source,
    register_configured_sources,
    source_statistics,
    update_source,
)
from knowledge_store.ingest.sync_runs import get_sync_run, start_sync_run
from knowledge_store.ingest.web_sources import retry_page
from knowledge_store.models.embeddings import Embedder, document_embedder
from knowledge_store.models.serving import serving_model_id, serving_model_path
from knowledge_store.storage.store import store_connection, transaction, utcnow


class FailureNotFoundError(GroundworkError):
    def __init__(self, failure_id: str) -> None:
        self.failure_id = failure_id
        super().__init__(f"no open ingestion failure with id {failure_id!r} (see `groundwork failures`)")


DOCUMENTS_LISTED = 500  # documents listed per source (statistics count all of them)


def describe_source(settings: Settings, name: str) -> dict[str, Any]:
    """The source row, live counts, its last sync summary, its open failures and its documents
    (the current version of each: pages, passages, when it was indexed)."""
    with store_connection(settings.store_path, read_only=True, timeout_s=settings.lock_timeout_s) as conn:
        source = get_source(conn, name)
        stats = source_statistics(conn, source.source_id)
        cursor = conn.execute(
            "SELECT failure_id, path, stage, kind, reason, last_seen_at FROM ingestion_failures "
            "WHERE source_id = ? AND resolved_at IS NULL ORDER BY last_seen_at DESC, path LIMIT 50",
            [source.source_id],
        )
        columns = [d[0] for d in cursor.description]
        failures = [dict(zip(columns, row)) for row in cursor.fetchall()]
        cursor = conn.execute(
            "SELECT d.doc_id, d.version, d.title, d.relative_path, d.url, d.doc_type, d.status, d.page_count, "
            "d.size_bytes, coalesce(d.valid_from, d.created_at) AS indexed_at, "
            "(SELECT count(*) FROM chunks c WHERE c.doc_id = d.doc_id AND c.version = d.version) AS chunks "
            "FROM documents d WHERE d.source_id = ? AND d.status IN ('active', 'pending', 'failed') "
            # one row per document: the served (active) version, else the newest one in the works
            "QUALIFY row_number() OVER (PARTITION BY d.doc_id ORDER BY d.status = 'active' DESC, d.version DESC) = 1 "
            f"ORDER BY d.relative_path LIMIT {DOCUMENTS_LISTED}",
            [source.source_id],
        )
        columns = [d[0] for d in cursor.description]
        documents = [dict(zip(columns, row)) for row in cursor.fetchall()]
    return {**source.as_dict(), "statistics": stats, "open_failures": failures, "documents": documents,
            "documents_listed_max": DOCUMENTS_LISTED}


def delete_source_now(settings: Settings, name: str) -> dict[str, Any]:
    """Soft-delete the source and its documents, then publish the index without them (one call)."""
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        configured = {s.source_id for s in register_configured_sources(conn, settings)}
        source, documents = delete_source(conn, name, configured)
        run_id = start_sync_run(conn, None, "source-delete", scope=[name])
        with transaction(conn):
            conn.execute("UPDATE sync_runs SET removed = ? WHERE sync_run_id = ?", [documents, run_id])
    publish = publish_index(settings, serving_model_id(settings), run_id)
    return {
        "name": name, "deleted_at": source.as_dict()["deleted_at"], "documents_deleted": documents,
        "snapshot_version": publish.snapshot_version, "chunks_indexed": publish.chunk_count,
        "purge_after_days": settings.deleted_retention_days,
    }


def update_source_now(settings: Settings, name: str, changes: dict[str, Any]) -> tuple[Source, list[str], bool, int | None]:
    """Apply ``changes`` (``sources.update_source``); a change of visibility publishes a snapshot at once, so
    an internal source leaves the public surface before the call returns.  Returns (source, changed keys,
    resync needed, the snapshot version published or None)."""
    check_renderer(settings, changes)
    with store_connection(settings.store_path, timeout_s=min(settings.lock_timeout_s, 10.0)) as conn:
        source, changed, resync = update_source(conn, name, changes)
        run_id = start_sync_run(conn, None, "source-visibility", scope=[source.name]) if "visibility" in changed else None
    if run_id is None:
        return source, changed, resync, None
    return source, changed, resync, publish_index(settings, serving_model_id(settings), run_id).snapshot_version


def open_failure(conn: duckdb.DuckDBPyConnection, failure_id: str) -> dict[str, Any]:
    cursor = conn.execute(
        "SELECT f.failure_id, f.source_id, f.path, f.doc_id, f.stage, f.kind, f.reason, s.name AS source "
        "FROM ingestion_failures f LEFT JOIN sources s USING (source_id) "
        "WHERE f.failure_id = ? AND f.resolved_at IS NULL",
        [failure_id],
    )
    row = cursor.fetchone()
    if row is None:
        raise FailureNotFoundError(failure_id)
    return dict(zip([d[0] for d in cursor.description], row))


def retry_failure(
    settings: Settings,
    failure_id: str,
    embedder: Embedder | None = None,
    progress: Any = None,
    web_client: Any = None,
) -> dict[str, Any]:
    """Run one failed item again and publish; returns what happened and whether the failure is resolved.

    - a web page that failed to fetch is fetched again on its own (same rules, same politeness);
    - a document version that failed to parse (corrupt, OCR timeout, …) is parsed again from the
      bytes already recorded, with today's settings (a raised timeout, a newly installed OCR);
    - a file the scan refused (too big, unsupported) is looked at again by re-syncing its source,
      since only the scan can tell whether the file changed.
    """
    started = time.perf_counter()
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        failure = open_failure(conn, failure_id)
    embedder = embedder or document_embedder(settings, model_path=serving_model_path(settings))
    stage = failure["stage"]
    if stage == "fetch":
        run_id = retry_page(settings, failure, progress=progress, web_client=web_client)
        process_pending(settings, embedder, run_id, progress=progress)
    elif stage in ("parse", "chunk", "embed") and failure["doc_id"]:
        with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
            run_id = start_sync_run(conn, None, "retry", scope=[failure["source"]] if failure["source"] else None)
            with transaction(conn):
                requeued = conn.execute(
                    "UPDATE documents SET status = 'pending', parsed_at = NULL, chunker_signature = NULL "
                    "WHERE doc_id = ? AND status = 'failed' RETURNING version",
                    [failure["doc_id"]],
                ).fetchall()
            if not requeued:
                # the failure belongs to an active version (e.g. pages without text before OCR was
                # installed): parse the same bytes again as a new version that supersedes it when ready
                _requeue_active(conn, failure["doc_id"], run_id)
        process_pending(settings, embedder, run_id, progress=progress)
    else:
        if not failure["source"]:
            raise FailureNotFoundError(failure_id)
        report = run_sync(settings, embedder, trigger="retry", names=[failure["source"]], progress=progress,
                          web_client=web_client)
        run_id = report.raw.sync_run_id
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        still = conn.execute(
            "SELECT kind, reason FROM ingestion_failures WHERE failure_id = ? AND resolved_at IS NULL", [failure_id]
        ).fetchone()
        newer = conn.execute(
            "SELECT failure_id, kind, reason FROM ingestion_failures WHERE path = ? AND resolved_at IS NULL "
            "AND failure_id <> ?", [failure["path"], failure_id]
        ).fetchall()
        run = get_sync_run(conn, run_id)
    return {
        "failure_id": failure_id, "path": failure["path"], "stage": stage, "source": failure["source"],
        "resolved": still is None and not newer,
        "still_failing": ({"kind": still[0], "reason": still[1]} if still else
                          ({"failure_id": newer[0][0], "kind": newer[0][1], "reason": newer[0][2]} if newer else None)),
        "summary": run.get("summary"), "snapshot_version": run.get("snapshot_version"),
        "seconds": round(time.perf_counter() - started, 2),
    }


def _requeue_active(conn: duckdb.DuckDBPyConnection, doc_id: str, run_id: str) -> None:
    row = conn.execute(
        "SELECT max(version) FROM documents WHERE doc_id = ?", [doc_id]
    ).fetchone()
    active = conn.execute("SELECT version FROM documents WHERE doc_id = ? AND status = 'active'", [doc_id]).fetchone()
    if row[0] is None or active is None:
        return
    with transaction(conn):
        conn.execute(
            "INSERT INTO documents (doc_id, version, source_id, relative_path, path, url, checksum, size_bytes, "
            "modified_at, status, supersedes, created_at, sync_run_id) "
            "SELECT doc_id, ?, source_id, relative_path, path, url, checksum, size_bytes, modified_at, 'pending', "
            "version, ?, ? FROM documents WHERE doc_id = ? AND version = ?",
            [row[0] + 1, utcnow(), run_id, doc_id, active[0]],
        )
