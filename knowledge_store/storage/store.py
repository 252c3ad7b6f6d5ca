"""The DuckDB store: connection handling, extensions and the schema migrations.

One file, ``store.duckdb``, holds sources, document versions, pages, blocks,
chunks, embeddings, ingestion failures, sync runs and the list of published
index snapshots.  Only the ingestion pipeline writes it (DuckDB allows one
writing process per file); readers that must never block - the query path -
read immutable index snapshots instead (see ``knowledge_store.storage.index``).

The schema is created and migrated by code: ``MIGRATIONS`` is an append-only
list, each entry applied once inside a transaction and recorded in
``schema_migrations``.  Never edit an applied migration; add a new one.
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import StoreBusyError, StoreError, StoreLockedError

# (number, description, SQL); the SQL may be a function rendering it when the migration runs
Migration = tuple[int, str, str | Callable[[], str]]

MIGRATIONS: list[Migration] = [
    (
        1,
        "initial schema: sources, documents, pages, blocks, chunks, embeddings, failures, sync runs, snapshots",
        # rendered when a new store is created: the embeddings column is as wide as the configured
        # settings.embedding_dim (GROUNDWORK_EMBEDDING_DIM); with the default 384 the text is unchanged
        lambda: f"""
        CREATE TABLE sources (
            source_id      VARCHAR PRIMARY KEY,
            name           VARCHAR NOT NULL UNIQUE,
            kind           VARCHAR NOT NULL,            -- folder (web/upload come later)
            location       VARCHAR NOT NULL,
            enabled        BOOLEAN NOT NULL DEFAULT TRUE,
            created_at     TIMESTAMP NOT NULL,
            last_synced_at TIMESTAMP
        );
        CREATE TABLE documents (
            doc_id         VARCHAR NOT NULL,            -- hash(source_id, relative_path): stable across versions
            version        INTEGER NOT NULL,            -- 1, 2, ... per doc_id
            source_id      VARCHAR NOT NULL,
            relative_path  VARCHAR NOT NULL,
            path           VARCHAR NOT NULL,
            url            VARCHAR NOT NULL,            -- file://... link to the original
            title          VARCHAR,
            doc_type       VARCHAR,
            checksum       VARCHAR NOT NULL,            -- sha256 of the file bytes
            size_bytes     BIGINT NOT NULL,
            modified_at    TIMESTAMP,
            status         VARCHAR NOT NULL,            -- pending | active | superseded | deleted | failed
            valid_from     TIMESTAMP,                   -- when this version became active
            valid_to       TIMESTAMP,                   -- when it was superseded or deleted
            supersedes     INTEGER,                     -- version number this one replaces
            paginated      BOOLEAN,
            page_count     INTEGER,
            metadata       JSON,
            parsed_at      TIMESTAMP,
            chunker_signature VARCHAR,                  -- settings the chunks were made with
            created_at     TIMESTAMP NOT NULL,
            sync_run_id    VARCHAR,
            PRIMARY KEY (doc_id, version)
        );
        CREATE TABLE pages (
            doc_id         VARCHAR NOT NULL,
            version        INTEGER NOT NULL,
            page_number    INTEGER NOT NULL,            -- real 1-based page number
            text           VARCHAR NOT NULL,
            has_text_layer BOOLEAN NOT NULL,
            PRIMARY KEY (doc_id, version, page_number)
        );
        CREATE TABLE blocks (
            doc_id         VARCHAR NOT NULL,
            version        INTEGER NOT NULL,
            block_index    INTEGER NOT NULL,
            page_number    INTEGER NOT NULL,
            kind           VARCHAR NOT NULL,
            text           VARCHAR NOT NULL,
            char_start     INTEGER NOT NULL,
            char_end       INTEGER NOT NULL,
            section_path   VARCHAR[] NOT NULL,
            anchor         VARCHAR,
            heading_level  INTEGER,
            PRIMARY KEY (doc_id, version, block_index)
        );
        CREATE TABLE chunks (
            chunk_id       VARCHAR PRIMARY KEY,         -- hash(doc_id, version, chunk_index, content_hash)
            doc_id         VARCHAR NOT NULL,
            version        INTEGER NOT NULL,
            chunk_index    INTEGER NOT NULL,
            text           VARCHAR NOT NULL,            -- the passage shown to people
            embed_text     VARCHAR NOT NULL,            -- header + passage: what the model saw
            title          VARCHAR,
            source_path    VARCHAR NOT NULL,
            url            VARCHAR NOT NULL,
            page_start     INTEGER,                     -- NULL for formats without pages
            page_end       INTEGER,
            section_path   VARCHAR[] NOT NULL,
            anchor         VARCHAR,
            char_start     INTEGER NOT NULL,            -- offset into page_start's page text
            char_end       INTEGER NOT NULL,            -- offset into page_end's page text
            token_count    INTEGER NOT NULL,            -- word-pieces of embed_text, no special tokens
            content_hash   VARCHAR NOT NULL,            -- sha256(embed_text): the embedding cache key
            block_kinds    VARCHAR[] NOT NULL,
            created_at     TIMESTAMP NOT NULL
        );
        CREATE INDEX chunks_doc_version ON chunks (doc_id, version);
        CREATE TABLE embeddings (
            content_hash   VARCHAR NOT NULL,
            model_id       VARCHAR NOT NULL,
            embedding      FLOAT[{Settings().embedding_dim}] NOT NULL,
            created_at     TIMESTAMP NOT NULL,
            PRIMARY KEY (content_hash, model_id)
        );
        CREATE TABLE ingestion_failures (
            failure_id     VARCHAR PRIMARY KEY,         -- hash(path, stage, kind, checksum|size)
            source_id      VARCHAR,
            path           VARCHAR NOT NULL,
            doc_id         VARCHAR,
            checksum       VARCHAR,
            stage          VARCHAR NOT NULL,            -- scan | parse | chunk | embed
            kind           VARCHAR NOT NULL,            -- empty | oversize | corrupt | ...
            reason         VARCHAR NOT NULL,            -- plain words
            first_seen_at  TIMESTAMP NOT NULL,
            last_seen_at   TIMESTAMP NOT NULL,
            resolved_at    TIMESTAMP,
            sync_run_id    VARCHAR
        );
        CREATE TABLE sync_runs (
            sync_run_id    VARCHAR PRIMARY KEY,
            trigger        VARCHAR,
            status         VARCHAR NOT NULL,            -- running | succeeded | failed | abandoned
            started_at     TIMESTAMP NOT NULL,
            finished_at    TIMESTAMP,
            added          INTEGER DEFAULT 0,
            updated        INTEGER DEFAULT 0,
            removed        INTEGER DEFAULT 0,
            unchanged      INTEGER DEFAULT 0,
            failed         INTEGER DEFAULT 0,
            chunks_created INTEGER DEFAULT 0,
            embeddings_computed INTEGER DEFAULT 0,
            embeddings_reused   INTEGER DEFAULT 0,
            snapshot_version INTEGER,
            summary        VARCHAR,
            details        JSON
        );
        CREATE TABLE index_snapshots (
            snapshot_version INTEGER PRIMARY KEY,
            file_name      VARCHAR NOT NULL,
            created_at     TIMESTAMP NOT NULL,
            chunk_count    INTEGER NOT NULL,
            document_count INTEGER NOT NULL,
            fingerprint    VARCHAR NOT NULL,            -- hash of the active (chunk_id, content_hash) set
            model_id       VARCHAR NOT NULL,
            sync_run_id    VARCHAR,
            status         VARCHAR NOT NULL             -- published | retired
        );
        """,
    ),
    (
        2,
        "source registry (config, soft delete, last sync), web page crawl state, OCR marks, excluded counts",
        """
        ALTER TABLE sources ADD COLUMN config JSON;                 -- kind-specific settings (web: depth, include, ...)
        ALTER TABLE sources ADD COLUMN origin VARCHAR DEFAULT 'settings';  -- settings (GROUNDWORK_SOURCES) | user (CLI/API)
        ALTER TABLE sources ADD COLUMN updated_at TIMESTAMP;
        ALTER TABLE sources ADD COLUMN deleted_at TIMESTAMP;        -- soft delete: excluded from queries at once
        ALTER TABLE sources ADD COLUMN resync_needed BOOLEAN DEFAULT FALSE;
        ALTER TABLE sources ADD COLUMN last_sync JSON;              -- summary of this source's last sync
        ALTER TABLE pages ADD COLUMN ocr BOOLEAN DEFAULT FALSE;     -- text came from OCR (no text layer)
        ALTER TABLE pages ADD COLUMN ocr_confidence DOUBLE;         -- mean word confidence 0..1 when known
        ALTER TABLE chunks ADD COLUMN ocr BOOLEAN DEFAULT FALSE;
        ALTER TABLE chunks ADD COLUMN ocr_confidence DOUBLE;
        ALTER TABLE sync_runs ADD COLUMN excluded INTEGER DEFAULT 0;
        ALTER TABLE sync_runs ADD COLUMN scope JSON;                -- names of the sources this run synced (NULL = all)
        CREATE TABLE web_pages (
            source_id      VARCHAR NOT NULL,
            url            VARCHAR NOT NULL,            -- canonical URL: the page's identity (doc relative_path)
            doc_id         VARCHAR NOT NULL,
            final_url      VARCHAR,                     -- after redirects
            content_type   VARCHAR,
            http_status    INTEGER,
            etag           VARCHAR,
            last_modified  VARCHAR,                     -- Last-Modified header, sent back as If-Modified-Since
            lastmod        VARCHAR,                     -- sitemap <lastmod> when the page was last fetched
            checksum       VARCHAR,                     -- sha256 of the body last stored
            body_path      VARCHAR,                     -- cached body the document version was parsed from
            links          JSON,                        -- canonical outgoing links (reused when a fetch is skipped)
            depth          INTEGER,
            origin         VARCHAR,                     -- base | llms.txt | llms-full | sitemap | link
            fetched_at     TIMESTAMP,
            seen_at        TIMESTAMP,                   -- last crawl that reached it
            PRIMARY KEY (source_id, url)
        );
        """,
    ),
    (
        3,
        "sync runs record the process running them, so a killed run shows as interrupted",
        """
        ALTER TABLE sync_runs ADD COLUMN pid INTEGER;               -- process running the sync (its latest stage)
        ALTER TABLE sync_runs ADD COLUMN hostname VARCHAR;          -- host of that process
        ALTER TABLE sync_runs ADD COLUMN heartbeat_at TIMESTAMP;    -- last time that process wrote to the run
        """,
    ),
    (
        4,
        "sync runs count the pages they parse (the server's pages_ingested_total, over every process)",
        """
        ALTER TABLE sync_runs ADD COLUMN pages_parsed BIGINT DEFAULT 0;
        """,
    ),
    (
        5,
        "entities named in chunk text: entities catalog, chunk_entities mentions, the vocabulary per version",
        """
        CREATE TABLE entities (
            entity_id       VARCHAR PRIMARY KEY,        -- sha256(type | canonical_value)[:32]
            type            VARCHAR NOT NULL,           -- asset | equipment | procedure | standard | a configured type
            canonical_value VARCHAR NOT NULL,           -- ASSET-104, SOP-42, API 510
            alt_labels      VARCHAR[] NOT NULL          -- other spellings seen in text (api-510, ISO 9001:2015)
        );
        CREATE TABLE chunk_entities (
            chunk_id        VARCHAR NOT NULL,           -- deleted with its chunk
            entity_id       VARCHAR NOT NULL,
            span_start      INTEGER NOT NULL,           -- offsets into chunks.text
            span_end        INTEGER NOT NULL,
            confidence      DOUBLE NOT NULL             -- 1.0 for regex matches
        );
        ALTER TABLE documents ADD COLUMN entity_signature VARCHAR;  -- vocabulary that extracted this version's mentions
        """,
    ),
    (
        6,
        "the document model: revision labels, supersedence across files, relations (supersedes, seeAlso), links",
        """
        ALTER TABLE documents ADD COLUMN rev_label VARCHAR;         -- "Rev C", "v2.1" (knowledge_store.core.revisions)
        ALTER TABLE documents ADD COLUMN rev_label_source VARCHAR;  -- metadata:<key> | file_name | title | none; NULL = not derived yet
        ALTER TABLE documents ADD COLUMN superseded_by VARCHAR;     -- doc_id of the newer revision (another file) that replaced it
        CREATE TABLE document_links (
            doc_id         VARCHAR NOT NULL,
            version        INTEGER NOT NULL,
            link_index     INTEGER NOT NULL,            -- reading order in the version
            href           VARCHAR NOT NULL,            -- as written
            text           VARCHAR NOT NULL,            -- the link text (evidence phrase)
            page_number    INTEGER NOT NULL,
            char_start     INTEGER,                     -- span of the text in the page text (NULL: not found)
            char_end       INTEGER,
            target_path    VARCHAR,                     -- a file of the same folder source it points at (relative path)
            target_url     VARCHAR,                     -- a web page it points at (canonical URL)
            PRIMARY KEY (doc_id, version, link_index)
        );
        CREATE TABLE relations (
            relation_id    VARCHAR PRIMARY KEY,         -- sha256(src_type|src_id|rel_type|dst_type|dst_id)[:32]
            src_type       VARCHAR NOT NULL,            -- document
            src_id         VARCHAR NOT NULL,
            rel_type       VARCHAR NOT NULL,            -- supersedes | seeAlso
            dst_type       VARCHAR NOT NULL,
            dst_id         VARCHAR NOT NULL,
            confidence     DOUBLE NOT NULL,
            evidence       JSON,                        -- why: {"phrase", "page", "span"} for links; keys and labels for revisions
            created_at     TIMESTAMP NOT NULL,
            updated_at     TIMESTAMP NOT NULL
        );
        CREATE INDEX rel_idx ON relations (src_id, rel_type, dst_id);
        CREATE INDEX rel_dst_idx ON relations (dst_id, rel_type);
        """,
    ),
    (
        7,
        "sentence vectors: each chunk text's sentences embedded alone (retrieval/sentences.py, sentence evidence)",
        """
        CREATE TABLE sentence_embeddings (
            content_hash   VARCHAR NOT NULL,            -- the chunk text's (chunks.content_hash): the cache key
            model_id       VARCHAR NOT NULL,            -- the chunk vectors' model id
            ordinal        INTEGER NOT NULL,            -- the sentence's place in the chunk text (core.text.sentences_to_embed)
            embedding      FLOAT[] NOT NULL,            -- as wide as the store's embeddings
            PRIMARY KEY (content_hash, model_id, ordinal)
        );
        """,
    ),
    (
        8,
        "source visibility: public sources are what the public surface (widget, anonymous ask) answers from",
        # NULL until registration decides: the default corpus is public, every other source internal
        "ALTER TABLE sources ADD COLUMN visibility VARCHAR;  -- public | internal",
    ),
    (
        9,
        "vectors of any width: one store holds the vectors of models of different widths (minilm 384, mpnet 768)",
        # each snapshot holds one model's vectors and casts them to that model's FLOAT[n] (index.build_snapshot)
        "ALTER TABLE embeddings ALTER COLUMN embedding SET DATA TYPE FLOAT[];",
    ),
    (
        10,
        "ingestion retries: a failure row's attempts, class, last traceback and input; a version's parse attempts",
        """
        ALTER TABLE ingestion_failures ADD COLUMN attempts INTEGER DEFAULT 1;     -- attempts made before the row was written
        ALTER TABLE ingestion_failures ADD COLUMN failure_class VARCHAR;          -- transient | permanent (NULL: recorded before classes)
        ALTER TABLE ingestion_failures ADD COLUMN traceback VARCHAR;              -- the last attempt's, secrets redacted
        ALTER TABLE ingestion_failures ADD COLUMN input_size_bytes BIGINT;        -- the input's size when it could be read
        ALTER TABLE ingestion_failures ADD COLUMN input_sha256 VARCHAR;           -- sha256 of the input's bytes
        ALTER TABLE documents ADD COLUMN parse_attempts INTEGER;                  -- attempts the last parse of this version took
        """,
    ),
    (
        11,
        "low-confidence OCR regions: recorded per page, counted per document (needs_review), marked on chunks",
        """
        CREATE TABLE low_confidence_regions (
            doc_id         VARCHAR NOT NULL,
            version        INTEGER NOT NULL,
            page_number    INTEGER NOT NULL,
            region_id      VARCHAR NOT NULL,            -- sha256(doc_id|version|page|box)[:24]
            x0 DOUBLE NOT NULL, y0 DOUBLE NOT NULL,     -- the text line's box on the page, in PDF points
            x1 DOUBLE NOT NULL, y1 DOUBLE NOT NULL,
            confidence     DOUBLE NOT NULL,             -- mean word confidence of the line, 0..1
            words          INTEGER NOT NULL,
            text           VARCHAR NOT NULL,            -- what OCR read there
            char_start     INTEGER,                     -- the line's span in the page text (NULL: not found in it)
            char_end       INTEGER,
            PRIMARY KEY (doc_id, version, page_number, region_id)
        );
        ALTER TABLE pages ADD COLUMN ocr_regions INTEGER;                 -- text lines OCR read (NULL: not OCR'd or unknown)
        ALTER TABLE pages ADD COLUMN low_confidence_regions INTEGER;      -- of them, under GROUNDWORK_OCR_LOW_CONFIDENCE
        ALTER TABLE documents ADD COLUMN low_confidence_regions INTEGER DEFAULT 0;
        ALTER TABLE documents ADD COLUMN needs_review BOOLEAN DEFAULT FALSE;  -- it has low-confidence OCR regions
        ALTER TABLE chunks ADD COLUMN low_confidence_ocr BOOLEAN DEFAULT FALSE;  -- the passage overlaps such a region
        """,
    ),
]


def utcnow() -> datetime:
    """Naive UTC timestamp: every TIMESTAMP column in the store is UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _extension_file(package: str, name: str) -> str:
    module = __import__(package)
    pattern = os.path.join(os.path.dirname(module.__file__), "**", f"{name}.duckdb_extension*")
    found = sorted(glob.glob(pattern, recursive=True))
    if not found:
        raise StoreError(f"DuckDB extension file for '{name}' not found inside the {package} package")
    return found[0]


_EXTENSION_PACKAGES = {"fts": "duckdb_extension_fts", "vss": "duckdb_extension_vss"}


def load_extensions(conn: duckdb.DuckDBPyConnection, *names: str) -> None:
    """Load DuckDB extensions from the pip packages that ship them.

    Extensions cannot be downloaded on this machine; ``INSTALL '<path>'``
    copies the packaged file into DuckDB's extension folder (cheap, once) and
    ``LOAD`` activates it for this connection.
    """
    for name in names:
        try:
            conn.execute(f"LOAD {name}")
            continue
        except duckdb.Error:
            pass
        conn.execute(f"INSTALL '{_extension_file(_EXTENSION_PACKAGES[name], name)}'")
        conn.execute(f"LOAD {name}")


def _is_lock_error(error: Exception) -> bool:
    text = str(error).lower()
    return "lock" in text and ("conflicting" in text or "could not set" in text)


def open_duckdb(path: Path, read_only: bool = False, timeout_s: float = 30.0) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB file, waiting up to ``timeout_s`` while another process holds its lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as error:
            if not _is_lock_error(error) or time.monotonic() >= deadline:
                if _is_lock_error(error):
                    raise StoreLockedError(path, str(error)) from error
                raise StoreError(f"cannot open {path}: {error}") from error
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def migrate(conn: duckdb.DuckDBPyConnection, migrations: list[Migration] | None = None) -> int:
    """Apply every migration not yet applied (default: the store's); returns the schema version.

    Each file keeps its own ``schema_migrations`` table; the query log uses this
    with its own list.  A migration whose SQL is a function is rendered only when
    it runs, so settings it reads are the ones of the process creating the file.
    """
    migrations = MIGRATIONS if migrations is None else migrations
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        "version INTEGER PRIMARY KEY, description VARCHAR, applied_at TIMESTAMP)"
    )
    applied = {row[0] for row in conn.execute("SELECT version FROM schema_migrations").fetchall()}
    for version, description, sql in migrations:
        if version in applied:
            continue
        with transaction(conn):
            conn.execute(sql() if callable(sql) else sql)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [version, description, utcnow()])
    return max(v for v, _, _ in migrations)


class ConnectionModeGate:
    """The in-process connection policy for one DuckDB file: one configuration at a time.

    Inside one process DuckDB refuses a read-only connection to a file while a
    read-write one is open, and the reverse (``ConnectionException: ... different
    configuration``); the server reads the store from request threads while its
    ingestion job writes it.  The gate makes that impossible:

    * while read-write connections are open, a read joins them *as read-write*
      (a read-write connection reads just as well; it skips the migrations);
    * while read-only connections are open, a writer waits for them to close
      (reads are short), and reads that arrive after it queue behind it and then
      join it as read-write, so a writer is never starved;
    * when nothing is open, a read opens read-only (several processes can then
      read at once) and a write opens read-write.

    Writers of this process also take turns (``writer``, re-entrant per thread),
    as DuckDB's file lock makes writing processes take turns: two request
    threads registering the same source must not both find it missing.  Reads
    never take that turn.

    Nobody fails because someone else read: waiting is bounded by ``timeout_s``
    and ends in ``StoreBusyError`` (a ``StoreLockedError``), like the
    cross-process file lock.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.mode: str | None = None  # "ro" | "rw" | None (nothing open)
        self.holders = 0
        self.writers_waiting = 0
        self._held: dict[int, int] = {}  # thread id -> connections it holds (nesting joins, never waits)
        self.writer = threading.RLock()  # one writing unit of work at a time in this process

    def acquire(self, read_only: bool, timeout_s: float, path: Path) -> bool:
        """Wait for a slot; returns whether the connection must be opened read-only."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            held = self._held.get(threading.get_ident(), 0)
            if held:  # nested in this thread: join whatever is open (waiting would wait for ourselves)
                if self.mode == "ro" and not read_only:
                    raise StoreError(f"{path}: a write was requested inside a read-only store connection of the same "
                                     "thread; open the write connection first")
                self.holders += 1
                self._held[threading.get_ident()] = held + 1
                return self.mode == "ro"
            waiting_as_writer = False
            try:
                while True:
                    if self.mode is None:
                        self.mode = "ro" if read_only and not self.writers_waiting else "rw"
                        break
                    if self.mode == "rw":
                        break
                    # read-only connections are open
                    if read_only and not self.writers_waiting:
                        break
                    if not read_only and not waiting_as_writer:
                        waiting_as_writer = True
                        self.writers_waiting += 1
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StoreBusyError(path, timeout_s)
                    self._cond.wait(remaining)
            finally:
                if waiting_as_writer:
                    self.writers_waiting -= 1
            self.holders += 1
            self._held[threading.get_ident()] = 1
            return self.mode == "ro"

    def release(self) -> None:
        with self._cond:
            me = threading.get_ident()
            if self._held.get(me, 0) > 1:
                self._held[me] -= 1
            else:
                self._held.pop(me, None)
            self.holders -= 1
            if self.holders == 0:
                self.mode = None
                self._cond.notify_all()


_GATES: dict[str, ConnectionModeGate] = {}
_GATES_LOCK = threading.Lock()


def connection_gate(path: Path) -> ConnectionModeGate:
    """The process-wide gate of one store file (keyed by its resolved path)."""
    key = os.path.realpath(path)
    with _GATES_LOCK:
        gate = _GATES.get(key)
        if gate is None:
            gate = _GATES[key] = ConnectionModeGate()
        return gate


@contextlib.contextmanager
def store_connection(
    path: Path, read_only: bool = False, timeout_s: float = 30.0
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A migrated connection to the store, closed on exit.

    Stages open and close the store per unit of work instead of holding it for
    a whole run, so ``groundwork status`` and other readers only ever wait for
    one short transaction.  Every connection goes through the file's
    ``ConnectionModeGate``: ``read_only=True`` promises not to write and may be
    served by a read-write connection when one is already open in this process.
    """
    if read_only and not path.exists():
        raise StoreError(f"no store at {path}; run `groundwork ingest` first")
    gate = connection_gate(path)
    began = time.monotonic()
    if not read_only and not gate.writer.acquire(timeout=max(0.0, timeout_s)):
        raise StoreBusyError(path, timeout_s)
    try:
        as_read_only = gate.acquire(read_only, max(0.0, timeout_s - (time.monotonic() - began)), path)
        try:
            conn = open_duckdb(path, read_only=as_read_only, timeout_s=max(0.0, timeout_s - (time.monotonic() - began)))
            try:
                if not read_only:
                    migrate(conn)
                yield conn
            finally:
                conn.close()
        finally:
            gate.release()
    finally:
        if not read_only:
            gate.writer.release()


@contextlib.contextmanager
def transaction(conn: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    conn.execute("BEGIN TRANSACTION")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    else:
        conn.execute("COMMIT")
