"""The one ``Definitions`` object Dagster loads (``workspace.yaml`` -> ``pipelines``)."""

from __future__ import annotations

import dagster as dg

from knowledge_store.settings import Settings
from pipelines.ingestion import INGESTION_ASSETS, INGESTION_CHECKS
from pipelines.resources import EmbeddingModelResource, KnowledgeStoreResource, RetrievalResource
from pipelines.sensors import INGEST_JOB_NAME, build_schedule, build_sensor

__all__ = ["INGEST_JOB_NAME", "build_definitions", "defs", "ingest_job"]

ingest_job = dg.define_asset_job(
    name=INGEST_JOB_NAME,
    selection=dg.AssetSelection.groups("ingestion"),
    description="Sync the sources into the store and publish a new index snapshot.",
    tags={"groundwork/job": "ingest"},
)


def build_definitions(
    store: KnowledgeStoreResource | None = None,
    model: EmbeddingModelResource | None = None,
    retrieval: RetrievalResource | None = None,
) -> dg.Definitions:
    settings = Settings()
    return dg.Definitions(
        assets=INGESTION_ASSETS,
        asset_checks=INGESTION_CHECKS,
        jobs=[ingest_job],
        sensors=[build_sensor(ingest_job, settings.sensor_interval_s)],
        schedules=[build_schedule(ingest_job)],
        resources={
            "store": store or KnowledgeStoreResource(),
            "model": model or EmbeddingModelResource(),
            "retrieval": retrieval or RetrievalResource(data_dir=store.data_dir if store else None),
        },
        # one process for the whole chain: the model and torch load once per run
        executor=dg.in_process_executor,
    )


defs = build_definitions()
