"""Markdown: a line-based block scanner, not a renderer.

We only need block boundaries and headings, so a small scanner that knows
CommonMark/GFM's block rules (front matter, ATX and setext headings, fenced
and indented code, pipe tables, lists, block quotes, paragraphs) is enough and
keeps the raw Markdown in the page text, which is what a citation should show.
Fenced code is always one block: splitting it would make chunks that do not
compile and would turn ``# comment`` lines into fake headings.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field

import yaml

from knowledge_store.ingest.documents import BlockKind, PageBuilder, ParsedDocument
from knowledge_store.ingest.parsers.links import markdown_links
from knowledge_store.ingest.parsers.text import plain_inline, read_source

_ATX = re.compile(r"^ {0,3}(#{1,6})(?=[ \t]|$)(.*)$")
_ATX_CLOSING = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")
_THEMATIC = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_LIST_ITEM = re.compile(r"^([ \t]*)([-+*]|\d{1,9}[.)])([ \t]+|$)")
_QUOTE = re.compile(r"^ {0,3}>")
_TABLE_DELIMITER = re.compile(r"^[ \t]*\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_INDENTED_CODE = re.compile(r"^(?: {4}|\t)")
# CommonMark: only bullets and lists starting at 1 may interrupt a paragraph.
_INTERRUPTING_MARKERS = ("-", "+", "*", "1.", "1)")

_SLUG_DROP = re.compile(r"[^\w\- ]", re.UNICODE)


def github_slug(text: str, seen: dict[str, int]) -> str | None:
    """GitHub's heading anchor: lowercase, punctuation dropped, spaces to hyphens.

    ``seen`` counts slugs already issued in this document so repeats become
    ``slug-1``, ``slug-2`` exactly like GitHub's renderer does.
    """
    base = _SLUG_DROP.sub("", text.strip().lower()).replace(" ", "-")
    slug = base
    while slug in seen:
        seen[base] += 1
        slug = f"{base}-{seen[base]}"
    seen.setdefault(slug, 0)
    return slug or None


def _json_safe(value: object) -> object:
    """YAML dates and odd keys would break JSON metadata columns downstream."""
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_safe(item) for item in value]
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def split_front_matter(text: str) -> tuple[str, dict[str, object]]:
    """Strip a leading ``---`` YAML block; return the body and its metadata.

    Bad YAML does not stop ingestion: the block is dropped from the body and
    the problem is recorded as ``front_matter_error`` so it can be fixed.
    """
    lines = text.split("\n")
    if not lines or lines[0].rstrip() != "---":
        return text, {}
    for end in range(1, len(lines)):
        if lines[end].rstrip() in ("---", "..."):
            break
    else:
        return text, {}  # no closing fence: it was a thematic break, not front matter
    body = "\n".join(lines[end + 1 :])
    raw = "\n".join(lines[1:end])
    try:
        loaded = yaml.safe_load(raw) if raw.strip() else {}
    except yaml.YAMLError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return body, {"front_matter_error": f"the YAML front matter could not be parsed: {first_line}"}
    if loaded is None:
        return body, {}
    if not isinstance(loaded, dict):
        return body, {"front_matter_error": "the YAML front matter is not a mapping of keys to values"}
    return body, _json_safe(loaded)  # type: ignore[return-value]


@dataclass
class _Scanner:
    """Walks the lines once, emitting blocks into a PageBuilder."""

    lines: list[str]
    builder: PageBuilder = field(default_factory=lambda: PageBuilder(1))
    stack: list[tuple[int, str]] = field(default_factory=list)
    anchor: str | None = None
    first_h1: str | None = None
    slugs: dict[str, int] = field(default_factory=dict)
    paragraph: list[str] = field(default_factory=list)
    i: int = 0

    def path(self) -> tuple[str, ...]:
        return tuple(title for _, title in self.stack)

    def emit(self, kind: BlockKind, lines: list[str]) -> None:
        self.builder.add(kind, "\n".join(lines).rstrip(), section_path=self.path(), anchor=self.anchor)

    def flush_paragraph(self) -> None:
        if self.paragraph:
            self.emit("paragraph", self.paragraph)
            self.paragraph = []

    def heading(self, level: int, title_source: str, raw: list[str]) -> None:
        self.flush_paragraph()
        title = plain_inline(title_source)
        if not title:
            self.emit("paragraph", raw)
            return
        while self.stack and self.stack[-1][0] >= level:
            self.stack.pop()
        self.stack.append((level, title))
        self.anchor = github_slug(title, self.slugs)
        if level == 1 and self.first_h1 is None:
            self.first_h1 = title
        self.builder.add(
            "heading", "\n".join(raw).rstrip(), section_path=self.path(), anchor=self.anchor, heading_level=level
        )

    # --- block scanners; each consumes lines starting at self.i -------------

    def fence(self, match: re.Match[str]) -> None:
        marker = match.group(1)
        block = [self.lines[self.i]]
        self.i += 1
        closing = re.compile(r"^[ \t]*" + re.escape(marker[0]) + "{" + str(len(marker)) + r",}[ \t]*$")
        while self.i < len(self.lines):
            line = self.lines[self.i]
            block.append(line)
            self.i += 1
            if closing.match(line):
                break
        self.emit("code", block)

    def indented_code(self) -> None:
        block: list[str] = []
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if _INDENTED_CODE.match(line) or (not line.strip() and block):
                block.append(line)
                self.i += 1
            else:
                break
        self.emit("code", block)

    def table(self) -> None:
        header = self.paragraph.pop()
        self.flush_paragraph()
        block = [header, self.lines[self.i]]
        self.i += 1
        while self.i < len(self.lines) and self.lines[self.i].strip() and "|" in self.lines[self.i]:
            block.append(self.lines[self.i])
            self.i += 1
        self.emit("table", block)

    def quote(self) -> None:
        block: list[str] = []
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if not line.strip():
                break
            if block and not _QUOTE.match(line) and self._starts_block(line):
                break
            block.append(line)
            self.i += 1
        self.emit("quote", block)

    def list_item(self) -> None:
        first = self.lines[self.i]
        indent = len(first) - len(first.lstrip())
        block = [first]
        self.i += 1
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if not line.strip():
                # A blank line continues the item only if the next line is indented into it.
                nxt = self._next_nonblank(self.i)
                if nxt is None:
                    break
                follow = self.lines[nxt]
                follow_indent = len(follow) - len(follow.lstrip())
                if follow_indent <= indent or _LIST_ITEM.match(follow) or _FENCE.match(follow):
                    break
                block.extend(self.lines[self.i : nxt])
                self.i = nxt
                continue
            if _LIST_ITEM.match(line) or _FENCE.match(line) or self._starts_block(line):
                break
            block.append(line)
            self.i += 1
        self.emit("list_item", block)

    def _next_nonblank(self, start: int) -> int | None:
        for index in range(start, len(self.lines)):
            if self.lines[index].strip():
                return index
        return None

    def _starts_block(self, line: str) -> bool:
        """Lines that interrupt a paragraph or a lazy continuation."""
        return bool(_ATX.match(line) or _FENCE.match(line) or _QUOTE.match(line) or _THEMATIC.match(line))

    def run(self) -> None:
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if not line.strip():
                self.flush_paragraph()
                self.i += 1
                continue
            fence = _FENCE.match(line)
            if fence and not (fence.group(1)[0] == "`" and "`" in fence.group(2)):
                self.flush_paragraph()
                self.fence(fence)
                continue
            if self.paragraph:
                setext = _SETEXT.match(line)
                if setext:
                    level = 1 if setext.group(1)[0] == "=" else 2
                    raw = self.paragraph + [line]
                    source = " ".join(part.strip() for part in self.paragraph)
                    self.paragraph = []
                    self.heading(level, source, raw)
                    self.i += 1
                    continue
                header = self.paragraph[-1]
                if _TABLE_DELIMITER.match(line) and "|" in header and ("|" in line or header.lstrip().startswith("|")):
                    self.table()
                    continue
            atx = _ATX.match(line)
            if atx:
                content = _ATX_CLOSING.sub("", atx.group(2).strip())
                self.heading(len(atx.group(1)), content, [line])
                self.i += 1
                continue
            if _THEMATIC.match(line):
                self.flush_paragraph()
                self.i += 1
                continue
            if _QUOTE.match(line):
                self.flush_paragraph()
                self.quote()
                continue
            item = _LIST_ITEM.match(line)
            if item and (not self.paragraph or item.group(2) in _INTERRUPTING_MARKERS) and line[item.end() :].strip():
                self.flush_paragraph()
                self.list_item()
                continue
            if not self.paragraph and _INDENTED_CODE.match(line):
                self.indented_code()
                continue
            self.paragraph.append(line)
            self.i += 1
        self.flush_paragraph()


def parse_markdown(path_or_text: str | os.PathLike[str]) -> ParsedDocument:
    """Parse a Markdown file (``Path``) or Markdown source (``str``)."""
    text, metadata, stem = read_source(path_or_text)
    body, front = split_front_matter(text)
    scanner = _Scanner(body.split("\n"))
    scanner.run()
    front_title = front.get("title")
    title = front_title.strip() if isinstance(front_title, str) and front_title.strip() else None
    page = scanner.builder.page()
    return ParsedDocument(
        title=title or scanner.first_h1 or stem,
        doc_type="markdown",
        pages=[page],
        blocks=scanner.builder.blocks,
        paginated=False,
        metadata={**metadata, **front},
        links=markdown_links(page.text, scanner.builder.blocks),
    )
