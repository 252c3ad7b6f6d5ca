"""RAGAS on the logs, through Dagster: thumbs become references that feedback_eval scores per suite configuration
(and its asset check fails when a configuration is made worse on purpose); query_log_eval scores the served answers
without a judge (answer support, key facts), and a deliberately wrong answer fails both metrics."""

from __future__ import annotations

import dagster as dg
import pytest

from knowledge_store.evaluation.log_eval import query_log_evaluation
from knowledge_store.evaluation.results_store import evaluation_summary
from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.query_log import QueryLog, QueryLogRecord
from pipelines.evaluation import EvaluationResource, feedback_eval, feedback_recall_did_not_regress, query_log_eval
from pipelines.resources import RetrievalResource

pytestmark = pytest.mark.slow

RATED = EXAMPLE_QUESTIONS[:4]


def _suite(root, configurations: str) -> str:
    (root / "evals" / "sets").mkdir(parents=True, exist_ok=True)
    (root / "evals" / "suites").mkdir(exist_ok=True)
    (root / "evals" / "sets" / "feedback.yaml").write_text("name: feedback\nkind: feedback\n")
    path = root / "evals" / "suites" / "feedback.yaml"
    path.write_text(f"name: feedback\nsets: [feedback]\nconfigurations: {configurations}\n"
                    "metrics: [ragas_recall@5, ragas_context_recall@5, ragas_context_precision@5, downrated_in_top5]\n"
                    "gate: {metric: ragas_recall@5, margin: 0.05}\n")
    return str(path)


@pytest.fixture(scope="module")
def rated(shared_sample_index, embedder, tmp_path_factory):
    """Four example questions asked through the engine and rated: every passage of the first five up, except the
    first question's fifth, rated down; plus one logged answer that is wrong on purpose."""
    root = tmp_path_factory.mktemp("log-evals")
    log = QueryLog(root / "logs.duckdb")
    engine = RetrievalEngine(shared_sample_index, embedder=embedder, query_log=log)
    wrong = None
    for index, question in enumerate(RATED):
        response = engine.search(question.question, k=5, client="api")
        for rank, hit in enumerate(response.hits[:5]):
            rating = "down" if index == 0 and rank == 4 else "up"
            log.add_feedback(response.retrieval_request_id, rating, chunk_id=hit.chunk_id)
        if index == 0:
            wrong = log.get(response.retrieval_request_id)
    # the same question and passages, but an answer that cites the thumbs-down passage and holds no key fact
    log.append(QueryLogRecord(query=wrong.query, client="api", params=wrong.params, results_pre=wrong.results_pre,
                              results_post=wrong.results_post, answer="The answer is forty-two [5].",
                              retrieval_request_id="wrong-on-purpose"))
    log.flush()
    log.add_feedback("wrong-on-purpose", "down", chunk_id=wrong.results_post[4]["chunk_id"])
    log.close()
    return root


def _materialise(root, settings, suite: str, *assets):
    evaluation = EvaluationResource(data_dir=str(root / "data"), logs_path=str(root / "logs.duckdb"),
                                    feedback_suite=suite)
    return dg.materialize(list(assets), raise_on_error=False, resources={
        "evaluation": evaluation, "retrieval": RetrievalResource(data_dir=str(settings.data_dir))})


def test_feedback_eval_scores_each_configuration_and_its_check_fails_when_one_is_made_worse(rated, shared_sample_index,
                                                                                          monkeypatch):
    monkeypatch.setenv("RAGAS_DO_NOT_TRACK", "true")
    suite = _suite(rated, "[{name: hybrid}, {name: vector, alpha: 1.0}]")
    first = _materialise(rated, shared_sample_index, suite, feedback_eval, feedback_recall_did_not_regress)
    assert first.success
    meta = first.asset_materializations_for_node("feedback_eval")[0].metadata
    assert meta["samples_with_references"].value == len(RATED)
    assert meta["ragas_recall@5/hybrid"].value == 1.0  # every up-rated passage is back in today's top five
    assert 0.0 <= meta["ragas_recall@5/vector"].value <= 1.0 and "ragas_context_precision@5" in meta["by_configuration"].value
    assert [c.passed for c in first.get_asset_check_evaluations()] == [True]
    # the Evaluation page's data: each configuration's RAGAS figures
    shown = evaluation_summary(rated / "data", rated / "data" / "index")["feedback_ragas"]
    assert set(shown["by_configuration"]) == {"hybrid", "vector"} and shown["samples"] == len(RATED)
    assert shown["by_configuration"]["hybrid"]["downrated_in_top5"] == pytest.approx(0.25)  # one of four queries

    # the same configuration made worse on purpose: BM25 only on paraphrased questions loses rated passages
    _suite(rated, "[{name: hybrid, alpha: 0.0}, {name: vector, alpha: 1.0}]")
    second = _materialise(rated, shared_sample_index, suite, feedback_eval, feedback_recall_did_not_regress)
    assert second.asset_materializations_for_node("feedback_eval")[0].metadata["ragas_recall@5/hybrid"].value < 0.95
    check = second.get_asset_check_evaluations()[0]
    assert not check.passed and "feedback/hybrid ragas_recall@5" in check.description
    assert "feedback/vector" not in check.description  # the unchanged configuration is not blamed


def test_query_log_eval_without_a_judge_scores_answers_and_a_wrong_answer_fails(rated, shared_sample_index,
                                                                             monkeypatch):
    monkeypatch.delenv("GROUNDWORK_EVAL_JUDGE_URL", raising=False)
    monkeypatch.delenv("GROUNDWORK_LLM_BASE_URL", raising=False)
    suite = _suite(rated, "[{name: hybrid}]")
    result = _materialise(rated, shared_sample_index, suite, query_log_eval)
    assert result.success
    meta = result.asset_materializations_for_node("query_log_eval")[0].metadata
    assert meta["queries"].value == len(RATED) + 1 and meta["judge_model"].value.startswith("none")
    assert "no judge endpoint" in meta["unavailable"].value  # faithfulness: not applicable, with the reason
    # four right answers and one wrong: both metrics below 1, above 0
    assert 0.0 < meta["answer_support/extractive"].value < 1.0 and 0.0 < meta["key_fact_recall/extractive"].value < 1.0
    report = query_log_evaluation(shared_sample_index, log_path=rated / "logs.duckdb", use_settings_judge=False)
    by_id = {row["retrieval_request_id"]: row for row in report.per_query}
    assert by_id["wrong-on-purpose"]["answer_support"] == 0.0 and by_id["wrong-on-purpose"]["key_fact_recall"] == 0.0
    assert [row["answer_support"] for rid, row in by_id.items() if rid != "wrong-on-purpose"] == [1.0] * len(RATED)
    shown = evaluation_summary(rated / "data", rated / "data" / "index")["query_log_eval"]
    assert shown["by_method"]["extractive"]["unavailable"]["faithfulness"]["status"] == "not_applicable"
