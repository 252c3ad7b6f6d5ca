"""Offline grounding score: is every sentence of an answer backed by the passage(s) it cites?

No model, no network.  Method:

1. **Sentences.**  An ``Answer`` with ``.sentences`` is taken as it is (each
   entry's ``text`` and ``citations``; any ``[n]`` markers left inside the text
   are read and stripped).  A plain string is cut at runs of citation markers
   (``[1]``, ``[2][3]``, ``[1, 2]``, with any punctuation right after them) and
   then at sentence boundaries (``text.sentence_spans``); a run of markers
   belongs to the sentence just before it, so both ``Claim. [1]`` (our
   extractive style) and ``Claim [1].`` (the usual LLM style) work, and in
   ``A. B. [1]`` only ``B`` cites [1] — ``A`` counts as uncited.  An answer that
   is empty or is the ``NO_ANSWER`` text has no sentences.
2. **Support** (``sentence_support``).  The sentence's informative terms are
   taken exactly as ``terms.query_terms`` takes a query's (lower case,
   accents stripped, English stopwords dropped, light stemming, distinct); its
   support is the share of them that occur among the terms of the passage
   (tokenised with ``terms.term_spans``, the same stemmer).  A sentence
   found verbatim in the passage (whitespace collapsed, ``…`` ends of a
   snippet dropped) scores 1.0 outright.  A sentence with no informative term
   scores 1.0 only if verbatim, else 0.0.
3. **Which passages.**  A sentence is checked against the union of the
   passages it cites (a claim citing [1][2] may combine both; verbatim in any of
   them counts).  A marker that points at no passage supports nothing.  A
   sentence citing nothing is checked against all passages and flagged
   ``uncited``.
4. **Score.**  A sentence is *supported* when its support ≥ ``threshold``
   (default 0.8); the score is supported sentences / sentences, and 0.0 for an
   answer with no sentences (there is nothing grounded to credit).

**Why 0.8.**  Extractive answers are verbatim and score 1.0.  A faithful
paraphrase keeps nearly all content words (stemming absorbs inflection), and
usually adds at most one connective or reworded term in five; a sentence that
brings in a fact the passage lacks (another number, name, unit or verb)
typically has two or more of its 5–10 content terms missing and drops below
0.8.  Lower thresholds let invented numbers through; 1.0 fails honest
paraphrase.  It is a lexical proxy: it cannot see negation or a wrong
relation between words that all occur in the passage.

When an OpenAI-compatible endpoint is configured, evaluations also compute the
LLM-judged RAGAS ``Faithfulness`` (claims extracted from the answer and verified
against the contexts by the model, ``ragas_metrics.RagasJudge``); this module is
the offline check beside it.  Extractive answers are verbatim, so the evaluation
marks their grounding not applicable rather than scoring a constant 1.0.

``helpful_rate`` turns the query log's thumbs (``'up'`` / ``'down'``) into a
rate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from knowledge_store.core.text import sentence_spans
from knowledge_store.retrieval.answer import NO_ANSWER, Answer
from knowledge_store.retrieval.snippets import ELLIPSIS, collapse_ws
from knowledge_store.retrieval.terms import normalize, query_terms, term_spans

__all__ = ["GroundingResult", "sentence_support", "grounding_score", "helpful_rate", "DEFAULT_THRESHOLD"]

DEFAULT_THRESHOLD = 0.8

_MARKER = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
# one run of markers, with the punctuation that may follow it ("claim [1][2]." / "claim. [1]")
_MARKER_RUN = re.compile(r"(?:\s*\[\d+(?:\s*,\s*\d+)*\])+[.!?;:]*")

Passages = Union[Mapping[int, str], Sequence[str]]


@dataclass
class GroundingResult:
    """``score`` = ``supported`` / ``sentences`` (0.0 when ``sentences`` is 0);
    ``details`` has one dict per sentence: ``text``, ``cited`` (markers),
    ``support`` (0-1), ``supported`` (bool), ``uncited`` (bool)."""

    score: float
    sentences: int
    supported: int
    details: list[dict[str, Any]] = field(default_factory=list)
    threshold: float = DEFAULT_THRESHOLD

    @property
    def uncited(self) -> int:
        return sum(1 for d in self.details if d["uncited"])


def _markers(text: str) -> list[int]:
    found: list[int] = []
    for match in _MARKER.finditer(text):
        for part in match.group(1).split(","):
            n = int(part)
            if n not in found:
                found.append(n)
    return found


_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")


def _strip_markers(text: str) -> str:
    """``text`` without ``[n]`` markers ("claim [1]." -> "claim."), whitespace collapsed."""
    return _SPACE_BEFORE_PUNCT.sub(r"\1", collapse_ws(_MARKER.sub(" ", text)))


def _plain(text: str) -> str:
    """Whitespace collapsed, snippet ellipses at the ends dropped."""
    return collapse_ws(text).strip(ELLIPSIS).strip()


def _passage_terms(passage: str) -> set[str]:
    return {term for term, _, _ in term_spans(passage)}


def _verbatim(sentence: str, passages: Sequence[str]) -> bool:
    body = _plain(sentence)
    if not body:
        return False
    candidates = {body, body.rstrip(".!?;:").rstrip()}  # "claim [1]." loses its period to the marker run
    return any(c and c in collapse_ws(p) for p in passages for c in candidates)


def _support(sentence: str, passages: Sequence[str]) -> float:
    if _verbatim(sentence, passages):
        return 1.0
    terms = query_terms(sentence)
    if not terms:
        return 0.0
    available: set[str] = set()
    for passage in passages:
        available |= _passage_terms(passage)
    return sum(1 for t in terms if t in available) / len(terms)


def sentence_support(sentence: str, passage: str) -> float:
    """Share of ``sentence``'s informative terms (stemmed, non-stopword, as in
    ``query_terms``) that occur in ``passage``; 1.0 when the sentence appears in
    the passage verbatim (whitespace-normalised).  Citation markers in the
    sentence are ignored."""
    return _support(_strip_markers(sentence), [passage])


def _split_text(text: str) -> list[tuple[str, list[int]]]:
    """(sentence text without markers, its markers) for a plain answer string."""
    out: list[tuple[str, list[int]]] = []

    def add(chunk: str, markers: list[int]) -> None:
        spans = sentence_spans(chunk)
        pieces = [chunk[s:e] for s, e in spans if _strip_markers(chunk[s:e])]
        for i, piece in enumerate(pieces):
            out.append((_strip_markers(piece), markers if i == len(pieces) - 1 else []))

    pos = 0
    for match in _MARKER_RUN.finditer(text):
        chunk = text[pos:match.start()]
        if _strip_markers(chunk):
            add(chunk, _markers(match.group()))
        elif out:  # "claim [1]. [2]": a further run with no text of its own cites the same sentence
            out[-1] = (out[-1][0], list(dict.fromkeys(out[-1][1] + _markers(match.group()))))
        pos = match.end()
    if _strip_markers(text[pos:]):
        add(text[pos:], [])
    return out


def _answer_sentences(answer: Answer | str) -> list[tuple[str, list[int]]]:
    if isinstance(answer, Answer):
        if answer.sentences:
            items = []
            for entry in answer.sentences:
                raw = str(entry.get("text") or "")
                cited = [int(n) for n in (entry.get("citations") or [])]
                if not cited and entry.get("citation") is not None:
                    cited = [int(entry["citation"])]
                for n in _markers(raw):
                    if n not in cited:
                        cited.append(n)
                text = _strip_markers(raw)
                if text:
                    items.append((text, cited))
            return items
        answer = answer.text
    text = answer or ""
    if not text.strip() or normalize(collapse_ws(text)).rstrip(".") == normalize(NO_ANSWER).rstrip("."):
        return []
    return _split_text(text)


def _passage_map(passages: Passages) -> dict[int, str]:
    if isinstance(passages, Mapping):
        return {int(n): str(p) for n, p in passages.items()}
    return {n: str(p) for n, p in enumerate(passages, start=1)}


def grounding_score(answer: Answer | str, passages: Passages, threshold: float = DEFAULT_THRESHOLD) -> GroundingResult:
    """Grounding of ``answer`` in ``passages`` (see the module docstring).

    ``passages`` maps citation marker -> passage text, or is a list where item
    ``i`` is the passage cited as ``[i + 1]`` (the hit list's order)."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    by_marker = _passage_map(passages)
    details: list[dict[str, Any]] = []
    for text, cited in _answer_sentences(answer):
        uncited = not cited
        if uncited:
            sources = list(by_marker.values())
        else:
            sources = [by_marker[n] for n in cited if n in by_marker]
        support = _support(text, sources) if sources else 0.0
        details.append({
            "text": text,
            "cited": list(cited),
            "support": support,
            "supported": support >= threshold,
            "uncited": uncited,
        })
    supported = sum(1 for d in details if d["supported"])
    n = len(details)
    return GroundingResult(
        score=supported / n if n else 0.0,
        sentences=n,
        supported=supported,
        details=details,
        threshold=threshold,
    )


def helpful_rate(ratings: list[str]) -> float | None:
    """``up / (up + down)`` over the query log's ratings; None when there are none.
    Any value other than 'up' / 'down' raises ValueError (the log allows no other)."""
    up = down = 0
    for rating in ratings:
        if rating == "up":
            up += 1
        elif rating == "down":
            down += 1
        else:
            raise ValueError(f"rating={rating!r}: must be 'up' or 'down'")
    if up + down == 0:
        return None
    return up / (up + down)
