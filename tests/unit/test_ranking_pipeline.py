"""The ranking pipeline: which steps settings turn on, their order, and that a step only re-orders the pool."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.evidence import QueryEvidence
from knowledge_store.retrieval.ranking import (
    RANKING_STEPS,
    TUNING_STEPS,
    EntityBoostStep,
    PhraseOrderStep,
    RankingPipeline,
    UnknownRankingStep,
)
from knowledge_store.storage.tuned import RankingParams


def test_the_served_pipeline_lists_every_step_its_settings_turn_on_in_registry_order():
    assert RankingPipeline.served(Settings()).names == tuple(RANKING_STEPS)
    off = Settings(sentence_weight=0.0, feedback_docs=0, entity_boost=0.0, phrase_boost=False)
    assert RankingPipeline.served(off).names == ()
    assert RankingPipeline.served(Settings(feedback_beta=0.0)).names == ("sentences", "entity_boost", "phrase")
    assert RankingPipeline.served(Settings(), only=TUNING_STEPS).names == TUNING_STEPS
    pipeline = RankingPipeline.served(Settings(candidate_pool=40, rrf_k=7))
    assert (pipeline.pool, pipeline.rrf_k) == (40, 7)


def test_an_unknown_step_name_is_refused_with_the_known_ones():
    with pytest.raises(UnknownRankingStep, match="'rerank'.*sentences, feedback, entity_boost, phrase"):
        RankingPipeline.served(Settings(), only=("rerank",))


def _evidence(n: int) -> QueryEvidence:
    bm25 = np.linspace(1.0, 0.1, n)
    vector = np.linspace(0.1, 0.9, n).astype(np.float32)
    return QueryEvidence(None, bm25, bm25, bm25, vector, vector)


def test_the_entity_boost_reorders_the_pool_leaves_its_boost_in_the_context_and_adds_no_row():
    class Snapshot(SimpleNamespace):
        def query_entity_rows(self, query):
            return [np.array([5])] if "SOP-42" in query else []

    pipeline = RankingPipeline((EntityBoostStep(1.0),), pool=10)
    plain = RankingPipeline(pool=10)
    evidence = _evidence(8)
    context = pipeline.context("what does SOP-42 say", evidence, RankingParams(0.5), snapshot=Snapshot())
    boosted = pipeline.rank(context)
    before = plain.rank(plain.context("what does SOP-42 say", evidence, RankingParams(0.5)))
    assert boosted.rows[0] == 5 and before.rows[0] != 5
    assert sorted(boosted.rows.tolist()) == sorted(before.rows.tolist())
    assert context.entity_boost is not None and context.entity_boost.weight == 1.0
    other = pipeline.context("no entity here", evidence, RankingParams(0.5), snapshot=Snapshot())
    assert pipeline.rank(other).rows.tolist() == before.rows.tolist() and other.entity_boost is None


def test_phrase_order_leaves_questions_and_short_queries_alone_and_needs_a_snapshot():
    pipeline = RankingPipeline((PhraseOrderStep(),), pool=10)
    evidence = _evidence(6)
    plain = RankingPipeline(pool=10).rank(RankingPipeline(pool=10).context("q", evidence, RankingParams(0.5)))
    for query in ("How do I reset the controller to its factory settings today?", "reset controller"):
        assert pipeline.rank(pipeline.context(query, evidence, RankingParams(0.5), snapshot=object())).rows.tolist() \
            == plain.rows.tolist()
    pasted = "the controller keeps its settings when the power fails for a short time"
    assert pipeline.rank(pipeline.context(pasted, evidence, RankingParams(0.5))).rows.tolist() == plain.rows.tolist()
