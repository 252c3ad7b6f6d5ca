"""Entity mentions of stored chunks: the last step of the chunk stage.

Every document version whose ``entity_signature`` is not the vocabulary in force
(new chunks, or changed ``GROUNDWORK_ENTITY_PATTERNS``) has its chunk texts read
again with the vocabulary's regexes and its ``chunk_entities`` rows replaced;
``entities`` gains the new canonical values and spellings.  The pass reads chunk
text from the store (no parse, no chunking, no embedding), in batches written
through Arrow.  Measured on the SciFact store (5,183 abstracts): see
docs/ARCHITECTURE.md, "Entities".

Mentions go with their chunks: re-chunking, a pending version restarted, a
source delete and the retention purge delete them in the same transaction
(``delete_mentions_of_chunks``), and ``delete_orphans`` drops any mention whose
chunk is gone and any catalog row no mention refers to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from knowledge_store.core.entities import EntityMention, EntityVocabulary
from knowledge_store.storage.store import transaction

DOCUMENTS_PER_BATCH = 500


@dataclass
class EntityResult:
    """What one extraction pass did, and what the active index holds afterwards."""

    signature: str = ""
    documents: int = 0  # versions (re-)extracted by this pass
    chunks_scanned: int = 0
    mentions: int = 0  # mentions written by this pass
    orphans_removed: int = 0
    seconds: float = 0.0
    by_type: list[dict[str, object]] = field(default_factory=list)  # current versions: type, entities, mentions, chunks

    @property
    def distinct_entities(self) -> int:
        return int(sum(int(row["entities"]) for row in self.by_type))

    @property
    def active_mentions(self) -> int:
        return int(sum(int(row["mentions"]) for row in self.by_type))


def delete_mentions_of_chunks(conn: duckdb.DuckDBPyConnection, chunk_where: str, params: list) -> None:
    """Delete the mentions of the chunks ``chunks WHERE <chunk_where>`` selects; call before deleting those chunks."""
    conn.execute(f"DELETE FROM chunk_entities WHERE chunk_id IN (SELECT chunk_id FROM chunks WHERE {chunk_where})", params)


def delete_orphans(conn: duckdb.DuckDBPyConnection) -> int:
    """Drop mentions of chunks that no longer exist and entities nothing mentions; returns rows removed."""
    mentions = conn.execute(
        "DELETE FROM chunk_entities ce WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_id = ce.chunk_id)"
    ).fetchone()[0]
    entities = conn.execute(
        "DELETE FROM entities e WHERE NOT EXISTS (SELECT 1 FROM chunk_entities ce WHERE ce.entity_id = e.entity_id)"
    ).fetchone()[0]
    return int(mentions) + int(entities)


def _frames(chunks: list[tuple[str, str]], vocabulary: EntityVocabulary) -> tuple[pa.Table, pa.Table]:
    """(chunk_entities rows, entities rows with the spellings seen) for ``(chunk_id, text)`` pairs."""
    mention_rows: dict[str, list] = {"chunk_id": [], "entity_id": [], "span_start": [], "span_end": [], "confidence": []}
    catalog: dict[str, tuple[EntityMention, set[str]]] = {}
    for chunk_id, text in chunks:
        for mention in vocabulary.extract(text or ""):
            mention_rows["chunk_id"].append(chunk_id)
            mention_rows["entity_id"].append(mention.entity_id)
            mention_rows["span_start"].append(mention.span_start)
            mention_rows["span_end"].append(mention.span_end)
            mention_rows["confidence"].append(mention.confidence)
            _first, labels = catalog.setdefault(mention.entity_id, (mention, set()))
            if mention.surface != mention.canonical_value:
                labels.add(mention.surface)
    mentions = pa.table({
        "chunk_id": pa.array(mention_rows["chunk_id"], pa.string()),
        "entity_id": pa.array(mention_rows["entity_id"], pa.string()),
        "span_start": pa.array(mention_rows["span_start"], pa.int32()),
        "span_end": pa.array(mention_rows["span_end"], pa.int32()),
        "confidence": pa.array(mention_rows["confidence"], pa.float64()),
    })
    entities = pa.table({
        "entity_id": pa.array(list(catalog), pa.string()),
        "type": pa.array([m.type for m, _ in catalog.values()], pa.string()),
        "canonical_value": pa.array([m.canonical_value for m, _ in catalog.values()], pa.string()),
        "alt_labels": pa.array([sorted(labels) for _, labels in catalog.values()], pa.list_(pa.string())),
    })
    return mentions, entities


def _write_batch(conn: duckdb.DuckDBPyConnection, keys: pa.Table, mentions: pa.Table, entities: pa.Table,
                 signature: str) -> None:
    """Replace the mentions of the batch's versions, merge the catalog and stamp the versions, in one transaction."""
    conn.register("entity_docs_df", keys)
    conn.register("entity_mentions_df", mentions)
    conn.register("entity_catalog_df", entities)
    try:
        with transaction(conn):
            conn.execute(
                "DELETE FROM chunk_entities WHERE chunk_id IN (SELECT c.chunk_id FROM chunks c "
                "JOIN entity_docs_df k ON c.doc_id = k.doc_id AND c.version = k.version)"
            )
            if mentions.num_rows:
                conn.execute("INSERT INTO chunk_entities (chunk_id, entity_id, span_start, span_end, confidence) "
                             "SELECT chunk_id, entity_id, span_start, span_end, confidence FROM entity_mentions_df")
                conn.execute(
                    "UPDATE entities SET alt_labels = list_sort(list_distinct(list_concat(entities.alt_labels, n.alt_labels))) "
                    "FROM entity_catalog_df n WHERE entities.entity_id = n.entity_id "
                    "AND NOT list_has_all(entities.alt_labels, n.alt_labels)"
                )
                conn.execute(
                    "INSERT INTO entities (entity_id, type, canonical_value, alt_labels) "
                    "SELECT entity_id, type, canonical_value, alt_labels::VARCHAR[] FROM entity_catalog_df n "
                    "WHERE NOT EXISTS (SELECT 1 FROM entities e WHERE e.entity_id = n.entity_id)"
                )
            conn.execute(
                "UPDATE documents SET entity_signature = ? FROM entity_docs_df k "
                "WHERE documents.doc_id = k.doc_id AND documents.version = k.version",
                [signature],
            )
    finally:
        for name in ("entity_docs_df", "entity_mentions_df", "entity_catalog_df"):
            conn.unregister(name)


def entity_counts(conn: duckdb.DuckDBPyConnection) -> list[dict[str, object]]:
    """Per entity type: distinct entities, mentions and chunks mentioning one, over the newest chunked
    version of each active or pending document (what the index holds once this sync publishes)."""
    rows = conn.execute(
        """
        WITH current_versions AS (
            SELECT doc_id, max(version) AS version FROM documents
            WHERE status IN ('active', 'pending') AND chunker_signature IS NOT NULL GROUP BY doc_id
        )
        SELECT e.type, count(DISTINCT e.entity_id), count(*), count(DISTINCT ce.chunk_id)
        FROM chunk_entities ce
        JOIN entities e ON e.entity_id = ce.entity_id
        JOIN chunks c ON c.chunk_id = ce.chunk_id
        JOIN current_versions v ON v.doc_id = c.doc_id AND v.version = c.version
        GROUP BY e.type ORDER BY e.type
        """
    ).fetchall()
    return [{"type": t, "entities": int(n), "mentions": int(m), "chunks": int(c)} for t, n, m, c in rows]


def extract_entities(conn: duckdb.DuckDBPyConnection, vocabulary: EntityVocabulary) -> EntityResult:
    """(Re-)extract the mentions of every chunked version not extracted with ``vocabulary``, drop
    orphans, and count what the active index holds.  No progress stage of its own: it is a regex
    pass over stored text, seconds even for a full re-extraction (docs/ARCHITECTURE.md)."""
    started = time.perf_counter()
    signature = vocabulary.signature
    result = EntityResult(signature=signature)
    todo = conn.execute(
        "SELECT doc_id, version FROM documents WHERE chunker_signature IS NOT NULL "
        "AND status IN ('pending', 'active', 'superseded') AND entity_signature IS DISTINCT FROM ? "
        "ORDER BY doc_id, version",
        [signature],
    ).fetchall()
    for offset in range(0, len(todo), DOCUMENTS_PER_BATCH):
        batch = todo[offset:offset + DOCUMENTS_PER_BATCH]
        keys = pa.table({"doc_id": pa.array([d for d, _ in batch], pa.string()),
                         "version": pa.array([v for _, v in batch], pa.int32())})
        conn.register("entity_docs_df", keys)
        try:
            chunks = conn.execute(
                "SELECT c.chunk_id, c.text FROM chunks c JOIN entity_docs_df k ON c.doc_id = k.doc_id AND c.version = k.version"
            ).fetchall()
        finally:
            conn.unregister("entity_docs_df")
        mentions, entities = _frames(chunks, vocabulary)
        _write_batch(conn, keys, mentions, entities, signature)
        result.documents += len(batch)
        result.chunks_scanned += len(chunks)
        result.mentions += mentions.num_rows
    with transaction(conn):
        result.orphans_removed = delete_orphans(conn)
    result.by_type = entity_counts(conn)
    result.seconds = time.perf_counter() - started
    return result
