"""Maintenance: the query log's retention, applied daily.

The job ``purge_query_log`` materialises the asset ``retained_query_log``: logged queries (and their
feedback) older than ``GROUNDWORK_QUERY_LOG_RETENTION_DAYS`` deleted
(``knowledge_store.storage.query_log.purge_query_log``). Its schedule ``query_log_retention_daily`` runs by
default, and a retention of 0 keeps everything. The asset is named for what it holds and the job for what it
does: Dagster refuses a code location whose job shares its name with an asset (the asset's op).
"""

import dagster as dg

from knowledge_store.storage.query_log import purge_query_log
from pipelines.resources import KnowledgeStoreResource

GROUP = "maintenance"
PURGE_QUERY_LOG_JOB_NAME = "purge_query_log"


@dg.asset(group_name=GROUP, kinds={"duckdb"},
          description="The query log with queries older than the retention (and their feedback) deleted.")
def retained_query_log(context: dg.AssetExecutionContext, store: KnowledgeStoreResource) -> dg.MaterializeResult:
    settings = store.settings()
    result = purge_query_log(settings)
    if result.kept_everything:
        context.log.info(f"retention off (0 days): {result.queries_left} queries kept")
    else:
        context.log.info(f"deleted {result.queries_deleted} queries logged before {result.cutoff}; "
                         f"{result.queries_left} left")
    return dg.MaterializeResult(metadata={
        "retention_days": result.days,
        "cutoff": result.cutoff or "",
        "queries_deleted": result.queries_deleted,
        "queries_left": result.queries_left,
        "kept_everything": result.kept_everything,
        "log": str(settings.logs_path),
    })


purge_query_log_job = dg.define_asset_job(
    name=PURGE_QUERY_LOG_JOB_NAME,
    selection=dg.AssetSelection.assets(retained_query_log),
    description="Delete logged queries and feedback older than GROUNDWORK_QUERY_LOG_RETENTION_DAYS.",
    tags={"groundwork/job": "maintenance"},
)

query_log_retention_daily = dg.ScheduleDefinition(
    name="query_log_retention_daily",
    job=purge_query_log_job,
    cron_schedule="30 1 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    tags={"groundwork/trigger": "schedule"},
    description="Apply the query-log retention at 01:30 every day (GROUNDWORK_QUERY_LOG_RETENTION_DAYS; 0 keeps everything).",
)

MAINTENANCE_ASSETS = [retained_query_log]
