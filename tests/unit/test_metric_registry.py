"""The open metric set (issue 15 item 2): one registry (knowledge_store.evaluation.metrics.METRICS) of canonical metric names,
scored from query outcomes and named by the evaluation configuration (the results store, the regression gate
and the CLI/API: tests/integration/test_metric_registry.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from knowledge_store.core.errors import ConfigError
from knowledge_store.evaluation.metrics import (
    METRICS,
    PRIMARY_METRIC,
    MetricError,
    MetricSpec,
    QueryOutcome,
    UnknownMetricError,
    metric_label,
    metric_spec,
    score_outcomes,
)
from knowledge_store.evaluation.retrieval_eval import EvalConfig


def outcomes() -> list[QueryOutcome]:
    return [
        QueryOutcome("q1", ["d1", "d2", "d3"], {"d1": 1}, answer="Hold the dial [1].", passages={1: "Hold the dial."},
                     latency_ms=10.0),
        QueryOutcome("q2", ["d9", "d8", "d7", "d6", "d5", "d2"], {"d2": 1}, answer="", passages={}, latency_ms=30.0),
        QueryOutcome("q3", ["d3", "d4"], {"d3": 2, "d4": 1}, latency_ms=20.0),
    ]


# ------------------------------------------------------------------ the registry


def test_every_metric_has_one_canonical_spelling_and_old_spellings_are_refused():
    assert all(name == spec.name for name, spec in METRICS.items())
    assert PRIMARY_METRIC in METRICS
    assert [metric_label(n) for n in ("recall@5", "ndcg@10", "ragas_recall@5", "latency_p95_ms")] == [
        "Recall@5", "nDCG@10", "RAGAS recall@5", "p95 ms"]
    assert metric_spec("ndcg@3").label == "nDCG@3"  # a ranking family at any depth
    for old in ("recall_at_5", "Recall@5", "ndcg_at_10", "p95_ms"):
        with pytest.raises(UnknownMetricError) as error:
            metric_spec(old)
        assert error.value.metric == old and old in str(error.value)


def test_score_outcomes_gives_every_registered_metric_keyed_by_canonical_name():
    figures, per_query, unavailable, seconds = score_outcomes(outcomes(), ks=(3,))
    # registry order first, then the asked depths; the judged metrics have no judge here (plain-text answers), the
    # answer metrics no passage ids and no key facts
    assert list(figures)[:len(METRICS) - len(unavailable)] == [name for name in METRICS if name not in unavailable]
    assert set(unavailable) == {"faithfulness", "answer_relevancy", "answer_support", "key_fact_recall"}
    assert set(seconds) >= set(METRICS)
    assert {"ndcg@3", "recall@3", "precision@3", "mrr@3"} <= set(figures)
    assert figures["recall@5"] == pytest.approx((1 + 0 + 1) / 3)
    assert figures["mrr@10"] == pytest.approx((1 + 1 / 6 + 1) / 3)
    assert figures["ragas_recall@5"] == pytest.approx(figures["recall@5"])  # RAGAS agrees on the deduped top 5
    assert figures["latency_p50_ms"] == 20.0 and figures["latency_p95_ms"] == 20.0  # nearest rank: index int(0.95 * 2)
    assert [row["query_id"] for row in per_query] == ["q1", "q2", "q3"] and per_query[1]["recall@5"] == 0.0
    assert score_outcomes([]) == ({}, [], {}, {})


def test_a_metric_scoring_the_wrong_number_of_queries_is_a_metric_error(monkeypatch):
    monkeypatch.setitem(METRICS, "broken", MetricSpec("broken", "Broken", True, lambda outcomes: [1.0]))
    with pytest.raises(MetricError, match="broken.*1 values for 3 queries"):
        score_outcomes(outcomes())


def test_eval_config_is_the_one_configuration_type_of_the_cli_notebooks_and_dagster():
    from pipelines.evaluation import CONFIGURATIONS, _evaluation_asset

    assert all(isinstance(c, EvalConfig) for c in CONFIGURATIONS)
    assert {c.name for c in CONFIGURATIONS} >= {"bm25", "vector", "hybrid", "hybrid_rrf", "hybrid_dbsf", "hybrid_mmr"}
    hybrid = next(c for c in CONFIGURATIONS if c.name == "hybrid")
    assert hybrid.alpha is None and hybrid.label == "hybrid alpha=default"  # the serving path's per-query alpha
    assert EvalConfig(alpha=0.5, fusion="rrf").configuration == "rrf (alpha 0.5)"
    with pytest.raises(ValidationError, match="nope"):
        EvalConfig(alpha=0.5, fusion="nope")
    with pytest.raises(ValidationError, match="1.5"):
        EvalConfig(alpha=1.5)
    with pytest.raises(ConfigError, match="needs a name"):
        _evaluation_asset(EvalConfig(alpha=0.5))
