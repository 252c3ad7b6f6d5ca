"""Embedding shards on other machines: vectors handed off as Parquet parts, written by one step.

On one machine every shard writes its own short batches into ``store.duckdb``;
DuckDB's file lock makes them take turns.  Across machines (Kubernetes pods,
Celery workers) that needs a shared filesystem whose locks DuckDB can trust, which
network filesystems are not.  With ``GROUNDWORK_EMBED_HANDOFF_DIR`` set (a folder
every worker mounts), a shard never opens the store for writing:

* it reads its share of the missing texts (read-only; nobody writes the store while
  the shards run),
* embeds them and writes ``<handoff>/<model id>/shard-<n>-<hash>.parquet`` parts,
  each written to a temporary name and renamed, so a part is whole or absent;
* the combining step - the store's single writer - imports every part
  (``INSERT OR IGNORE``: importing twice is harmless) and deletes it.

A run killed midway leaves whole parts behind; the next run imports them before it
plans its shards, so no finished work is embedded again.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from knowledge_store.config.settings import Settings
from knowledge_store.core.progress import Sink, stage_progress
from knowledge_store.ingest.embed import (
    EmbedResult,
    embed_missing_sentences,
    embed_part,
    missing_embeddings,
    write_sentence_table,
)
from knowledge_store.ingest.sync_runs import add_counts
from knowledge_store.models.embeddings import Embedder
from knowledge_store.storage.store import store_connection, transaction, utcnow


def _model_dir(handoff: Path, model_id: str) -> Path:
    return handoff / hashlib.sha256(model_id.encode()).hexdigest()[:16]


def embed_shard_to_parts(
    settings: Settings, embedder: Embedder, shard: int, shards: int, handoff: Path, progress: Sink | None = None
) -> EmbedResult:
    """Embed one shard's missing texts into Parquet parts under ``handoff`` (the store is only read)."""
    result = EmbedResult(model_id=embedder.model_id)
    started = time.perf_counter()
    missing, reused = missing_embeddings(settings, embedder.model_id, shard, shards)
    result.reused = reused if shard == 0 else 0
    folder = _model_dir(handoff, embedder.model_id)
    folder.mkdir(parents=True, exist_ok=True)
    if missing and hasattr(embedder, "load"):
        embedder.load()
    batch = settings.write_batch_chunks
    counts = stage_progress(f"embed shard {shard}", "chunks", progress).start(len(missing))
    for offset in range(0, len(missing), batch):
        part = missing[offset:offset + batch]
        model_started = time.perf_counter()
        vectors, sentences = embed_part(embedder, part, settings.sentence_vectors)
        result.model_seconds += time.perf_counter() - model_started
        if sentences is not None:  # written before the vectors: a text with a vector part has its sentences
            _write_part(folder, f"sentences-{shard}", sentences)
            result.sentence_texts += len(part)
            result.sentences += sentences.num_rows
        table = pa.table({
            "content_hash": [m.content_hash for m in part],
            "model_id": [embedder.model_id] * len(part),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), embedder.dim),
        })
        _write_part(folder, f"shard-{shard}", table)
        result.computed += len(part)
        counts.advance(len(part))
    counts.finish()
    if settings.sentence_vectors:  # the sentences of the same shard, handed off the same way
        embed_missing_sentences(settings, embedder, result, shard, shards, progress,
                                write=lambda _settings, table: _write_part(folder, f"sentences-{shard}", table))
    result.seconds = time.perf_counter() - started
    return result


def _write_part(folder: Path, prefix: str, table: pa.Table) -> Path:
    """``table`` as ``<folder>/<prefix>-<hash>.parquet``, written to a temporary name and renamed: whole or absent."""
    name = hashlib.sha256("".join(table["content_hash"].to_pylist()).encode()).hexdigest()[:16]
    final = folder / f"{prefix}-{name}.parquet"
    temp = final.with_suffix(".parquet.tmp")
    pq.write_table(table, temp)
    with open(temp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temp, final)
    return final


def import_parts(settings: Settings, handoff: Path, model_id: str, sync_run_id: str | None = None) -> int:
    """Load every whole part for ``model_id`` into the store (one writer), then delete them; returns the chunk
    vectors read (sentence parts are imported too, not counted)."""
    folder = _model_dir(handoff, model_id)
    for part in sorted(folder.glob("sentences-*.parquet")) if folder.is_dir() else []:
        write_sentence_table(settings, pq.read_table(part))  # INSERT OR IGNORE: importing twice is harmless
        part.unlink(missing_ok=True)
    parts = sorted(folder.glob("shard-*.parquet")) if folder.is_dir() else []
    if not parts:
        return 0
    table = pa.concat_tables([pq.read_table(p) for p in parts])
    frame = pa.table({
        "content_hash": table["content_hash"], "model_id": table["model_id"], "embedding": table["embedding"],
        "created_at": pa.array([utcnow()] * table.num_rows, type=pa.timestamp("us")),
    })
    dim = settings.embedding_dim
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn, transaction(conn):
        conn.register("handoff_df", frame)
        conn.execute(f"INSERT OR IGNORE INTO embeddings SELECT content_hash, model_id, embedding::FLOAT[{dim}], "
                     "created_at FROM handoff_df")
        conn.unregister("handoff_df")
        if sync_run_id:
            add_counts(conn, sync_run_id, embeddings_computed=table.num_rows)
    for part in parts:  # only after the commit: a kill before this line just imports them again
        part.unlink(missing_ok=True)
    return table.num_rows
