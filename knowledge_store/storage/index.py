"""Index snapshots: immutable DuckDB files that queries read.

Layout under ``<data_dir>/index/``::

    snapshot-000007.duckdb   chunks (+ embedding FLOAT[embedding_dim]) of active versions and of
                             superseded ones still retained (column ``status``; queries
                             see active only unless asked), the fts BM25 index over them,
                             ``bm25_postings`` (the fts term index aggregated for fast
                             in-memory scoring), documents, the entity mentions of those
                             chunks (``chunk_entities``, ``entities``), each chunk text's
                             sentence vectors (``sentence_embeddings``, when every chunk has
                             them), meta (with the entity vocabulary, so queries read names
                             the way ingestion did)
    CURRENT.json             {"snapshot_version": 7, "file": "snapshot-000007.duckdb", ...}

A snapshot is written under a temporary name, checkpointed, fsynced and
renamed; only then is ``CURRENT.json`` replaced (write-temp + ``os.replace``,
atomic on POSIX).  A reader therefore sees either the old snapshot or the new
one, never a half-built one, and a run killed with -9 at any point leaves the
previous snapshot published.  The vector index (HNSW) is never persisted: the
vss extension keeps no crash-recovery log for it, so readers build it in
memory from the stored embeddings.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb

from knowledge_store.core.entities import DEFAULT_VOCABULARY, EntityVocabulary
from knowledge_store.core.errors import IndexNotBuiltError, StoreError
from knowledge_store.storage.store import load_extensions

POINTER = "CURRENT.json"
FTS_FIELDS = ("title", "section", "text")
# characters the fts tokenizer turns into spaces; the query reader splits queries with the same rule
FTS_IGNORE = r"(\.|[^a-z0-9_])+"
# Stop words: the fts extension's English list (571 words).  Lucene's 33-word list (bm25s,
# Elasticsearch) was measured against it and did not win on either dev set (docs/EVALUATION.md).
# part of the snapshot fingerprint: a change to how BM25 is indexed republishes on the next sync
FTS_CONFIG_ID = "porter+english"


@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_version: int
    file: str
    created_at: str
    chunk_count: int
    document_count: int
    fingerprint: str
    model_id: str
    model_path: str | None = None  # the model that made the vectors (queries are embedded with it); None: older

    def path(self, index_dir: Path) -> Path:
        return Path(index_dir) / self.file


def snapshot_file_name(version: int) -> str:
    return f"snapshot-{version:06d}.duckdb"


def read_pointer(index_dir: Path) -> SnapshotInfo:
    """The published snapshot; raises IndexNotBuiltError when there is none."""
    pointer = Path(index_dir) / POINTER
    try:
        data = json.loads(pointer.read_text())
    except FileNotFoundError as error:
        raise IndexNotBuiltError(index_dir) from error
    except json.JSONDecodeError as error:  # cannot happen with os.replace, but say so if it does
        raise StoreError(f"{pointer} is not valid JSON: {error}") from error
    return SnapshotInfo(**data)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_pointer(index_dir: Path, info: SnapshotInfo) -> None:
    index_dir = Path(index_dir)
    tmp = index_dir / f".{POINTER}.tmp"
    with open(tmp, "w") as handle:
        json.dump(asdict(info), handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, index_dir / POINTER)
    _fsync_dir(index_dir)


# the embedding is cast to its model's FLOAT[n] (the store's column takes any width: models of several widths)
SNAPSHOT_CHUNKS_SQL = """
    SELECT
        c.chunk_id, c.doc_id, c.version, c.chunk_index, c.text, c.title,
        array_to_string(c.section_path, ' > ') AS section, c.section_path,
        d.source_id, c.source_path, c.url, c.page_start, c.page_end, c.anchor,
        c.char_start, c.char_end, c.token_count, c.content_hash, d.doc_type,
        d.metadata, coalesce(d.modified_at, d.valid_from) AS last_updated, d.status,
        d.rev_label, d.valid_from, d.valid_to, d.superseded_by,
        coalesce(c.ocr, FALSE) AS ocr, c.ocr_confidence,
        coalesce(c.low_confidence_ocr, FALSE) AS low_confidence_ocr, coalesce(d.needs_review, FALSE) AS needs_review,
        e.embedding::FLOAT[{dim}] AS embedding
    FROM chunks c
    JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version AND d.status IN ('active', 'superseded')
    JOIN embeddings e ON e.content_hash = c.content_hash AND e.model_id = ?
    ORDER BY d.status, c.doc_id, c.version, c.chunk_index
"""

SNAPSHOT_DOCUMENTS_SQL = """
    SELECT doc_id, version, source_id, relative_path, path, url, title, doc_type, checksum, size_bytes,
           modified_at, valid_from, paginated, page_count, metadata, rev_label
    FROM documents WHERE status = 'active'
"""


def build_snapshot(store: duckdb.DuckDBPyConnection, index_dir: Path, info: SnapshotInfo,
                   entity_vocabulary: EntityVocabulary | None = None, sentences: bool = False) -> Path:
    """Write snapshot ``info.snapshot_version`` from the store's active versions and return its path.

    ``entity_vocabulary`` (default: the built-in patterns) is recorded in the meta: the server
    extracts entities from queries and filter values with the patterns that extracted the chunks'.
    ``sentences``: copy the chunks' sentence vectors (``sentence_embeddings``, one row per sentence of
    each distinct chunk text; the caller checked every chunk has them).
    The caller publishes it with ``write_pointer`` once it is complete.
    """
    vocabulary = entity_vocabulary or DEFAULT_VOCABULARY
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    final = index_dir / info.file
    tmp = index_dir / f".{info.file}.tmp"
    for leftover in (tmp, Path(f"{tmp}.wal")):
        leftover.unlink(missing_ok=True)
    store.execute(f"ATTACH '{tmp}' AS snap")
    try:
        width = store.execute("SELECT len(embedding) FROM embeddings WHERE model_id = ? LIMIT 1", [info.model_id]).fetchone()
        store.execute(f"CREATE TABLE snap.chunks AS {SNAPSHOT_CHUNKS_SQL.format(dim=width[0] if width else 1)}",
                      [info.model_id])
        store.execute(f"CREATE TABLE snap.documents AS {SNAPSHOT_DOCUMENTS_SQL}")
        store.execute("CREATE TABLE snap.sources AS SELECT source_id, name, kind, location, "
                      "coalesce(visibility, 'internal') AS visibility FROM sources")
        # relations (supersedes, seeAlso) between documents: citations name them without a store read
        store.execute("CREATE TABLE snap.relations AS SELECT relation_id, src_type, src_id, rel_type, dst_type, dst_id, "
                      "confidence, evidence::VARCHAR AS evidence, created_at FROM relations ORDER BY src_id, rel_type, dst_id")
        store.execute(
            "CREATE TABLE snap.chunk_entities AS SELECT ce.chunk_id, ce.entity_id, ce.span_start, ce.span_end, "
            "ce.confidence FROM chunk_entities ce SEMI JOIN snap.chunks c ON c.chunk_id = ce.chunk_id "
            "ORDER BY ce.chunk_id, ce.span_start"
        )
        store.execute(
            "CREATE TABLE snap.entities AS SELECT e.entity_id, e.type, e.canonical_value, e.alt_labels FROM entities e "
            "SEMI JOIN snap.chunk_entities ce ON ce.entity_id = e.entity_id ORDER BY e.type, e.canonical_value"
        )
        if sentences:
            store.execute(
                "CREATE TABLE snap.sentence_embeddings AS SELECT s.content_hash, s.ordinal, s.embedding "
                "FROM sentence_embeddings s SEMI JOIN snap.chunks c ON c.content_hash = s.content_hash "
                "WHERE s.model_id = ? ORDER BY s.content_hash, s.ordinal", [info.model_id])
        store.execute("CREATE TABLE snap.meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        store.execute(
            "INSERT INTO snap.meta VALUES " + ", ".join(["(?, ?)"] * 7),
            ["snapshot_version", str(info.snapshot_version), "created_at", info.created_at,
             "fingerprint", info.fingerprint, "model_id", info.model_id,
             "chunk_count", str(info.chunk_count), "fts_fields", ",".join(FTS_FIELDS),
             "entity_vocabulary", vocabulary.to_json()],
        )
    finally:
        store.execute("DETACH snap")
    index_snapshot_file(tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    _fsync_dir(index_dir)
    return final


def index_snapshot_file(path: Path) -> None:
    """Build the BM25 structures inside a snapshot file whose tables are written.

    Separate from ``build_snapshot`` so benchmarks can index synthetic snapshots
    exactly the way the pipeline does.
    """
    snap = duckdb.connect(str(path))
    try:
        load_extensions(snap, "fts")
        # the fts index does not follow table changes; a snapshot is built once, so build it last
        fields = ", ".join(f"'{f}'" for f in FTS_FIELDS)
        snap.execute(
            f"PRAGMA create_fts_index('chunks', 'chunk_id', {fields}, stemmer = 'porter', "
            f"stopwords = 'english', ignore = '{FTS_IGNORE}', strip_accents = 1, lower = 1, overwrite = 1)"
        )
        # (termid, docid, tf) postings, aggregated once here so readers load them in one scan
        snap.execute(
            "CREATE TABLE bm25_postings AS SELECT termid::INTEGER AS termid, docid::INTEGER AS docid, "
            "count(*)::INTEGER AS tf FROM fts_main_chunks.terms GROUP BY ALL ORDER BY termid, docid"
        )
        snap.execute("CHECKPOINT")
    finally:
        snap.close()


def open_snapshot(index_dir: Path, info: SnapshotInfo | None = None) -> tuple[duckdb.DuckDBPyConnection, SnapshotInfo]:
    """Open the published (or given) snapshot read-only with fts loaded."""
    info = info or read_pointer(index_dir)
    path = info.path(index_dir)
    if not path.exists():
        raise StoreError(f"published snapshot {path} is missing; re-run `groundwork ingest`")
    conn = duckdb.connect(str(path), read_only=True)
    load_extensions(conn, "fts")
    return conn, info


def retire_old_snapshots(index_dir: Path, keep: int, current_version: int) -> list[str]:
    """Delete all but the ``keep`` newest snapshot files (never the current one).

    Open readers of a deleted file keep working on POSIX until they reopen.
    """
    index_dir = Path(index_dir)
    files = sorted(index_dir.glob("snapshot-*.duckdb"), reverse=True)
    removed: list[str] = []
    for path in files[keep:]:
        if path.name == snapshot_file_name(current_version):
            continue
        path.unlink(missing_ok=True)
        Path(f"{path}.wal").unlink(missing_ok=True)
        removed.append(path.name)
    for stale in index_dir.glob(".snapshot-*.tmp*"):
        stale.unlink(missing_ok=True)
    return removed
