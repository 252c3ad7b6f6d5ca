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
    IdentifierBoostStep,
    PhraseOrderStep,
    RankingPipeline,
    UnknownRankingStep,
)
from knowledge_store.retrieval.snapshot_reader import QueryTerms
from knowledge_store.storage.tuned import RankingParams


def test_the_served_pipeline_lists_every_step_its_settings_turn_on_in_registry_order():
    assert RankingPipeline.served(Settings()).names == tuple(RANKING_STEPS)
    off = Settings(sentence_weight=0.0, feedback_docs=0, entity_boost=0.0, identifier_boost=0.0, phrase_boost=False)
    assert RankingPipeline.served(off).names == ()
    assert RankingPipeline.served(Settings(feedback_beta=0.0)).names == ("sentences", "entity_boost", "identifiers",
                                                                         "phrase")
    assert RankingPipeline.served(Settings(), only=TUNING_STEPS).names == TUNING_STEPS
    pipeline = RankingPipeline.served(Settings(candidate_pool=40, rrf_k=7))
    assert (pipeline.pool, pipeline.rrf_k) == (40, 7)


def test_an_unknown_step_name_is_refused_with_the_known_ones():
    with pytest.raises(UnknownRankingStep, match="'rerank'.*sentences, feedback, entity_boost, identifiers, phrase"):
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


def _terms(*known: str) -> QueryTerms:
    return QueryTerms(np.arange(len(known), dtype=np.int64), np.ones(len(known)), list(known), [])


class _Postings(SimpleNamespace):
    """A snapshot whose term ``i`` is held by the rows ``holding[i]``."""

    def term_rows(self, termid):
        return np.array(self.holding[termid], dtype=np.int64)


def test_the_identifier_boost_brings_the_rows_holding_a_code_first_and_leaves_words_alone():
    pipeline = RankingPipeline((IdentifierBoostStep(0.75),), pool=10)
    plain = RankingPipeline(pool=10)
    evidence = _evidence(8)
    before = plain.rank(plain.context("what does e47 mean", evidence, RankingParams(0.8)))
    assert before.rows[0] != 6
    evidence.terms = _terms("e47", "mean")
    snapshot = _Postings(holding={0: [6], 1: [0, 1, 2, 3]})
    boosted = pipeline.rank(pipeline.context("what does e47 mean", evidence, RankingParams(0.8), snapshot=snapshot))
    assert boosted.rows[0] == 6 and boosted.boost[0] > 0 and (boosted.boost[1:] == 0).all()
    assert sorted(boosted.rows.tolist()) == sorted(before.rows.tolist())  # re-orders, adds no row
    for pure in (0.0, 1.0):  # BM25 alone or vectors alone: left as they rank
        alone = RankingPipeline(pool=10)
        expected = alone.rank(alone.context("what does e47 mean", evidence, RankingParams(pure)))
        got = pipeline.rank(pipeline.context("what does e47 mean", evidence, RankingParams(pure), snapshot=snapshot))
        assert got.rows.tolist() == expected.rows.tolist() and got.boost is None
    # words (even rare ones) and numbers alone are not identifiers: the pool is left as it was
    evidence.terms = _terms("mean", "2038", "pump")
    same = pipeline.rank(pipeline.context("mean 2038 pump", evidence, RankingParams(0.8), snapshot=_Postings(
        holding={0: [6], 1: [6], 2: [6]})))
    assert same.rows.tolist() == before.rows.tolist() and same.boost is None


def test_identifier_terms_are_letters_and_digits_together():
    from knowledge_store.retrieval.ranking import identifier_terms

    terms = _terms("e47", "ext4", "x86_64", "sha256", "3", "2038", "pump", "e", "_1", "api")
    assert [terms.known[i] for i in identifier_terms(terms)] == ["e47", "ext4", "x86_64", "sha256"]


def test_an_entity_and_an_identifier_boost_both_stay_counted():
    class Snapshot(_Postings):
        def query_entity_rows(self, query):
            return [np.array([5])]

    evidence = _evidence(8)
    evidence.terms = _terms("sop", "42", "e47")
    pipeline = RankingPipeline((EntityBoostStep(1.0), IdentifierBoostStep(1.0)), pool=10)
    ranked = pipeline.rank(pipeline.context("SOP-42 E47", evidence, RankingParams(0.5),
                                            snapshot=Snapshot(holding={2: [5]})))
    assert ranked.rows[0] == 5 and ranked.boost[0] > ranked.boost[1:].max() and (ranked.boost[1:] == 0).all()
    first = ranked.fused[0] - ranked.boost[0]  # the fused score before both boosts
    plain = RankingPipeline(pool=10).rank(RankingPipeline(pool=10).context("x", evidence, RankingParams(0.5)))
    assert first == pytest.approx(float(plain.fused[plain.rows.tolist().index(5)]))


def test_phrase_order_leaves_questions_and_short_queries_alone_and_needs_a_snapshot():
    pipeline = RankingPipeline((PhraseOrderStep(),), pool=10)
    evidence = _evidence(6)
    plain = RankingPipeline(pool=10).rank(RankingPipeline(pool=10).context("q", evidence, RankingParams(0.5)))
    for query in ("How do I reset the controller to its factory settings today?", "reset controller"):
        assert pipeline.rank(pipeline.context(query, evidence, RankingParams(0.5), snapshot=object())).rows.tolist() \
            == plain.rows.tolist()
    pasted = "the controller keeps its settings when the power fails for a short time"
    assert pipeline.rank(pipeline.context(pasted, evidence, RankingParams(0.5))).rows.tolist() == plain.rows.tolist()
