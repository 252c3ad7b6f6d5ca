"""Section-aware evidence, distribution-based fusion and phrase evidence: behaviour on small inputs."""

from __future__ import annotations

import numpy as np
import pytest

from knowledge_store.retrieval.evidence import QueryEvidence
from knowledge_store.retrieval.fusion import FUSION_MODES, distribution_scaled, fuse_scores
from knowledge_store.retrieval.phrase import bigram_share, is_phrase_query, phrase_order
from knowledge_store.retrieval.ranking import RankingPipeline
from knowledge_store.retrieval.snapshot_reader import BM25_B, BM25_K1, build_section_index, section_groups
from knowledge_store.storage.tuned import RankingParams


def test_sections_are_runs_of_one_document_and_heading_split_at_the_cap():
    doc_index = np.array([0, 0, 0, 0, 1, 1, 1])
    paths = [["A"], ["A"], ["B"], ["B"], ["A"], ["A"], ["A"]]
    group = section_groups(doc_index, paths, max_chunks=2)
    # doc 0: A A | B B ; doc 1: A A | A (cap 2)
    assert group.tolist() == [0, 0, 1, 1, 2, 2, 3]


def test_section_postings_sum_term_frequencies_and_lengths_of_their_chunks():
    group = np.array([0, 0, 1], dtype=np.int32)
    doc_len = np.array([10, 20, 5], dtype=np.float32)
    # term 0 in rows 0 and 1 (tf 2 and 3), term 1 in row 2 (tf 1)
    term_ptr = np.array([0, 2, 3])
    post_rows = np.array([0, 1, 2], dtype=np.int32)
    post_tf = np.array([2, 3, 1], dtype=np.float32)
    index = build_section_index(group, doc_len, term_ptr, post_rows, post_tf)
    assert index.lead_row.tolist() == [0, 2]
    assert index.length.tolist() == [30, 5]
    assert index.df.tolist() == [1, 1]
    scores = index.scores(np.array([0]))
    idf = np.log10((2 - 1 + 0.5) / (1 + 0.5) + 1.0)
    norm = BM25_K1 * (1 - BM25_B + BM25_B * 30 / 17.5)
    assert scores[0] == pytest.approx(idf * 5 * (BM25_K1 + 1) / (5 + norm), rel=1e-5)
    assert scores[1] == 0.0


def _evidence(**arrays) -> QueryEvidence:
    n = len(next(iter(arrays.values())))
    zeros = np.zeros(n, dtype=np.float32)
    return QueryEvidence(terms=None, bm25_chunk=arrays.get("bm25_chunk", zeros), bm25_section=arrays.get("bm25_section", zeros),
                         coverage=zeros, vector_chunk=arrays.get("vector_chunk", zeros), vector_lead=arrays.get("vector_lead", zeros))


def test_lead_weight_lets_a_section_whose_opening_matches_beat_a_page_with_one_matching_chunk():
    # row 0: a later chunk of a long page, row 1: continuation of an answer section whose lead (row 2) matches
    ev = _evidence(vector_chunk=np.array([0.60, 0.55, 0.58], dtype=np.float32),
                   vector_lead=np.array([0.20, 0.58, 0.58], dtype=np.float32))
    pipeline = RankingPipeline(pool=10)
    assert pipeline.rank(pipeline.context("q", ev, RankingParams(1.0))).rows[0] == 0
    assert pipeline.rank(pipeline.context("q", ev, RankingParams(1.0, lead_weight=0.6))).rows[0] in (1, 2)


def test_ranking_params_reject_out_of_range_values_and_unknown_fusion():
    with pytest.raises(ValueError, match="section_weight"):
        RankingParams(0.5, section_weight=1.5)
    with pytest.raises(ValueError, match="fusion"):
        RankingParams(0.5, fusion="max")


def test_dbsf_scales_by_each_methods_own_pool_and_clips_at_zero():
    reference = np.array([1.0, 2.0, 3.0])
    scaled = distribution_scaled(np.array([2.0, -10.0]), reference)
    assert scaled[0] == pytest.approx(0.5)
    assert scaled[1] == 0.0
    fused = fuse_scores(np.array([5.0, 0.0, 1.0]), np.array([0.1, 0.9, 0.5]), None, 0.5, 10, "dbsf")
    assert set(fused.rows.tolist()) == {0, 1, 2}
    assert "dbsf" in FUSION_MODES


def test_a_pasted_span_is_a_phrase_query_and_a_question_is_not():
    assert is_phrase_query("the routine glp_simplex returns the status of the basic solution found by")
    assert not is_phrase_query("How do I keep my Debian system up to date with security fixes?")
    assert not is_phrase_query("how do i keep my debian system up to date with security fixes")
    assert not is_phrase_query("glp_simplex status")


def test_phrase_order_moves_the_chunk_holding_the_span_first_and_keeps_the_rest():
    span = "the routine returns the status of the basic solution found by the solver"
    texts = [
        "The solver returns a status; the basic solution routine is found by the status of the problem.",
        "Other text.",
        "Before. The routine returns the status of the basic solution found by the solver. After.",
    ]
    order, scores = phrase_order(span, texts)
    assert order.tolist() == [2, 0, 1]
    assert scores[2] == pytest.approx(1.1)  # every word pair, held by the chunk alone (+ a tenth)
    assert bigram_share(span.split(), texts[0]) < 0.7


def test_a_question_naming_a_corpus_entity_keeps_the_corpus_alpha():
    from knowledge_store.retrieval.query_form import NAMED_ENTITY, OTHER, QUESTION, alpha_for, query_form

    class Corpus:  # what query_form reads of a snapshot: the rows mentioning each entity the query names
        def query_entity_rows(self, query):
            return [np.array([3, 7])] if "API 510" in query else []

    corpus = Corpus()
    assert query_form("what does API 510 require", corpus) == NAMED_ENTITY
    assert alpha_for("what does API 510 require", 0.7, 0.8, corpus) == 0.7  # BM25 and the boost know "API 510"
    assert query_form("what does the inspection require?", corpus) == QUESTION
    assert alpha_for("what does the inspection require?", 0.7, 0.8, corpus) == 0.8
    assert query_form("API 510 inspection", corpus) == NAMED_ENTITY and query_form("inspection interval", corpus) == OTHER
    assert query_form("what does API 510 require") == QUESTION  # without a corpus, form alone decides
    assert alpha_for("how do I inspect?", 0.7, None, corpus) == 0.7  # question_alpha off
