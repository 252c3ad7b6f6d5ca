"""``evaluate_dataset`` with an OpenAI-compatible endpoint configured (a stand-in server started here): the
answers are written by the endpoint, RAGAS judges them through it, and the run record keeps the judge model
and the RAGAS version; nothing leaves 127.0.0.1."""

from __future__ import annotations

import socket
from datetime import datetime

import pytest

from knowledge_store.evaluation.ragas_metrics import ragas_version
from knowledge_store.evaluation.results_store import read_scorecard, record_eval_results, results_path
from knowledge_store.evaluation.retrieval_eval import EvalConfig, evaluate_dataset
from tests.helpers import write_tiny_beir
from tests.openai_stand_in import StandIn

pytestmark = pytest.mark.slow


@pytest.fixture()
def loopback_only(monkeypatch):
    real_connect = socket.socket.connect

    def connect(self, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "localhost", "::1"):
            raise AssertionError(f"network access to {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def test_llm_answers_are_judged_through_the_endpoint_and_the_judge_is_recorded(tmp_path, monkeypatch, loopback_only):
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GROUNDWORK_FINETUNE_EMBEDDER", "false")
    write_tiny_beir(tmp_path / "tiny")
    with StandIn() as server:
        monkeypatch.setenv("GROUNDWORK_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("GROUNDWORK_LLM_MODEL", "answer-model")
        monkeypatch.setenv("GROUNDWORK_EVAL_JUDGE_MODEL", "judge-model")
        done = evaluate_dataset(tmp_path / "tiny", config=EvalConfig(name="bm25", alpha=0.0),
                                data_root=tmp_path / "data" / "eval", compare_base=False)
    result = done.result
    assert result.queries == 3 and result.answer_method == "llm"
    assert (result.judge_model, result.ragas_version) == ("judge-model", ragas_version())
    assert result.metrics["faithfulness"] == pytest.approx(0.5)  # the stand-in supports one statement of two
    assert 0.0 < result.metrics["answer_relevancy"] <= 1.0
    assert result.metrics["grounding"] == 1.0  # each answer is its first passage's first sentence, cited [1]
    assert 0.0 <= result.metrics["answer_support"] <= 1.0  # the endpoint's answers, by the documents they cite
    assert list(result.unavailable) == ["key_fact_recall"]  # a BEIR set has no key facts
    models = server.chat_models()
    assert models.count("answer-model") == 3 and set(models) == {"answer-model", "judge-model"}
    assert set(server.embedding_models()) == {"judge-model"}  # the embedding model defaults to the judge

    path = results_path(tmp_path / "data")
    record_eval_results(path, [done.run_record("judged-run", datetime(2026, 1, 1))])
    [row] = read_scorecard(path)
    assert (row["answer_method"], row["judge_model"], row["ragas_version"]) == ("llm", "judge-model", "0.4.3")
    assert row["metrics"]["faithfulness"] == pytest.approx(0.5) and list(row["unavailable"]) == ["key_fact_recall"]
