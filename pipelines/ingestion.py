"""Ingestion assets: raw documents -> parsed documents -> chunks -> embeddings -> search index.

The data lives in DuckDB (``store.duckdb`` and the index snapshots), not in
Dagster's IO managers: each asset is one call to a stage of the ingestion sequence
(``knowledge_store.ingest.run``: the same functions the API's in-process syncs run)
and reports what it did as metadata.  The asset checks sit next to the assets they
check and call the sequence's checks (``knowledge_store.ingest.checks``).
"""


import dagster as dg

from knowledge_store.core.progress import DagsterLogSink
from knowledge_store.ingest.checks import INDEX_CHECKS, IndexCheck
from knowledge_store.ingest.chunk import chunking_config
from knowledge_store.ingest.embed_handoff import embed_shard_to_parts, import_parts
from knowledge_store.ingest.failures import open_failures
from knowledge_store.ingest.run import chunk_stage, embed_stage, parse_stage, publish_stage, record_sources
from knowledge_store.ingest.sync_runs import current_sync_run
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
    result = parse_stage(settings, _run_id(store, context), progress=DagsterLogSink(context.log))
    context.log.info(
        f"parsed {result.parsed} documents ({result.pages} pages, {result.pages_per_minute:.0f} pages/min, "
        f"{result.pages_ocr} OCR'd in {result.ocr_seconds:.1f} s), {result.failed} failed; "
        f"{result.retried} retried after a transient failure ({result.recovered} recovered, "
        f"{result.retry_attempts} extra attempts, {result.retry_wait_s:g} s waited)"
    )
    for failure in result.failures:
        context.log.warning(f"ingestion failure: {failure['path']}: {failure['reason']}")
    for skipped in result.skipped:
        context.log.warning(f"not indexed ({skipped['kind']}): {skipped['path']}: {skipped['reason']}")
    return dg.MaterializeResult(
        metadata={
            "documents_parsed": result.parsed,
            "failures": result.failed,
            "pages": result.pages,
            "pages_without_text_layer": result.pages_without_text,
            "pages_ocr": result.pages_ocr,
            "ocr_seconds": round(result.ocr_seconds, 2),
            "blocks": result.blocks,
            "retried": result.retried,
            "recovered_on_retry": result.recovered,
            "retry_attempts": result.retry_attempts,
            "retry_wait_s": round(result.retry_wait_s, 3),
            "duration_s": round(result.seconds, 3),
            "pages_per_minute": round(result.pages_per_minute, 1),
            "by_type": dg.MetadataValue.json(result.by_type),
            "failure_rows": markdown_table(result.failures),
            "skipped": len(result.skipped),
            "skipped_rows": markdown_table(result.skipped),
            "preview": markdown_table(result.preview),
        }
    )


@dg.asset(group_name=GROUP, deps=[parsed_documents], kinds={"duckdb"}, description="Structure-aware chunks of at most 254 word-pieces with citation fields.")
def chunks(context: dg.AssetExecutionContext, store: KnowledgeStoreResource, model: EmbeddingModelResource) -> dg.MaterializeResult:
    settings = store.settings()
    result = chunk_stage(settings, _run_id(store, context), progress=DagsterLogSink(context.log), counter=model.token_counter())
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
        result = embed_stage(settings, embedder, _run_id(store, context), progress=DagsterLogSink(context.log),
                             shard=shard, shards=settings.embed_workers)
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
    # the resource's embedder follows the serving model unless the resource names a model of its own
    result = publish_stage(settings, model.embedder(settings=settings), _run_id(store, context),
                           follow_serving=not model.model_path, progress=DagsterLogSink(context.log))
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
            # files superseded by a newer revision (another file) / active again, relations in the index
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


def _check(result: IndexCheck) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=result.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"offending_rows": result.offending_rows, "check": result.description, **result.metadata},
    )


def _asset_check(name: str, asset) -> dg.AssetChecksDefinition:
    """The ingestion sequence's check ``name`` (``INDEX_CHECKS``) as a Dagster check of ``asset``."""
    spec = INDEX_CHECKS[name]

    @dg.asset_check(asset=asset, name=name, description=spec.description)
    def check(store: KnowledgeStoreResource) -> dg.AssetCheckResult:
        return _check(spec.run(store.settings()))

    return check


_STAGE_ASSETS = {"chunks": chunks, "embeddings": embeddings, "search_index": search_index}
INGESTION_CHECK_DEFS = {name: _asset_check(name, _STAGE_ASSETS[spec.stage]) for name, spec in INDEX_CHECKS.items()}


INGESTION_ASSETS = [raw_documents, parsed_documents, chunks, embeddings, search_index]
INGESTION_CHECKS = list(INGESTION_CHECK_DEFS.values())
