"""Evaluation assets end to end on a tiny BEIR set: datasets -> per-configuration evals -> scorecard + regression gate."""

from __future__ import annotations

import json

import dagster as dg
import duckdb
import pytest

from knowledge_store.evaluation.metrics import METRICS
from pipelines.evaluation import CONFIGURATIONS, EVALUATION_ASSETS, EVALUATION_CHECKS, EvaluationResource
from pipelines.resources import RetrievalResource
from tests.helpers import write_tiny_beir

pytestmark = pytest.mark.slow


def run(tmp_path, monkeypatch, baseline=None):
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(tmp_path / "data"))
    evaluation = EvaluationResource(datasets=[str(tmp_path / "tiny")], data_dir=str(tmp_path / "data"),
                                    baseline_path=str(baseline) if baseline else None)
    return dg.materialize(
        [*EVALUATION_ASSETS, *EVALUATION_CHECKS],
        resources={"evaluation": evaluation, "retrieval": RetrievalResource(data_dir=str(tmp_path / "data"))},
        raise_on_error=False,
    )


def test_evaluation_assets_write_a_scorecard_and_gate_regressions(tmp_path, monkeypatch):
    write_tiny_beir(tmp_path / "tiny")
    first = run(tmp_path, monkeypatch)
    assert first.success
    checks = {c.check_name: c.passed for c in first.get_asset_check_evaluations()}
    assert checks == {"recall_did_not_regress": True, "feedback_recall_did_not_regress": True}
    hybrid = first.asset_materializations_for_node("retrieval_eval_hybrid")[0].metadata
    assert hybrid["recall@5"].value == 1.0 and hybrid["mrr@10"].value == 1.0
    assert hybrid["ragas_recall@5"].value == hybrid["recall@5"].value  # RAGAS agrees with our recall@5
    # extractive answers: grounding and the judged metrics are not applicable (null), with the reason
    assert hybrid["grounding"].value is None and "extractive answers" in hybrid["unavailable"].value
    assert hybrid["answer_method"].value == "extractive" and hybrid["ragas_version"].value == "0.4.3"
    assert 0.0 <= hybrid["ragas_context_recall@5"].value <= 1.0 and hybrid["ragas_seconds"].value >= 0
    # the answer metrics: support is scored on every labelled set; key facts exist only for the example questions
    assert 0.0 <= hybrid["answer_support"].value <= 1.0 and "Answer support" in hybrid["results"].value
    assert hybrid["key_fact_recall"].value is None and "no key facts" in hybrid["unavailable"].value
    card = first.asset_materializations_for_node("eval_scorecard")[0].metadata
    assert card["rows"].value == len(CONFIGURATIONS)
    assert "nDCG@10" in card["scorecard"].value and "data:image/png;base64," in card["scorecard"].value
    results = tmp_path / "data" / "eval" / "results.duckdb"
    conn = duckdb.connect(str(results), read_only=True)
    assert conn.execute("SELECT count(*) FROM scorecard").fetchone()[0] == len(CONFIGURATIONS)
    assert conn.execute("SELECT count(*) FROM eval_runs").fetchone()[0] == len(CONFIGURATIONS)
    not_applicable = ("grounding", "faithfulness", "answer_relevancy", "key_fact_recall")
    assert conn.execute("SELECT count(*) FROM eval_metrics").fetchone()[0] == len(CONFIGURATIONS) * (
        len(METRICS) - len(not_applicable))
    assert conn.execute("SELECT count(*) FROM eval_metric_notes WHERE status = 'not_applicable'").fetchone()[0] == (
        len(CONFIGURATIONS) * len(not_applicable))
    conn.close()
    assert (tmp_path / "data" / "eval" / "scorecard.png").stat().st_size > 1000

    # a stored baseline that the current numbers fall short of: the check fails and says where
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"tiny/hybrid": 1.5}))
    second = run(tmp_path, monkeypatch, baseline)
    check = next(c for c in second.get_asset_check_evaluations() if c.check_name == "recall_did_not_regress")
    assert not check.passed and check.metadata["count"].value == 1
    assert "hybrid" in check.metadata["regressions"].value


def test_a_failed_run_is_reported_in_a_file_and_in_status(tmp_path):
    from knowledge_store.app.status import store_status
    from knowledge_store.config.settings import Settings
    from pipelines.definitions import evaluate_job
    from pipelines.resources import KnowledgeStoreResource
    from pipelines.sensors import build_failure_sensor

    sensor = build_failure_sensor([evaluate_job])
    store = KnowledgeStoreResource(data_dir=str(tmp_path / "data"))
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [dg.asset(name="boom")(lambda: (_ for _ in ()).throw(RuntimeError("scorecard exploded")))],
            instance=instance, raise_on_error=False,
        )
        assert not result.success
        run = instance.get_run_by_id(result.run_id)
        failure = next(e for e in instance.all_logs(result.run_id) if e.dagster_event and e.dagster_event.is_run_failure)
        context = dg.build_run_status_sensor_context(
            sensor_name="report_run_failures", dagster_instance=instance, dagster_run=run,
            dagster_event=failure.dagster_event, resources={"store": store},
        ).for_run_failure()
        sensor(context)
    lines = (tmp_path / "data" / "run_failures.jsonl").read_text().splitlines()
    record = json.loads(lines[-1])
    assert record["run_id"] == result.run_id and "boom" in record["steps"]
    settings = Settings(data_dir=tmp_path / "data")
    settings.store_path.parent.mkdir(parents=True, exist_ok=True)
    from knowledge_store.storage.store import store_connection

    with store_connection(settings.store_path):
        pass
    assert store_status(settings)["recent_run_failures"][-1]["run_id"] == result.run_id
