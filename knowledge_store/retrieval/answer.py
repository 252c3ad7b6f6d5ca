"""Answers built from retrieved passages, every sentence carrying a citation marker.

Two ways:

- ``extractive_answer``: no model at all.  The answer is made only of units
  quoted from the retrieved passages - sentences, list items and table rows
  (``answer_units``), with markup removed and whitespace normalised, a row
  paired with its header's names - each followed by ``[n]`` where ``n`` is the
  1-based position of its hit.  It cannot say anything the sources do not say.
- ``LLMAnswerer``: an OpenAI-compatible ``/chat/completions`` endpoint the user
  configured (often a local server), asked with a strictly grounded prompt to
  answer only from the numbered passages and cite them.  This is the only code
  in the package that sends anything over the network, and only when called.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import BaseModel, Field

from knowledge_store.core.errors import GroundworkError
from knowledge_store.core.text import plain_inline, sentence_spans
from knowledge_store.core.vocabulary import Vocabulary
from knowledge_store.retrieval.answer_types import (
    AnswerType,
    asked_action,
    asks_for_action,
    expected_answer_type,
    gives_instruction,
)
from knowledge_store.retrieval.answer_units import AnswerUnit, answer_units, word_count
from knowledge_store.retrieval.snippets import best_snippet, collapse_ws, term_weights
from knowledge_store.retrieval.terms import mixes_letters_and_digits, normalize, query_terms, term_spans
from knowledge_store.retrieval.types import SearchHit

if TYPE_CHECKING:
    from knowledge_store.config.settings import Settings

log = logging.getLogger(__name__)

NO_ANSWER = "No relevant content found."


@dataclass(frozen=True)
class AnswerMode:
    """One value of a query's ``answer`` parameter: what it gives and what it needs to run."""

    name: str  # what the engine, the HTTP API (query and ask bodies) and the console accept
    description: str  # what it gives, in one line (schema descriptions)
    writes_answer: bool = True  # False: passages only (POST /api/ask always writes an answer, so not offered there)
    needs: str | None = None  # what it cannot run without, said in the schema
    needs_llm: bool = False  # runs only with an OpenAI-compatible endpoint configured (Settings.llm_configured)

    def available(self, settings: Settings) -> bool:
        """Whether these settings let it run."""
        return not self.needs_llm or settings.llm_configured

    def schema_text(self) -> str:
        """``name: what it gives (needs ...)``, for schema descriptions."""
        return f"{self.name}: {self.description}" + (f" (needs {self.needs})" if self.needs else "")


# the one place an answer mode is named (in the order the API's schema lists them)
ANSWER_REGISTRY: dict[str, AnswerMode] = {mode.name: mode for mode in (
    AnswerMode("extractive", "sentences of the passages, each cited [n], no model needed"),
    AnswerMode("none", "passages only, no answer", writes_answer=False),
    AnswerMode("llm", "written from the passages, cited [n], by the configured OpenAI-compatible endpoint",
               needs="GROUNDWORK_LLM_BASE_URL and GROUNDWORK_LLM_MODEL", needs_llm=True),
)}
ANSWER_MODES = Vocabulary("answer", ANSWER_REGISTRY)


def available_answer_modes(settings: Settings, writing_only: bool = False) -> tuple[str, ...]:
    """The answer modes these settings can run, in registry order; ``writing_only``: those that write an
    answer (what ``POST /api/ask`` offers)."""
    return tuple(name for name, mode in ANSWER_REGISTRY.items()
                 if mode.available(settings) and (mode.writes_answer or not writing_only))


class GenerationError(GroundworkError):
    """The answer model could not produce an answer.  ``endpoint`` is the URL that
    was called (credentials stripped), ``status`` the last HTTP status if any,
    ``attempts`` how many requests were made."""

    def __init__(self, message: str, *, endpoint: str, status: int | None = None, attempts: int = 0) -> None:
        self.endpoint = endpoint
        self.status = status
        self.attempts = attempts
        super().__init__(message)


class Answer(BaseModel):
    """``citations`` lists the markers the text uses (positions in the hit list,
    1-based, in order of first use); ``sentences`` has one entry per answer
    sentence: ``text``, ``citation`` (its first marker, or None), ``citations``
    (all its markers) and ``chunk_id`` (of the first marker's hit, or None);
    extractive sentences also carry ``start``/``end`` offsets of the quoted unit in
    the hit's text and its ``kind`` (sentence, item or row; see ``answer_units``),
    and an extractive answer its ``confidence``: how well the quoted units answer
    the question (0-1, ``AnswerEvidence.confidence``; its 0.55 and 0.75 steps cap
    the response's coverage)."""

    text: str
    citations: list[int] = Field(default_factory=list)
    method: Literal["extractive", "llm"]
    model: str | None = None
    sentences: list[dict[str, Any]] = Field(default_factory=list)
    confidence: float | None = None


# ---------------------------------------------------------------------------
# extractive

_RANK_DECAY = 0.25  # a unit in hit r (0-based) scores 1 / (1 + 0.25 r) of the same unit in hit 0
_RELATED_SHARE = 0.7  # besides the best unit and its continuation, units scoring at least 70% of the best
_CONTINUE_SHARE = 0.5  # another unit shares the best one's focus when it holds half its share of the query's words
_CONTINUE_COSINE = 0.05  # ... or, next to it, when its cosine with the query is within this of the best's
_HEADING_SHARE = 0.5  # a query word only in the passage's title or section names counts half
_NEAR_DUPLICATE = 0.8  # token-set overlap above which two units say the same thing
_FULL_SENTENCE_WORDS = 12  # a unit this long is judged by its own vector; a shorter one partly by its passage's
# a cosine's 0..1 scale: 0 at unrelated text, 1 at a paraphrase (the calibration of ``fusion.relevance``)
_COSINE_FLOOR, _COSINE_CEILING = 0.2, 0.7


def _word_set(text: str) -> frozenset[str]:
    return frozenset(term for term, _, _ in term_spans(text))


def _near_duplicate(a: frozenset[str], b: frozenset[str]) -> bool:
    if not a or not b:
        return a == b
    common = len(a & b)
    return common / len(a | b) >= _NEAR_DUPLICATE or common / min(len(a), len(b)) >= 0.9


def _scaled_cosine(cosine: float) -> float:
    return min(1.0, max(0.0, (cosine - _COSINE_FLOOR) / (_COSINE_CEILING - _COSINE_FLOOR)))


@dataclass(frozen=True)
class AnswerCandidate:
    """One unit of one retrieved passage and its evidence for the query.

    ``words`` are the query's terms the unit holds; ``context`` those only what frames it holds: its passage's
    title and section names, and the line that introduces its list or table ("When cloud features are enabled,
    the thermostat reports:").  ``own`` is the idf-weighted share of the query's terms in ``words`` (a term no
    retrieved unit or heading holds counts as missing, at the weight of the rarest); ``lexical`` adds ``context``
    at half weight; ``semantic`` is the unit's own cosine with the query on a 0..1 scale (the best embedded
    sentence overlapping it, leaning on its passage's cosine the shorter it is than ``_FULL_SENTENCE_WORDS``: a
    four-word line's vector, pooled in its chunk or embedded alone, says little of its own; the passage's cosine
    when the index has no sentence vectors; None without either), ``passage_semantic`` its passage's.
    ``support`` is how well the unit answers on its own (the mean of ``lexical`` and ``semantic``), ``score`` the
    same discounted by the passage's rank.  ``typed``: the unit holds a value of the kind the question asks for
    (``answer_types``: "1.0 bar" for "what pressure ..."; False when it asks for none)."""

    hit: int  # 0-based position of its passage in the hits
    order: int  # position among every unit of every hit
    unit: AnswerUnit
    words: frozenset[str]
    context: frozenset[str]
    own: float
    lexical: float
    semantic: float | None
    passage_semantic: float | None
    support: float
    score: float
    vector: tuple[int, int] | None  # the span of the embedded sentence its cosine comes from (None: passage's)
    typed: bool = False
    points: bool = False  # it refers the reader elsewhere in the document (``points_elsewhere``)


@dataclass(frozen=True)
class AnswerEvidence:
    """What an extractive answer is chosen from: every unit of the hits with its evidence, and the query terms'
    weights (``weights``; ``total`` is their sum with missing terms counted at ``rarest``, the weight of the
    rarest present term); ``expected`` is the kind of value the question asks for
    (``answer_types.expected_answer_type``), None when it asks for none; ``asks_action``: the question asks what
    to do (``answer_types.asks_for_action``: "how do I clear E55"); ``action``: the query's terms of the verb it asks
    to do (``answer_types.asked_action``: "clear"), which a quoted instruction answers though it seldom repeats it
    ("The installer must remove the O/B wire" clears E55)."""

    terms: tuple[str, ...]
    weights: dict[str, float]
    total: float
    candidates: tuple[AnswerCandidate, ...]
    expected: AnswerType | None = None
    rarest: float = 1.0
    asks_action: bool = False
    action: frozenset[str] = frozenset()

    def confidence(self, chosen: Sequence[AnswerCandidate]) -> float:
        """How well ``chosen`` answer the query together (0-1): the share of the query's terms they hold, they or
        what frames them (a unit under "Version 3.4" answers about 3.4, as the reader of its citation sees),
        averaged with their best semantic evidence, each quoted unit read in its passage (the better of its own
        cosine and its passage's).  A question that asks for a kind of value (``expected``) counts it as one more
        term, as heavy as its rarest: an answer naming the thing without its value holds part of what was asked.
        A question asking what to do (``asks_action``) holds its verb (``action``) when a quoted unit says what to do
        (``answer_types.gives_instruction``)."""
        if not chosen:
            return 0.0
        held = set().union(*(c.words | c.context for c in chosen))
        if self.action and any(gives_instruction(c.unit.text) for c in chosen):
            held |= self.action
        # a term no unit holds counts in ``total`` at the rarest weight: so does the asked verb the instruction answers
        lexical = sum(self.weights.get(t) or (self.rarest if t in self.action else 0.0) for t in held) / self.total \
            if self.total else 0.0
        if self.expected is not None and self.total:
            value = self.rarest
            lexical = (lexical * self.total + (value if any(c.typed for c in chosen) else 0.0)) / (self.total + value)
        semantic = [max(x for x in (c.semantic, c.passage_semantic) if x is not None) for c in chosen
                    if c.semantic is not None or c.passage_semantic is not None]
        return 0.5 * lexical + 0.5 * max(semantic) if semantic else lexical


_COMPOUND_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)+(?![\w]|[.,]\d)")


def answer_terms(text: str) -> set[str]:
    """The terms of ``text`` an answer compares (``terms.term_spans``'s stems), plus each version or decimal
    number whole ("3.4", "1.0"): split into its digits, "firmware 3.4" would match any "4"."""
    return {term for term, _, _ in term_spans(text)} | set(_COMPOUND_NUMBER.findall(text))


def answer_query_terms(query: str) -> tuple[str, ...]:
    """``query_terms`` of ``query`` with each version or decimal number whole instead of its digits (unless a
    digit also stands alone in the query)."""
    compounds = _COMPOUND_NUMBER.findall(query)
    if not compounds:
        return tuple(query_terms(query))
    alone = query_terms(_COMPOUND_NUMBER.sub(" ", query))
    pieces = {piece for number in compounds for piece, _, _ in term_spans(number)}
    return tuple(dict.fromkeys([t for t in query_terms(query) if t not in pieces or t in alone] + compounds))


def _cosine_of(hit: SearchHit, unit: AnswerUnit) -> tuple[float, tuple[int, int]] | None:
    """The best cosine of the embedded sentences overlapping ``unit`` (``SearchHit.sentence_cosines``) and that
    sentence's span; None when the hit has none."""
    overlapping = [(cos, (s, e)) for s, e, cos in hit.sentence_cosines if s < unit.end and e > unit.start]
    return max(overlapping) if overlapping else None


# A sentence whose message is where the answer is, not the answer: one that opens by sending the reader on ("See
# the wiring chapter.", "For more details, see Chapter 13."), or points to another part of the document ("each has
# a section of its own below", "in the next section").  A cross-reference inside a sentence that says something
# ("... using intrusion detection systems (see Section 10.3), you may ...") does not make it one: parentheses are
# dropped first.  "below" and "above" count only where a clause ends: "below 18 V" and "above the limit" compare.
_PARENTHESES = re.compile(r"\([^()]*\)")
_POINTS_ELSEWHERE = re.compile(
    r"^\W*(?:for (?:more|further|additional)\b[^,]*,\s*)?(?:please\s+)?(?:see|refer to|consult)\b"
    r"|\b(?:below|above)\s*(?:[.:;]|$)"
    r"|\b(?:the|a) (?:following|next|previous) (?:sections?|chapters?|pages?)\b", re.IGNORECASE)


def points_elsewhere(text: str) -> bool:
    """Whether ``text`` says where the answer is rather than what it is (``_POINTS_ELSEWHERE``)."""
    return _POINTS_ELSEWHERE.search(_PARENTHESES.sub(" ", text)) is not None


def answer_evidence(query: str, hits: Sequence[SearchHit]) -> AnswerEvidence:
    """Every unit of ``hits`` (``answer_units``) with its evidence for ``query`` (see ``AnswerCandidate``).
    A unit that points elsewhere (``points_elsewhere``: "E42 and E55 ... each has a section of its own below")
    names what it points to as a heading does: its query terms count as what frames it, at half weight, so the
    section it points to answers before it does; it still answers when nothing else holds the terms."""
    expected = expected_answer_type(query)
    terms = answer_query_terms(query)
    if expected is not None:  # "long" in "how long" asks for the value; the answer need not say it
        asking = set().union(*(answer_terms(word) for word in expected.asking))
        terms = tuple(t for t in terms if t not in asking) or terms
    wanted = set(terms)
    per_hit = []
    framings = []
    for hit in hits:
        headings = [name for name in (hit.title, hit.section, *hit.section_path) if name]
        units = answer_units(hit.text, headings)
        framing = set().union(*(answer_terms(name) for name in headings)) & wanted if headings else set()
        holds = [answer_terms(u.text) & wanted for u in units]
        pointed = [found if points_elsewhere(u.text) else set() for u, found in zip(units, holds)]
        own = [found - away for found, away in zip(holds, pointed)]
        intro: dict[int, set[str]] = {}  # group -> the query terms of the line introducing it ("listed below:")
        for i, unit in enumerate(units[1:], start=1):
            before = units[i - 1]
            if before.kind == "intro" and before.block != unit.block and unit.block not in intro:
                intro[unit.block] = holds[i - 1]
        context = [(framing | intro.get(u.block, set()) | away) - found for u, found, away in zip(units, own, pointed)]
        per_hit.append((units, holds, own, context, pointed))
        framings.append((hit, units, framing))
    # rarer terms weigh more: inverse frequency among the units (headings and intros too) and, once per passage,
    # its title and section names (a section name is one occurrence, not one per unit it frames)
    occurrences = [found for _, holds, _, _, _ in per_hit for found in holds]
    occurrences += [framed for _, _, framed in framings]
    weights = term_weights(terms, occurrences)
    present = {t: w for t, w in weights.items() if w > 0}
    missing = [t for t in terms if t not in present]
    rarest = max(present.values()) if present else 1.0
    total = sum(present.values()) + len(missing) * rarest
    candidates = []
    order = 0
    for r, (hit, (units, _, own, context, pointed)) in enumerate(zip(hits, per_hit)):
        passage = None if hit.vector_score is None else _scaled_cosine(hit.vector_score)
        for unit, found, around, away in zip(units, own, context, pointed):
            held = sum(weights[t] for t in found) / total if total else 0.0
            lexical = held + (_HEADING_SHARE * sum(weights[t] for t in around) / total if total else 0.0)
            vector = _cosine_of(hit, unit)
            if vector is None:
                semantic = passage
            else:  # a short unit's vector says little of its own: it leans on its passage's in proportion
                own_share = min(1.0, word_count(unit.text) / _FULL_SENTENCE_WORDS)
                semantic = _scaled_cosine(vector[0]) if passage is None else \
                    passage + own_share * (_scaled_cosine(vector[0]) - passage)
            support = lexical if semantic is None else 0.5 * lexical + 0.5 * semantic
            candidates.append(AnswerCandidate(r, order, unit, frozenset(found), frozenset(around), held, lexical,
                                              semantic, passage, support, support / (1 + _RANK_DECAY * r),
                                              None if vector is None else vector[1],
                                              expected is not None and expected.given_by(unit.text), bool(away)))
            order += 1
    verb = asked_action(query)
    action = frozenset(answer_terms(verb) & wanted) if verb else frozenset()
    return AnswerEvidence(terms, weights, total, tuple(candidates), expected, rarest, asks_for_action(query), action)


def _names_something(term: str) -> bool:
    """A term that names something rather than says something: letters and digits mixed (e47, ipv6), a version
    or decimal number (3.4), or a compound name (min_cycle_minutes); a bare number is not one."""
    return mixes_letters_and_digits(term) or "." in term or "_" in term


def _shares_focus(candidate: AnswerCandidate, best: AnswerCandidate, held: set[str], adjacent: bool) -> bool:
    """Whether ``candidate`` keeps to what the best unit answers.  When the best unit holds some of the query's
    terms: ``candidate`` holds some too, and either at least ``_CONTINUE_SHARE`` of the best unit's share, or a
    term no chosen unit holds yet, itself or in what frames it (``held``: the other half of a two-part question),
    or - right next to the best unit in its paragraph or list (``adjacent``) - a cosine of its own (from another
    embedded sentence than the best's: table rows share one) within ``_CONTINUE_COSINE`` of the best's.
    When the best unit holds none (it won on meaning alone): an adjacent unit close in meaning.  Without sentence
    vectors nothing tells a passage's units apart by meaning: the best one then stands alone."""
    close = (candidate.vector is not None and best.vector is not None and candidate.vector != best.vector
             and candidate.semantic is not None and best.semantic is not None and candidate.semantic > 0
             and candidate.semantic >= best.semantic - _CONTINUE_COSINE / (_COSINE_CEILING - _COSINE_FLOOR))
    if best.own <= 0:
        return adjacent and close
    if candidate.own <= 0:
        return False
    return candidate.own >= _CONTINUE_SHARE * best.own or bool(candidate.words - held) or (adjacent and close)


def choose_answer_units(evidence: AnswerEvidence, max_units: int = 3, max_chars: int = 600) -> list[AnswerCandidate]:
    """The units an extractive answer quotes, best first: the best-scoring quotable unit; the units right after
    it in its paragraph or list while they share its focus (``_shares_focus``: the 429 sentence after the rate
    limit's), and the sentence right before a best sentence when it does (what the best one continues; a list item or table
    row stands on its own); then other units that share it and score at least ``_RELATED_SHARE`` of the best; no
    near-duplicates, at most ``max_units`` and ``max_chars`` (markers included).  When the query names something
    (``_names_something``: an error code, a version, a parameter), only the units that name the most of it, themselves
    or in what frames them, are candidates: a general sentence about firmware releases does not answer what
    changed in 3.4 when the 3.4 section is among the passages.  Likewise, when the query asks for a kind of value
    (``AnswerEvidence.expected``: a measurement, a duration, a frequency), only the units that give one and hold
    some of the query's terms, themselves or in what frames them, are candidates when there are any: "The
    expansion vessel is a pressure vessel" does not answer what pressure it should be; "it must be 1.0 bar" under
    the heading "Expansion vessel" does.  A unit that points elsewhere ("each has a section of its own below") is
    a candidate only when no other unit holds any of the query's terms.  When the question asks what to do
    (``AnswerEvidence.asks_action``) and no chosen unit says it, the first unit of the best one's paragraph or list
    that does (``answer_types.gives_instruction``) is quoted too: "E55 is shown when ..." answers what E55 is, "The
    installer must either remove the O/B wire ..." how to clear it.  Empty when no passage has a quotable unit."""
    quotable = [c for c in evidence.candidates if c.unit.quoted]
    if not quotable:
        return []
    names = [t for t in evidence.terms if _names_something(t)]
    if names:  # the query names something (E47, 3.4, a parameter): answer from where it is named, when it is
        named = {id(c): sum(1 for t in names if t in c.words or t in c.context) for c in quotable}
        most = max(named.values())
        quotable = [c for c in quotable if named[id(c)] == most]
    if any(c.points for c in quotable) and any(not c.points and (c.words or c.context) for c in quotable):
        quotable = [c for c in quotable if not c.points]  # where the answer is, rather than where it says it is
    typed = [c for c in quotable if c.typed and (c.words or c.context)]
    if typed:  # it asks for a value (a pressure, how long, how often): answer from where one is given, when it is
        quotable = typed
    ranked = sorted(quotable, key=lambda c: (-c.score, c.order))
    best = ranked[0]
    chosen: list[AnswerCandidate] = []
    seen: list[frozenset[str]] = []
    used = 0

    def take(candidate: AnswerCandidate) -> bool:
        nonlocal used
        words = _word_set(candidate.unit.text)
        cost = len(candidate.unit.text) + len(f" [{candidate.hit + 1}]") + (1 if chosen else 0)
        if any(_near_duplicate(words, other) for other in seen) or (chosen and used + cost > max_chars):
            return False
        chosen.append(candidate)
        seen.append(words)
        used += cost
        return True

    def held() -> set[str]:  # the query's terms the chosen units hold, themselves or in what frames them
        return set().union(*(c.words | c.context for c in chosen))

    def focus() -> AnswerCandidate:  # what the answer is about so far: the chosen unit holding most of the query
        return max(chosen, key=lambda c: (c.own, c is best))

    take(best)
    for following in evidence.candidates[best.order + 1:]:
        if len(chosen) >= max_units or following.hit != best.hit or following.unit.block != best.unit.block:
            break
        if following.unit.kind in ("fragment", "rule"):
            continue
        if not following.unit.quoted or not _shares_focus(following, focus(), held(), True) or not take(following):
            break
    before = evidence.candidates[best.order - 1] if best.order > 0 else None
    if (before is not None and len(chosen) < max_units and best.unit.kind == "sentence"
            and before.hit == best.hit and before.unit.quoted
            and before.unit.block == best.unit.block and _shares_focus(before, focus(), held(), True)):
        take(before)  # the best one continues it ("Requests above the limit ..." after the limit)
    if evidence.asks_action and len(chosen) < max_units and not any(gives_instruction(c.unit.text) for c in chosen):
        # "how do I clear E55": the best unit says what E55 is; what to do is in its own paragraph or list
        for candidate in evidence.candidates:
            if (candidate.hit == best.hit and candidate.unit.block == best.unit.block and candidate.unit.quoted
                    and not candidate.points and candidate not in chosen and gives_instruction(candidate.unit.text)):
                take(candidate)
                break
    for candidate in ranked[1:]:
        if len(chosen) >= max_units or best.score <= 0 or candidate.score < _RELATED_SHARE * best.score:
            break
        if candidate not in chosen and _shares_focus(candidate, focus(), held(), False):
            take(candidate)
    return chosen


def extractive_answer(query: str, hits: Sequence[SearchHit], max_sentences: int = 3, max_chars: int = 600) -> Answer:
    """An answer quoting only what ``hits`` say, each quoted unit followed by its hit's ``[n]``.

    The passages are cut into units (``answer_units``): sentences, list items and table rows are quoted, with
    their markup removed and rows paired with their header's names; headings, header rows, lines that only
    introduce what follows, fragments and code never are.  Each unit is scored by the query's words it holds
    (rarer ones weigh more; words only in its passage's headings count half) and by its own cosine with the query
    (the sentence vectors the engine attached, ``SearchHit.sentence_cosines``), discounted by its passage's rank;
    ``choose_answer_units`` picks the best, what continues it and what else scores close.  They are given grouped
    by passage in order of their best unit, in passage order inside one, each with its offsets in its hit and its
    ``kind``; ``confidence`` says how well they answer together (``AnswerEvidence.confidence``).  A passage without any
    quotable unit gives the best-matching part of its first hit's text."""
    if not hits:
        return Answer(text=NO_ANSWER, citations=[], method="extractive")
    evidence = answer_evidence(query, hits)
    chosen = choose_answer_units(evidence, max_sentences, max_chars)
    if not chosen:
        return _best_part(query, hits, max_chars)
    items = []
    for candidate in _passage_order(chosen):
        text = candidate.unit.text
        budget = max(1, max_chars - len(f" [{candidate.hit + 1}]"))
        if len(text) > budget:  # only the best unit alone can be longer than the answer: quote its best part
            text, _, _ = best_snippet(text, query, budget)
        items.append({"text": text, "citation": candidate.hit + 1, "citations": [candidate.hit + 1],
                      "chunk_id": hits[candidate.hit].chunk_id, "start": candidate.unit.start,
                      "end": candidate.unit.end, "kind": candidate.unit.kind})
    return Answer(
        text=" ".join(f"{item['text']} [{item['citation']}]" for item in items),
        citations=list(dict.fromkeys(item["citation"] for item in items)),
        method="extractive",
        sentences=items,
        confidence=round(evidence.confidence(chosen), 4),
    )


def _passage_order(chosen: Sequence[AnswerCandidate]) -> list[AnswerCandidate]:
    """Passages in order of their best unit (the order chosen); inside a passage, its best unit with the units of
    its paragraph or list around it in their own order, then the passage's other units in theirs: the answer
    leads with what answers, and a sentence continued by the best one still reads before it."""
    first: dict[int, int] = {}
    lead: dict[int, AnswerCandidate] = {}
    for candidate in chosen:
        first.setdefault(candidate.hit, len(first))
        lead.setdefault(candidate.hit, candidate)
    return sorted(chosen, key=lambda c: (first[c.hit], c.unit.block != lead[c.hit].unit.block, c.unit.start))


def _best_part(query: str, hits: Sequence[SearchHit], max_chars: int) -> Answer:
    """No passage has a quotable unit (code only, a table without rows): the best-matching part of the first hit
    that has text, its markup removed."""
    for r, hit in enumerate(hits):
        if not hit.text.strip():
            continue
        budget = max(1, max_chars - len(f" [{r + 1}]"))
        snippet, start, end = best_snippet(hit.text, query, budget)
        text = plain_inline(snippet) or snippet
        return Answer(text=f"{text} [{r + 1}]", citations=[r + 1], method="extractive",
                      sentences=[{"text": text, "citation": r + 1, "citations": [r + 1], "chunk_id": hit.chunk_id,
                                  "start": start, "end": end, "kind": "fragment"}], confidence=0.0)
    return Answer(text=NO_ANSWER, citations=[], method="extractive")


# ---------------------------------------------------------------------------
# LLM

SYSTEM_PROMPT = (
    "You answer questions using ONLY the numbered passages given by the user. "
    "Do not use any outside knowledge. "
    "Cite every claim with the number of the passage that supports it in square brackets, like [1] or [2][3]. "
    f'If the passages do not contain the answer, reply exactly "{NO_ANSWER}" and nothing else.'
)

_MARKER = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
_USERINFO = re.compile(r"//[^/@\s]*@")


def _pages_label(hit: SearchHit) -> str:
    pages = hit.pages
    if not pages:
        return ""
    if len(pages) == 1:
        return f" (p. {pages[0]})"
    return f" (pp. {pages[0]}–{pages[-1]})"


def format_passages(hits: Sequence[SearchHit]) -> str:
    """``[n] title — section (pages)`` then the passage text, for every hit."""
    blocks = []
    for n, hit in enumerate(hits, start=1):
        head = f"[{n}] {hit.title or hit.source_path or hit.doc_id}"
        if hit.section and hit.section != hit.title:
            head += f" — {hit.section}"
        head += _pages_label(hit)
        blocks.append(f"{head}\n{hit.text.strip()}")
    return "\n\n".join(blocks)


def build_messages(query: str, hits: Sequence[SearchHit]) -> list[dict[str, str]]:
    user = (
        f"Passages:\n\n{format_passages(hits)}\n\n"
        f"Question: {query.strip()}\n\n"
        f"Answer from the passages above only, citing them as [n]. "
        f'If they do not contain the answer, reply exactly "{NO_ANSWER}"'
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def cited_markers(text: str, n_hits: int) -> list[int]:
    """Markers ``[n]`` / ``[n, m]`` in ``text`` that point at a hit, in order of first use."""
    found: list[int] = []
    for match in _MARKER.finditer(text):
        for part in match.group(1).split(","):
            n = int(part)
            if 1 <= n <= n_hits and n not in found:
                found.append(n)
    return found


def _is_no_answer(text: str) -> bool:
    return normalize(text).strip().strip('"').rstrip(".").strip() == normalize(NO_ANSWER).rstrip(".")


class LLMAnswerer:
    """Grounded answers from an OpenAI-compatible chat-completions endpoint.

    ``max_retries`` counts retries after the first request, so at most
    ``max_retries + 1`` requests are made.  Timeouts, connection failures, 429
    and 5xx are retried after ``backoff_s * 2**k`` seconds (k = 0, 1, …; capped
    at ``max_backoff_s``) or after the server's numeric ``Retry-After`` (capped
    at ``max_retry_after_s``); any other 4xx fails at once.  The API key is sent
    as a Bearer token and never appears in an error message or a log line."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 20,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        *,
        max_backoff_s: float = 8.0,
        max_retry_after_s: float = 10.0,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key or None
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._transport = transport
        self._sleep = sleep

    def __repr__(self) -> str:  # no key
        return f"LLMAnswerer(endpoint={self.endpoint!r}, model={self.model!r})"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def endpoint(self) -> str:
        """The URL as shown in messages: any ``user:password@`` removed."""
        return _USERINFO.sub("//", self.url)

    def _redact(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text

    def _delay(self, retry: int, response: httpx.Response | None) -> float:
        if response is not None:
            header = response.headers.get("retry-after", "").strip()
            try:
                seconds = float(header)
            except ValueError:
                seconds = None
            if seconds is not None and seconds == seconds and seconds >= 0:  # not NaN
                return min(seconds, self.max_retry_after_s)
        return min(self.backoff_s * (2**retry), self.max_backoff_s)

    def complete(self, messages: list[dict[str, str]]) -> tuple[str, str]:
        """(reply text, model name) for ``messages``, with the retry policy above."""
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        attempts = self.max_retries + 1
        last_error = "no request made"
        last_status: int | None = None
        with httpx.Client(timeout=self.timeout_s, transport=self._transport) as client:
            for attempt in range(1, attempts + 1):
                response: httpx.Response | None = None
                try:
                    response = client.post(self.url, json=payload, headers=headers)
                except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                    last_error = f"{type(exc).__name__}: {exc}".rstrip(": ")
                    last_status = None
                except httpx.HTTPError as exc:  # bad URL, unsupported scheme, …: retrying cannot help
                    raise self._error(f"request failed: {type(exc).__name__}: {exc}", None, attempt) from None
                else:
                    if 200 <= response.status_code < 300:
                        return self._parse(response, attempt)
                    last_status = response.status_code
                    last_error = f"HTTP {response.status_code}{_body_excerpt(response)}"
                    if response.status_code != 429 and response.status_code < 500:
                        raise self._error(f"{last_error} (not retried)", last_status, attempt)
                if attempt < attempts:
                    delay = self._delay(attempt - 1, response)
                    log.warning(
                        "%s", self._redact(
                            f"LLM endpoint {self.endpoint}: {last_error}; retry {attempt}/{self.max_retries} in {delay:.2f}s"
                        )
                    )
                    self._sleep(delay)
        raise self._error(f"gave up after {attempts} attempt(s); last error: {last_error}", last_status, attempts)

    def _error(self, detail: str, status: int | None, attempts: int) -> GenerationError:
        message = self._redact(f"LLM endpoint {self.endpoint} (model {self.model!r}): {detail}")
        return GenerationError(message, endpoint=self.endpoint, status=status, attempts=attempts)

    def _parse(self, response: httpx.Response, attempt: int) -> tuple[str, str]:
        try:
            data = response.json()
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._error(
                f"HTTP {response.status_code} but the body is not a chat completion{_body_excerpt(response)}",
                response.status_code, attempt,
            ) from None
        if not isinstance(content, str):
            raise self._error("the completion has no text content", response.status_code, attempt)
        model = data.get("model") if isinstance(data.get("model"), str) and data.get("model") else self.model
        return content, model

    def answer(self, query: str, hits: Sequence[SearchHit]) -> Answer:
        """Ask the model; with no hits there is nothing to ground on and no request is made."""
        if not hits:
            return Answer(text=NO_ANSWER, citations=[], method="llm", model=self.model)
        content, model = self.complete(build_messages(query, hits))
        text = content.strip()
        if not text or _is_no_answer(text):
            return Answer(text=NO_ANSWER, citations=[], method="llm", model=model)
        sentences = []
        for s, e in sentence_spans(text):
            sentence = text[s:e]
            markers = cited_markers(sentence, len(hits))
            sentences.append({
                "text": sentence,
                "citation": markers[0] if markers else None,
                "citations": markers,
                "chunk_id": hits[markers[0] - 1].chunk_id if markers else None,
            })
        return Answer(text=text, citations=cited_markers(text, len(hits)), method="llm", model=model, sentences=sentences)

    __call__ = answer


def _body_excerpt(response: httpx.Response, limit: int = 200) -> str:
    try:
        body = collapse_ws(response.text)
    except Exception:  # undecodable body
        return ""
    if not body:
        return ""
    return f": {body[:limit]}{'…' if len(body) > limit else ''}"
