"""query_log_eval with a REAL judge: llama.cpp's OpenAI-compatible server on loopback (tests/llama_server.py:
xllamacpp serving SmolLM2-135M-Instruct, sha256-pinned). A tiny corpus keeps the passages short, so the judge's
prompts stay small on a 2-core machine; one answer is logged as extractive, one written by the same server
(answer=llm), and faithfulness is recorded for each answer method with the judge model named: a number, since
the judge's replies are constrained to RAGAS's JSON schemas (and the DRY sampler keeps the small model from
repeating one item to the completion cap).  Its value says little with a 135M judge; that it is computed
through a real server, end to end, is what this tests."""

from __future__ import annotations

import math

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.evaluation.log_eval import query_log_evaluation
from knowledge_store.ingest.run import run_sync
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.query_log import QueryLog
from tests.llama_server import MODEL_NAME, llama_server

pytestmark = pytest.mark.slow

DOCS = {
    "warranty.md": "# Warranty\n\nThe Aurora thermostat has a two-year warranty from the date of purchase.\n",
    "battery.md": "# Battery\n\nThe sensor battery is a CR2032 cell and lasts about two years.\n",
}
QUESTION = "How long is the Aurora warranty?"


def test_query_log_eval_records_faithfulness_per_answer_method_through_a_real_llama_server(tmp_path, embedder,
                                                                                           monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    with llama_server() as server:
        settings = Settings(data_dir=tmp_path / "data", sources=[docs], min_markdown_words=0,
                            llm_base_url=server.base_url, llm_model=server.model)
        run_sync(settings, embedder)
        log = QueryLog(tmp_path / "logs.duckdb")
        engine = RetrievalEngine(settings, embedder=embedder, query_log=log)
        extractive = engine.search(QUESTION, k=2, client="api", answer="extractive")
        written = engine.search(QUESTION, k=2, client="api", answer="llm")
        assert written.answer is not None and written.answer.method == "llm"
        log.add_feedback(extractive.retrieval_request_id, "up", chunk_id=extractive.hits[0].chunk_id)
        log.flush()
        log.close()
        monkeypatch.setenv("GROUNDWORK_EVAL_JUDGE_URL", server.base_url)
        monkeypatch.setenv("GROUNDWORK_EVAL_JUDGE_MODEL", server.model)
        monkeypatch.setenv("GROUNDWORK_EVAL_JUDGE_TIMEOUT_S", "600")  # a 135M model on a loaded 2-core CPU
        judged = Settings(data_dir=tmp_path / "data", sources=[docs], min_markdown_words=0)
        # faithfulness only: each judged metric is several requests per answer, minutes on a loaded 2-core machine
        report = query_log_evaluation(judged, log_path=tmp_path / "logs.duckdb", judged=("faithfulness",))
    print("query_log_eval judged:", report.by_method, report.unavailable)  # what the judge gave, in -s output
    assert report.judge_model == MODEL_NAME and report.queries == 2
    assert set(report.by_method) == {"extractive", "llm"}
    for method in ("extractive", "llm"):
        # the judge's number: its replies are constrained to RAGAS's schemas, so even a 135M model's parse
        figures = report.by_method[method]
        assert "faithfulness" in figures, (method, report.unavailable[method])
        assert 0.0 <= figures["faithfulness"] <= 1.0 and not math.isnan(figures["faithfulness"])
    # the extractive answer quotes the up-rated passage: supported without any judge
    assert report.by_method["extractive"]["answer_support"] == 1.0
