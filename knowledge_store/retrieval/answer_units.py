"""The units an extractive answer may quote, and the ones it never quotes.

A retrieved passage is prose, list items, table rows, code and the headings between them, stored as its format
gave it: Markdown keeps ``**x**``, backticks, links and pipe tables, and its prose is hard-wrapped; HTML and Word
tables are rows of cells joined by `` | ``; every format puts headings and label lines between blank lines.  An
answer made of whatever matches the query's words quotes a heading, a table's header row, a line that only
introduces the list below it, or half a sentence.  ``answer_units`` cuts a passage into units and says what each
one is:

- quoted: ``sentence`` (a complete sentence of prose: it ends with ``.``, ``!`` or ``?``), ``item`` (a list item
  with its continuation lines; a numbered item keeps its number, so a step stays a step) and ``row`` (a table
  row, its cells paired with the header's names: "E47 — Meaning: No contact ...; What to do: ...");
- never quoted: ``heading`` (a heading, the passage's title or section name, or a short line without a sentence
  end between blank lines: "Wiring notes"), ``header`` (a table's header row), ``rule`` (a Markdown table's
  delimiter row), ``intro`` (a line that introduces what follows: it ends with ``:``, or it is the only sentence
  of a paragraph right before a table), ``fragment`` (a piece of a sentence: no sentence end, fewer than
  ``MIN_WORDS`` words, or the passage starts inside it) and ``code`` (a fenced block, kept whole).

Each unit keeps its span in the passage (what an answer sentence's offsets point at) and its ``text`` as it is
quoted: markup removed (``core.text.plain_inline``), whitespace collapsed.  ``block`` numbers the paragraph, list
or table a unit belongs to: the items of one list share it even when blank lines separate them (as HTML, Word
and PDF lists come out), so an answer can tell the unit that continues another.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from knowledge_store.core.text import plain_inline, sentence_spans, trim_span

UnitKind = Literal["sentence", "item", "row", "heading", "header", "rule", "intro", "fragment", "code"]
QUOTED_KINDS: frozenset[str] = frozenset({"sentence", "item", "row"})
MIN_WORDS = 3  # "Yes.", "See below." are fragments, not answers
LABEL_MAX_WORDS = 12  # a line of at most this many words without a sentence end, alone between blank lines: a heading

_FENCE = re.compile(r"^\s*(?:```|~~~)")
_ATX_HEADING = re.compile(r"^\s{0,3}#{1,6}(?:\s|$)")
_BULLET = re.compile(r"^\s*(?:[-*+\u2022\u25aa\u25e6\u2023\u25cf\u2013]|(\d{1,3}|[A-Za-z])[.)])\s+")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(?:\|\s*:?-{2,}:?\s*)*\|?\s*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_SENTENCE_END = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*$")
_EMPTY_CELLS = frozenset({"", "-", "\u2013", "\u2014", "n/a"})
_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class AnswerUnit:
    """One unit of a passage: its span in the passage, what it is, how it is quoted and its block."""

    start: int
    end: int
    kind: UnitKind
    text: str
    block: int

    @property
    def quoted(self) -> bool:
        return self.kind in QUOTED_KINDS


_COUNTED_WORD = re.compile(r"\S*[^\W_]\S*")


def word_count(text: str) -> int:
    """Whitespace-separated tokens holding a letter or a digit ("E42", "3.4", "don't"; not "|" or "--")."""
    return len(_COUNTED_WORD.findall(text))


def _is_table_line(line: str) -> bool:
    stripped = line.strip()
    return stripped.startswith("|") or (" | " in stripped and not _BULLET.match(line))


def table_cells(line: str) -> list[str]:
    """A table row's cells, markup removed: ``| a | b |`` (Markdown) or ``a | b`` (HTML, Word)."""
    stripped = line.strip()
    if stripped.startswith("|"):
        stripped = stripped[1:]
    if stripped.endswith("|") and not stripped.endswith("\\|"):
        stripped = stripped[:-1]
    return [plain_inline(cell.replace("\\|", "|")) for cell in _CELL_SPLIT.split(stripped)]


def _looks_like_header(cells: list[str]) -> bool:
    """A first row seen without what came before it (the passage opens with the table): labels, not data."""
    return len(cells) >= 2 and all(cell and word_count(cell) <= 4 and not _DIGIT.search(cell) for cell in cells)


def render_row(cells: list[str], header: list[str] | None) -> str:
    """A row as a reader would say it: ``first — Name: value; Name: value`` with the header's names (two
    columns: ``first: value``), empty cells left out; without a header, the cells joined by `` — ``."""
    if header and len(header) == len(cells):
        rest = [(name, cell) for name, cell in zip(header[1:], cells[1:]) if cell.casefold() not in _EMPTY_CELLS]
        if not rest:
            return cells[0]
        if len(cells) == 2:
            return f"{cells[0]}: {cells[1]}"
        return f"{cells[0]} \u2014 " + "; ".join(f"{name}: {cell}" if name else cell for name, cell in rest)
    return " \u2014 ".join(cell for cell in cells if cell.casefold() not in _EMPTY_CELLS)


@lru_cache(maxsize=16384)
def heading_key(text: str) -> str:
    """How a heading is compared: markup and a Markdown heading's ``#`` marks removed, case-folded, no end stop."""
    return plain_inline(re.sub(r"^\s*#{1,6}\s+", "", text)).casefold().rstrip(":.").strip()


@dataclass
class _Block:
    kind: Literal["prose", "item", "table", "code", "heading"]
    lines: list[tuple[int, int]]


def _blocks(text: str) -> list[_Block]:
    """The passage's lines grouped: paragraphs (until a blank line or a line of another kind), list items with
    their continuation lines, runs of table rows, fenced code, heading lines."""
    blocks: list[_Block] = []
    current: _Block | None = None
    fenced = False
    position = 0
    for raw in text.split("\n"):
        span = (position, position + len(raw))
        position += len(raw) + 1
        if fenced:
            current.lines.append(span)  # type: ignore[union-attr]
            if _FENCE.match(raw):
                fenced, current = False, None
            continue
        if not raw.strip():
            current = None
            continue
        if _FENCE.match(raw):
            current = _Block("code", [span])
            blocks.append(current)
            fenced = True
            continue
        if _ATX_HEADING.match(raw):
            blocks.append(_Block("heading", [span]))
            current = None
            continue
        if _is_table_line(raw) or _TABLE_RULE.match(raw) and current is not None and current.kind == "table":
            if current is None or current.kind != "table":
                current = _Block("table", [])
                blocks.append(current)
            current.lines.append(span)
            continue
        if _BULLET.match(raw):
            current = _Block("item", [span])
            blocks.append(current)
            continue
        if current is not None and current.kind in ("prose", "item"):
            current.lines.append(span)  # a wrapped line, or an item's continuation
            continue
        current = _Block("prose", [span])
        blocks.append(current)
    return blocks


def _ends_sentence(text: str) -> bool:
    return bool(_SENTENCE_END.search(text))


def answer_units(text: str, headings: Iterable[str] = ()) -> list[AnswerUnit]:
    """``text`` (a passage) as answer units in order (see the module docstring); ``headings`` are names that are
    headings wherever they stand (the passage's title and section path).  Cached per passage: the same passages
    come back for many queries."""
    return list(_answer_units(text, tuple(name for name in headings if name)))


@lru_cache(maxsize=4096)
def _answer_units(text: str, headings: tuple[str, ...]) -> tuple[AnswerUnit, ...]:
    heading_keys = {heading_key(name) for name in headings}
    first_word = len(text) - len(text.lstrip())
    blocks = _blocks(text)
    units: list[AnswerUnit] = []
    group = 0
    for index, block in enumerate(blocks):
        previous = blocks[index - 1] if index else None
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        if not (block.kind == "item" and previous is not None and previous.kind == "item"):
            group += 1  # the items of one list share a group, blank lines between them or not
        start, end = trim_span(text, block.lines[0][0], block.lines[-1][1])
        if block.kind in ("code", "heading"):
            units.append(AnswerUnit(start, end, block.kind, plain_inline(text[start:end]), group))
        elif block.kind == "table":
            units.extend(_table_units(text, block, group, opens_passage=start <= first_word))
        elif block.kind == "item":
            body = plain_inline(text[start:end])
            number = _BULLET.match(text[start:end])
            shown = body if number is None or number.group(1) else plain_inline(_BULLET.sub("", text[start:end], 1))
            kind: UnitKind = "item"
            if shown.endswith(":") and following is not None and following.kind in ("item", "table", "code"):
                kind = "intro"
            elif word_count(shown) < 2:
                kind = "fragment"
            units.append(AnswerUnit(start, end, kind, shown, group))
        else:
            units.extend(_prose_units(text, start, end, group, heading_keys, at_start=start <= first_word,
                                      before_table=following is not None and following.kind == "table"))
    return tuple(units)


def _table_units(text: str, block: _Block, group: int, opens_passage: bool) -> list[AnswerUnit]:
    rows = [(s, e) for s, e in (trim_span(text, s, e) for s, e in block.lines) if e > s]
    header: list[str] | None = None
    header_row = -1
    if len(rows) >= 2 and _TABLE_RULE.match(text[rows[1][0]:rows[1][1]]):
        header_row = 0
    elif len(rows) >= 2:
        first = table_cells(text[rows[0][0]:rows[0][1]])
        if not opens_passage or _looks_like_header(first):
            header_row = 0  # a table that starts inside the passage starts with its header row
    if header_row == 0:
        header = table_cells(text[rows[0][0]:rows[0][1]])
    units = []
    for i, (s, e) in enumerate(rows):
        line = text[s:e]
        if _TABLE_RULE.match(line):
            units.append(AnswerUnit(s, e, "rule", "", group))
        elif i == header_row:
            units.append(AnswerUnit(s, e, "header", " | ".join(header or []), group))
        else:
            cells = table_cells(line)
            filled = [cell for cell in cells if cell.casefold() not in _EMPTY_CELLS]
            kind: UnitKind = "row" if len(filled) >= 2 else "fragment"
            units.append(AnswerUnit(s, e, kind, render_row(cells, header), group))
    return units


def _prose_units(text: str, start: int, end: int, group: int, heading_keys: set[str], at_start: bool,
                 before_table: bool) -> list[AnswerUnit]:
    paragraph = text[start:end]
    spans = [(start + s, start + e) for s, e in sentence_spans(paragraph)]
    units = []
    for n, (s, e) in enumerate(spans):
        shown = plain_inline(text[s:e])
        kind: UnitKind = "sentence"
        if not shown:
            kind = "fragment"
        elif heading_key(shown) in heading_keys:
            kind = "heading"
        elif len(spans) == 1 and "\n" not in paragraph and not _ends_sentence(shown) \
                and not shown.endswith(":") and word_count(shown) <= LABEL_MAX_WORDS:
            kind = "heading"  # a short line alone between blank lines: a heading or a label
        elif shown.endswith(":"):
            kind = "intro"
        elif not _ends_sentence(shown) or word_count(shown) < MIN_WORDS:
            kind = "fragment"
        elif n == 0 and at_start and shown[:1].islower():
            kind = "fragment"  # the passage starts inside a sentence
        elif len(spans) == 1 and before_table:
            kind = "intro"  # the one sentence before a table introduces it
        units.append(AnswerUnit(s, e, kind, shown, group))
    return units
