"""The one ``Definitions`` object Dagster loads (``workspace.yaml`` -> ``pipelines``)."""

from __future__ import annotations

import os

import dagster as dg

from knowledge_store.config.settings import Settings
from knowledge_store.core.progress import install_terminal_progress
from pipelines.evaluation import EVALUATION_ASSETS, EVALUATION_CHECKS, NOTEBOOK_ASSETS, EvaluationResource
from pipelines.finetuning import FINETUNE_JOB_NAME, FINETUNING_ASSETS, FINETUNING_CHECKS, build_finetune_sensor
from pipelines.ingestion import INGESTION_ASSETS, INGESTION_CHECKS
from pipelines.maintenance import MAINTENANCE_ASSETS, purge_query_log_job, query_log_retention_daily
from pipelines.resources import EmbeddingModelResource, KnowledgeStoreResource, RetrievalResource
from pipelines.sensors import INGEST_JOB_NAME, build_failure_sensor, build_schedule, build_sensor
from pipelines.sources import SOURCE_ASSETS, SYNC_SOURCE_JOB_NAME, build_source_registry_sensor
from pipelines.tuning import TUNE_JOB_NAME, TUNING_ASSETS, TUNING_CHECKS, build_feedback_sensor

__all__ = ["FINETUNE_JOB_NAME", "INGEST_JOB_NAME", "SYNC_SOURCE_JOB_NAME", "TUNE_JOB_NAME", "build_definitions", "defs",
           "finetune_job", "ingest_job", "sync_source_job", "tune_job"]

ingest_job = dg.define_asset_job(
    name=INGEST_JOB_NAME,
    selection=dg.AssetSelection.groups("ingestion"),
    description="Sync the sources into the store and publish a new index snapshot. In one process by default (the "
                "model loads once); with GROUNDWORK_EMBED_WORKERS > 1 pick the multiprocess executor in the launchpad "
                "(or a K8s/Celery executor) and the embedding shards run at once.",
    tags={"groundwork/job": "ingest"},
    executor_def=dg.multi_or_in_process_executor,
    config={"execution": {"config": {"in_process": {}}}},
)

sync_source_job = dg.define_asset_job(
    name=SYNC_SOURCE_JOB_NAME,
    selection=dg.AssetSelection.assets(*SOURCE_ASSETS),
    description="Re-sync one source (pick its partition) and publish the index; the other sources are not touched.",
    # same tag as ingest: the instance runs at most one store writer at a time (dagster.yaml)
    tags={"groundwork/job": "ingest"},
)

evaluate_job = dg.define_asset_job(
    name="evaluate",
    selection=dg.AssetSelection.groups("evaluation"),
    description="Evaluate every retrieval configuration on the labelled sets and rebuild the scorecard.",
    tags={"groundwork/job": "evaluate"},
)

nightly_eval = dg.ScheduleDefinition(
    name="nightly_eval",
    job=evaluate_job,
    cron_schedule="0 3 * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Evaluate at 03:00, after the 02:00 re-sync (off by default; switch on in the UI).",
)

tune_job = dg.define_asset_job(
    name=TUNE_JOB_NAME,
    selection=dg.AssetSelection.groups("tuning"),
    description="Self-tune the ranking on the corpus's headings, titles, FAQ questions and feedback (index/tuned.json).",
    tags={"groundwork/job": "tune"},
)

finetune_job = dg.define_asset_job(
    name=FINETUNE_JOB_NAME,
    selection=dg.AssetSelection.groups("finetuning"),
    description="Fine-tune the embedding model on the corpus (no labels) and serve it only if held-out pseudo-queries "
                "rank clearly better (index/embedder.json). Writes the store: it takes turns with the ingest runs.",
    tags={"groundwork/job": "ingest"},
)

weekly_tuning = dg.ScheduleDefinition(
    name="weekly_tuning",
    job=tune_job,
    cron_schedule="0 4 * * 0",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    tags={"groundwork/trigger": "schedule"},
    description="Re-tune the ranking on Sundays at 04:00, after the 02:00 re-sync (off by default; switch on in the UI).",
)


def build_definitions(
    store: KnowledgeStoreResource | None = None,
    model: EmbeddingModelResource | None = None,
    retrieval: RetrievalResource | None = None,
    evaluation: EvaluationResource | None = None,
) -> dg.Definitions:
    settings = Settings()
    return dg.Definitions(
        assets=[*INGESTION_ASSETS, *SOURCE_ASSETS, *TUNING_ASSETS, *FINETUNING_ASSETS, *EVALUATION_ASSETS,
                *NOTEBOOK_ASSETS, *MAINTENANCE_ASSETS],
        asset_checks=[*INGESTION_CHECKS, *TUNING_CHECKS, *FINETUNING_CHECKS, *EVALUATION_CHECKS],
        jobs=[ingest_job, sync_source_job, tune_job, finetune_job, evaluate_job, purge_query_log_job],
        sensors=[
            build_sensor(ingest_job, settings.sensor_interval_s),
            build_failure_sensor([ingest_job, sync_source_job, tune_job, finetune_job, evaluate_job,
                                  purge_query_log_job]),
            build_source_registry_sensor(),
            build_feedback_sensor(tune_job, settings.feedback_check_interval_s),
            build_finetune_sensor(finetune_job),
        ],
        schedules=[build_schedule(ingest_job), weekly_tuning, nightly_eval, query_log_retention_daily],
        resources={
            "store": store or KnowledgeStoreResource(),
            "model": model or EmbeddingModelResource(),
            "retrieval": retrieval or RetrievalResource(data_dir=store.data_dir if store else None),
            "evaluation": evaluation or EvaluationResource(data_dir=store.data_dir if store else None),
        },
        # one process for the whole chain: the model and torch load once per run
        executor=dg.in_process_executor,
    )


if os.environ.get("GROUNDWORK_TERMINAL_PROGRESS"):
    # `groundwork ingest` / `groundwork sync` run the job in a process of their own: it shows each stage's counts
    install_terminal_progress()

defs = build_definitions()
