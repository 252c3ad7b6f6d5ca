"""Structure-aware chunking measured in the embedding model's own word-pieces.

Why this shape:
- all-MiniLM-L6-v2 sees at most 256 word-pieces, [CLS] and [SEP] included; text
  past that is invisible to the vector.  Every chunk's *embedded* text (a short
  "title > section" header plus the passage) is measured with the model's
  tokenizer and never exceeds ``chunk_max_tokens`` (254 by default).
- Blocks are broken into units that must not be cut: sentences for prose,
  the whole block for code and tables when they fit, otherwise line groups /
  rows.  Units are packed greedily up to ``chunk_size_tokens``; only a unit
  that alone exceeds the window is cut, at a word boundary.
- A new section starts a new chunk unless the current chunk is still a tiny
  fragment (< ``chunk_min_tokens``), in which case small sections are merged.
  A trailing fragment is merged back into its predecessor when it fits.
- Consecutive chunks of one section share up to ``chunk_overlap_tokens`` of
  trailing *sentences* (never half a code block) so a fact split across the
  boundary is retrievable from either side.
- Chunk text is always an exact slice of the page text, so ``char_start`` /
  ``char_end`` point at the words a citation shows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from knowledge_store.core.text import sentence_spans, trim_span
from knowledge_store.ingest.documents import Block, ParsedDocument
from knowledge_store.models.embeddings import TokenCounter

SECTION_SEPARATOR = " > "
@dataclass(frozen=True)
class ChunkingConfig:
    size_tokens: int = 200
    max_tokens: int = 254
    overlap_tokens: int = 32
    min_tokens: int = 24
    header_max_tokens: int = 40

    @property
    def signature(self) -> str:
        """Identifies the settings a document's chunks were made with."""
        raw = f"v1|{self.size_tokens}|{self.max_tokens}|{self.overlap_tokens}|{self.min_tokens}|{self.header_max_tokens}"
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass
class Unit:
    """A piece of a block that is never cut (a sentence, a code block, a table row group)."""

    text: str
    page_number: int
    char_start: int
    char_end: int
    tokens: int
    block: Block
    prose: bool  # may be repeated as overlap
    starts_block: bool


@dataclass
class ChunkDraft:
    chunk_index: int
    text: str
    embed_text: str
    page_start: int
    page_end: int
    char_start: int
    char_end: int
    section_path: tuple[str, ...]
    anchor: str | None
    token_count: int
    block_kinds: list[str] = field(default_factory=list)

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.embed_text.encode("utf-8")).hexdigest()


def _line_groups(text: str, counter: TokenCounter, budget: int) -> list[tuple[int, int]]:
    """Spans of consecutive whole lines, each within ``budget`` word-pieces when possible."""
    lines: list[tuple[int, int]] = []
    pos = 0
    for line in text.splitlines(keepends=True):
        lines.append((pos, pos + len(line.rstrip("\n"))))
        pos += len(line)
    counts = counter.count_many([text[s:e] for s, e in lines])
    groups: list[tuple[int, int]] = []
    group_start: int | None = None
    group_end = 0
    used = 0
    for (s, e), n in zip(lines, counts):
        n += 1  # the newline joining lines
        if group_start is not None and used + n > budget:
            groups.append((group_start, group_end))
            group_start, used = None, 0
        if group_start is None:
            group_start = s
        group_end = e
        used += n
    if group_start is not None:
        groups.append((group_start, group_end))
    return [g for g in groups if text[g[0]:g[1]].strip()]


def _units_for_block(block: Block, counter: TokenCounter, unit_budget: int) -> list[Unit]:
    """Cut one block into units that each fit ``unit_budget`` word-pieces."""
    text = block.text
    if block.kind in ("code", "table"):
        whole = counter.count(text)
        spans = [(0, len(text))] if whole <= unit_budget else _line_groups(text, counter, unit_budget)
        prose = False
    elif block.kind == "heading":
        spans, prose = [(0, len(text))], False
    else:
        spans, prose = sentence_spans(text), True
    pieces: list[tuple[int, int]] = []
    counts = counter.count_many([text[s:e] for s, e in spans])
    for (s, e), n in zip(spans, counts):
        if n <= unit_budget:
            pieces.append((s, e))
        else:  # one giant sentence / line: the only case where we cut inside a unit
            pieces.extend((s + a, s + b) for a, b in counter.split_offsets(text[s:e], unit_budget))
    pieces = [trim_span(text, s, e) for s, e in pieces]
    pieces = [(s, e) for s, e in pieces if e > s]
    counts = counter.count_many([text[s:e] for s, e in pieces])
    return [
        Unit(
            text=text[s:e],
            page_number=block.page_number,
            char_start=block.char_start + s,
            char_end=block.char_start + e,
            tokens=n,
            block=block,
            prose=prose,
            starts_block=i == 0,
        )
        for i, ((s, e), n) in enumerate(zip(pieces, counts))
    ]


def _section_of(units: list[Unit]) -> tuple[str, ...]:
    for unit in units:
        if unit.block.kind != "heading":
            return unit.block.section_path
    return units[0].block.section_path


def build_header(title: str, section_path: tuple[str, ...], counter: TokenCounter, max_tokens: int) -> str:
    """The context line embedded with every chunk: it tells the model what the passage is about."""
    parts = [title.strip()] if title and title.strip() else []
    section = SECTION_SEPARATOR.join(s for s in section_path if s and s != title)
    if section:
        parts.append(section)
    header = "\n".join(parts)
    return counter.truncate(header, max_tokens) if header else ""


def chunk_document(doc: ParsedDocument, counter: TokenCounter, config: ChunkingConfig) -> list[ChunkDraft]:
    """Chunk a parsed document; see the module docstring for the rules."""
    pages = {p.page_number: p.text for p in doc.pages}
    unit_budget = config.max_tokens - config.header_max_tokens - 2
    units: list[Unit] = []
    for block in doc.blocks:
        units.extend(_units_for_block(block, counter, unit_budget))
    if not units:
        return []

    groups: list[list[Unit]] = []
    current: list[Unit] = []
    used = 0

    def content_tokens(group: list[Unit]) -> int:
        return sum(u.tokens for u in group if u.block.kind != "heading")

    def flush(with_overlap: bool) -> None:
        nonlocal current, used
        if not current:
            return
        # do not end a chunk on headings: carry them over to open the next one
        carried: list[Unit] = []
        while current and current[-1].block.kind == "heading" and len(current) > 1:
            carried.insert(0, current.pop())
        groups.append(current)
        overlap: list[Unit] = []
        if with_overlap and not carried:
            budget = config.overlap_tokens
            for unit in reversed(current):
                if not unit.prose or unit.tokens > budget or unit is current[0]:
                    break
                overlap.insert(0, unit)
                budget -= unit.tokens
        current = overlap + carried
        used = sum(u.tokens for u in current) + len(current)

    for unit in units:
        new_section = unit.block.kind == "heading" and unit.starts_block
        if new_section and current and content_tokens(current) >= config.min_tokens:
            flush(with_overlap=False)
        cost = unit.tokens + 1
        if current and used + cost > config.size_tokens:
            small = content_tokens(current) < config.min_tokens
            if not (small and used + cost <= unit_budget):
                flush(with_overlap=True)
                if current and used + cost > unit_budget:  # overlap would not leave room
                    current = [u for u in current if u.block.kind == "heading"]
                    used = sum(u.tokens for u in current) + len(current)
        current.append(unit)
        used += cost
    if current:
        # a trailing fragment joins its predecessor when it fits
        if groups and content_tokens(current) < config.min_tokens:
            tail = [u for u in current if u not in groups[-1]]
            merged = groups[-1] + tail
            if sum(u.tokens for u in merged) + len(merged) <= unit_budget:
                groups[-1] = merged
                current = []
        if current:
            groups.append(current)

    drafts: list[ChunkDraft] = []
    for group in groups:
        draft = _assemble(group, doc.title, pages, counter, config)
        # the estimate above adds tokens; joins can differ by a few: verify exactly
        while draft.token_count > config.max_tokens and len(group) > 1:
            group = group[:-1]
            draft = _assemble(group, doc.title, pages, counter, config)
        drafts.append(draft)
    for index, draft in enumerate(drafts):
        draft.chunk_index = index
    return drafts


def _assemble(group: list[Unit], title: str, pages: dict[int, str], counter: TokenCounter, config: ChunkingConfig) -> ChunkDraft:
    first = group[0]
    pieces: list[str] = []
    page_numbers = sorted({u.page_number for u in group})
    for page_number in page_numbers:
        on_page = [u for u in group if u.page_number == page_number]
        start = min(u.char_start for u in on_page)
        end = max(u.char_end for u in on_page)
        pieces.append(pages[page_number][start:end])
    text = "\n\n".join(pieces)
    section_path = _section_of(group)
    header = build_header(title, section_path, counter, config.header_max_tokens)
    embed_text = f"{header}\n\n{text}" if header else text
    kinds: list[str] = []
    for unit in group:
        if unit.block.kind not in kinds:
            kinds.append(unit.block.kind)
    anchor = next((u.block.anchor for u in group if u.block.kind != "heading" and u.block.anchor), first.block.anchor)
    return ChunkDraft(
        chunk_index=0,
        text=text,
        embed_text=embed_text,
        page_start=page_numbers[0],
        page_end=page_numbers[-1],
        char_start=min(u.char_start for u in group if u.page_number == page_numbers[0]),
        char_end=max(u.char_end for u in group if u.page_number == page_numbers[-1]),
        section_path=section_path,
        anchor=anchor,
        token_count=counter.count(embed_text),
        block_kinds=kinds,
    )
