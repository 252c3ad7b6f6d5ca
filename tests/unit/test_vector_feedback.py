"""Pseudo-relevance feedback over the fused pool (ranking.VectorFeedbackStep): what moves, and what never does."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.evidence import QueryEvidence, first_document_rows
from knowledge_store.retrieval.fusion import fuse_scores
from knowledge_store.retrieval.ranking import RankingContext, VectorFeedbackStep
from knowledge_store.storage.tuned import RankingParams


def _unit(*rows):
    m = np.array(rows, dtype=np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


# rows 0 and 1 are one document; row 2 is close to the query; row 3 is close to row 0, far from the query
EMBEDDINGS = _unit([1.0, 0.2, 0.0], [0.9, 0.3, 0.1], [0.6, 0.0, 0.8], [0.7, 0.7, 0.0], [0.0, 0.0, 1.0])
SNAPSHOT = SimpleNamespace(embeddings=EMBEDDINGS, doc_index=np.array([0, 0, 1, 2, 3]), sections=None)
QUERY = _unit([1.0, 0.0, 0.3])[0]
PARAMS = RankingParams(alpha=1.0)


def _feedback(fused, step, params=PARAMS):
    """``step`` applied to ``fused`` for QUERY (no sentence vectors: the pool is scored by chunk cosine)."""
    zeros = np.zeros(len(EMBEDDINGS))
    evidence = QueryEvidence(None, zeros, zeros, zeros, EMBEDDINGS @ QUERY, EMBEDDINGS @ QUERY)
    context = RankingContext("query", evidence, params, snapshot=SNAPSHOT, query_vector=QUERY, pool=5, rrf_k=60)
    return step.apply(fused, context)


def _fused():
    return fuse_scores(np.zeros(5), EMBEDDINGS @ QUERY, None, PARAMS.alpha, 5)


def test_first_document_rows_keeps_one_row_per_document_in_rank_order():
    assert first_document_rows(SNAPSHOT, np.array([1, 0, 3, 2, 4]), 3).tolist() == [1, 3, 2]


def test_the_pool_is_reordered_towards_its_top_document_and_never_grows_or_shrinks():
    before = _fused()
    assert before.rows.tolist() == [0, 1, 2, 3, 4]
    after = _feedback(before, VectorFeedbackStep.from_settings(Settings(feedback_docs=1, feedback_beta=2.0)))
    assert sorted(after.rows.tolist()) == sorted(before.rows.tolist())
    # moved towards row 0's vector: row 3 (like row 0) overtakes row 2 (like the query only)
    assert after.rows.tolist().index(3) < after.rows.tolist().index(2)
    assert np.all(np.diff(after.fused) <= 1e-12)  # still best first


def test_a_tiny_beta_keeps_the_order_and_bm25_only_ranking_is_left_alone():
    before = _fused()
    still = _feedback(before, VectorFeedbackStep.from_settings(Settings(feedback_beta=1e-6)))
    assert still.rows.tolist() == before.rows.tolist()
    lexical = fuse_scores(np.array([3.0, 2.0, 1.0, 0.5, 0.2]), EMBEDDINGS @ QUERY, None, 0.0, 5)
    same = _feedback(lexical, VectorFeedbackStep.from_settings(Settings()), RankingParams(alpha=0.0))
    assert same is lexical


def test_feedback_is_off_when_either_setting_is_zero():
    assert VectorFeedbackStep.from_settings(Settings(feedback_docs=0)) is None
    assert VectorFeedbackStep.from_settings(Settings(feedback_beta=0.0)) is None
    on = VectorFeedbackStep.from_settings(Settings())
    assert (on.docs, on.beta) == (3, 0.3)
