"""Ranking metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from knowledge_store.core.metrics import aggregate, dedupe_ranking, mrr_at_k, ndcg_at_k, precision_at_k, recall_at_k
from knowledge_store.evaluation.metrics import score_query

RANKED = ["a", "x", "b", "y", "z"]


def test_recall_at_k() -> None:
    relevant = {"a": 1, "b": 1, "c": 1}
    assert recall_at_k(RANKED, relevant, 1) == pytest.approx(1 / 3)
    assert recall_at_k(RANKED, relevant, 2) == pytest.approx(1 / 3)
    assert recall_at_k(RANKED, relevant, 3) == pytest.approx(2 / 3)
    assert recall_at_k(RANKED, relevant, 100) == pytest.approx(2 / 3)  # "c" never retrieved
    # denominator is |relevant|, not min(k, |relevant|)
    assert recall_at_k(["a"], {"a", "b", "c"}, 1) == pytest.approx(1 / 3)


def test_precision_at_k_divides_by_k() -> None:
    relevant = {"a", "b"}
    assert precision_at_k(RANKED, relevant, 1) == 1.0
    assert precision_at_k(RANKED, relevant, 3) == pytest.approx(2 / 3)
    assert precision_at_k(RANKED, relevant, 5) == pytest.approx(2 / 5)
    assert precision_at_k(["a"], relevant, 10) == pytest.approx(1 / 10)  # short list: still / k


def test_ndcg_two_relevant_at_ranks_1_and_3() -> None:
    expected = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(RANKED, {"a": 1, "b": 1}, 10) == pytest.approx(expected)
    assert ndcg_at_k(RANKED, {"a", "b"}, 10) == pytest.approx(expected)  # a set means grade 1
    assert ndcg_at_k(RANKED, {"a": 1, "b": 1}, 2) == pytest.approx(1 / (1 + 1 / math.log2(3)))
    assert ndcg_at_k(["a", "b"], {"a": 1, "b": 1}, 10) == pytest.approx(1.0)


def test_ndcg_is_graded_with_ideal_from_qrels() -> None:
    # grades: b=2, a=1, c=1 (c not retrieved); ranking puts a (1) first, b (2) at rank 3
    relevant = {"a": 1, "b": 2, "c": 1}
    dcg = 1 / math.log2(2) + 2 / math.log2(4)
    idcg_at_5 = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(RANKED, relevant, 5) == pytest.approx(dcg / idcg_at_5)
    # the ideal is cut at k too
    idcg_at_1 = 2.0
    assert ndcg_at_k(RANKED, relevant, 1) == pytest.approx(1 / idcg_at_1)
    # zero grades are not relevant
    assert ndcg_at_k(["q"], {"q": 0, "a": 1}, 1) == 0.0


def test_mrr_at_k() -> None:
    assert mrr_at_k(RANKED, {"y"}, 10) == pytest.approx(0.25)  # first hit at rank 4
    assert mrr_at_k(RANKED, {"y"}, 3) == 0.0  # outside the cut
    assert mrr_at_k(RANKED, {"b", "y"}, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(RANKED, {"nope"}, 10) == 0.0


def test_empty_relevant_set_scores_zero() -> None:
    # documented: a query with nothing relevant scores 0.0 on every metric;
    # load_beir drops such queries so they are never averaged in.
    for metric in (recall_at_k, precision_at_k, ndcg_at_k, mrr_at_k):
        assert metric(RANKED, {}, 10) == 0.0
        assert metric(RANKED, set(), 10) == 0.0
        assert metric(RANKED, {"a": 0}, 10) == 0.0


def test_empty_ranking_scores_zero() -> None:
    for metric in (recall_at_k, precision_at_k, ndcg_at_k, mrr_at_k):
        assert metric([], {"a": 1}, 10) == 0.0


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k(RANKED, {"a"}, 0)
    with pytest.raises(ValueError, match="dedupe_ranking"):
        ndcg_at_k(["a", "a", "b"], {"a", "b"}, 10)


def test_dedupe_ranking_first_occurrence_wins() -> None:
    chunk_docs = ["d2", "d1", "d2", "d3", "d1", "d4", "d3"]
    assert dedupe_ranking(chunk_docs) == ["d2", "d1", "d3", "d4"]
    assert dedupe_ranking([]) == []
    assert dedupe_ranking(iter(["x", "x"])) == ["x"]


def test_aggregate_means_and_ignores_non_numeric() -> None:
    rows = [
        {"query_id": "q1", "ndcg@10": 1.0, "recall@10": 0.5},
        {"query_id": "q2", "ndcg@10": 0.0, "recall@10": 1.0},
        {"query_id": "q3", "ndcg@10": 0.5, "recall@10": 0.0},
    ]
    assert aggregate(rows) == pytest.approx({"ndcg@10": 0.5, "recall@10": 0.5})
    assert aggregate([]) == {}
    with pytest.raises(ValueError, match="recall@10"):
        aggregate([{"ndcg@10": 1.0, "recall@10": 1.0}, {"ndcg@10": 1.0}])


def test_score_query_names_every_metric() -> None:
    scores = score_query(RANKED, {"a": 1, "b": 1}, ks=(1, 10))
    assert set(scores) == {f"{m}@{k}" for m in ("ndcg", "recall", "precision", "mrr") for k in (1, 10)}
    assert scores["mrr@10"] == 1.0
    assert scores["recall@1"] == 0.5


def test_int_ids_match_their_relevant_ids_whatever_the_type() -> None:
    """Self-tuning ranks section numbers (ints): they must match int or str relevant ids alike."""
    assert recall_at_k([7, 3, 9], frozenset({3}), 5) == 1.0
    assert recall_at_k([7, 3, 9], {"3": 1}, 5) == 1.0
    assert ndcg_at_k([3, 7], {3}, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["7", "3"], {3: 2}, 10) == ndcg_at_k([7, 3], {"3": 2}, 10) > 0.0


# ------------------------------------------------------------------ answer metrics


def _answered(answer, cited_ids, relevant, key_facts=()):
    """One labelled query whose answer cites passages 1..n, judged as ``cited_ids``."""
    from knowledge_store.evaluation.metrics import QueryOutcome

    passages = {n: f"passage {n}" for n in range(1, len(cited_ids) + 1)}
    return QueryOutcome("q", ["d1"], relevant, answer=answer, passages=passages,
                        passage_ids=dict(zip(passages, cited_ids)), key_facts=key_facts)


def test_answer_support_fails_an_answer_citing_a_passage_of_an_irrelevant_document() -> None:
    from knowledge_store.evaluation.metrics import METRICS
    from knowledge_store.retrieval.answer import NO_ANSWER, Answer

    support = METRICS["answer_support"].score
    right = Answer(text="E47 means no contact with the Hub. [1]", citations=[1], method="extractive")
    wrong = Answer(text="Code | Meaning | What to do [2]", citations=[2], method="extractive")  # another document
    mixed = Answer(text="E47 means no contact. [1] See the API guide. [2]", citations=[1, 2], method="extractive")
    none = Answer(text=NO_ANSWER, citations=[], method="extractive")
    relevant = {"troubleshooting": 1}
    outcomes = [_answered(a, ["troubleshooting", "api-guide"], relevant) for a in (right, wrong, mixed, none)]
    assert support(outcomes) == [1.0, 0.0, 0.0, 0.0]
    # a plain-text answer (an endpoint's) is judged by its [n] markers
    assert support([_answered("It means no contact [2].", ["troubleshooting", "api-guide"], relevant)]) == [0.0]


def test_key_fact_recall_fails_an_answer_without_every_key_fact() -> None:
    from knowledge_store.evaluation.metrics import METRICS, MetricNotApplicable

    recall = METRICS["key_fact_recall"].score
    facts = ("10 requests per second", "429 Too Many Requests")
    both = _answered("Each client may send **10 requests** per second. Above it: `429 Too Many Requests`. [1]",
                     ["api"], {"api": 1}, facts)
    half = _answered("Each client may send 10 requests per second. [1]", ["api"], {"api": 1}, facts)
    near = _answered("Each client may send 100 requests per second; 429 Too Many Requests. [1]", ["api"], {"api": 1},
                     facts)
    unlabelled = _answered("Anything. [1]", ["api"], {"api": 1})
    assert recall([both, half, near, unlabelled]) == [1.0, 0.0, 0.0, None]
    with pytest.raises(MetricNotApplicable, match="no key facts"):
        recall([unlabelled])


def test_answer_metrics_are_recorded_and_not_applicable_when_their_inputs_are_missing() -> None:
    from knowledge_store.evaluation.metrics import QueryOutcome, score_outcomes

    plain = QueryOutcome("q", ["d1"], {"d1": 1}, answer="Hold the dial [1].", passages={1: "Hold the dial."})
    figures, _, unavailable, _ = score_outcomes([plain])
    assert unavailable["answer_support"]["status"] == unavailable["key_fact_recall"]["status"] == "not_applicable"
    assert "answer_support" not in figures
    judged = _answered("Hold the dial [1].", ["d1"], {"d1": 1}, ("hold the dial",))
    figures, per_query, unavailable, _ = score_outcomes([judged])
    assert figures["answer_support"] == figures["key_fact_recall"] == 1.0
    assert per_query[0]["answer_support"] == 1.0 and "answer_support" not in unavailable
