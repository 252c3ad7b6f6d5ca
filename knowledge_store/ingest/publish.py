"""Stage 5: activate ready versions, purge expired ones, publish an index snapshot.

Activation is one transaction: every pending version whose chunks all have
embeddings becomes ``active`` and the version it replaces ``superseded``.
Then, if the set of active chunks differs from the published snapshot's, a new
snapshot is built and published atomically (``knowledge_store.storage.index``).  A
no-change sync therefore ends here having hashed files and nothing more.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import IndexNotBuiltError, StoreError
from knowledge_store.ingest.embed import sentenceless_chunks_sql
from knowledge_store.ingest.entities import delete_mentions_of_chunks, delete_orphans
from knowledge_store.ingest.relations import apply_document_model, document_model_digest
from knowledge_store.ingest.sync_runs import (
    STOPPED_RUN_STATUSES,
    add_counts,
    finish_sync_run,
    unpublished_active_versions,
)
from knowledge_store.ingest.web_sources import cache_dir
from knowledge_store.models.serving import model_path_for
from knowledge_store.storage.index import (
    FTS_CONFIG_ID,
    SnapshotInfo,
    build_snapshot,
    read_pointer,
    retire_old_snapshots,
    snapshot_file_name,
    write_pointer,
)
from knowledge_store.storage.store import store_connection, transaction, utcnow


@dataclass
class PublishResult:
    sync_run_id: str
    activated_added: int = 0
    activated_updated: int = 0
    resumed: int = 0  # documents a killed run had left unpublished, brought into the index by this run
    purged_documents: int = 0
    purged_versions: int = 0
    purged_sources: list[str] = field(default_factory=list)
    snapshot_version: int | None = None
    snapshot_built: bool = False
    chunk_count: int = 0
    document_count: int = 0
    build_seconds: float = 0.0
    seconds: float = 0.0
    retired: list[str] = field(default_factory=list)
    sync_run: dict[str, object] = field(default_factory=dict)
    # the document model (ingest/relations.py): labels derived, revisions superseded/reactivated, relations
    revisions: dict[str, object] = field(default_factory=dict)
    # the snapshot carries each chunk's sentence vectors (retrieval/sentences.py); when settings.sentence_vectors is
    # on but some indexed chunk texts have none yet (an interrupted or handed-off embedding), it is built without
    sentence_vectors: bool = False
    sentence_texts_missing: int = 0


def ready_versions(conn, model_id: str) -> list[tuple[str, int, int | None, str | None]]:
    """Pending versions whose chunks all have embeddings: (doc_id, version, supersedes, sync_run_id)."""
    return conn.execute(
        """
        SELECT d.doc_id, d.version, d.supersedes, d.sync_run_id
        FROM documents d
        WHERE d.status = 'pending' AND d.parsed_at IS NOT NULL AND d.chunker_signature IS NOT NULL
          AND NOT EXISTS (
              SELECT 1 FROM chunks c LEFT JOIN embeddings e ON e.content_hash = c.content_hash AND e.model_id = ?
              WHERE c.doc_id = d.doc_id AND c.version = d.version AND e.content_hash IS NULL)
        """,
        [model_id],
    ).fetchall()


def activate_ready_versions(conn, model_id: str, ready: list[tuple] | None = None) -> tuple[int, int]:
    """Make complete pending versions (default: ``ready_versions``) active; returns (added, updated)."""
    ready = ready_versions(conn, model_id) if ready is None else ready
    now = utcnow()
    added = updated = 0
    for doc_id, version, *_ in ready:
        previous = conn.execute(
            "SELECT version FROM documents WHERE doc_id = ? AND status = 'active' AND version <> ?", [doc_id, version]
        ).fetchall()
        if previous:
            conn.execute(
                "UPDATE documents SET status = 'superseded', valid_to = ? WHERE doc_id = ? AND status = 'active'",
                [now, doc_id],
            )
            updated += 1
        elif conn.execute(  # a new version of a file another file had superseded: an update of that document
            "SELECT count(*) FROM documents WHERE doc_id = ? AND version < ? AND status = 'superseded' "
            "AND superseded_by IS NOT NULL", [doc_id, version]).fetchone()[0]:
            updated += 1
        else:
            added += 1
        conn.execute(
            "UPDATE documents SET status = 'active', valid_from = ? WHERE doc_id = ? AND version = ?",
            [now, doc_id, version],
        )
    return added, updated


def purge_expired(conn, retention_days: float) -> tuple[int, int]:
    """Hard-delete documents soft-deleted longer ago than the retention, and the
    pages/blocks/chunks of versions superseded that long ago.  Returns (documents, versions)."""
    cutoff = utcnow() - timedelta(days=retention_days)
    gone = [
        row[0]
        for row in conn.execute(
            """
            SELECT doc_id FROM documents GROUP BY doc_id
            HAVING bool_and(status IN ('deleted', 'superseded', 'failed'))
               AND max(CASE WHEN status = 'deleted' THEN valid_to END) < ?
               -- a file superseded by a newer revision (another file) is still there: not gone
               AND NOT coalesce(arg_max(status = 'superseded' AND superseded_by IS NOT NULL, version), FALSE)
            """,
            [cutoff],
        ).fetchall()
    ]
    if gone:
        delete_mentions_of_chunks(conn, "list_contains(?, doc_id)", [gone])
        for table in ("pages", "blocks", "chunks", "document_links", "documents"):
            conn.execute(f"DELETE FROM {table} WHERE list_contains(?, doc_id)", [gone])
    # versions replaced by a newer version of their file; not the live version of a file another file supersedes
    old_versions = conn.execute(
        "SELECT doc_id, version FROM documents d WHERE status = 'superseded' AND valid_to < ? AND NOT ("
        "superseded_by IS NOT NULL AND NOT EXISTS (SELECT 1 FROM documents n WHERE n.doc_id = d.doc_id "
        "AND n.version > d.version AND n.status IN ('active', 'superseded', 'deleted')))", [cutoff]
    ).fetchall()
    for doc_id, version in old_versions:
        delete_mentions_of_chunks(conn, "doc_id = ? AND version = ?", [doc_id, version])
        for table in ("pages", "blocks", "chunks", "document_links"):
            conn.execute(f"DELETE FROM {table} WHERE doc_id = ? AND version = ?", [doc_id, version])
    if gone or old_versions:
        conn.execute("DELETE FROM embeddings WHERE content_hash NOT IN (SELECT content_hash FROM chunks)")
        delete_orphans(conn)  # entities no remaining chunk mentions
    return len(gone), len(old_versions)


def purge_deleted_sources(conn, settings: Settings) -> list[str]:
    """Forget sources deleted longer ago than the retention whose documents are all purged;
    their cached web pages go with them.  Returns the names removed."""
    cutoff = utcnow() - timedelta(days=settings.deleted_retention_days)
    rows = conn.execute(
        "SELECT source_id, name FROM sources s WHERE deleted_at IS NOT NULL AND deleted_at < ? "
        "AND NOT EXISTS (SELECT 1 FROM documents d WHERE d.source_id = s.source_id)",
        [cutoff],
    ).fetchall()
    for source_id, _name in rows:
        conn.execute("DELETE FROM web_pages WHERE source_id = ?", [source_id])
        conn.execute("DELETE FROM sources WHERE source_id = ?", [source_id])
        shutil.rmtree(cache_dir(settings, source_id), ignore_errors=True)
    return [name for _, name in rows]


def active_fingerprint(conn, model_id: str) -> tuple[str, int, int]:
    """(fingerprint, active chunks, active documents).  The fingerprint changes when the indexed chunk set,
    a status or the entity vocabulary that extracted a version's mentions changes: any of them republishes."""
    row = conn.execute(
        """
        SELECT coalesce(sha256(string_agg(c.chunk_id || d.status || coalesce(d.entity_signature, ''), ','
                                          ORDER BY c.chunk_id)), ''),
               count(*) FILTER (WHERE d.status = 'active'), count(DISTINCT c.doc_id) FILTER (WHERE d.status = 'active')
        FROM chunks c JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version
        WHERE d.status IN ('active', 'superseded')
        """
    ).fetchone()
    return f"{row[0][:32]}:{model_id}:{FTS_CONFIG_ID}", int(row[1]), int(row[2])


def sentence_texts_missing(conn, model_id: str) -> int:
    """How many chunk texts of the versions a snapshot holds (active, retained) have no sentence vectors."""
    return conn.execute("SELECT count(DISTINCT c.content_hash) " + sentenceless_chunks_sql(("active", "superseded")),
                        [model_id]).fetchone()[0]


def publish_index(settings: Settings, model_id: str, sync_run_id: str, model_path: Path | None = None) -> PublishResult:
    """Activate what is ready, purge what expired, and publish a snapshot of the active chunks with their
    ``model_id`` vectors (a new one only when something it holds changed).  ``model_path``: the model that made
    them, recorded in the snapshot so queries are embedded with it (default: found from ``model_id``)."""
    result = PublishResult(sync_run_id=sync_run_id)
    model_path = model_path or model_path_for(settings, model_id)
    started = time.perf_counter()
    index_dir = settings.index_dir
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        with transaction(conn):
            # work of a run killed half-way that this run brings into the index: versions it had
            # activated without publishing them, and pending versions it recorded
            unpublished = unpublished_active_versions(conn)
            ready = ready_versions(conn, model_id)
            stopped = {row[0] for row in conn.execute(
                "SELECT sync_run_id FROM sync_runs WHERE list_contains(?, status) AND sync_run_id <> ?",
                [list(STOPPED_RUN_STATUSES), sync_run_id]).fetchall()}
            result.resumed = len(unpublished) + sum(1 for row in ready if row[3] in stopped)
            result.activated_added, result.activated_updated = activate_ready_versions(conn, model_id, ready)
            result.revisions = apply_document_model(conn, settings, utcnow()).as_dict()
            result.purged_documents, result.purged_versions = purge_expired(conn, settings.deleted_retention_days)
            result.purged_sources = purge_deleted_sources(conn, settings)
            resumed_updated = sum(1 for _version, supersedes in unpublished.values() if supersedes is not None)
            add_counts(conn, sync_run_id, added=result.activated_added + len(unpublished) - resumed_updated,
                       updated=result.activated_updated + resumed_updated)
        missing = conn.execute(
            """
            SELECT count(*) FROM chunks c JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version
            LEFT JOIN embeddings e ON e.content_hash = c.content_hash AND e.model_id = ?
            WHERE d.status IN ('active', 'superseded') AND e.content_hash IS NULL
            """,
            [model_id],
        ).fetchone()[0]
        if missing:
            raise StoreError(
                f"{missing} active or retained chunks have no embedding for model {model_id}; materialise the embeddings asset first"
            )
        fingerprint, chunk_count, document_count = active_fingerprint(conn, model_id)
        fingerprint += f":{document_model_digest(conn)}"  # labels, supersedence and relations are in the snapshot too
        if settings.sentence_vectors:
            result.sentence_texts_missing = sentence_texts_missing(conn, model_id)
            result.sentence_vectors = result.sentence_texts_missing == 0
        if result.sentence_vectors:  # a snapshot without them is replaced once they are all there
            fingerprint += ":sentences"
        result.chunk_count, result.document_count = chunk_count, document_count
        try:
            current = read_pointer(index_dir)
        except IndexNotBuiltError:
            current = None
        if current and current.fingerprint == fingerprint and current.path(index_dir).exists():
            result.snapshot_version = current.snapshot_version
        else:
            last = conn.execute("SELECT coalesce(max(snapshot_version), 0) FROM index_snapshots").fetchone()[0]
            version = max(last, current.snapshot_version if current else 0) + 1
            info = SnapshotInfo(
                snapshot_version=version, file=snapshot_file_name(version), created_at=utcnow().isoformat() + "Z",
                chunk_count=chunk_count, document_count=document_count, fingerprint=fingerprint, model_id=model_id,
                model_path=str(model_path) if model_path else None,
            )
            build_started = time.perf_counter()
            build_snapshot(conn, index_dir, info, settings.entity_vocabulary, sentences=result.sentence_vectors)
            result.build_seconds = time.perf_counter() - build_started
            with transaction(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO index_snapshots VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'published')",
                    [version, info.file, utcnow(), chunk_count, document_count, fingerprint, model_id, sync_run_id],
                )
                conn.execute(
                    "UPDATE index_snapshots SET status = 'retired' WHERE snapshot_version <> ? AND status = 'published'",
                    [version],
                )
            write_pointer(index_dir, info)  # the moment readers switch
            result.snapshot_version = version
            result.snapshot_built = True
            result.retired = retire_old_snapshots(index_dir, settings.snapshots_to_keep, version)
        with transaction(conn):
            result.sync_run = finish_sync_run(
                conn, sync_run_id, result.snapshot_version,
                {"chunk_count": chunk_count, "document_count": document_count,
                 "snapshot_built": result.snapshot_built, "purged_documents": result.purged_documents,
                 "resumed": result.resumed, "revisions": result.revisions},
            )
    result.seconds = time.perf_counter() - started
    return result
