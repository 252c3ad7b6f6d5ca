"""Phrase evidence for pasted passages: a chunk that contains the query's words *in order* is the one.

A user who pastes a sentence from a manual wants the page it came from.  BM25
and the vector both treat the paste as a bag of words/meaning, so a page that
uses the same generic vocabulary ("the routine returns the value of the
parameter") can outrank the page that holds the exact sentence.  Word order is
the evidence neither has: the share of the query's consecutive word pairs
(bigrams) that occur in the chunk.  A verbatim span scores ~1, a paraphrase
or a question ~0 (questions reorder words: "how do I X" vs "to X, ...").

Applied only to queries that look pasted, not asked: at least ``PHRASE_MIN_TOKENS``
words, not ending in "?" and not opening with a question word.  Measured on the
Debian FAQ set: 16 of 151 questions occur verbatim in some *other* page (tables
of contents, other FAQs), and moving those pages first cost 0.01-0.02 nDCG@10;
questions are for the fused ranking.  And only among
the fused candidates, and only rows with a bigram share of at least
``PHRASE_MIN_SHARE`` move: they go first, best share first, the rest keep
the fused order.  So ordinary questions are untouched unless a passage repeats
most of them verbatim (then it is very likely the answer).
"""

from __future__ import annotations

import re

import numpy as np

from knowledge_store.retrieval.query_form import is_question

PHRASE_MIN_TOKENS = 8
PHRASE_MIN_SHARE = 0.7
_SPLIT = re.compile(r"[^0-9a-z_]+")


def words(text: str) -> list[str]:
    return [w for w in _SPLIT.split(text.lower()) if w]


def bigrams(tokens: list[str]) -> set[tuple[str, str]]:
    return set(zip(tokens, tokens[1:]))


def is_phrase_query(query: str) -> bool:
    """Long and not a question (``query_form.is_question``): a passage pasted to find where it came from."""
    return len(words(query)) >= PHRASE_MIN_TOKENS and not is_question(query)


def normalise(text: str) -> str:
    """Lower case, every non-word run one space, padded: bigram ``a b`` occurs iff `` a b `` is a substring."""
    return " " + _SPLIT.sub(" ", text.lower()).strip() + " "


def normalised_share(wanted: set[tuple[str, str]], padded: str) -> float:
    if not wanted:
        return 0.0
    return sum(1 for a, b in wanted if f" {a} {b} " in padded) / len(wanted)


def bigram_share(query_tokens: list[str], text: str) -> float:
    """Share of the query's distinct bigrams that occur in ``text`` (same tokenisation as ``words``).

    Substring tests on the normalised text (C speed) instead of building the text's bigram set:
    this runs on up to 200 candidates per query.
    """
    wanted = bigrams(query_tokens)
    if not wanted:
        return 0.0
    padded = " " + _SPLIT.sub(" ", text.lower()) + " "
    return sum(1 for a, b in wanted if f" {a} {b} " in padded) / len(wanted)


def order_by_share(shares: np.ndarray) -> np.ndarray:
    """Candidates (given best first) with a strong share moved first, best share first; the rest keep their order."""
    n = len(shares)
    strong = shares >= PHRASE_MIN_SHARE  # (callers may add a small tie-break on top of the share)
    if not strong.any():
        return np.arange(n)
    position = np.arange(n)
    return np.lexsort((position, -np.where(strong, shares, 0.0), ~strong))


def phrase_order(query: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(new order of the candidates, bigram share per candidate) for candidates given best first."""
    tokens = words(query)
    shares = np.array([bigram_share(tokens, t) for t in texts], dtype=np.float64)
    return order_by_share(shares), shares
