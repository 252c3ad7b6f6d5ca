"""The fine-tuning sensor as `dagster dev` runs it: the `pipelines` code location loaded from workspace.yaml in a
code server of its own (as tests/integration/test_dagster_code_location.py loads it), the sensor evaluated there
the way the daemon evaluates it, and the run it requests created and launched through the instance's run launcher
- the fine-tuning itself runs in the code server's run worker, on a tiny budget (MiniLM, a few seconds)."""

from __future__ import annotations

import shutil
import time
import uuid
from datetime import datetime, timezone

import dagster as dg
import pytest
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.sample_corpus import write_sample_corpus
from knowledge_store.learning.finetune import Decision, corpus_change
from knowledge_store.models.embeddings import model_id_for
from knowledge_store.models.serving import EmbedderRecord, save_record
from tests.helpers import REPO_ROOT, copy_project_docs

pytestmark = pytest.mark.slow
WORKSPACE = REPO_ROOT / "workspace.yaml"
SENSOR = "corpus_changed_for_finetuning"
# the code server and its run workers inherit these: a tiny fine-tuning run, never skipped for a small held-out set
ENV = {
    "GROUNDWORK_FINETUNE_MIN_PAIRS": "10",
    "GROUNDWORK_FINETUNE_BUDGET_S": "3",
    "GROUNDWORK_TORCH_THREADS": "2",
    "GROUNDWORK_FINETUNE_TARGET_GAIN": "1.0",
    "HF_HUB_OFFLINE": "1",
}
ADDED = ("MCP.md", "WIDGET.md")  # project docs added by the second sync: well over a fifth of the corpus


def _evaluate(location, repo, instance) -> object:
    """One sensor tick, evaluated in the code server as the sensor daemon evaluates it."""
    return location.get_sensor_execution_data(instance, repo.handle, SENSOR, None, None, None, None, None)


def _launch(location, repo, instance, process, request) -> str:
    """Create the requested run as the sensor daemon does and hand it to the instance's run launcher."""
    job = repo.get_full_job(request.job_name or "finetune")
    plan = location.get_execution_plan(
        job, request.run_config, step_keys_to_execute=None, known_state=None, instance=instance
    )
    run = instance.create_run(
        job_name=job.name,
        run_id=str(uuid.uuid4()),
        run_config=request.run_config,
        resolved_op_selection=job.resolved_op_selection,
        step_keys_to_execute=None,
        status=dg.DagsterRunStatus.NOT_STARTED,
        op_selection=None,
        root_run_id=None,
        parent_run_id=None,
        tags={**(job.run_tags or {}), **request.tags, "dagster/run_key": request.run_key},
        job_snapshot=job.job_snapshot,
        execution_plan_snapshot=plan.execution_plan_snapshot,
        parent_job_snapshot=job.parent_job_snapshot,
        remote_job_origin=job.get_remote_origin(),
        job_code_origin=job.get_python_origin(),
        asset_selection=None,
        asset_check_selection=None,
        asset_graph=repo.asset_graph,
    )
    instance.launch_run(run.run_id, process.create_request_context())
    return run.run_id


def test_a_sync_that_changes_a_fifth_of_the_corpus_starts_a_finetuning_run_with_its_decision_and_memory(
    tmp_path, monkeypatch, embedder
):
    write_sample_corpus(tmp_path / "sample")
    (tmp_path / "added").mkdir()
    data = tmp_path / "data"
    for key, value in {**ENV, "GROUNDWORK_DATA_DIR": str(data)}.items():
        monkeypatch.setenv(key, value)
    settings = Settings(data_dir=data, sources=[tmp_path / "sample", tmp_path / "added"])
    run_sync(settings, embedder)
    # a decision made just now: nothing is new since
    save_record(
        settings.index_dir,
        EmbedderRecord(
            base_model_id=model_id_for(settings.model_path),
            decision=Decision(
                decision="declined",
                reason="declined: the decision before this test's sync",
                base_model_id=model_id_for(settings.model_path),
                finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            ).to_dict(),
        ),
    )
    time.sleep(1.1)  # the new vectors are made after the decision (timestamps to the second)

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "pipelines" / "dagster.yaml", home / "dagster.yaml")
    with (
        dg.DagsterInstance.from_config(str(home)) as instance,
        WorkspaceProcessContext(
            instance, WorkspaceFileTarget(paths=[str(WORKSPACE)]), version=dg.__version__
        ) as process,
    ):
        entry = process.create_request_context().get_code_location_entries()["pipelines"]
        assert entry.load_error is None, entry.load_error.to_string()
        location = entry.code_location
        repo = next(iter(location.get_repositories().values()))
        assert repo.get_sensor(SENSOR).get_targets()[0].job_name == "finetune"

        quiet = _evaluate(location, repo, instance)
        assert not quiet.run_requests and "new since the last fine-tuning decision" in quiet.skip_message

        copy_project_docs(tmp_path / "added", names=ADDED)
        run_sync(settings, embedder)
        share, _, _ = corpus_change(settings)
        assert share >= settings.finetune_change_share  # the sync changed at least a fifth of the corpus

        tick = _evaluate(location, repo, instance)
        assert len(tick.run_requests) == 1, tick.skip_message
        request = tick.run_requests[0]
        assert request.tags["groundwork/trigger"] == "corpus-changed"
        run_id = _launch(location, repo, instance, process, request)
        deadline = time.monotonic() + 900
        while not instance.get_run_by_id(run_id).is_finished:
            assert time.monotonic() < deadline, "the fine-tuning run did not finish in 15 minutes"
            time.sleep(1)
        run = instance.get_run_by_id(run_id)
        assert run.status == dg.DagsterRunStatus.SUCCESS, [e.message for e in instance.all_logs(run_id)][-20:]
        assert run.job_name == "finetune" and run.tags["groundwork/trigger"] == "corpus-changed"

        event = instance.get_latest_materialization_event(dg.AssetKey("finetuned_embedder"))
        assert event is not None and event.run_id == run_id
        metadata = event.asset_materialization.metadata
        assert metadata["decision"].value in ("adopted", "declined")
        assert metadata["reason"].value.startswith(metadata["decision"].value)
        assert metadata["training_steps"].value >= 1 and "training steps" in metadata["progress"].value
        assert metadata["peak_rss_mb"].value > 100  # the run worker's own peak: torch and a model at least
        assert metadata["memory_plan"].value["batch_size"] == 32
        memory = metadata["memory_mb"].value  # the plan's estimate beside what the run worker held and reached
        assert 0 < memory["resident_mb_at_plan"] < memory["estimate_mb"] and memory["peak_mb_after_training"] > 0
        logs = " ".join(e.message or "" for e in instance.all_logs(run_id))
        assert "fine-tune step 1/" in logs  # training's progress in the run's log

        again = _evaluate(location, repo, instance)  # decided: nothing new since
        assert not again.run_requests, again.skip_message
