"""RAGAS ID-based recall vs our recall_at_k, and the offline grounding score."""

from __future__ import annotations

import os
import random

import pytest

os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")

from knowledge_store.core.metrics import dedupe_ranking, recall_at_k
from knowledge_store.evaluation.grounding import GroundingResult, grounding_score, helpful_rate, sentence_support
from knowledge_store.evaluation.ragas_metrics import ragas_recall_at_k, ragas_recall_batch
from knowledge_store.retrieval.answer import NO_ANSWER, Answer, extractive_answer
from knowledge_store.retrieval.types import SearchHit

# ---------------------------------------------------------------------------
# RAGAS recall

# (retrieved ids, best first; reference ids; k)
RECALL_CASES = [
    (["a", "b", "c", "d", "e"], ["a"], 5),  # one relevant at rank 1
    (["a", "b", "c", "d", "e"], ["e"], 5),  # at rank k
    (["a", "b", "c", "d", "e"], ["x"], 5),  # no overlap
    (["a", "b", "c", "d", "e"], ["x", "y", "z"], 5),  # no overlap, several refs
    (["a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e"], 5),  # all present
    (["a", "b", "c"], ["c", "b", "a"], 5),  # all present, fewer than k retrieved
    (["a", "b", "c", "d", "e"], ["a", "x"], 5),  # half
    (["a", "b", "c", "d", "e"], ["b", "d", "x", "y"], 5),  # 2 of 4
    (["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"], ["h"], 5),  # in top-10 but not top-5
    (["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"], ["h"], 10),  # ... found at k=10
    (["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"], ["a", "h"], 5),  # one in, one beyond k
    (["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"], ["a", "h"], 10),
    (["a", "a", "b", "b", "c", "d", "e", "f"], ["f"], 5),  # duplicates: f is 6th chunk-hit but 6th doc too
    (["a", "a", "a", "b", "c", "d", "e"], ["e"], 5),  # duplicates push e to chunk 7, doc rank 5
    (["a", "b", "a", "b", "c"], ["c", "a"], 3),  # duplicates interleaved
    (["a", "b", "c"], ["a", "a", "b"], 5),  # duplicate reference ids count once
    ([], ["a"], 5),  # nothing retrieved
    (["a", "b", "c", "d", "e"], ["a"], 1),  # k = 1 hit
    (["b", "a", "c", "d", "e"], ["a"], 1),  # k = 1 miss
    (["1", "2", "3"], ["3", "4"], 2),  # numeric-looking ids
    (["a", "b"], [], 5),  # empty reference: 0.0 by our convention (RAGAS alone gives NaN)
]


def ours(retrieved: list[str], reference: list[str], k: int) -> float:
    return recall_at_k(dedupe_ranking(retrieved), reference, k)


@pytest.mark.parametrize("retrieved, reference, k", RECALL_CASES)
def test_ragas_recall_equals_ours(retrieved, reference, k):
    assert ragas_recall_at_k(retrieved, reference, k) == pytest.approx(ours(retrieved, reference, k))


def test_ragas_recall_known_values():
    assert ragas_recall_at_k(["a", "b", "c", "d", "e"], ["b", "d", "x", "y"], 5) == 0.5
    assert ragas_recall_at_k(list("abcdefghij"), ["h"], 5) == 0.0
    assert ragas_recall_at_k(list("abcdefghij"), ["h"], 10) == 1.0
    assert ragas_recall_at_k(["a", "a", "a", "b", "c", "d", "e"], ["e"], 5) == 1.0
    assert ragas_recall_at_k(["a", "b"], [], 5) == 0.0


def test_ragas_batch_matches_single_and_ours():
    rng = random.Random(7)
    samples = [(r, f) for r, f, _ in RECALL_CASES]
    samples += [
        ([f"d{rng.randint(0, 25)}" for _ in range(10)], [f"d{rng.randint(0, 25)}" for _ in range(rng.randint(1, 4))])
        for _ in range(100)
    ]
    batch = ragas_recall_batch(samples, k=5)
    assert len(batch) == len(samples)
    assert batch == [ragas_recall_at_k(r, f, 5) for r, f in samples]
    assert batch == pytest.approx([ours(r, f, 5) for r, f in samples])
    assert ragas_recall_batch([], k=5) == []


def test_ragas_bad_k():
    with pytest.raises(ValueError):
        ragas_recall_at_k(["a"], ["a"], 0)
    with pytest.raises(ValueError):
        ragas_recall_batch([(["a"], ["a"])], k=0)


# ---------------------------------------------------------------------------
# grounding

P1 = (
    "To reset the thermostat, hold the mode button for ten seconds. "
    "The display will flash twice when the reset is complete. "
    "Settings are kept in non-volatile memory."
)
P2 = (
    "The HVAC unit needs a filter change every 90 days. "
    "Use only MERV 8 filters in the return air grille."
)
P3 = "Error code E4 means the outdoor sensor is disconnected. Check the sensor cable at the terminal block."


def make_hit(text: str, n: int) -> SearchHit:
    return SearchHit(
        chunk_id=f"c{n}", doc_id=f"d{n}", version=1, title=f"Doc {n}", section=f"Section {n}",
        section_path=(f"Doc {n}",), page_start=None, page_end=None, url=f"file:///doc{n}",
        source_path=f"/doc{n}.md", source_id="src", text=text, doc_type="md",
    )


def test_sentence_support_terms_and_verbatim():
    assert sentence_support("The display will flash twice when the reset is complete.", P1) == 1.0
    # whitespace differences do not matter for the verbatim check
    assert sentence_support("The display   will\nflash twice when the reset is complete.", P1) == 1.0
    # inflection is absorbed by the stemmer
    assert sentence_support("Resetting the thermostat: hold the mode button.", P1) == 1.0
    # terms: filter, chang, every, 90, day, thermostat -> 5 of 6 in P2
    assert sentence_support("Change the thermostat filter every 90 days.", P2) == pytest.approx(5 / 6)
    assert sentence_support("Bananas are yellow.", P1) == 0.0
    assert sentence_support("It is.", P1) == 0.0  # no informative term and not verbatim
    assert sentence_support("Hold the mode button for ten seconds [1].", P1) == 1.0  # marker ignored


def test_verbatim_extractive_answer_scores_one():
    hits = [make_hit(P1, 1), make_hit(P2, 2), make_hit(P3, 3)]
    answer = extractive_answer("how do I reset the thermostat and how often to change the filter", hits)
    assert answer.sentences
    passages = [h.text for h in hits]
    result = grounding_score(answer, passages)
    assert isinstance(result, GroundingResult)
    assert result.score == 1.0
    assert result.sentences == result.supported == len(answer.sentences)
    assert all(d["support"] == 1.0 and not d["uncited"] for d in result.details)
    # the same answer as plain text ("Sentence. [n] Sentence. [m]") scores the same
    text_result = grounding_score(answer.text, passages)
    assert text_result.score == 1.0
    assert [d["cited"] for d in text_result.details] == [s["citations"] for s in answer.sentences]


def test_invented_sentence_is_unsupported():
    text = (
        "Hold the mode button for ten seconds [1]. "
        "The thermostat also supports voice control through a mobile app [1]. "
        "Use only MERV 8 filters in the return air grille [2]."
    )
    result = grounding_score(text, {1: P1, 2: P2})
    assert result.sentences == 3
    assert result.supported == 2
    assert result.score == pytest.approx(2 / 3)
    invented = result.details[1]
    assert invented["text"].startswith("The thermostat also supports voice control")
    assert invented["cited"] == [1]
    assert not invented["supported"] and invented["support"] < 0.8
    assert result.details[0]["supported"] and result.details[2]["supported"]


def test_sentence_citing_the_wrong_passage_is_unsupported():
    text = "Error code E4 means the outdoor sensor is disconnected. [2]"
    wrong = grounding_score(text, [P1, P2, P3])
    assert wrong.sentences == 1 and wrong.supported == 0 and wrong.score == 0.0
    assert wrong.details[0]["cited"] == [2]
    right = grounding_score(text.replace("[2]", "[3]"), [P1, P2, P3])
    assert right.score == 1.0
    # a marker that points at no passage supports nothing
    assert grounding_score(text.replace("[2]", "[9]"), [P1, P2, P3]).score == 0.0


def test_uncited_sentence_is_checked_against_all_passages_and_flagged():
    text = "Check the sensor cable at the terminal block. Hold the mode button for ten seconds [1]."
    result = grounding_score(text, [P1, P2, P3])
    assert result.sentences == 2
    assert result.details[0]["uncited"] and result.details[0]["supported"]
    assert not result.details[1]["uncited"] and result.details[1]["cited"] == [1]
    assert result.score == 1.0 and result.uncited == 1


def test_multiple_citations_use_the_union_of_passages():
    text = "Hold the mode button for ten seconds and change the filter every 90 days [1][2]."
    assert grounding_score(text, [P1, P2]).score == 1.0
    assert grounding_score(text, [P1, P2]).details[0]["cited"] == [1, 2]
    assert grounding_score(text.replace("[1][2]", "[1]"), [P1, P2]).score == 0.0


def test_llm_style_answer_object():
    text = "Hold the mode button for ten seconds [1]. Filters last forever [2]."
    answer = Answer(
        text=text, citations=[1, 2], method="llm", model="m",
        sentences=[
            {"text": "Hold the mode button for ten seconds [1].", "citation": 1, "citations": [1], "chunk_id": "c1"},
            {"text": "Filters last forever [2].", "citation": 2, "citations": [2], "chunk_id": "c2"},
        ],
    )
    result = grounding_score(answer, [P1, P2])
    assert (result.sentences, result.supported, result.score) == (2, 1, 0.5)
    assert result.details[0]["text"] == "Hold the mode button for ten seconds."
    assert not result.details[1]["supported"]


def test_empty_answer_scores_zero():
    for empty in ("", "   ", NO_ANSWER, Answer(text=NO_ANSWER, method="extractive")):
        result = grounding_score(empty, [P1])
        assert (result.score, result.sentences, result.supported, result.details) == (0.0, 0, 0, [])
    assert grounding_score("Hold the mode button [1].", []).score == 0.0


def test_threshold():
    text = "Change the thermostat filter every 90 days [1]."  # support 5/6: "thermostat" is not in P2
    assert grounding_score(text, [P2]).details[0]["support"] == pytest.approx(5 / 6)
    assert grounding_score(text, [P2]).score == 1.0  # 0.83 >= 0.8
    assert grounding_score(text, [P2], threshold=0.9).score == 0.0
    with pytest.raises(ValueError):
        grounding_score(text, [P2], threshold=1.5)


def test_helpful_rate():
    assert helpful_rate([]) is None
    assert helpful_rate(["up"]) == 1.0
    assert helpful_rate(["down"]) == 0.0
    assert helpful_rate(["up", "up", "down"]) == pytest.approx(2 / 3)
    assert helpful_rate(["up", "down"] * 5) == 0.5
    with pytest.raises(ValueError):
        helpful_rate(["up", "meh"])
