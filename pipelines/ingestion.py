"""Ingestion assets: raw documents -> parsed documents -> chunks -> embeddings -> search index.

The data lives in DuckDB (``store.duckdb`` and the index snapshots), not in
Dagster's IO managers: each asset calls one stage of ``knowledge_store.ingest``
and reports what it did as metadata.  The asset checks sit next to the assets
they check.
"""


import dagster as dg

from knowledge_store.core.progress import DagsterLogSink
from knowledge_store.ingest.chunk import chunk_parsed, chunking_config
from knowledge_store.ingest.embed import embed_missing
from knowledge_store.ingest.embed_handoff import embed_shard_to_parts, import_parts
from knowledge_store.ingest.failures import open_failures
from knowledge_store.ingest.parse import parse_pending
from knowledge_store.ingest.publish import publish_index
from knowledge_store.ingest.run import record_sources
from knowledge_store.ingest.sync_runs import current_sync_run
from knowledge_store.models.serving import serving_model_id
from knowledge_store.storage.index import open_snapshot
from knowledge_store.storage.store import store_connection
from pipelines.metadata import markdown_table
from pipelines.resources import EmbeddingModelResource, KnowledgeStoreResource
from pipelines.sources import crawl_logger

GROUP = "ingestion"


def _run_id(store: KnowledgeStoreResource, context: dg.AssetExecutionContext) -> str:
    settings = store.settings()
    with store_connection(settings.store_path, timeout_s=settings.lock_timeout_s) as conn:
        return current_sync_run(conn, context.run.run_id)


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="Files in the source folders and pages of the web sources, hashed and recorded as document versions.")
def raw_documents(context: dg.AssetExecutionContext, store: KnowledgeStoreResource) -> dg.MaterializeResult:
    settings = store.settings()
    trigger = context.run.tags.get("groundwork/trigger", "dagster")
    # the file-change sensor syncs folders only ("folder,upload"): a web crawl never runs because a file changed
    kinds_tag = context.run.tags.get("groundwork/kinds")
    kinds = [k.strip() for k in kinds_tag.split(",") if k.strip()] if kinds_tag else None
    result = record_sources(settings, sync_run_id=context.run.run_id, trigger=trigger, kinds=kinds,
                            progress=crawl_logger(context))
    context.log.info(
        f"sources synced ({', '.join(result.sources)}): {result.files_seen} files/pages, {result.added} new, "
        f"{result.updated} changed, {result.removed} removed, {result.unchanged} unchanged, "
        f"{result.excluded} excluded, {result.failed} refused"
    )
    for items in result.excluded_items.values():
        for item in items:
            if "symbolic link" in item["reason"]:  # a link out of a source folder: worth a look
                context.log.warning(f"excluded {item['path']}: {item['reason']}")
    return dg.MaterializeResult(
        metadata={
            "files_seen": result.files_seen,
            "added": result.added,
            "updated": result.updated,
            "removed": result.removed,
            "unchanged": result.unchanged,
            "excluded": result.excluded,
            "pending_versions": result.pending,
            "failures_new": result.failed,
            "bytes_hashed": result.bytes_hashed,
            "sources": dg.MetadataValue.json(result.sources),
            "per_source": dg.MetadataValue.json(result.per_source),
            "crawls": dg.MetadataValue.json(
                {name: {k: v for k, v in crawl.items() if k != "excluded_preview"} for name, crawl in result.crawls.items()}
            ),
            "missing_sources": dg.MetadataValue.json(result.missing_sources),
            "excluded_items": dg.MetadataValue.json(result.excluded_items),
            "changes": markdown_table(result.changes),
            "sync_run_id": result.sync_run_id,
        }
    )


@dg.asset(group_name=GROUP, deps=[raw_documents], kinds={"pymupdf"}, description="Pending versions parsed into pages and structural blocks.")
def parsed_documents(context: dg.AssetExecutionContext, store: KnowledgeStoreResource) -> dg.MaterializeResult:
    settings = store.settings()
    result = parse_pending(settings, _run_id(store, context), progress=DagsterLogSink(context.log))
    context.log.info(
        f"parsed {result.parsed} documents ({result.pages} pages, {result.pages_per_minute:.0f} pages/min, "
        f"{result.pages_ocr} OCR'd in {result.ocr_seconds:.1f} s), {result.failed} failed"
    )
    for failure in result.failures:
        context.log.warning(f"ingestion failure: {failure['path']}: {failure['reason']}")
    return dg.MaterializeResult(
        metadata={
            "documents_parsed": result.parsed,
            "failures": result.failed,
            "pages": result.pages,
            "pages_without_text_layer": result.pages_without_text,
            "pages_ocr": result.pages_ocr,
            "ocr_seconds": round(result.ocr_seconds, 2),
            "blocks": result.blocks,
            "duration_s": round(result.seconds, 3),
            "pages_per_minute": round(result.pages_per_minute, 1),
            "by_type": dg.MetadataValue.json(result.by_type),
            "failure_rows": markdown_table(result.failures),
            "preview": markdown_table(result.preview),
        }
    )


@dg.asset(group_name=GROUP, deps=[parsed_documents], kinds={"duckdb"}, description="Structure-aware chunks of at most 254 word-pieces with citation fields.")
def chunks(context: dg.AssetExecutionContext, store: KnowledgeStoreResource, model: EmbeddingModelResource) -> dg.MaterializeResult:
    settings = store.settings()
    result = chunk_parsed(settings, model.token_counter(), _run_id(store, context), progress=DagsterLogSink(context.log))
    rate = result.chunks / result.seconds if result.seconds else 0.0
    context.log.info(f"chunked {result.documents} documents into {result.chunks} chunks ({rate:.0f} chunks/s)")
    entities = result.entities
    per_type = ", ".join(f"{row['entities']} {row['type']}" for row in entities.by_type) or "none"
    context.log.info(f"entities: {entities.documents} versions (re-)extracted, {entities.mentions} mentions written; "
                     f"active index: {entities.distinct_entities} entities ({per_type}), {entities.active_mentions} mentions")
    return dg.MaterializeResult(
        metadata={
            "documents_chunked": result.documents,
            "chunks_created": result.chunks,
            "empty_documents": result.empty_documents,
            "tokens_min": result.token_stats["min"],
            "tokens_median": result.token_stats["median"],
            "tokens_max": result.token_stats["max"],
            "duration_s": round(result.seconds, 3),
            "chunks_per_second": round(rate, 1),
            "chunker_signature": chunking_config(settings).signature,
            "preview": markdown_table(result.preview),
            # entities named in chunk text (knowledge_store/core/entities.py): this run's extraction, then the active index
            "entity_signature": entities.signature,
            "entity_documents_extracted": entities.documents,
            "entity_mentions_extracted": entities.mentions,
            "entity_extraction_s": round(entities.seconds, 3),
            "entities_distinct": entities.distinct_entities,
            "entity_mentions": entities.active_mentions,
            **{f"entities_{row['type']}": int(row["entities"]) for row in entities.by_type},
            "entities_by_type": markdown_table(entities.by_type),
        }
    )


@dg.op(ins={"after_chunks": dg.In(dg.Nothing)}, out=dg.DynamicOut(int),
       description="One step per embedding shard (GROUNDWORK_EMBED_WORKERS); shards split the missing texts by content hash.")
def plan_embedding_shards(context: dg.OpExecutionContext, store: KnowledgeStoreResource,
                          model: EmbeddingModelResource):
    settings = store.settings()
    shards = settings.embed_workers
    if settings.embed_handoff_dir is not None:  # whole parts a killed run left behind: import, never re-embed
        leftover = import_parts(settings, settings.embed_handoff_dir, model.embedder(settings=settings).model_id, _run_id(store, context))
        if leftover:
            context.log.info(f"imported {leftover} vectors left in {settings.embed_handoff_dir} by an interrupted run")
    context.log.info(f"embedding in {shards} shard(s)"
                     + (f", handing vectors off through {settings.embed_handoff_dir}" if settings.embed_handoff_dir else ""))
    for shard in range(shards):
        yield dg.DynamicOutput(shard, mapping_key=f"shard_{shard}")


@dg.op(description="Embed one shard's missing texts; each step loads the model once and writes short batches.")
def embed_shard(context: dg.OpExecutionContext, shard: int, store: KnowledgeStoreResource,
                model: EmbeddingModelResource) -> dict:
    settings = store.settings()
    embedder = model.embedder(workers=settings.embed_workers, settings=settings)  # the cores are shared between the shards
    if settings.embed_handoff_dir is not None:  # another machine: never write the store, leave Parquet parts
        result = embed_shard_to_parts(settings, embedder, shard, settings.embed_workers, settings.embed_handoff_dir,
                                      progress=DagsterLogSink(context.log))
    else:
        result = embed_missing(settings, embedder, _run_id(store, context), shard=shard, shards=settings.embed_workers,
                               progress=DagsterLogSink(context.log))
    context.log.info(
        f"shard {shard}/{settings.embed_workers}: embedded {result.computed} new texts "
        f"({result.chunks_per_second:.1f}/s, {embedder.torch_threads} thread(s)), reused {result.reused} from cache"
    )
    if result.sentence_texts:
        context.log.info(f"shard {shard}: embedded the {result.sentences} sentences of {result.sentence_texts} chunk "
                         f"texts in {result.sentence_seconds:.1f} s (sentence evidence)")
    return {"shard": shard, "computed": result.computed, "reused": result.reused, "model_id": result.model_id,
            "sentence_texts": result.sentence_texts, "sentences": result.sentences,
            "sentence_seconds": round(result.sentence_seconds, 3),
            "seconds": round(result.seconds, 3), "model_seconds": round(result.model_seconds, 3),
            "chunks_per_second": round(result.chunks_per_second, 1), "threads": embedder.torch_threads}


@dg.op(out=dg.Out(dg.Nothing), description="Import handed-off vectors (the store's one writer) and sum the shards "
                                          "into the asset's metadata.")
def combine_embedding_shards(context: dg.OpExecutionContext, shards: list[dict], store: KnowledgeStoreResource) -> None:
    shards = sorted(shards, key=lambda r: r["shard"])
    settings = store.settings()
    if settings.embed_handoff_dir is not None and shards:
        imported = import_parts(settings, settings.embed_handoff_dir, shards[0]["model_id"], _run_id(store, context))
        context.log.info(f"imported {imported} handed-off vectors into the store")
    computed = sum(r["computed"] for r in shards)
    wall = max((r["seconds"] for r in shards), default=0.0)
    context.add_output_metadata({
        "embeddings_computed": computed,
        "embeddings_reused": sum(r["reused"] for r in shards),
        "model_id": shards[0]["model_id"] if shards else "",
        "shards": len(shards),
        "duration_s": wall,
        "model_seconds": round(sum(r["model_seconds"] for r in shards), 3),
        # the shards run at once under a multiprocess/K8s/Celery executor: throughput is over the slowest shard
        "chunks_per_second": round(computed / wall, 1) if wall else 0.0,
        "torch_threads": shards[0]["threads"] if shards else 0,
        # every chunk text's sentences embedded alone (settings.sentence_vectors; retrieval/sentences.py)
        "sentence_texts_embedded": sum(r["sentence_texts"] for r in shards),
        "sentences_embedded": sum(r["sentences"] for r in shards),
        "sentence_seconds": round(max((r["sentence_seconds"] for r in shards), default=0.0), 3),
        "per_shard": markdown_table([{k: r[k] for k in ("shard", "computed", "seconds", "chunks_per_second", "threads")}
                                     for r in shards]),
    })


@dg.graph_asset(
    group_name=GROUP, kinds={"pytorch"},
    ins={"chunks": dg.AssetIn(key=chunks.key, dagster_type=dg.Nothing)},
    description="all-MiniLM-L6-v2 vectors, cached by content hash; embedded in GROUNDWORK_EMBED_WORKERS shards "
                "(parallel steps under the multiprocess, Kubernetes or Celery executor; the store keeps one writer).",
)
def embeddings(chunks):
    return combine_embedding_shards(plan_embedding_shards(chunks).map(embed_shard).collect())


@dg.asset(group_name=GROUP, deps=[embeddings], kinds={"duckdb"}, description="Published index snapshot: BM25 (fts) + vectors of active chunks.")
def search_index(context: dg.AssetExecutionContext, store: KnowledgeStoreResource, model: EmbeddingModelResource) -> dg.MaterializeResult:
    settings = store.settings()
    result = publish_index(settings, model.embedder(settings=settings).model_id, _run_id(store, context))
    summary = result.sync_run.get("summary", "")
    with store_connection(settings.store_path, read_only=True) as conn:
        failures = open_failures(conn)
    context.log.info(
        f"sync: {summary}; snapshot {result.snapshot_version} "
        f"({'built' if result.snapshot_built else 'unchanged'}), {result.chunk_count} chunks"
    )
    return dg.MaterializeResult(
        metadata={
            "sync_summary": str(summary),
            "snapshot_version": result.snapshot_version,
            "snapshot_built": result.snapshot_built,
            "chunks_indexed": result.chunk_count,
            "documents_indexed": result.document_count,
            "activated_new": result.activated_added,
            "activated_updated": result.activated_updated,
            "purged_documents": result.purged_documents,
            # seed 003: files superseded by a newer revision (another file) / active again, relations in the index
            "revisions_superseded": int(result.revisions.get("superseded", 0)),
            "revisions_reactivated": int(result.revisions.get("reactivated", 0)),
            "relations_supersedes": int(result.revisions.get("supersedes", 0)),
            "relations_see_also": int(result.revisions.get("see_also", 0)),
            "revision_changes": dg.MetadataValue.json(result.revisions.get("changes", [])),
            "sentence_vectors": result.sentence_vectors,  # the snapshot carries them: sentence evidence is on
            "sentence_texts_missing": result.sentence_texts_missing,
            "build_duration_s": round(result.build_seconds, 3),
            "duration_s": round(result.seconds, 3),
            "open_ingestion_failures": len(failures),
            "failures": markdown_table([{k: f[k] for k in ("path", "stage", "kind", "reason")} for f in failures]),
            "retired_snapshots": dg.MetadataValue.json(result.retired),
            "sync_run": dg.MetadataValue.json({k: str(v) for k, v in result.sync_run.items() if k != "details"}),
        }
    )


# ---------------------------------------------------------------- asset checks


def _check(passed: bool, count: int, description: str, **metadata: object) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"offending_rows": count, "check": description, **metadata},
    )


@dg.asset_check(asset=chunks, description="No chunk is empty or whitespace.")
def no_empty_chunks(store: KnowledgeStoreResource) -> dg.AssetCheckResult:
    settings = store.settings()
    with store_connection(settings.store_path, read_only=True) as conn:
        bad = conn.execute("SELECT count(*) FROM chunks WHERE length(trim(text)) = 0").fetchone()[0]
    return _check(bad == 0, bad, "length(trim(text)) = 0")


@dg.asset_check(asset=chunks, description="Every chunk carries the fields a citation needs and fits the model window.")
def chunks_have_citation_fields(store: KnowledgeStoreResource) -> dg.AssetCheckResult:
    settings = store.settings()
    with store_connection(settings.store_path, read_only=True) as conn:
        bad = conn.execute(
            """
            SELECT count(*) FROM chunks c JOIN documents d USING (doc_id, version)
            WHERE c.chunk_id IS NULL OR c.doc_id IS NULL OR c.version IS NULL OR c.title IS NULL
               OR c.source_path IS NULL OR c.url IS NULL OR c.section_path IS NULL OR c.content_hash IS NULL
               OR c.char_start < 0
               OR (c.char_end <= c.char_start AND coalesce(c.page_start, 1) = coalesce(c.page_end, 1))
               OR c.token_count < 1 OR c.token_count > ?
               OR (d.paginated AND (c.page_start IS NULL OR c.page_end IS NULL OR c.page_end < c.page_start))
            """,
            [settings.chunk_max_tokens],
        ).fetchone()[0]
        total = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    return _check(bad == 0, bad, "citation fields present, token_count within the window", chunks_checked=total)


@dg.asset_check(asset=embeddings, description="Every vector of the serving model has its settings.embedding_dim "
                                             "dimensions and unit L2 norm.")
def embeddings_are_unit_vectors(store: KnowledgeStoreResource) -> dg.AssetCheckResult:
    settings = store.settings()
    with store_connection(settings.store_path, read_only=True) as conn:
        bad, total, worst = conn.execute(
            """
            SELECT count(*) FILTER (WHERE len(embedding) <> ? OR abs(sqrt(list_dot_product(embedding::FLOAT[], embedding::FLOAT[])) - 1) > 1e-3),
                   count(*), coalesce(max(abs(sqrt(list_dot_product(embedding::FLOAT[], embedding::FLOAT[])) - 1)), 0)
            FROM embeddings WHERE model_id = ?
            """,
            [settings.embedding_dim, serving_model_id(settings)],
        ).fetchone()
    return _check(bad == 0, bad, f"dimension {settings.embedding_dim} and |norm - 1| <= 1e-3", vectors_checked=total,
                  worst_norm_error=float(worst))


@dg.asset_check(asset=search_index, description="The published snapshot holds exactly the active chunks, all in the BM25 index.")
def index_matches_active_chunks(store: KnowledgeStoreResource) -> dg.AssetCheckResult:
    settings = store.settings()
    with store_connection(settings.store_path, read_only=True) as conn:
        active, retained = conn.execute(
            "SELECT count(*) FILTER (WHERE d.status = 'active'), count(*) FILTER (WHERE d.status = 'superseded') "
            "FROM chunks c JOIN documents d USING (doc_id, version)"
        ).fetchone()
    snap, info = open_snapshot(settings.index_dir)
    try:
        indexed_active, indexed_all = snap.execute(
            "SELECT count(*) FILTER (WHERE status = 'active'), count(*) FROM chunks"
        ).fetchone()
        in_fts = snap.execute("SELECT count(*) FROM fts_main_chunks.docs").fetchone()[0]
        with_vectors = snap.execute("SELECT count(*) FROM chunks WHERE embedding IS NOT NULL").fetchone()[0]
    finally:
        snap.close()
    passed = active == indexed_active and indexed_all == in_fts == with_vectors == active + retained
    return _check(
        passed, abs(active - indexed_active) + abs(active + retained - indexed_all),
        "snapshot active rows = active chunks in the store; every row (active + retained superseded) in fts and with a vector",
        active_chunks=active, superseded_chunks_retained=retained, snapshot_active_rows=indexed_active,
        snapshot_rows=indexed_all, fts_documents=in_fts, vectors=with_vectors, snapshot_version=info.snapshot_version,
    )


INGESTION_ASSETS = [raw_documents, parsed_documents, chunks, embeddings, search_index]
INGESTION_CHECKS = [no_empty_chunks, chunks_have_citation_fields, embeddings_are_unit_vectors, index_matches_active_chunks]
