"""Maintenance: the query log's retention, applied daily.

``query_log_retention`` deletes logged queries (and their feedback) older than
``GROUNDWORK_QUERY_LOG_RETENTION_DAYS`` (``knowledge_store.storage.query_log.purge_query_log``);
its schedule runs by default, and a retention of 0 keeps everything.
"""

import dagster as dg

from knowledge_store.storage.query_log import purge_query_log
from pipelines.resources import KnowledgeStoreResource

GROUP = "maintenance"
QUERY_LOG_RETENTION_JOB_NAME = "query_log_retention"


@dg.asset(group_name=GROUP, kinds={"duckdb"},
          description="The query log with queries older than the retention (and their feedback) deleted.")
def query_log_retention(context: dg.AssetExecutionContext, store: KnowledgeStoreResource) -> dg.MaterializeResult:
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


query_log_retention_job = dg.define_asset_job(
    name=QUERY_LOG_RETENTION_JOB_NAME,
    selection=dg.AssetSelection.assets(query_log_retention),
    description="Delete logged queries and feedback older than GROUNDWORK_QUERY_LOG_RETENTION_DAYS.",
    tags={"groundwork/job": "maintenance"},
)

query_log_retention_daily = dg.ScheduleDefinition(
    name="query_log_retention_daily",
    job=query_log_retention_job,
    cron_schedule="30 1 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    tags={"groundwork/trigger": "schedule"},
    description="Apply the query-log retention at 01:30 every day (GROUNDWORK_QUERY_LOG_RETENTION_DAYS; 0 keeps everything).",
)

MAINTENANCE_ASSETS = [query_log_retention]
