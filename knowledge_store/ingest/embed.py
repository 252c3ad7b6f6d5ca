"""Stage 4: embed every chunk text that has no vector yet for this model.

The cache key is ``(content_hash, model_id)``: text that did not change is
never embedded twice, across versions, documents and runs.  The store is
closed while the model runs and vectors are written in batches, so a kill
loses at most one batch and the next run resumes from the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from knowledge_store.config.settings import Settings
from knowledge_store.core.progress import Sink, stage_progress
from knowledge_store.core.text import sentences_to_embed
from knowledge_store.ingest.sync_runs import add_counts
from knowledge_store.models.embeddings import Embedder, bare_weight_of, embed_chunks
from knowledge_store.storage.store import store_connection, transaction, utcnow


@dataclass
class EmbedResult:
    computed: int = 0
    reused: int = 0
    seconds: float = 0.0
    model_seconds: float = 0.0
    model_id: str = ""
    # sentence vectors (settings.sentence_vectors): chunk texts whose sentences were embedded, and how many sentences
    sentence_texts: int = 0
    sentences: int = 0
    sentence_seconds: float = 0.0

    @property
    def chunks_per_second(self) -> float:
        return self.computed / self.model_seconds if self.model_seconds else 0.0


def shard_of(content_hash: str, shards: int) -> int:
    """Which of ``shards`` embedding shards a text belongs to: from its content hash, so every worker
    (process, pod) agrees without talking to the others, and a text is in exactly one shard."""
    return int(content_hash[:8], 16) % shards if shards > 1 else 0


class MissingText(NamedTuple):
    """A chunk text with no vector yet: what is embedded (header + text) and the text alone."""

    content_hash: str
    embed_text: str
    text: str


def chunk_vectors(embedder, part: list[MissingText]) -> np.ndarray:
    """The vectors of ``part`` as the embedder's model id says they are made (``+bare<w>``: blended with
    the bare text, ``embed_chunks``).  Read off the id, not an attribute, so a wrapper that passes the id
    on can never store plain vectors under a blend's id."""
    return embed_chunks(embedder.embed, [m.embed_text for m in part], [m.text for m in part],
                        bare_weight_of(embedder.model_id))


def missing_embeddings(
    settings: Settings, model_id: str, shard: int = 0, shards: int = 1
) -> tuple[list[MissingText], int]:
    """The chunk texts a snapshot may hold (pending, active and family-superseded versions) with no vector for
    ``model_id`` (this shard only), and how many pending chunks reuse a cached vector.  Superseded ones count:
    a change of model re-embeds them too, or the snapshot would drop them."""
    with store_connection(settings.store_path, read_only=True, timeout_s=settings.lock_timeout_s) as conn:
        # chunks of versions that are waiting to go live, or live ones re-chunked
        wanted = conn.execute(
            """
            SELECT c.content_hash, any_value(c.embed_text), any_value(c.text), bool_or(e.content_hash IS NOT NULL)
            FROM chunks c
            JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version
            LEFT JOIN embeddings e ON e.content_hash = c.content_hash AND e.model_id = ?
            WHERE d.status IN ('pending', 'active', 'superseded')
            GROUP BY c.content_hash ORDER BY c.content_hash
            """,
            [model_id],
        ).fetchall()
        reused_pending = conn.execute(
            """
            SELECT count(*) FROM chunks c JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version
            JOIN embeddings e ON e.content_hash = c.content_hash AND e.model_id = ?
            WHERE d.status = 'pending'
            """,
            [model_id],
        ).fetchone()[0]
    missing = [MissingText(h, t, x) for h, t, x, have in wanted if not have and shard_of(h, shards) == shard]
    return missing, int(reused_pending)


def embed_missing(
    settings: Settings, embedder: Embedder, sync_run_id: str, shard: int = 0, shards: int = 1,
    progress: Sink | None = None,
) -> EmbedResult:
    """Embed the missing texts (of one shard when ``shards`` > 1: several workers can each take one,
    each writing its own short batches; the store's lock makes the writes take turns)."""
    if not 0 <= shard < max(shards, 1):
        raise ValueError(f"shard={shard}: must be in 0..{shards - 1}")
    result = EmbedResult(model_id=embedder.model_id)
    started = time.perf_counter()
    missing, reused_pending = missing_embeddings(settings, embedder.model_id, shard, shards)
    if missing and hasattr(embedder, "load"):
        embedder.load()  # model load time is not inference time
    result.reused = reused_pending if shard == 0 else 0  # counted once, by shard 0
    counts = stage_progress("embed" if shards == 1 else f"embed shard {shard}", "chunks", progress).start(len(missing))
    batch = settings.write_batch_chunks
    for offset in range(0, len(missing), batch):
        part = missing[offset:offset + batch]
        model_started = time.perf_counter()
        vectors = chunk_vectors(embedder, part)
        result.model_seconds += time.perf_counter() - model_started
        frame = pa.table(
            {
                "content_hash": [m.content_hash for m in part],
                "model_id": [embedder.model_id] * len(part),
                "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), embedder.dim),
                "created_at": pa.array([utcnow()] * len(part), type=pa.timestamp("us")),
            }
        )
        with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn, transaction(conn):
            conn.register("emb_df", frame)
            conn.execute(
                f"INSERT OR IGNORE INTO embeddings SELECT content_hash, model_id, embedding::FLOAT[{embedder.dim}], "
                "created_at FROM emb_df"
            )
            conn.unregister("emb_df")
            add_counts(conn, sync_run_id, embeddings_computed=len(part))
        result.computed += len(part)
        counts.advance(len(part))
    counts.finish()
    if result.reused:
        with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
            add_counts(conn, sync_run_id, embeddings_reused=result.reused)
    if settings.sentence_vectors:
        embed_missing_sentences(settings, embedder, result, shard, shards, progress)
    result.seconds = time.perf_counter() - started
    return result


def sentenceless_chunks_sql(statuses: tuple[str, ...]) -> str:
    """``FROM ... WHERE ...`` of the chunks of versions in ``statuses`` whose text has no sentence vectors for the
    model id bound as the one parameter: what the embed stage fills in and what publishing counts."""
    listed = ", ".join(f"'{s}'" for s in statuses)
    return f"""
        FROM chunks c JOIN documents d ON d.doc_id = c.doc_id AND d.version = c.version AND d.status IN ({listed})
        WHERE NOT EXISTS (SELECT 1 FROM sentence_embeddings s WHERE s.content_hash = c.content_hash AND s.model_id = ?)
    """


def missing_sentence_texts(settings: Settings, model_id: str, shard: int = 0, shards: int = 1) -> list[tuple[str, str]]:
    """(content hash, text) of the chunk texts a snapshot may hold (pending, active, retained) whose sentences
    have no vectors for ``model_id`` yet (this shard only)."""
    with store_connection(settings.store_path, read_only=True, timeout_s=settings.lock_timeout_s) as conn:
        rows = conn.execute(
            "SELECT c.content_hash, any_value(c.text) " + sentenceless_chunks_sql(("pending", "active", "superseded"))
            + " GROUP BY c.content_hash ORDER BY c.content_hash", [model_id]).fetchall()
    return [(h, t or "") for h, t in rows if shard_of(h, shards) == shard]


def sentence_table(embedder, part: list[tuple[str, str]]) -> pa.Table:
    """The sentence vectors of ``part`` ((content hash, text) pairs) as ``sentence_embeddings`` rows."""
    split = [sentences_to_embed(text) for _, text in part]
    flat = [sentence for sentences in split for sentence in sentences]
    vectors = np.asarray(embedder.embed(flat), dtype=np.float32).reshape(len(flat), embedder.dim)
    return pa.table({
        "content_hash": [h for (h, _), sentences in zip(part, split) for _ in sentences],
        "model_id": [embedder.model_id] * len(flat),
        "ordinal": pa.array([i for sentences in split for i in range(len(sentences))], type=pa.int32()),
        "embedding": pa.ListArray.from_arrays(
            pa.array(np.arange(0, len(flat) * embedder.dim + 1, embedder.dim, dtype=np.int32)),
            pa.array(vectors.reshape(-1), type=pa.float32())),
    })


def write_sentence_table(settings: Settings, table: pa.Table) -> None:
    """Insert ``sentence_table`` rows into the store (one transaction: a text gets all its sentences or none)."""
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn, transaction(conn):
        conn.register("sentence_df", table)
        conn.execute("INSERT OR IGNORE INTO sentence_embeddings SELECT content_hash, model_id, ordinal, embedding "
                     "FROM sentence_df")
        conn.unregister("sentence_df")


def embed_missing_sentences(settings: Settings, embedder: Embedder, result: EmbedResult, shard: int = 0,
                            shards: int = 1, progress: Sink | None = None,
                            write: Callable[[Settings, pa.Table], None] = write_sentence_table) -> None:
    """Embed the sentences of every chunk text that has none yet (``retrieval/sentences.py``), in the same
    short batches as the chunk vectors: a kill loses at most one batch, the next run resumes.  ``write``
    stores each batch (default: into the store; ``embed_handoff`` hands them off as Parquet parts)."""
    started = time.perf_counter()
    missing = missing_sentence_texts(settings, embedder.model_id, shard, shards)
    if missing and hasattr(embedder, "load"):
        embedder.load()
    label = "embed sentences" if shards == 1 else f"embed sentences shard {shard}"
    counts = stage_progress(label, "chunk texts", progress).start(len(missing))
    batch = settings.write_batch_chunks
    for offset in range(0, len(missing), batch):
        part = missing[offset:offset + batch]
        table = sentence_table(embedder, part)
        write(settings, table)
        result.sentence_texts += len(part)
        result.sentences += table.num_rows
        counts.advance(len(part))
    counts.finish()
    result.sentence_seconds = time.perf_counter() - started
