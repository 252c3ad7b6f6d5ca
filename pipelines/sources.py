"""One Dagster partition per source: re-sync a single folder or site from the UI.

``source_sync`` is partitioned by the dynamic partitions ``sources`` (one key
per source name).  Materialising one partition runs every stage for that
source only - scan or crawl, parse, chunk, embed - and publishes the whole
index, so the other sources are not touched.  The ``source_registry`` sensor
keeps the partition keys equal to the store's source names (adding a source
through the CLI or API makes it appear within the sensor interval, no restart).
The full ``ingest`` job still syncs every source in one run.
"""


import time

import dagster as dg

from knowledge_store.core.errors import StoreError
from knowledge_store.core.progress import DagsterLogSink
from knowledge_store.ingest.failures import open_failures
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.sources import get_source, list_sources, register_configured_sources, source_statistics
from knowledge_store.storage.store import store_connection
from pipelines.metadata import markdown_table
from pipelines.resources import EmbeddingModelResource, KnowledgeStoreResource

SOURCE_PARTITIONS = dg.DynamicPartitionsDefinition(name="sources")
SYNC_SOURCE_JOB_NAME = "sync_source"


def crawl_logger(context: dg.AssetExecutionContext):
    """Crawl progress while the run is going: a line in the run's log and an asset observation
    carrying the counters (visible on the asset's page before the materialisation lands).
    The crawler reports every ``web_progress_interval_s``."""
    partition = context.partition_key if context.has_partition_key else None

    stages = DagsterLogSink(context.log)

    def report(source: str, progress: dict) -> None:
        if "unit" in progress:  # a stage's counts (parse/chunk/embed), not the crawl's
            stages(source, progress)
            return
        done = " (done)" if progress.get("done") else ""
        context.log.info(
            f"crawl {source}{done}: fetched {progress.get('fetched', 0)}, unchanged {progress.get('not_modified', 0)}, "
            f"queued {progress.get('queued', '-')}, excluded {progress.get('excluded', 0)}, failed {progress.get('failed', 0)}, "
            f"{progress.get('requests', 0)} requests"
        )
        context.log_event(dg.AssetObservation(
            asset_key=context.asset_key, partition=partition,
            metadata={"crawl_source": source, **{f"crawl_{k}": v for k, v in progress.items()
                                                 if isinstance(v, (int, float)) and not isinstance(v, bool)},
                      "crawl_done": bool(progress.get("done"))},
        ))

    return report


class SourceSyncConfig(dg.Config):
    refresh: bool = False  # web: download every page again, ignoring sitemap <lastmod> and ETag/Last-Modified


@dg.asset(
    group_name="sources",
    partitions_def=SOURCE_PARTITIONS,
    kinds={"duckdb"},
    description="One source (folder, uploads or web site) synced on its own, then the index published.",
)
def source_sync(
    context: dg.AssetExecutionContext, config: SourceSyncConfig, store: KnowledgeStoreResource,
    model: EmbeddingModelResource,
) -> dg.MaterializeResult:
    settings = store.settings()
    name = context.partition_key
    started = time.perf_counter()
    report = run_sync(
        settings, model.embedder(settings=settings), trigger=context.run.tags.get("groundwork/trigger", "dagster-partition"),
        names=[name], progress=crawl_logger(context), sync_run_id=context.run.run_id, refresh=config.refresh,
    )
    raw = report.raw
    with store_connection(settings.store_path, read_only=True) as conn:
        source = get_source(conn, name)
        stats = source_statistics(conn, source.source_id)
        failures = [f for f in open_failures(conn) if f.get("source_id") == source.source_id]
    crawl = raw.crawls.get(name, {})
    context.log.info(
        f"source {name}: {report.summary}; {raw.excluded} excluded; snapshot {report.publish.snapshot_version}; "
        f"{stats['documents']} documents, {stats['chunks']} chunks"
    )
    metadata: dict[str, object] = {
        "source": name,
        "kind": source.kind,
        "location": source.location,
        "sync_summary": report.summary,
        "added": raw.added,
        "updated": raw.updated,
        "removed": raw.removed,
        "unchanged": raw.unchanged,
        "excluded": raw.excluded,
        "failed": raw.failed + report.parse.failed,
        "documents": stats["documents"],
        "pages": stats["pages"],
        "chunks": stats["chunks"],
        "open_failures": stats["open_failures"],
        "snapshot_version": report.publish.snapshot_version,
        "duration_s": round(time.perf_counter() - started, 3),
        "changes": markdown_table(raw.changes),
        "failures": markdown_table([{k: f[k] for k in ("path", "stage", "kind", "reason")} for f in failures]),
    }
    if crawl:
        metadata["crawl"] = dg.MetadataValue.json({k: v for k, v in crawl.items() if k != "excluded_preview"})
        metadata["excluded_preview"] = markdown_table(
            [{"url": url, "reason": why} for url, why in crawl.get("excluded_preview", [])]
        )
    return dg.MaterializeResult(metadata=metadata)


def source_names(store: KnowledgeStoreResource) -> list[str]:
    """Names of the sources the store knows (not deleted); registers the configured folders first."""
    settings = store.settings()
    with store_connection(settings.store_path, timeout_s=5) as conn:
        register_configured_sources(conn, settings)
        return [s.name for s in list_sources(conn)]


def build_source_registry_sensor(interval_s: int = 30) -> dg.SensorDefinition:
    @dg.sensor(
        name="source_registry",
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Keeps the 'sources' partitions equal to the store's sources (added through CLI/API appear without restart).",
    )
    def source_registry(context: dg.SensorEvaluationContext, store: KnowledgeStoreResource):
        try:
            names = source_names(store)
        except StoreError as error:  # a sync holds the store: look again next tick
            return dg.SkipReason(f"store busy: {error}")
        known = set(context.instance.get_dynamic_partitions(SOURCE_PARTITIONS.name))
        add = sorted(set(names) - known)
        drop = sorted(known - set(names))
        if not add and not drop:
            return dg.SkipReason(f"{len(names)} sources, partitions up to date")
        requests = []
        if add:
            requests.append(SOURCE_PARTITIONS.build_add_request(add))
        if drop:
            requests.append(SOURCE_PARTITIONS.build_delete_request(drop))
        context.log.info(f"source partitions: added {add or 'none'}, removed {drop or 'none'}")
        return dg.SensorResult(dynamic_partitions_requests=requests)

    return source_registry


SOURCE_ASSETS = [source_sync]
