"""Automation: a sensor that notices changed source files and a daily re-sync schedule.

The sensor only stats files (path, size, mtime) - cheap enough to run every
minute - and requests an ``ingest`` run when that fingerprint changes; the
run itself decides by SHA-256 what really changed.  It is ON by default.
The daily schedule is a safety net (and applies the retention purge); it is
OFF by default - switch it on in the UI or with ``dagster schedule start``.
"""


import hashlib
import os

import dagster as dg

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
        fingerprint, count = source_fingerprint([str(p) for p in settings.source_dirs])
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
            tags={"groundwork/trigger": "sensor"},
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
