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
from knowledge_store.core.text import sentence_spans_to_embed, sentences_to_embed
from knowledge_store.ingest.sync_runs import add_counts
from knowledge_store.models.embeddings import (
    Embedder,
    bare_weight_of,
    blend_bare,
    embed_chunks,
    in_context_sentences_of,
)
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


def embeds_sentences_in_context(embedder) -> bool:
    """The embedder's sentence vectors are pooled from its chunks' own pass (settings ``sentence_encoding``):
    read off the model id, as the bare-text blend, so a wrapper that passes the id on without
    ``embed_in_context`` fails instead of storing sentences embedded alone under an in-context id."""
    return in_context_sentences_of(embedder.model_id)


def embed_part(embedder, part: list[MissingText], sentences: bool) -> tuple[np.ndarray, pa.Table | None]:
    """``part``'s chunk vectors and, when ``sentences`` and the embedder pools them in context, their sentence
    rows from the same forward pass (None otherwise: separate sentences come from ``embed_missing_sentences``)."""
    if sentences and embeds_sentences_in_context(embedder):
        return in_context_vectors(embedder, part)
    return chunk_vectors(embedder, part), None


def in_context_vectors(embedder, part: list[MissingText]) -> tuple[np.ndarray, pa.Table]:
    """One forward pass over ``part``'s embed texts (header + text) gives both the chunk vectors and each
    sentence's vector (``sentence_spans_to_embed`` of the text, its token states pooled in context).  A
    sentence the model's window cut off, a text without words, or one its embed text does not end with (no
    offsets to pool), is embedded on its own, as in ``separate`` mode."""
    spans, sentences = [], []
    for m in part:
        text_spans = sentence_spans_to_embed(m.text)
        shift = len(m.embed_text) - len(m.text) if m.embed_text.endswith(m.text) else None
        sentences.append([" ".join(m.text[a:b].split()) for a, b in text_spans] or [""])
        spans.append([(a + shift, b + shift) for a, b in text_spans] if shift is not None and text_spans else [])
    vectors, pooled, covered = embedder.embed_in_context([m.embed_text for m in part], spans)
    flat = [sentence for text_sentences in sentences for sentence in text_sentences]
    sentence_vectors = np.zeros((len(flat), embedder.dim), dtype=np.float32)
    row = position = 0
    alone: list[int] = []
    for text_spans, text_sentences in zip(spans, sentences):
        if text_spans:
            sentence_vectors[row:row + len(text_spans)] = pooled[position:position + len(text_spans)]
            alone += [row + j for j in range(len(text_spans)) if not covered[position + j]]
            position += len(text_spans)
        else:
            alone += list(range(row, row + len(text_sentences)))
        row += len(text_sentences)
    if alone:
        sentence_vectors[alone] = np.asarray(embedder.embed([flat[i] for i in alone]), dtype=np.float32)
    chunk = blend_bare(vectors, embedder.embed, [m.embed_text for m in part], [m.text for m in part],
                       bare_weight_of(embedder.model_id))
    return chunk, sentence_rows(embedder, [m.content_hash for m in part], [len(x) for x in sentences], sentence_vectors)


def sentence_rows(embedder, hashes: list[str], counts: list[int], vectors: np.ndarray) -> pa.Table:
    """``sentence_embeddings`` rows: ``counts[i]`` sentence vectors (in order) for the text ``hashes[i]``."""
    total = int(sum(counts))
    return pa.table({
        "content_hash": [h for h, n in zip(hashes, counts) for _ in range(n)],
        "model_id": [embedder.model_id] * total,
        "ordinal": pa.array([i for n in counts for i in range(n)], type=pa.int32()),
        "embedding": pa.ListArray.from_arrays(
            pa.array(np.arange(0, total * embedder.dim + 1, embedder.dim, dtype=np.int32)),
            pa.array(np.asarray(vectors, dtype=np.float32).reshape(-1), type=pa.float32())),
    })


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
        vectors, sentences = embed_part(embedder, part, settings.sentence_vectors)
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
            if sentences is not None:  # a text gets its vector and its sentences together, or neither
                insert_sentence_rows(conn, sentences)
                result.sentence_texts += len(part)
                result.sentences += sentences.num_rows
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


def missing_sentence_texts(settings: Settings, model_id: str, shard: int = 0, shards: int = 1) -> list[MissingText]:
    """The chunk texts a snapshot may hold (pending, active, retained) whose sentences have no vectors for
    ``model_id`` yet (this shard only)."""
    with store_connection(settings.store_path, read_only=True, timeout_s=settings.lock_timeout_s) as conn:
        rows = conn.execute(
            "SELECT c.content_hash, any_value(c.embed_text), any_value(c.text) "
            + sentenceless_chunks_sql(("pending", "active", "superseded"))
            + " GROUP BY c.content_hash ORDER BY c.content_hash", [model_id]).fetchall()
    return [MissingText(h, e or "", t or "") for h, e, t in rows if shard_of(h, shards) == shard]


def sentence_table(embedder, part: list[MissingText]) -> pa.Table:
    """The sentence vectors of ``part`` as ``sentence_embeddings`` rows: each sentence embedded on its own,
    or, for an embedder that pools them in context, from a pass over the chunk texts (their vectors unused)."""
    if embeds_sentences_in_context(embedder):
        return in_context_vectors(embedder, part)[1]
    split = [sentences_to_embed(m.text) for m in part]
    flat = [sentence for sentences in split for sentence in sentences]
    vectors = np.asarray(embedder.embed(flat), dtype=np.float32).reshape(len(flat), embedder.dim)
    return sentence_rows(embedder, [m.content_hash for m in part], [len(x) for x in split], vectors)


def insert_sentence_rows(conn, table: pa.Table) -> None:
    """Insert ``sentence_table`` rows on ``conn`` (inside the caller's transaction)."""
    conn.register("sentence_df", table)
    conn.execute("INSERT OR IGNORE INTO sentence_embeddings SELECT content_hash, model_id, ordinal, embedding "
                 "FROM sentence_df")
    conn.unregister("sentence_df")


def write_sentence_table(settings: Settings, table: pa.Table) -> None:
    """Insert ``sentence_table`` rows into the store (one transaction: a text gets all its sentences or none)."""
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn, transaction(conn):
        insert_sentence_rows(conn, table)


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
