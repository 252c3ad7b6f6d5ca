"""Sentence evidence: a chunk's best-matching sentence, beside its whole-chunk cosine.

A chunk's vector is the mean of everything its ~200 word-pieces say; an FAQ answer, a function's
description or an abstract's finding often answers in one sentence, which the mean dilutes.
Ingestion therefore also makes a vector for every sentence of every chunk (``core.text.sentences_to_embed``):
embedded on its own (the text alone, no header), or pooled from its tokens' states in the chunk's own forward
pass (``settings.sentence_encoding``), stored per chunk text in ``sentence_embeddings`` and copied into each
snapshot.  At query time the fused pool (a few hundred rows, never the corpus) is scored again with
``(1 - w) * chunk cosine + w * best sentence cosine`` for each candidate and its section lead, and
fused again (``ranking.SentenceEvidenceStep``; ``settings.sentence_weight``).

The weight 0.15 is the best worst case over the train splits of the three dev sets: it raises
nDCG@10 on every train split and on both documentation test splits (the figures are in
docs/EVALUATION.md).  Embedded on their own they cost a second embedding pass at ingestion (sentences are short: about as many
word-pieces as the chunks themselves; in context, no second pass) and ~2 bytes x 384 per sentence in memory (float16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from knowledge_store.core.text import sentence_spans_to_embed
from knowledge_store.retrieval.half_products import half_products


@dataclass(frozen=True)
class SentenceIndex:
    """Every snapshot row's sentence vectors: ``vectors[start[r]:end[r]]`` (rows of one chunk text share them)."""

    vectors: np.ndarray  # float16 (sentences, dim), L2-normalised
    start: np.ndarray  # int64 per row
    end: np.ndarray  # int64 per row

    @property
    def count(self) -> int:
        return len(self.vectors)

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sentence vectors of ``rows`` as one contiguous float16 block, and where each row's start in it.  A
        caller scoring the same rows with several vectors (a query before and after its feedback step) gathers
        once (``best(..., gathered=)``)."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = self.end[rows] - self.start[rows]
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        index = np.repeat(self.start[rows] - offsets, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        return self.vectors[index], offsets

    def best(self, rows: np.ndarray, query_vector: np.ndarray,
             gathered: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Each row's best sentence cosine with ``query_vector`` (float32 products of the float16 block:
        ``half_products``); ``gathered``: ``gather(rows)``, made before."""
        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        block, offsets = self.gather(rows) if gathered is None else gathered
        return np.maximum.reduceat(half_products(block, query_vector), offsets)


def sentence_index_from(content_hashes: list[str], table_hashes: list[str], vectors: np.ndarray) -> SentenceIndex | None:
    """The index of a snapshot whose rows have ``content_hashes``, from its ``sentence_embeddings`` rows (ordered
    by content hash, then ordinal: ``table_hashes`` per sentence).  None when some row has no sentences."""
    if not len(content_hashes):
        return None
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, h in enumerate(table_hashes):
        first.setdefault(h, i)
        last[h] = i + 1
    if any(h not in first for h in content_hashes):
        return None
    start = np.array([first[h] for h in content_hashes], dtype=np.int64)
    end = np.array([last[h] for h in content_hashes], dtype=np.int64)
    return SentenceIndex(np.ascontiguousarray(vectors, dtype=np.float16), start, end)


def sentence_cosines(index: SentenceIndex, row: int, text: str, query_vector: np.ndarray) -> tuple[tuple[int, int, float], ...]:
    """``(start, end, cosine)`` of each embedded sentence of snapshot row ``row`` (whose chunk text is ``text``):
    its span in ``text`` (``core.text.sentence_spans_to_embed``, the sentences ingestion embedded, in order) and its
    vector's cosine with ``query_vector``.  Empty when the row's vectors do not line up with the text's sentences."""
    if row < 0 or row >= len(index.start):
        return ()
    vectors = index.vectors[index.start[row]:index.end[row]]
    spans = sentence_spans_to_embed(text)
    if len(spans) != len(vectors) or not spans:
        return ()
    cosines = half_products(vectors, query_vector)
    return tuple((start, end, float(cosine)) for (start, end), cosine in zip(spans, cosines))
