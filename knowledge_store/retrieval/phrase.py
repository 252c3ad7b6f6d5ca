"""Phrase evidence for pasted passages: a chunk that contains the query's words *in order* is the one.

A user who pastes a sentence from a manual wants the page it came from.  BM25
and the vector both treat the paste as a bag of words/meaning, so a page that
uses the same generic vocabulary ("the routine returns the value of the
parameter") can outrank the page that holds the exact sentence.  Word order is
the evidence neither has: the share of the query's consecutive word pairs
(bigrams) that occur in the chunk.  A verbatim span scores ~1, a paraphrase
or a question ~0 (questions reorder words: "how do I X" vs "to X, ...").

Applied only to queries that look pasted, not asked: at least ``PHRASE_MIN_TOKENS``
words, not ending in "?" and not opening with a question word.  An FAQ question
often occurs verbatim in some *other* page (tables of contents, other FAQs), and
on the documentation dev sets moving those pages first lowered nDCG@10;
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
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot

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
    """Share of the bigrams ``wanted`` that occur in ``padded`` (a ``normalise``d text)."""
    if not wanted:
        return 0.0
    return sum(1 for a, b in wanted if f" {a} {b} " in padded) / len(wanted)


class PhraseQuery:
    """A query's word pairs, scored against normalised texts.

    A pigeonhole pre-screen skips most texts: one missing all of any ``misses + 1`` of the query's bigrams
    cannot reach ``PHRASE_MIN_SHARE``, so only texts holding one of the longest such bigrams are scored."""

    def __init__(self, query: str):
        self.pairs = bigrams(words(query))
        probe = sorted(self.pairs, key=lambda p: -len(p[0]) - len(p[1]))[: int(len(self.pairs) * (1 - PHRASE_MIN_SHARE)) + 1]
        self._screen = re.compile("|".join(re.escape(f" {a} {b} ") for a, b in probe)) if probe else None

    def share(self, padded: str) -> float:
        """The share of the query's bigrams in ``padded`` (``normalise``d); 0 for a text the pre-screen rules out."""
        if self._screen is None or not self._screen.search(padded):
            return 0.0
        return normalised_share(self.pairs, padded)

    def border_score(self, own: str, pair: str) -> float:
        """A chunk's phrase score from its own text and its text joined to the next chunk's (``phrase_texts``): the
        span read across the border counts, holding it alone adds a tenth (breaks ties)."""
        across = self.share(pair)
        return across + 0.1 * normalised_share(self.pairs, own) if across > 0.0 else 0.0


def bigram_share(query_tokens: list[str], text: str) -> float:
    """Share of the query's distinct bigrams that occur in ``text`` (same tokenisation as ``words``)."""
    return normalised_share(bigrams(query_tokens), normalise(text))


def order_by_share(shares: np.ndarray) -> np.ndarray:
    """Candidates (given best first) with a strong share moved first, best share first; the rest keep their order."""
    n = len(shares)
    strong = shares >= PHRASE_MIN_SHARE  # (callers may add a small tie-break on top of the share)
    if not strong.any():
        return np.arange(n)
    position = np.arange(n)
    return np.lexsort((position, -np.where(strong, shares, 0.0), ~strong))


def phrase_order(query: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(new order of the candidates, phrase score per candidate) for candidate texts given best first, each read
    on its own (no next chunk): the scoring the ranking's phrase step uses."""
    phrase = PhraseQuery(query)
    scores = np.array([phrase.border_score(own, own) for own in map(normalise, texts)], dtype=np.float64)
    return order_by_share(scores), scores


PHRASE_TEXT_CACHE_ROWS = 50_000  # normalised texts kept per snapshot (~1-2 KB each)


def phrase_texts(snapshot: LoadedSnapshot, rows: list[int]) -> list[tuple[str, str]]:
    """(own, pair) normalised texts per row, padded with spaces: ``own`` is the chunk's text, ``pair`` the
    text followed by the next chunk of the same document (and its heading when it opens a section), so a
    pasted span that crosses a chunk border is still found whole.  Cached on the snapshot: a popular chunk
    is normalised once, not per query."""
    cache = snapshot.phrase_text_cache
    missing = [r for r in dict.fromkeys(rows) if r not in cache]
    if missing:
        records = snapshot.records
        following = [r + 1 if r + 1 < snapshot.size and snapshot.doc_index[r + 1] == snapshot.doc_index[r] else -1
                     for r in missing]
        own_cache = snapshot.normalised_text_cache
        if len(cache) > PHRASE_TEXT_CACHE_ROWS:
            cache.clear()
            own_cache.clear()
        wanted = [r for r in dict.fromkeys(missing + [r for r in following if r >= 0]) if r not in own_cache]
        if wanted:
            for row, text in zip(wanted, records.column("text").take(wanted).to_pylist()):
                own_cache[row] = normalise(text or "")
        present = [r for r in following if r >= 0]
        paths = dict(zip(present, records.column("section_path").take(present).to_pylist())) if present else {}
        for row, nxt in zip(missing, following):
            own = own_cache[row]
            if nxt < 0:
                cache[row] = (own, own)
                continue
            heading = ""
            if snapshot.sections is not None and snapshot.sections.group[nxt] != snapshot.sections.group[row]:
                heading = normalise((paths[nxt] or [""])[-1]).strip()
            # normalised strings join with one space: a bigram across the border stays a substring
            cache[row] = (own, " ".join(part for part in (own.strip(), heading, own_cache[nxt].strip()) if part).join("  "))
    return [cache[r] for r in rows]
