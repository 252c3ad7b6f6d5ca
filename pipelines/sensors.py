"""Automation: a sensor that notices changed source files and a daily re-sync schedule.

The sensor only stats files (path, size, mtime) - cheap enough to run every
minute - and requests an ``ingest`` run when that fingerprint changes; the
run itself decides by SHA-256 what really changed.  It is ON by default.
The daily schedule is a safety net (and applies the retention purge); it is
OFF by default - switch it on in the UI or with ``dagster schedule start``.
"""


import hashlib
import json
import os
from datetime import datetime, timezone

import dagster as dg

from knowledge_store.core.errors import StoreError
from knowledge_store.ingest.sources import list_sources
from knowledge_store.storage.store import store_connection
from pipelines.resources import KnowledgeStoreResource

INGEST_JOB_NAME = "ingest"


def source_fingerprint(folders: list) -> tuple[str, int]:
    """Hash of (relative path, size, mtime) of every visible file in the folders."""
    digest = hashlib.sha256()
    count = 0
    for folder in folders:
        digest.update(f"\0{folder}".encode())
        if not os.path.isdir(folder):
            continue
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if name.startswith("."):
                    continue
                path = os.path.join(root, name)
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                digest.update(f"{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
                count += 1
    return digest.hexdigest()[:32], count


def watched_folders(settings) -> list[str]:
    """The configured folders plus the enabled folder sources registered through the CLI/API."""
    folders = [str(p) for p in settings.source_dirs]
    if settings.store_path.exists():
        try:
            with store_connection(settings.store_path, read_only=True, timeout_s=5) as conn:
                folders += [s.location for s in list_sources(conn) if s.kind == "folder" and s.enabled
                            and s.origin == "user" and s.location not in folders]
        except StoreError:
            pass  # a sync holds the store; the configured folders still count
    return folders


def build_sensor(job, interval_s: int) -> dg.SensorDefinition:
    @dg.sensor(
        name="source_files_changed",
        job=job,
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests an ingest run when files in the source folders are added, changed or removed.",
    )
    def source_files_changed(context: dg.SensorEvaluationContext, store: KnowledgeStoreResource):
        settings = store.settings()
        fingerprint, count = source_fingerprint(watched_folders(settings))
        if context.cursor == fingerprint:
            return dg.SkipReason(f"no change in {count} files")
        in_flight = context.instance.get_runs(
            filters=dg.RunsFilter(
                job_name=INGEST_JOB_NAME,
                statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED],
            ),
            limit=1,
        )
        if in_flight:
            return dg.SkipReason("an ingest run is in progress; will look again")
        context.update_cursor(fingerprint)
        return dg.RunRequest(
            run_key=fingerprint,
            # folders only: a changed file must not start a crawl of every web source
            tags={"groundwork/trigger": "sensor", "groundwork/kinds": "folder,upload"},
            run_config={},
        )

    return source_files_changed


def build_schedule(job) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="daily_resync",
        job=job,
        cron_schedule="0 2 * * *",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        tags={"groundwork/trigger": "schedule"},
        description="Re-sync every source at 02:00 (off by default; the sensor handles file changes).",
    )


def build_failure_sensor(jobs: list) -> dg.SensorDefinition:
    """Makes a failed ingest/evaluate run impossible to miss: one clear line in the Dagster log and
    in ``<data_dir>/run_failures.jsonl`` (job, run id, step, error), which `groundwork status` shows."""

    @dg.run_failure_sensor(name="report_run_failures", monitored_jobs=jobs,
                           default_status=dg.DefaultSensorStatus.RUNNING)
    def report_run_failures(context: dg.RunFailureSensorContext, store: KnowledgeStoreResource):
        failure = context.failure_event
        steps = [e.step_key for e in context.get_step_failure_events()]
        record = {
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "job": context.dagster_run.job_name, "run_id": context.dagster_run.run_id,
            "steps": steps, "error": (failure.message or "")[:2000],
        }
        path = store.settings().data_dir / "run_failures.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        context.log.error(f"run {record['run_id']} of job '{record['job']}' FAILED in {steps or 'setup'}: {record['error'][:300]}")

    return report_run_failures
