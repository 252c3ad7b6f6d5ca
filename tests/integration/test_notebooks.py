"""The parameterised notebooks run under papermill, from the CLI and as Dagster assets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from tests.helpers import REPO_ROOT as ROOT
from tests.helpers import write_tiny_beir

pytestmark = pytest.mark.slow


def test_alpha_sweep_runs_under_papermill_from_the_cli(tmp_path):
    write_tiny_beir(tmp_path / "tiny")
    env = {**os.environ, "GROUNDWORK_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run(
        [sys.executable, "-m", "knowledge_store.cli", "notebook", "alpha_sweep", "-p", "dataset", str(tmp_path / "tiny"),
         "-p", "alphas", "[0, 0.5, 1]", "-p", "k", "5"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    notebook = Path(next(line.split(":", 1)[1].strip() for line in result.stdout.splitlines() if line.startswith("notebook:")))
    assert notebook.is_file() and notebook.is_relative_to(tmp_path / "data" / "notebooks")
    executed = json.loads(notebook.read_text())
    assert any("injected-parameters" in c.get("metadata", {}).get("tags", []) for c in executed["cells"])
    plots = list(notebook.parent.glob("alpha_sweep_*.png"))
    assert plots and plots[0].stat().st_size > 1000
    table = (notebook.parent / "alpha_sweep_tiny_test.csv").read_text().splitlines()
    assert len(table) == 4 and table[0].startswith("alpha,method,recall@5")
    assert '"best_alpha"' in result.stdout

    # the console's Evaluation page draws this sweep from the notebook's table
    from knowledge_store.evaluation.results_store import notebook_alpha_sweeps

    [sweep] = notebook_alpha_sweeps(tmp_path / "data" / "notebooks")
    assert (sweep["dataset"], sweep["split"]) == ("tiny", "test") and sweep["plot_path"] == str(plots[0])
    assert [s["name"] for s in sweep["series"]] == ["Recall@5", "nDCG@5"]
    assert [p[0] for p in sweep["series"][0]["points"]] == [0.0, 0.5, 1.0]


def test_unknown_notebook_is_a_clear_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "knowledge_store.cli", "notebook", "nope"], cwd=ROOT,
                            env={**os.environ, "GROUNDWORK_DATA_DIR": str(tmp_path)}, capture_output=True, text=True)
    assert result.returncode == 2 and "alpha_sweep" in result.stderr


def test_reranker_comparison_runs_as_a_dagster_asset(tmp_path, monkeypatch):
    from pipelines.evaluation import NOTEBOOK_ASSETS, EvaluationResource, eval_datasets

    write_tiny_beir(tmp_path / "tiny")
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(tmp_path / "data"))
    evaluation = EvaluationResource(datasets=[str(tmp_path / "tiny")], data_dir=str(tmp_path / "data"))
    result = dg.materialize([eval_datasets, NOTEBOOK_ASSETS[1]], resources={"evaluation": evaluation})
    assert result.success
    meta = result.asset_materializations_for_node("reranker_comparison_notebook")[0].metadata
    assert Path(meta["output_notebook"].value).is_file() and Path(meta["plot_path"].value).is_file()
    assert "data:image/png;base64," in meta["plot"].value
