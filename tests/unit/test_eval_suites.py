"""Evaluation as data: the committed suites and set manifests load, a bad one is refused naming its file and field,
the regression gate names the set, configuration and metric that dropped, and evals/ stays out of the wheel."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from knowledge_store.evaluation.suites import SuiteError, gate_failures, load_baseline, load_set, load_suite
from tests.helpers import REPO_ROOT

EVALS = REPO_ROOT / "evals"


def test_every_committed_suite_and_set_manifest_loads():
    suites = {path.stem: load_suite(path) for path in sorted((EVALS / "suites").glob("*.yaml"))}
    assert {"docs", "scifact", "sample", "feedback", "logs"} <= set(suites)
    assert [s.name for s in suites["docs"].sets] == ["debian-docs", "perl-docs"]
    assert all(s.build and "evals.experiments" in s.build for s in suites["docs"].sets)  # how to build them
    scifact = suites["scifact"].sets[0]
    assert scifact.folder(REPO_ROOT) == (REPO_ROOT.parent / "shared" / "datasets" / "scifact").resolve()
    for path in (EVALS / "sets").glob("*.yaml"):
        assert load_set(path).name == path.stem  # a suite names a set by its file
    for suite in suites.values():
        assert suite.gate.metric in suite.metrics and suite.baseline_path() == (EVALS / "baseline.json").resolve()


def test_the_committed_baseline_names_sets_and_configurations_of_the_suites():
    baseline = load_baseline(EVALS / "baseline.json")
    assert baseline, "evals/baseline.json holds measured figures"
    known = {f"{s.name}/{c.name}" for path in (EVALS / "suites").glob("*.yaml")
             for suite in [load_suite(path)] for s in suite.sets for c in suite.configurations}
    assert set(baseline) <= known


def _suite(tmp_path: Path, body: str) -> Path:
    (tmp_path / "evals" / "sets").mkdir(parents=True, exist_ok=True)
    (tmp_path / "evals" / "suites").mkdir(exist_ok=True)
    (tmp_path / "evals" / "sets" / "mine.yaml").write_text("name: mine\nkind: beir\npath: my-questions\n")
    path = tmp_path / "evals" / "suites" / "s.yaml"
    path.write_text("name: s\nsets: [mine]\n" + body)
    return path


@pytest.mark.parametrize(("body", "field", "says"), [
    ("configurations: [{name: a, fusion: nope}]\nmetrics: [recall@5]\n", "configurations[0].fusion", "nope"),
    ("configurations: [{name: a, reranker: magic}]\nmetrics: [recall@5]\n", "configurations[0].reranker", "magic"),
    ("configurations: [{name: a, alpha: 1.5}]\nmetrics: [recall@5]\n", "configurations[0].alpha", "1.5"),
    ("configurations: [{name: a, alhpa: 0.5}]\nmetrics: [recall@5]\n", "configurations[0].alhpa", "Extra inputs"),
    ("configurations: [{name: a, model: gpt-9}]\nmetrics: [recall@5]\n", "configurations[0].model", "gpt-9"),
    ("configurations: [{name: a}]\nmetrics: [recall_at_5]\n", "metrics[0]", "recall_at_5"),
    ("configurations: [{name: a}]\nmetrics: [ndcg@10]\n", "gate.metric", "recall@5"),
    ("configurations: []\nmetrics: [recall@5]\n", "configurations", "non-empty"),
    ("configurations: [{name: a}]\nmetrics: [recall@5]\ngate: {margin: -1}\n", "gate.margin", "-1"),
])
def test_a_bad_suite_is_refused_naming_the_file_and_the_field(tmp_path, body, field, says):
    path = _suite(tmp_path, body)
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    assert info.value.path == str(path.resolve()) and info.value.field == field and says in str(info.value)


def test_a_set_without_a_manifest_or_a_bad_manifest_is_named(tmp_path):
    path = _suite(tmp_path, "configurations: [{name: a}]\nmetrics: [recall@5]\n")
    path.write_text(path.read_text().replace("[mine]", "[mine, theirs]"))
    with pytest.raises(SuiteError, match=r"sets\[1\]: no manifest .*theirs.yaml"):
        load_suite(path)
    (tmp_path / "evals" / "sets" / "mine.yaml").write_text("name: mine\nkind: beir\n")
    with pytest.raises(SuiteError, match=r"mine.yaml: path: a beir set needs"):
        load_set(tmp_path / "evals" / "sets" / "mine.yaml")


def test_a_new_configuration_is_a_yaml_change(tmp_path):
    path = _suite(tmp_path, "configurations: [{name: a}, {name: lexical, alpha: 0.0, reranker: mmr}]\n"
                            "metrics: [recall@5, ndcg@10]\n")
    suite = load_suite(path)
    config = suite.configurations[1].eval_config()
    assert (config.name, config.alpha, config.reranker) == ("lexical", 0.0, "mmr")
    assert suite.root == tmp_path.resolve() and suite.sets[0].folder(suite.root) == (tmp_path / "my-questions").resolve()


def test_the_gate_names_what_dropped_beyond_the_margin_and_nothing_else():
    baseline = {"scifact/hybrid": {"recall@5": 0.80, "ndcg@10": 0.70}, "docs/bm25": {"recall@5": 0.50}}
    figures = {"scifact/hybrid": {"recall@5": 0.77, "ndcg@10": 0.60}, "docs/bm25": {"recall@5": 0.49},
               "docs/new": {"recall@5": 0.1}}  # no baseline yet: not compared
    failures = gate_failures(figures, baseline, 0.02, ["recall@5"])
    assert [(f.set, f.configuration, f.metric, f.drop) for f in failures] == [("scifact", "hybrid", "recall@5", 0.03)]
    assert "scifact/hybrid recall@5: 0.7700 vs baseline 0.8000" in str(failures[0])
    assert gate_failures(figures, baseline, 0.05, ["recall@5"]) == []
    # a metric where lower is better (thumbs-down passages still served) fails when it rises
    rise = gate_failures({"feedback/a": {"downrated_in_top5": 1.0}}, {"feedback/a": {"downrated_in_top5": 0.0}},
                         0.5, ["downrated_in_top5"])
    assert [f.metric for f in rise] == ["downrated_in_top5"]


def test_a_baseline_that_is_not_numbers_is_named(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"scifact/hybrid": {"recall@5": "high"}}))
    with pytest.raises(SuiteError, match=r"scifact/hybrid.recall@5"):
        load_baseline(path)
    assert load_baseline(tmp_path / "missing.json") == {}


def test_evals_is_importable_and_stays_out_of_the_wheel():
    import evals.experiments.dev_store  # noqa: F401 - the experiments import as evals.experiments

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not any(pattern.startswith("evals") for pattern in include)
    assert not (REPO_ROOT / "research").exists() and not (REPO_ROOT / "docs" / "evaluation").exists()
