"""Snippets: the words of a retrieved passage that best match a query, and where they are.

- ``segments`` cuts a passage into the units a snippet or an extractive answer
  is built from: sentences (``text.sentence_spans``), and inside them the
  separate lines of code / table / list blocks (prose is stored joined with
  spaces, so a newline inside a sentence is almost always structure; hard-wrapped
  plain text is recognised and kept together).
- ``term_weights`` / ``best_segment`` score units by the query terms
  (``retrieval.terms``) they contain, rarer terms within the passage counting more.
- ``best_snippet`` picks the best-matching unit and returns at most
  ``max_chars`` characters around the matched words, ellipses included, with
  the exact character offsets of the quoted words in the passage.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from knowledge_store.core.text import sentence_spans, trim_span
from knowledge_store.retrieval.terms import query_terms, term_spans

ELLIPSIS = "…"

_NONSPACE = re.compile(r"\S+")


# ---------------------------------------------------------------------------
# segmentation

_BULLET = re.compile(r"^\s*(?:[-*+•▪◦‣–—]|\d+[.)]|[a-z][.)])\s")
_CODEISH = re.compile(r"[|\t{};=<>`]|^\s*(?:#|//|\$ |>>>|\.\.\.)")


def _structured(line: str) -> bool:
    return bool(line[:1].isspace() or _BULLET.match(line) or _CODEISH.search(line))


def _line_break_is_structure(line: str, next_line: str) -> bool:
    """True when the newline between two lines separates units (code rows, list
    items, a heading above a paragraph) rather than soft-wrapping prose."""
    if _structured(line) or _structured(next_line):
        return True
    stripped = line.rstrip()
    if not stripped or stripped.endswith((":", ";", "{", "}", "[", "]", "(", ")")):
        return True
    head = next_line.lstrip()[:1]
    # a short line followed by a capitalised one reads as a heading or a label
    return bool(head) and (head.isupper() or head.isdigit()) and len(stripped) < 50 and not stripped.endswith((",", "-"))


def segments(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of ``text``; the lines of code, table and
    list blocks each count as one.  Spans are trimmed and never empty."""
    out: list[tuple[int, int]] = []
    for start, end in sentence_spans(text):
        if "\n" not in text[start:end]:
            out.append((start, end))
            continue
        lines: list[tuple[int, int]] = []
        pos = start
        for piece in text[start:end].split("\n"):
            lines.append((pos, pos + len(piece)))
            pos += len(piece) + 1
        lines = [(s, e) for s, e in lines if text[s:e].strip()]
        seg_start = lines[0][0]
        for (s, e), (ns, ne) in zip(lines, lines[1:]):
            if _line_break_is_structure(text[s:e], text[ns:ne]):
                out.append(trim_span(text, seg_start, e))
                seg_start = ns
        out.append(trim_span(text, seg_start, lines[-1][1]))
    return [(s, e) for s, e in out if e > s]


def collapse_ws(text: str) -> str:
    """Whitespace runs (newlines included) as single spaces, ends trimmed."""
    return " ".join(_NONSPACE.findall(text))


# ---------------------------------------------------------------------------
# scoring

def term_weights(terms: Iterable[str], units: Sequence[set[str]]) -> dict[str, float]:
    """Inverse unit frequency of each query term among ``units`` (term sets):
    a term found in one sentence out of ten counts more than one found in all."""
    n = max(len(units), 1)
    weights: dict[str, float] = {}
    for term in terms:
        df = sum(1 for unit in units if term in unit)
        weights[term] = math.log(1.0 + n / df) if df else 0.0
    return weights


def unit_term_sets(spans: Sequence[tuple[int, int]], tokens: Sequence[tuple[str, int, int]]) -> list[set[str]]:
    """The set of terms in each unit (``spans`` sorted, non-overlapping)."""
    sets: list[set[str]] = [set() for _ in spans]
    i = 0
    for term, start, _ in tokens:
        while i < len(spans) and spans[i][1] <= start:
            i += 1
        if i == len(spans):
            break
        if spans[i][0] <= start:
            sets[i].add(term)
    return sets


def best_segment(text: str, terms: Sequence[str],
                 tokens: Sequence[tuple[str, int, int]] | None = None) -> tuple[int, float, list[tuple[int, int]]]:
    """(index of the best unit, its score, all unit spans).  The score is the summed
    within-passage weight of the distinct query terms a unit contains; ties go to
    the earlier unit, and with no match at all the first unit wins (score 0).
    ``tokens``: ``term_spans(text)``, when the caller has them."""
    index, score, spans, _ = _best_unit(text, terms, tokens)
    return index, score, spans


def _best_unit(text: str, terms: Sequence[str], tokens: Sequence[tuple[str, int, int]] | None
               ) -> tuple[int, float, list[tuple[int, int]], dict[str, float]]:
    """``best_segment`` and the terms' within-passage weights it scored with (a snippet reuses them)."""
    spans = segments(text)
    if not spans:
        return -1, 0.0, spans, {}
    if not terms:
        return 0, 0.0, spans, {}
    sets = unit_term_sets(spans, term_spans(text) if tokens is None else tokens)
    weights = term_weights(terms, sets)
    best, best_score = 0, 0.0
    for index, found in enumerate(sets):
        score = sum(weights[t] for t in terms if t in found)
        if score > best_score + 1e-12:
            best, best_score = index, score
    return best, best_score, spans, weights


# ---------------------------------------------------------------------------
# snippets

def best_snippet(text: str, query: str, max_chars: int = 150) -> tuple[str, int, int]:
    """The part of ``text`` that best answers ``query``, at most ``max_chars`` long.

    Returns ``(snippet, start, end)``: ``start``/``end`` are offsets in ``text`` of
    the quoted words (without the "…" marks); whitespace runs are collapsed to
    single spaces in the snippet only, so ``collapse_ws(text[start:end])`` equals
    the snippet minus its ellipses.  "…" marks a cut inside a sentence (or code
    line); a snippet that starts or ends on a sentence boundary has none.  With
    no matching term, the (start of the) first sentence."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, got {max_chars}")
    terms = query_terms(query)
    tokens = term_spans(text) if terms else None  # stemmed once, for the unit and for the words around it
    index, _, spans, weights = _best_unit(text, terms, tokens)
    if index < 0:
        return "", 0, 0
    return snippet_around(text, spans, index, terms, max_chars, tokens, weights)


class _Words:
    """The words (maximal non-space runs) of a text around one unit, with the unit each belongs to and the query
    terms each contains; lengths are whitespace-collapsed.

    Only the words a snippet of at most ``max_chars`` characters holding the whole unit ``around`` (or, when the
    unit is longer, words of it alone) can reach are kept, and one more on each side: each word takes its length and
    a space.  A unit cut off at either end of that window looks shorter than it is, but a snippet reaching its cut
    end would be longer than ``max_chars``, so every choice ``snippet_around`` makes is the one it makes over all
    the words.  Indices are positions in the window; ``unit`` holds indices of the text's units."""

    def __init__(self, text: str, spans: Sequence[tuple[int, int]], terms: Sequence[str],
                 tokens: Sequence[tuple[str, int, int]] | None, weights: dict[str, float] | None,
                 around: int, max_chars: int) -> None:
        self.text = text
        tokens = term_spans(text) if tokens is None else tokens
        term_set = set(terms)
        if weights is None:
            weights = term_weights(terms, unit_term_sets(spans, tokens)) if terms else {}
        self.weights = weights
        matches = list(_NONSPACE.finditer(text))
        unit_start, unit_end = spans[around]
        first = bisect_left(matches, unit_start, key=lambda m: m.end())  # the unit's first word (or one it is in)
        last = bisect_left(matches, unit_end, key=lambda m: m.start()) - 1  # ... its last
        lo, reach = first, 0
        while lo > 0 and reach <= max_chars:  # stop at the first word a snippet holding `first` cannot reach
            lo -= 1
            reach += len(matches[lo][0]) + 1
        hi, reach = last, 0
        while hi < len(matches) - 1 and reach <= max_chars:
            hi += 1
            reach += len(matches[hi][0]) + 1
        window = matches[lo:hi + 1]
        self.starts: list[int] = [m.start() for m in window]
        self.ends: list[int] = [m.end() for m in window]
        self.unit: list[int] = []
        self.terms: list[frozenset[str]] = []
        self.prefix = [0]
        t = bisect_left(tokens, self.starts[0], key=lambda token: token[1])
        u = max(0, bisect_left(spans, self.starts[0], key=lambda span: span[1]) - 1)
        for ws, we in zip(self.starts, self.ends):
            found: set[str] = set()
            while t < len(tokens) and tokens[t][1] < we:
                if tokens[t][1] >= ws and tokens[t][0] in term_set:
                    found.add(tokens[t][0])
                t += 1
            while u < len(spans) - 1 and spans[u][1] <= ws:
                u += 1
            self.unit.append(u)
            self.terms.append(frozenset(found))
            self.prefix.append(self.prefix[-1] + we - ws)
        self.unit_first: dict[int, int] = {}
        self.unit_last: dict[int, int] = {}
        for i, unit in enumerate(self.unit):
            self.unit_first.setdefault(unit, i)
            self.unit_last[unit] = i

    def __len__(self) -> int:
        return len(self.starts)

    def lead(self, i: int) -> int:
        """1 when a snippet starting at word ``i`` needs a leading ellipsis."""
        return 0 if self.unit_first[self.unit[i]] == i else 1

    def tail(self, j: int) -> int:
        return 0 if self.unit_last[self.unit[j]] == j else 1

    def length(self, i: int, j: int) -> int:
        """Characters of the snippet made of words i..j, ellipses included."""
        return self.prefix[j + 1] - self.prefix[i] + (j - i) + self.lead(i) + self.tail(j)

    def render(self, i: int, j: int) -> tuple[str, int, int]:
        body = " ".join(self.text[self.starts[k]:self.ends[k]] for k in range(i, j + 1))
        lead = ELLIPSIS if self.lead(i) else ""
        tail = ELLIPSIS if self.tail(j) else ""
        return f"{lead}{body}{tail}", self.starts[i], self.ends[j]


def snippet_around(
    text: str, spans: list[tuple[int, int]], index: int, terms: Sequence[str], max_chars: int,
    tokens: Sequence[tuple[str, int, int]] | None = None, weights: dict[str, float] | None = None,
) -> tuple[str, int, int]:
    """Snippet for unit ``index`` of ``spans`` (see ``best_snippet``; ``tokens``: ``term_spans(text)``;
    ``weights``: the terms' ``term_weights`` over the units, when the caller has them)."""
    words = _Words(text, spans, terms, tokens, weights, index, max_chars)
    first = words.unit_first[index]
    last = words.unit_last[index]
    fits = lambda i, j: words.length(i, j) <= max_chars  # noqa: E731

    if fits(first, last):
        # the whole unit fits: add whole neighbouring units while they fit
        # (next, then previous), then single words of the next or previous one
        lo, hi = first, last
        grown = True
        while grown:
            grown = False
            if hi + 1 < len(words) and fits(lo, words.unit_last[words.unit[hi + 1]]):
                hi, grown = words.unit_last[words.unit[hi + 1]], True
            if lo > 0 and fits(words.unit_first[words.unit[lo - 1]], hi):
                lo, grown = words.unit_first[words.unit[lo - 1]], True
        while hi + 1 < len(words) and fits(lo, hi + 1):
            hi += 1
        while lo > 0 and fits(lo - 1, hi):
            lo -= 1
        return words.render(lo, hi)

    # the unit is too long: find the window richest in query terms, then centre on its matches
    core_lo = core_hi = first
    best_key: tuple[float, int] | None = None
    for m in range(first, last + 1):
        if not words.terms[m]:
            continue
        seen: set[str] = set()
        score = 0.0
        j = last_hit = m
        while j <= last and fits(m, j):
            new = words.terms[j] - seen
            if new:
                score += sum(words.weights.get(x, 0.0) for x in new) + 1e-6
                seen |= new
                last_hit = j
            elif words.terms[j]:
                score += 1e-3  # a repeated term counts a little
                last_hit = j
            j += 1
        key = (round(score, 9), -(last_hit - m))
        if best_key is None or key > best_key:  # ties keep the earlier run
            best_key, core_lo, core_hi = key, m, last_hit
    if not fits(core_lo, core_hi):
        core_hi = core_lo
    if not fits(core_lo, core_lo):
        return _cut_word(text, words, core_lo, spans[index], terms, max_chars)
    lo, hi = core_lo, core_hi
    grown = True
    while grown:
        grown = False
        if hi < last and fits(lo, hi + 1):
            hi, grown = hi + 1, True
        if lo > first and fits(lo - 1, hi):
            lo, grown = lo - 1, True
    return words.render(lo, hi)


def _cut_word(
    text: str, words: _Words, k: int, unit: tuple[int, int], terms: Sequence[str], max_chars: int
) -> tuple[str, int, int]:
    """A single word longer than the limit (a URL, a hash, a minified line): cut
    it by characters around the first matched token in it."""
    w_start, w_end = words.starts[k], words.ends[k]
    centre = w_start
    term_set = set(terms)
    for term, start, end in term_spans(text[w_start:w_end]):
        if term in term_set:
            centre = w_start + (start + end) // 2
            break
    if max_chars <= 2:  # no room for ellipses
        start = max(w_start, min(centre - max_chars // 2, w_end - max_chars))
        return text[start:start + max_chars], start, start + max_chars
    room = max_chars - 2
    start = max(w_start, min(centre - room // 2, w_end - room))
    end = min(w_end, start + room)

    def used(s: int, e: int) -> int:
        return (e - s) + (1 if s > unit[0] else 0) + (1 if e < unit[1] else 0)

    while end < w_end and used(start, end + 1) <= max_chars:
        end += 1
    while start > w_start and used(start - 1, end) <= max_chars:
        start -= 1
    lead = ELLIPSIS if start > unit[0] else ""
    tail = ELLIPSIS if end < unit[1] else ""
    return f"{lead}{text[start:end]}{tail}", start, end
