"""The support-tool contract: ``from knowledge_store import retrieve_knowledge`` never raises."""

from __future__ import annotations

import time
from datetime import datetime

import numpy as np
import pytest

from knowledge_store import retrieve_knowledge, support_tool
from knowledge_store.query_log import QueryLog
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.settings import Settings
from tests.conftest import build_sample_index

pytestmark = pytest.mark.slow

KEYS = {"sources_consulted", "coverage", "gaps", "retrieval_time_ms"}


@pytest.fixture(scope="module")
def sample_settings(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("support")
    return build_sample_index(root, embedder)


def use_engine(engine) -> None:
    support_tool.set_engine(engine)
    support_tool.warm_up().result(timeout=60)


def assert_empty(result: dict, gap_fragment: str) -> None:
    assert set(result) >= KEYS
    assert result["sources_consulted"] == [] and result["coverage"] == "none"
    assert any(gap_fragment in gap for gap in result["gaps"]), result["gaps"]
    assert isinstance(result["retrieval_time_ms"], int)


def test_answers_with_at_most_three_bounded_sources(sample_settings, embedder, tmp_path):
    use_engine(RetrievalEngine(sample_settings, embedder=embedder, query_log=QueryLog(tmp_path / "log.duckdb")))
    result = retrieve_knowledge("troubleshooting", "How do I authenticate to the Hub REST API?", {}, budget_ms=2000)
    assert set(result) >= KEYS
    assert 1 <= len(result["sources_consulted"]) <= 3
    assert result["coverage"] in ("high", "medium")
    for source in result["sources_consulted"]:
        assert len(source["title"]) <= 200 and len(source["url"]) <= 500 and len(source["excerpt"]) <= 150
        assert 0.7 <= source["relevance_score"] <= 1.0
        datetime.fromisoformat(source["last_updated"].replace("Z", "+00:00"))
    assert "aurora-api-guide.md#authentication" in result["sources_consulted"][0]["url"]


def test_device_metadata_narrows_to_that_product(sample_settings, embedder, tmp_path):
    use_engine(RetrievalEngine(sample_settings, embedder=embedder, query_log=QueryLog(tmp_path / "log.duckdb")))
    result = retrieve_knowledge("api", "how do I request an access token from the hub", {"product": "aurora-hub"}, budget_ms=2000)
    assert result["sources_consulted"] and all("aurora-api-guide.md" in s["url"] for s in result["sources_consulted"])


def test_off_topic_question_returns_no_sources_and_says_why(sample_settings, embedder, tmp_path):
    use_engine(RetrievalEngine(sample_settings, embedder=embedder, query_log=QueryLog(tmp_path / "log.duckdb")))
    result = retrieve_knowledge("billing", "can I pay my invoice with a credit card?", {}, budget_ms=2000)
    assert result["sources_consulted"] == [] and result["coverage"] in ("none", "low") and result["gaps"]


def test_missing_store_is_a_gap_not_an_exception(tmp_path, embedder):
    use_engine_nowait = RetrievalEngine(Settings(data_dir=tmp_path / "nothing"), embedder=embedder,
                                        query_log=QueryLog(tmp_path / "log.duckdb"))
    support_tool.set_engine(use_engine_nowait)
    first = retrieve_knowledge("x", "how do I reset", {}, budget_ms=100)
    assert first["sources_consulted"] == [] and first["coverage"] == "none" and first["gaps"]
    try:
        support_tool.warm_up().result(timeout=30)
    except Exception:
        pass
    second = retrieve_knowledge("x", "how do I reset", {}, budget_ms=100)
    assert_empty(second, "unavailable")
    assert "groundwork ingest" in " ".join(second["gaps"])


class FailingEmbedder:
    model_id, dim, torch_threads = "broken", 384, 1

    def load(self):
        return self

    def embed(self, texts):
        if texts == ["warm up"]:
            return np.zeros((1, 384), dtype=np.float32)
        raise RuntimeError("model weights are corrupt")


class SlowEmbedder(FailingEmbedder):
    def __init__(self, inner):
        self.inner = inner

    def embed(self, texts):
        if texts != ["warm up"]:
            time.sleep(0.5)
        return self.inner.embed(texts)


def test_a_failing_model_becomes_a_gap(sample_settings, tmp_path):
    use_engine(RetrievalEngine(sample_settings, embedder=FailingEmbedder(), query_log=QueryLog(tmp_path / "log.duckdb")))
    assert_empty(retrieve_knowledge("x", "how do I reset", {}, budget_ms=2000), "model weights are corrupt")


def test_the_time_budget_is_hard(sample_settings, embedder, tmp_path):
    use_engine(RetrievalEngine(sample_settings, embedder=SlowEmbedder(embedder), query_log=QueryLog(tmp_path / "log.duckdb")))
    started = time.perf_counter()
    result = retrieve_knowledge("x", "how do I reset", {}, budget_ms=100)
    elapsed = (time.perf_counter() - started) * 1000
    assert_empty(result, "100 ms budget")
    assert elapsed < 400  # returned at the budget, not after the slow model


@pytest.mark.parametrize("message,metadata", [("", {}), (None, None), (12, {"device": 3}), ("   ", "not a dict")])
def test_bad_inputs_never_raise(sample_settings, embedder, tmp_path, message, metadata):
    use_engine(RetrievalEngine(sample_settings, embedder=embedder, query_log=QueryLog(tmp_path / "log.duckdb")))
    result = retrieve_knowledge(None, message, metadata, budget_ms=2000)
    assert set(result) >= KEYS and result["coverage"] == "none" and result["sources_consulted"] == []


def teardown_module(module):
    support_tool.set_engine(None)
