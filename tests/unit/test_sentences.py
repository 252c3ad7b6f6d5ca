"""Sentence evidence: how chunk texts become sentences, and how a chunk's best sentence enters its vector evidence."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from knowledge_store.core.text import SENTENCE_MAX_WORDS, sentence_spans_to_embed, sentences_to_embed
from knowledge_store.retrieval.evidence import (
    QueryEvidence,
    best_sentence_cosines,
    chunk_vectors,
    pool_vector_evidence,
)
from knowledge_store.retrieval.ranking import RankingPipeline, SentenceEvidenceStep
from knowledge_store.retrieval.sentences import SentenceIndex, sentence_index_from
from knowledge_store.storage.tuned import RankingParams


def test_sentences_split_at_sentence_ends_blank_lines_and_list_items_and_short_pieces_join_the_next():
    text = ("Use the reaper code from perlipc. It calls wait() when SIGCHLD arrives.\n\nSee below.\n"
            "- first item of a list\n- second item of a list")
    assert sentences_to_embed(text) == [
        "Use the reaper code from perlipc.", "It calls wait() when SIGCHLD arrives.",
        "See below. - first item of a list", "- second item of a list"]
    assert sentences_to_embed("short") == ["short"] and sentences_to_embed("") == [""]
    assert sentences_to_embed("Ends with a piece. Ok.") == ["Ends with a piece. Ok."]  # a short tail joins the last one
    long = " ".join(f"w{i}" for i in range(2 * SENTENCE_MAX_WORDS + 5))
    assert [len(s.split()) for s in sentences_to_embed(long)] == [SENTENCE_MAX_WORDS, SENTENCE_MAX_WORDS, 5]


def test_sentence_spans_cover_exactly_the_words_of_each_embedded_sentence():
    texts = ["Use the reaper code from perlipc.  It calls wait()\nwhen SIGCHLD arrives.\n\nSee below.\n- first item of a list\n"
             "- second item of a list", "  short  ", "", "Ends with a piece. Ok.",
             " ".join(f"w{i}" for i in range(2 * SENTENCE_MAX_WORDS + 5)) + ".\n\nTail."]
    for text in texts:
        spans = sentence_spans_to_embed(text)
        assert [" ".join(text[a:b].split()) for a, b in spans] == [s for s in sentences_to_embed(text) if s]
        assert all(not text[a].isspace() and not text[b - 1].isspace() for a, b in spans)  # no edge whitespace
        assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # in order, never overlapping
    assert sentence_spans_to_embed("") == [] and sentences_to_embed("   ") == [""]
    text = "It calls wait()\nwhen SIGCHLD arrives."  # whitespace inside a sentence is kept in the span
    assert sentence_spans_to_embed(text) == [(0, len(text))]


def _unit(rng, n, dim=8):
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_best_sentence_cosine_is_each_rows_maximum_and_rows_of_one_text_share_sentences():
    rng = np.random.default_rng(3)
    table_hashes = ["a", "a", "a", "b", "c", "c"]  # ordered by content hash, then ordinal
    vectors = _unit(rng, 6)
    index = sentence_index_from(["c", "a", "b", "a"], table_hashes, vectors)
    q = _unit(rng, 1)[0]
    expected = [max(vectors[4:6] @ q), max(vectors[0:3] @ q), vectors[3] @ q, max(vectors[0:3] @ q)]
    np.testing.assert_allclose(index.best(np.array([0, 1, 2, 3]), q), expected, atol=2e-3)  # float16 storage
    np.testing.assert_allclose(index.best(np.array([3, 2]), q), [expected[3], expected[2]], atol=2e-3)
    assert index.vectors.dtype == np.float16 and index.count == 6
    assert sentence_index_from(["a", "zzz"], table_hashes, vectors) is None, "a row without sentences: no index"


def _snapshot(chunk_vectors, sentence_rows):
    """What pool_vector_evidence and rank_rows read: vectors, sentence index, no sections, all rows active."""
    hashes = [str(i) for i in range(len(chunk_vectors))]
    table = [str(i) for i, rows in enumerate(sentence_rows) for _ in rows]
    index = sentence_index_from(hashes, table, np.concatenate(sentence_rows))
    return SimpleNamespace(embeddings=np.asarray(chunk_vectors, dtype=np.float32), sentence_index=index, sections=None,
                           doc_index=np.arange(len(chunk_vectors)), size=len(chunk_vectors))


def test_a_chunk_whose_one_sentence_answers_moves_up_by_its_sentence_evidence():
    q = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    answer_sentence = np.array([[1.0, 0.0, 0.0]], dtype=np.float32)
    other = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    chunks = [[0.70, 0.71, 0.0], [0.60, 0.0, 0.80], [0.0, 1.0, 0.0]]  # row 1's mean is further off than row 0's
    snap = _snapshot(chunks, [other, np.concatenate([answer_sentence, other[1:]]), other[:1]])
    rows = np.arange(3)
    np.testing.assert_allclose(pool_vector_evidence(snap, rows, q, 0.6), np.asarray(chunks) @ q)  # weight 0: chunk cosine
    mixed = pool_vector_evidence(snap, rows, q, 0.6, sentence_weight=0.5)
    np.testing.assert_allclose(mixed, 0.5 * (np.asarray(chunks) @ q) + 0.5 * np.array([0.0, 1.0, 0.0]), atol=2e-3)

    evidence = QueryEvidence(None, np.zeros(3), np.zeros(3), np.zeros(3), np.asarray(chunks, np.float32) @ q,
                             np.asarray(chunks, np.float32) @ q)
    params = RankingParams(alpha=1.0)
    plain, with_sentences = RankingPipeline(pool=10), RankingPipeline((SentenceEvidenceStep(0.5),), pool=10)
    assert plain.rank(plain.context("q", evidence, params, snap, q)).rows[0] == 0
    assert with_sentences.rank(with_sentences.context("q", evidence, params, snap, q)).rows[0] == 1
    # without sentence vectors in the snapshot the step does nothing
    bare = SimpleNamespace(**{**vars(snap), "sentence_index": None})
    assert with_sentences.rank(with_sentences.context("q", evidence, params, bare, q)).rows[0] == 0


def test_sentence_index_type_is_frozen_data():
    index = SentenceIndex(np.zeros((1, 2), np.float16), np.array([0]), np.array([1]))
    assert index.best(np.array([0]), np.array([1.0, 0.0])).tolist() == [0.0]


def test_a_memo_gives_the_same_best_sentence_cosines_and_computes_each_row_once_per_vector():
    rng = np.random.default_rng(5)
    snapshot = _snapshot(_unit(rng, 6), [_unit(rng, k) for k in (1, 3, 2, 1, 2, 4)])
    q, moved = _unit(rng, 2)
    calls = []
    best = snapshot.sentence_index.best
    snapshot.sentence_index = SimpleNamespace(start=snapshot.sentence_index.start,
                                              best=lambda rows, v: calls.append(len(rows)) or best(rows, v))
    pipeline = RankingPipeline((SentenceEvidenceStep(0.2),))
    memo = pipeline.context("q", None, None, snapshot, q, shared_caches=True).sentence_memo
    rows = np.array([4, 0, 4, 2])  # a row twice, as section leads repeat
    np.testing.assert_array_equal(best_sentence_cosines(snapshot, rows, q, memo), best(rows, q))
    np.testing.assert_array_equal(best_sentence_cosines(snapshot, np.array([2, 5, 0]), q, memo), best(np.array([2, 5, 0]), q))
    assert calls == [4, 1]  # the second call computed only row 5
    np.testing.assert_array_equal(best_sentence_cosines(snapshot, rows, moved, memo), best(rows, moved))
    assert calls[-1] == 4 and len(memo) == 2  # another vector is remembered apart
    assert pipeline.context("q", None, None, snapshot, q).sentence_memo is None  # a query ranked once keeps no memo


def test_a_pool_scored_again_in_another_order_with_another_vector_reuses_its_gathered_sentences():
    rng = np.random.default_rng(7)
    snapshot = _snapshot(_unit(rng, 6), [_unit(rng, k) for k in (1, 3, 2, 1, 2, 4)])
    q, moved = _unit(rng, 2)
    index = snapshot.sentence_index
    gathers = []
    gather = index.gather
    snapshot.sentence_index = SimpleNamespace(start=index.start, best=index.best,
                                              gather=lambda rows: gathers.append(len(rows)) or gather(rows))
    blocks: dict = {}
    pool = np.array([4, 0, 4, 2, 5])
    np.testing.assert_allclose(best_sentence_cosines(snapshot, pool, q, None, blocks), index.best(pool, q), rtol=1e-6)
    refused = pool[[3, 1, 4, 0, 2]]  # the same rows after re-fusion
    np.testing.assert_allclose(best_sentence_cosines(snapshot, refused, moved, None, blocks), index.best(refused, moved),
                               rtol=1e-6)
    assert gathers == [5] and len(blocks) == 1  # gathered once for both vectors
    np.testing.assert_allclose(index.best(pool, q, index.gather(pool)), index.best(pool, q))


def test_replaced_rows_are_scored_with_their_replacement_and_the_snapshot_is_untouched():
    rng = np.random.default_rng(7)
    snapshot = _snapshot(_unit(rng, 4), [_unit(rng, 1) for _ in range(4)])
    stored = snapshot.embeddings.copy()
    replacement = _unit(rng, 1)[0]
    q = _unit(rng, 1)[0]
    rows = np.array([3, 1, 0])
    vectors = chunk_vectors(snapshot, rows, {1: replacement})
    np.testing.assert_array_equal(vectors[1], replacement)
    np.testing.assert_array_equal(vectors[[0, 2]], stored[[3, 0]])
    np.testing.assert_allclose(pool_vector_evidence(snapshot, rows, q, 0.0, 0.0, {1: replacement}), vectors @ q, rtol=1e-6)
    np.testing.assert_array_equal(snapshot.embeddings, stored)
