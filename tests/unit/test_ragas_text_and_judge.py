"""RAGAS metrics that say something recall@5 does not: text-based context recall and precision against the
labelled passages' text, grounding marked not applicable for extractive answers, and faithfulness and answer
relevancy judged through an OpenAI-compatible endpoint (a stand-in server started here) - with a failing judge
recorded as a failed metric carrying its error, never as 0."""

from __future__ import annotations

import os
import socket
from datetime import datetime

import duckdb
import pytest

os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")

from knowledge_store.config.settings import Settings
from knowledge_store.evaluation.metrics import METRICS, MetricError, QueryOutcome, score_outcomes
from knowledge_store.evaluation.ragas_metrics import RagasJudge, ragas_version
from knowledge_store.evaluation.results_store import (
    EvalRun,
    evaluation_summary,
    read_scorecard,
    record_eval_results,
    results_path,
)
from knowledge_store.evaluation.retrieval_eval import EvalConfig, EvalResult
from knowledge_store.retrieval.answer import Answer
from tests.openai_stand_in import QUESTION, StandIn

THERMOSTAT = ("Hold the dial for ten seconds to reset the thermostat to factory settings. The display blinks twice "
              "when the reset is done. Settings made in the app are kept in the cloud and come back after the next "
              "sync. A reset does not change the firmware version.")
HUB = "Press the blue button on the hub to pair a new sensor within two minutes."


@pytest.fixture()
def loopback_only(monkeypatch):
    """Any connection other than to 127.0.0.1 fails the test: nothing may be downloaded (no tiktoken encoding,
    no analytics, no model)."""
    real_connect = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise AssertionError(f"network access to {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def extractive(text: str) -> Answer:
    return Answer(text=text, citations=[1], method="extractive")


def generated(text: str) -> Answer:
    return Answer(text=text, citations=[1], method="llm", model="answer-model")


def partial_outcomes(answer=extractive) -> list[QueryOutcome]:
    """q1 finds its document but serves only its first sentence; q2 serves its document whole, second."""
    first_sentence = THERMOSTAT.split(". ")[0] + "."
    return [
        QueryOutcome("q1", ["d1", "d9"], {"d1": 1}, answer=answer(f"{first_sentence} [1]"),
                     passages={1: first_sentence, 2: "Unrelated text about batteries and their lifetime."},
                     question=QUESTION, references={"d1": THERMOSTAT}),
        QueryOutcome("q2", ["d9", "d2"], {"d2": 1}, answer=answer(f"{HUB} [2]"),
                     passages={1: "Unrelated text about batteries and their lifetime.", 2: HUB},
                     question="pair a sensor with the hub", references={"d2": HUB}),
    ]


# ------------------------------------------------------------------ text-based context recall and precision


def test_text_context_metrics_see_what_id_recall_cannot():
    """Both documents are in the top five, so recall@5 (and RAGAS's ID-based recall, equal to it by
    construction) is 1.0; but q1 served a fifth of its labelled text: text recall 0.5, and q2's match is
    second: text precision 0.5 there."""
    scores = score_outcomes(partial_outcomes())
    figures, rows = scores.figures, scores.per_query
    assert figures["recall@5"] == 1.0 and figures["ragas_recall@5"] == 1.0
    assert [row["ragas_context_recall@5"] for row in rows] == [0.0, 1.0]
    assert figures["ragas_context_recall@5"] == pytest.approx(0.5)
    assert rows[1]["ragas_context_precision@5"] == pytest.approx(0.5)  # the match ranks second: AP 1/2
    assert rows[0]["ragas_context_precision@5"] == 0.0
    assert figures["ragas_context_recall@5"] != figures["recall@5"]


def test_text_context_metrics_of_a_whole_match_and_of_nothing_served():
    whole = QueryOutcome("q", ["d1"], {"d1": 1}, passages={1: THERMOSTAT}, references={"d1": THERMOSTAT})
    nothing = QueryOutcome("n", [], {"d1": 1}, passages={}, references={"d1": THERMOSTAT})
    rows = score_outcomes([whole, nothing]).per_query
    assert [r["ragas_context_recall@5"] for r in rows] == [1.0, 0.0]
    assert rows[0]["ragas_context_precision@5"] == pytest.approx(1.0) and rows[1]["ragas_context_precision@5"] == 0.0


# ------------------------------------------------------------------ grounding of extractive answers


def test_grounding_and_judged_metrics_are_not_applicable_to_extractive_answers():
    scores = score_outcomes(partial_outcomes(extractive))
    for name in ("grounding", "faithfulness", "answer_relevancy"):
        assert name not in scores.figures
        assert scores.unavailable[name] == {"status": "not_applicable", "reason": "extractive answers"}
        assert all(row[name] is None for row in scores.per_query)
    # a generated answer is grounded as before: q1's answer is its passage's sentence
    generated_scores = score_outcomes(partial_outcomes(generated))
    assert generated_scores.figures["grounding"] == 1.0 and "grounding" not in generated_scores.unavailable


def run_record(scores, run_id: str, judge: RagasJudge | None) -> EvalRun:
    result = EvalResult(EvalConfig(name="hybrid"), scores.figures, len(scores.per_query), scores.per_query,
                        unavailable=scores.unavailable, answer_method="llm" if judge else "extractive",
                        judge_model=judge.model if judge else None,
                        ragas_version=judge.ragas_version if judge else None)
    return EvalRun.from_result(result, run_id=run_id, dataset="tiny", split="test", created_at=datetime(2026, 1, 1))


def test_not_applicable_is_stored_as_a_note_not_a_number(tmp_path):
    path = results_path(tmp_path)
    record_eval_results(path, [run_record(score_outcomes(partial_outcomes()), "r1", None)])
    conn = duckdb.connect(str(path), read_only=True)
    values = dict(conn.execute("SELECT metric, value FROM eval_metrics").fetchall())
    notes = conn.execute("SELECT metric, status, reason FROM eval_metric_notes ORDER BY metric").fetchall()
    assert conn.execute("SELECT answer_method, judge_model FROM scorecard").fetchall() == [("extractive", None)]
    conn.close()
    assert "grounding" not in values and values["ragas_context_recall@5"] == pytest.approx(0.5)
    assert notes == [("answer_relevancy", "not_applicable", "extractive answers"),
                     ("answer_support", "not_applicable",
                      "the evaluation did not record which document each served passage is"),
                     ("faithfulness", "not_applicable", "extractive answers"),
                     ("grounding", "not_applicable", "extractive answers"),
                     ("key_fact_recall", "not_applicable",
                      "the set has no key facts (the sample corpus's example questions have them)")]
    assert len(values) + len(notes) == len(METRICS)
    [row] = evaluation_summary(tmp_path, tmp_path / "index")["scorecard"]
    assert row["unavailable"]["grounding"] == {"status": "not_applicable", "reason": "extractive answers"}
    assert row["answer_method"] == "extractive" and row["judge_model"] is None


def test_a_note_must_name_a_known_metric_with_a_status_and_a_reason(tmp_path):
    good = run_record(score_outcomes(partial_outcomes()), "r1", None)
    for unavailable, match in (({"grounding": {"status": "skipped", "reason": "x"}}, "status"),
                               ({"grounding": {"status": "failed", "reason": " "}}, "reason"),
                               ({"recall@5": {"status": "failed", "reason": "x"}}, "has a value")):
        bad = EvalRun(**{**good.__dict__, "unavailable": {**good.unavailable, **unavailable}})
        with pytest.raises(MetricError, match=match):
            record_eval_results(results_path(tmp_path), [bad])
    assert not results_path(tmp_path).exists() or read_scorecard(results_path(tmp_path)) == []


# ------------------------------------------------------------------ the judge, through a stand-in endpoint


def judge_settings(base_url: str, **extra) -> Settings:
    return Settings(llm_base_url=base_url, llm_model="answer-model", **extra)


def test_judge_defaults_to_the_answering_model_and_can_be_set():
    assert RagasJudge.from_settings(Settings(llm_base_url=None, llm_model=None)) is None
    judge = RagasJudge.from_settings(judge_settings("http://127.0.0.1:9/v1"))
    assert (judge.model, judge.embedding_model) == ("answer-model", "answer-model")
    judge = RagasJudge.from_settings(judge_settings("http://127.0.0.1:9/v1", eval_judge_model="judge-model",
                                                    eval_judge_embedding_model="embedder"))
    assert (judge.model, judge.embedding_model) == ("judge-model", "embedder")


def test_judged_faithfulness_and_relevancy_are_recorded_with_the_judge_and_ragas_version(tmp_path, loopback_only):
    with StandIn() as server:
        judge = RagasJudge.from_settings(judge_settings(server.base_url, eval_judge_model="judge-model",
                                                        eval_judge_embedding_model="embedder"))
        scores = score_outcomes(partial_outcomes(generated), judge=judge)
    assert scores.figures["faithfulness"] == pytest.approx(0.5)  # the stand-in supports one statement of two
    relevancy = [row["answer_relevancy"] for row in scores.per_query]
    assert relevancy[0] == pytest.approx(1.0)  # the generated question is q1's own question
    assert 0.0 < relevancy[1] < 1.0
    assert not {"faithfulness", "answer_relevancy"} & set(scores.unavailable)
    assert set(server.chat_models()) == {"judge-model"} and set(server.embedding_models()) == {"embedder"}

    path = results_path(tmp_path)
    record_eval_results(path, [run_record(scores, "judged", judge)])
    [row] = read_scorecard(path)
    assert row["judge_model"] == "judge-model" and row["ragas_version"] == ragas_version() == "0.4.3"
    assert row["answer_method"] == "llm" and row["metrics"]["faithfulness"] == pytest.approx(0.5)


@pytest.mark.parametrize("model, error", [("broken-judge", "500"), ("garbage-judge", "")])
def test_a_failing_judge_is_a_failed_metric_with_its_error_not_a_zero(tmp_path, loopback_only, model, error):
    with StandIn() as server:
        judge = RagasJudge(base_url=server.base_url, model=model, embedding_model="embedder", max_retries=0)
        scores = score_outcomes(partial_outcomes(generated), judge=judge)
    for name in ("faithfulness", "answer_relevancy"):
        assert name not in scores.figures
        note = scores.unavailable[name]
        assert note["status"] == "failed" and f"judge {model} failed on 2 of 2 answers" in note["reason"]
        assert error in note["reason"]
    assert "the judge is down" in scores.unavailable["faithfulness"]["reason"] or model == "garbage-judge"
    assert scores.figures["grounding"] == 1.0  # the other metrics are unaffected

    path = results_path(tmp_path)
    record_eval_results(path, [run_record(scores, "failed", judge)])
    conn = duckdb.connect(str(path), read_only=True)
    assert conn.execute("SELECT count(*) FROM eval_metrics WHERE metric IN ('faithfulness', 'answer_relevancy')"
                        ).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM eval_metric_notes WHERE status = 'failed'").fetchone()[0] == 2
    conn.close()
