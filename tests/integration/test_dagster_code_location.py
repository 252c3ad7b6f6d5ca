"""The Dagster code location loads the way `dagster dev` loads it, with everything README says it has.

`dagster dev -w workspace.yaml` gives its webserver and daemon the workspace file; they load the `pipelines`
location in a gRPC code server of its own.  The fixture below does the same through Dagster's workspace loading
(``WorkspaceProcessContext`` on ``workspace.yaml``, the instance configured by ``pipelines/dagster.yaml``), so a
definition Dagster refuses (two definitions of one name, a job selecting nothing) fails here as it would in the UI.
``dagster definitions validate -w workspace.yaml`` - what ``make lint`` runs - must pass too.  Importing
``pipelines.defs`` alone proves neither: ``Definitions`` resolves lazily.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from tests.helpers import REPO_ROOT

WORKSPACE = REPO_ROOT / "workspace.yaml"
LOCATION = "pipelines"

JOBS = {"ingest", "sync_source", "tune", "finetune", "evaluate", "purge_query_log"}
ASSETS_BY_GROUP = {
    "ingestion": {"raw_documents", "parsed_documents", "chunks", "embeddings", "search_index"},
    "sources": {"source_sync"},
    "tuning": {"corpus_tuning", "query_adapter"},
    "finetuning": {"finetuned_embedder"},
    "evaluation": {"eval_datasets", "retrieval_eval_bm25", "retrieval_eval_vector", "retrieval_eval_hybrid",
                   "retrieval_eval_hybrid_dbsf", "retrieval_eval_hybrid_rrf", "retrieval_eval_hybrid_calibrated",
                   "retrieval_eval_hybrid_mmr",
                   "example_questions_eval", "eval_scorecard", "feedback_eval", "query_log_eval", "query_log_drift"},
    "notebooks": {"alpha_sweep_notebook", "reranker_comparison_notebook"},
    "maintenance": {"retained_query_log"},
}
ASSET_CHECKS = {
    ("chunks", "no_empty_chunks"), ("chunks", "chunks_have_citation_fields"),
    ("embeddings", "embeddings_are_unit_vectors"), ("search_index", "index_matches_active_chunks"),
    ("corpus_tuning", "tuning_not_worse_than_builtin"), ("query_adapter", "adapter_helps_held_out_queries"),
    ("finetuned_embedder", "served_snapshot_uses_the_serving_model"), ("eval_scorecard", "recall_did_not_regress"),
    ("feedback_eval", "feedback_recall_did_not_regress"),
}
# "- Sensor `name` (**on** by default ..." in README's Automation section
AUTOMATION_LINE = re.compile(r"^- (Sensor|Schedule) `(\w+)` \(\*\*(on|off)\*\* by default", re.MULTILINE)


@dataclass(frozen=True)
class LoadedLocation:
    load_error: str | None
    repository: object | None  # dagster's RemoteRepository: what the webserver and the daemon work from

    def repo(self):
        assert self.load_error is None, f"the {LOCATION} code location failed to load:\n{self.load_error}"
        return self.repository


def _dagster_home(root: Path) -> Path:
    """A throwaway DAGSTER_HOME with the instance configuration `make run` copies into data/dagster_home."""
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "pipelines" / "dagster.yaml", home / "dagster.yaml")
    return home


@pytest.fixture(scope="module")
def location(tmp_path_factory) -> LoadedLocation:
    root = tmp_path_factory.mktemp("dagster-location")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GROUNDWORK_DATA_DIR", str(root / "data"))  # the code server inherits it: ./data is never touched
        with dg.DagsterInstance.from_config(str(_dagster_home(root))) as instance, WorkspaceProcessContext(
                instance, WorkspaceFileTarget(paths=[str(WORKSPACE)]), version=dg.__version__) as process:
            entry = process.create_request_context().get_code_location_entries()[LOCATION]
            if entry.load_error is not None:
                yield LoadedLocation(entry.load_error.to_string(), None)
                return
            repositories = entry.code_location.get_repositories()
            assert len(repositories) == 1, f"one repository expected in {LOCATION}, got {sorted(repositories)}"
            yield LoadedLocation(None, next(iter(repositories.values())))


def _readme_automation() -> dict[tuple[str, str], str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Automation\n", 1)[1].split("\n## ", 1)[0]
    return {(kind.lower(), name): state for kind, name, state in AUTOMATION_LINE.findall(section)}


def test_definitions_validate_passes_on_the_workspace(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(_dagster_home(tmp_path)), "GROUNDWORK_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(WORKSPACE)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr  # Dagster's log goes to stdout, Python's warnings to stderr
    assert done.returncode == 0, output[-4000:]
    assert f"Validation successful for code location {LOCATION}" in output


def test_dagster_dev_loads_the_code_location_without_error(location):
    assert location.load_error is None, location.load_error


def test_every_job_sensor_schedule_asset_and_check_resolves(location):
    repo = location.repo()
    jobs = {job.name for job in repo.get_all_jobs() if not job.name.startswith("__")}  # __ASSET_JOB: Dagster's own
    assert jobs == JOBS
    for name in JOBS:
        assert repo.get_full_job(name).name == name
        assert repo.get_asset_node_snaps(job_name=name), f"job {name} selects no asset"

    for sensor in repo.get_sensors():
        assert {target.job_name for target in sensor.get_targets()} <= jobs, sensor.name
    for schedule in repo.get_schedules():
        assert schedule.job_name in jobs, schedule.name

    groups: dict[str, set[str]] = {}
    for node in repo.get_asset_node_snaps():
        groups.setdefault(node.group_name, set()).add(node.asset_key.to_user_string())
    assert groups == ASSETS_BY_GROUP
    checks = {(c.key.asset_key.to_user_string(), c.key.name) for c in repo.get_asset_check_node_snaps()}
    assert checks == ASSET_CHECKS


def test_sensors_and_schedules_start_running_or_stopped_as_readme_says(location):
    repo = location.repo()
    running = {dg.DefaultSensorStatus.RUNNING, dg.DefaultScheduleStatus.RUNNING}
    loaded = {("sensor", s.name): "on" if s.default_status in running else "off" for s in repo.get_sensors()}
    loaded |= {("schedule", s.name): "on" if s.default_status in running else "off" for s in repo.get_schedules()}
    readme = _readme_automation()
    assert readme, "README's Automation section lists no sensor or schedule"
    assert loaded == readme
