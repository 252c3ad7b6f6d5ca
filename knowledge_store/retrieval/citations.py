"""Citations: which words of a retrieved chunk support the answer, and where they are.

- ``query_terms`` normalises a query the way the BM25 index sees text (lower
  case, accents stripped, split on anything that is not ``[a-z0-9_]``, English
  stopwords dropped) plus a small suffix-stripping stemmer, so "resetting"
  matches "reset" and "codes" matches "code".  No nltk: dependency-free.
- ``segments`` cuts a passage into the units a snippet or an extractive answer
  is built from: sentences (``chunking.split_sentences``), and inside them the
  separate lines of code / table / list blocks (prose is stored joined with
  spaces, so a newline inside a sentence is almost always structure; hard-wrapped
  plain text is recognised and kept together).
- ``best_snippet`` picks the best-matching unit and returns at most
  ``max_chars`` characters around the matched words, ellipses included, with
  the exact character offsets of the quoted words in the passage.
- ``Citation`` / ``build_citation(s)`` turn ``SearchHit`` objects into the JSON
  the API and CLI show next to an answer.
"""

from __future__ import annotations

import math
import re
import unicodedata
from functools import lru_cache
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

from knowledge_store.chunking import split_sentences, trim_span
from knowledge_store.retrieval.types import SearchHit

ELLIPSIS = "…"

STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all also am an and any are as at be because been before being
    below between both but by can could did do does doing don down during each either else few for
    from further had has have having he her here hers herself him himself his how i if in into is it
    its itself just let me more most my myself no nor not of off on once only or other our ours
    ourselves out over own please s same shall she should so some such t than that the their theirs
    them themselves then there these they this those through to too under until up upon us very was
    we were what when where which while who whom whose why will with within without would you your
    yours yourself yourselves
    """.split()
)

_SPLIT = re.compile(r"[^a-z0-9_]+")
_WORD = re.compile(r"\w+")
_NONSPACE = re.compile(r"\S+")
_VOWELS = set("aeiouy")
# suffix -> minimum length of what remains; tried longest first, only one is stripped
_SUFFIXES: tuple[tuple[str, int], ...] = (
    ("ingly", 3), ("edly", 3), ("ation", 3), ("ment", 3), ("ness", 3), ("ing", 3), ("ed", 3), ("ly", 4),
)
_UNDOUBLE_AFTER = ("ing", "ed", "ingly", "edly")


@lru_cache(maxsize=65536)
def normalize(text: str) -> str:
    """Lower case with accents stripped ("Café" -> "cafe"), as the fts index does."""
    if text.isascii():
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light, Porter-flavoured suffix stripper.  Only consistency matters: the
    same function runs on the query and on the passage, so "resetting", "resets"
    and "reset" all become "reset", "codes"/"coded"/"coding" become "cod".
    Identifiers (digits, underscores) and words of 3 letters or fewer are kept."""
    if len(word) <= 3 or not word.isalpha():
        return word
    # plurals
    if word.endswith("sses"):
        word = word[:-2]
    elif word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("ss", "us", "is")):
        pass
    elif word.endswith("s"):
        word = word[:-1]
    # derivational / inflectional endings
    for suffix, min_stem in _SUFFIXES:
        if not word.endswith(suffix):
            continue
        base = word[: -len(suffix)]
        if len(base) < min_stem or not (_VOWELS & set(base)):
            continue
        if suffix == "ly" and base.endswith("pp"):  # apply, supply
            continue
        word = base
        if suffix in _UNDOUBLE_AFTER and len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz" + "aeiou":
            word = word[:-1]
        break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    if len(word) > 3 and word.endswith("i"):
        word = word[:-1] + "y"
    return word


def query_terms(query: str) -> list[str]:
    """Distinct stemmed, non-stopword terms of ``query``, in order of appearance."""
    terms: list[str] = []
    for token in _SPLIT.split(normalize(query)):
        if not token or token in STOPWORDS:
            continue
        term = stem(token)
        if term not in terms:
            terms.append(term)
    return terms


def term_spans(text: str) -> list[tuple[str, int, int]]:
    """(stemmed term, start, end) for every token of ``text``; offsets are exact
    positions in ``text`` (a word like ``hvac.min`` gives two tokens).

    Cached per text: the same passages come back for many queries."""
    return list(_term_spans(text))


@lru_cache(maxsize=8192)
def _term_spans(text: str) -> tuple[tuple[str, int, int], ...]:
    spans: list[tuple[str, int, int]] = []
    for match in _WORD.finditer(text):
        word = match.group()
        if word.isascii() and word.isalnum() and word.islower():
            spans.append((stem(word), match.start(), match.end()))  # fast path
            continue
        for token in _SPLIT.split(normalize(word)):
            if token:
                spans.append((stem(token), match.start(), match.end()))
    return tuple(spans)


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
    for start, end in split_sentences(text):
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


def best_segment(text: str, terms: Sequence[str]) -> tuple[int, float, list[tuple[int, int]]]:
    """(index of the best unit, its score, all unit spans).  The score is the summed
    within-passage weight of the distinct query terms a unit contains; ties go to
    the earlier unit, and with no match at all the first unit wins (score 0)."""
    spans = segments(text)
    if not spans:
        return -1, 0.0, spans
    if not terms:
        return 0, 0.0, spans
    sets = unit_term_sets(spans, term_spans(text))
    weights = term_weights(terms, sets)
    best, best_score = 0, 0.0
    for index, found in enumerate(sets):
        score = sum(weights[t] for t in terms if t in found)
        if score > best_score + 1e-12:
            best, best_score = index, score
    return best, best_score, spans


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
    index, _, spans = best_segment(text, terms)
    if index < 0:
        return "", 0, 0
    return snippet_around(text, spans, index, terms, max_chars)


class _Words:
    """The words (maximal non-space runs) of a text, with the unit each belongs
    to and the query terms each contains; lengths are whitespace-collapsed."""

    def __init__(self, text: str, spans: Sequence[tuple[int, int]], terms: Sequence[str]) -> None:
        self.text = text
        tokens = term_spans(text)
        term_set = set(terms)
        self.weights = term_weights(terms, unit_term_sets(spans, tokens)) if terms else {}
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.unit: list[int] = []
        self.terms: list[frozenset[str]] = []
        self.prefix = [0]
        t = u = 0
        for match in _NONSPACE.finditer(text):
            ws, we = match.span()
            found: set[str] = set()
            while t < len(tokens) and tokens[t][1] < we:
                if tokens[t][1] >= ws and tokens[t][0] in term_set:
                    found.add(tokens[t][0])
                t += 1
            while u < len(spans) - 1 and spans[u][1] <= ws:
                u += 1
            self.starts.append(ws)
            self.ends.append(we)
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
    text: str, spans: list[tuple[int, int]], index: int, terms: Sequence[str], max_chars: int
) -> tuple[str, int, int]:
    """Snippet for unit ``index`` of ``spans`` (see ``best_snippet``)."""
    words = _Words(text, spans, terms)
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


# ---------------------------------------------------------------------------
# citations

class Citation(BaseModel):
    """One numbered source shown with an answer: ``n`` is the marker ``[n]``."""

    n: int
    chunk_id: str
    doc_id: str
    version: int
    title: str
    section: str
    section_path: list[str] = Field(default_factory=list)
    pages: list[int] = Field(default_factory=list)
    page_start: int | None = None
    page_end: int | None = None
    url: str
    snippet: str
    snippet_start: int
    snippet_end: int
    score: float = 0.0
    bm25_score: float | None = None
    vector_score: float | None = None
    relevance: float = 0.0
    rerank_score: float | None = None
    last_updated: str | None = None
    doc_type: str = ""
    status: str = "active"
    ocr: bool = Field(False, description="The passage was read by OCR from a scanned page.")
    ocr_confidence: float | None = Field(
        None, description="Mean OCR word confidence (0-1) of the passage's least sure page; only set when ocr is true and known."
    )
    # seed 003's citation: {doc_id, title, rev_label, section, pages[], chunk_id, source_path} and validity
    source_path: str = Field("", description="Seed 003's name for url: where the original is, at the passage "
                             "(file:// link with #page=N or #anchor; the page URL for web sources).")
    rev_label: str | None = Field(None, description="The document's revision label (Rev C, v2.1) from its front matter, "
                                  "DOCX/PDF properties, file name or title; null when it has none.")
    valid_from: str | None = Field(None, description="When this version of the document became the valid one (ISO-8601 UTC).")
    valid_to: str | None = Field(None, description="When it stopped being valid (a newer version or revision replaced it, "
                                 "or it was deleted; ISO-8601 UTC); null while it is the valid one.")
    superseded_by: str | None = Field(None, description="doc_id of the newer revision (another file) that superseded "
                                      "this document; null when none did.")
    supersedes: list[str] = Field(default_factory=list, description="doc_ids of older revisions (other files) this "
                                  "document supersedes (relations rel_type supersedes).")
    see_also: list[str] = Field(default_factory=list, description="doc_ids of documents this document links to "
                                "(relations rel_type seeAlso).")


def citation_url(hit: SearchHit) -> str:
    """``hit.url`` as stored (``#page=N`` for PDFs, ``#anchor`` for headings);
    a link without a fragment gets ``#page=N`` when the hit has a page."""
    url = hit.url or ""
    if url and "#" not in url and hit.page_start is not None:
        return f"{url}#page={hit.page_start}"
    return url


def build_citation(hit: SearchHit, query: str, n: int, max_snippet_chars: int = 150) -> Citation:
    snippet, start, end = best_snippet(hit.text, query, max_snippet_chars)
    return Citation(
        n=n,
        chunk_id=hit.chunk_id,
        doc_id=hit.doc_id,
        version=hit.version,
        title=hit.title,
        section=hit.section,
        section_path=list(hit.section_path),
        pages=hit.pages,
        page_start=hit.page_start,
        page_end=hit.page_end,
        url=citation_url(hit),
        snippet=snippet,
        snippet_start=start,
        snippet_end=end,
        score=hit.score,
        bm25_score=hit.bm25_score,
        vector_score=hit.vector_score,
        relevance=hit.relevance,
        rerank_score=hit.rerank_score,
        last_updated=hit.last_updated,
        doc_type=hit.doc_type,
        status=hit.status,
        ocr=hit.ocr,
        ocr_confidence=hit.ocr_confidence if hit.ocr else None,
        source_path=citation_url(hit),
        rev_label=hit.rev_label,
        valid_from=hit.valid_from,
        valid_to=hit.valid_to,
        superseded_by=hit.superseded_by,
        supersedes=list(hit.supersedes),
        see_also=list(hit.see_also),
    )


def build_citations(hits: Sequence[SearchHit], query: str, max_snippet_chars: int = 150) -> list[Citation]:
    """One citation per hit, numbered 1..len(hits) in rank order."""
    return [build_citation(hit, query, n, max_snippet_chars) for n, hit in enumerate(hits, start=1)]
