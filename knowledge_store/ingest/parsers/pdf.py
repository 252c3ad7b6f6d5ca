"""PDF: one Page per PDF page, blocks in a reading order a person would use.

PyMuPDF gives positioned lines grouped into blocks.  On top of that we:

* drop running headers/footers and bare page numbers, which would otherwise
  repeat in every chunk and pollute retrieval;
* order blocks column-aware, so a two-column page reads left column then
  right column instead of zig-zagging across the gutter;
* derive the section path from the PDF outline (bookmarks) when there is one,
  using each bookmark's target position so a heading in mid-page applies from
  there on, and from font sizes when there is none;
* keep monospace listings as single "code" blocks with their line breaks.

Pages without any text but with images (scans) have ``has_text_layer=False``.
They are OCR'd (``knowledge_store.ingest.parsers.ocr``: Tesseract through PyMuPDF) and
the OCR text page goes through the same extraction as a digital page, with the
font styles ignored (OCR text has none); ``Page.ocr`` marks them.  Pages with a
text layer are never OCR'd.  When OCR is unavailable or finds nothing, the page
is kept with empty text so the failure row (and the user) can see what was skipped.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pymupdf

from knowledge_store.core.errors import CorruptFileError, NoTextError, PasswordProtectedError
from knowledge_store.ingest.documents import Block, BlockKind, Page, PageBuilder, ParsedDocument
from knowledge_store.ingest.parsers.ocr import DocumentOcr, OcrOptions, missing_text_reason

# Ligatures are expanded ("ﬁ" -> "fi") so words match what people type.
_TEXT_FLAGS = pymupdf.TEXT_PRESERVE_WHITESPACE | pymupdf.TEXT_MEDIABOX_CLIP | pymupdf.TEXT_CID_FOR_UNKNOWN_UNICODE
_SPAN_BOLD = 16
_SPAN_MONO = 8
# Many embedded monospace fonts do not set the PDF "fixed pitch" flag, so names count too.
_MONO_FONT = re.compile(
    r"mono|nimbusmon|courier|consol|cmtt|sftt|typewriter|menlo|inconsolata|fixed|code|cousine|andale|letter ?gothic",
    re.IGNORECASE,
)
_BOLD_FONT = re.compile(r"bold|black|heavy|semibold|demi|cmbx", re.IGNORECASE)
_SPACES = re.compile(r"[ \t\u00a0]+")
_BULLET = re.compile(r"^\s*[•◦▪▫‣⁃●○■□►▸–∙·*-]\s+\S")
_NUMBERED = re.compile(r"^\s*(\d{1,3}|[a-z]|[ivx]{1,4})[.)]\s+\S")
_ROMAN = re.compile(r"^m{0,3}(cm|cd|d?c{0,3})(xc|xl|l?x{0,3})(ix|iv|v?i{0,3})$", re.IGNORECASE)
_PAGE_NUMBER = re.compile(
    r"^[\s\-–—|]*(page\s+)?(\d{1,4}|[ivxlcdm]{1,7})(\s*(/|of)\s*\d{1,4})?[\s\-–—|]*$", re.IGNORECASE
)
_LABEL = re.compile(
    r"^((chapter|appendix|part|section|lecture|unit|kapitel|chapitre)\s+)?"
    r"(\d+|[ivxlc]+|[a-z])([.-]\d+)*\.?$",
    re.IGNORECASE,
)
_NORM = re.compile(r"[\W_]+", re.UNICODE)
_DIGITS = re.compile(r"\d+")
# Metadata titles that are really file names or tool defaults.
_MEANINGLESS_TITLE = re.compile(
    r"^(untitled\b.*|microsoft word\b.*|document\d*|title|unknown|none|slide \d+)$|\.(pdf|docx?|tex|dvi|ps|indd|qxd|odt)$",
    re.IGNORECASE,
)

TOP_ZONE = 0.15  # share of page height where a running header may sit
BOTTOM_ZONE = 0.85
RUNNING_MIN_PAGES = 3
RUNNING_MIN_SHARE = 0.3
HEADING_SIZE_RATIO = 1.15
BOLD_HEADING_SIZE_RATIO = 1.05
HEADING_MAX_CHARS = 120
CODE_MONO_SHARE = 0.8
CODE_MIXED_SHARE = 0.4


@dataclass(slots=True)
class _Line:
    text: str
    x0: float
    y0: float
    x1: float
    y1: float
    size: float
    bold: bool
    mono: bool  # mostly monospace
    char_width: float
    chars: int = 0  # non-space characters
    mono_chars: int = 0
    starts_mono: bool = False


@dataclass(slots=True)
class _Item:
    """A proto-block: lines of one kind in reading order, not yet on a page."""

    kind: BlockKind
    lines: list[_Line]
    column: str = "full"
    heading_level: int | None = None
    title: str | None = None  # section name when this item is a heading
    _text: str | None = None

    def extend(self, lines: list[_Line]) -> None:
        self.lines.extend(lines)
        self._text = None

    @property
    def x0(self) -> float:
        return min(line.x0 for line in self.lines)

    @property
    def y0(self) -> float:
        return min(line.y0 for line in self.lines)

    @property
    def y1(self) -> float:
        return max(line.y1 for line in self.lines)

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = item_text(self)
        return self._text


@dataclass
class _RawPage:
    number: int  # 1-based
    width: float
    height: float
    blocks: list[list[_Line]]
    has_visuals: bool = False
    unreadable: bool = False
    items: list[_Item] = field(default_factory=list)
    ocr: bool = False  # the lines come from OCR
    ocr_confidence: float | None = None
    ocr_lines: int | None = None
    low_regions: tuple = ()  # OcrRegion lines under the low-confidence threshold

    @property
    def needs_ocr(self) -> bool:
        """No text layer but something drawn on it: a scan (the existing detection)."""
        return not self.blocks and self.has_visuals and not self.unreadable


# --------------------------------------------------------------------------- extraction


@lru_cache(maxsize=4096)
def _font_style(font: str) -> tuple[bool, bool]:
    """(bold, monospace) judged from the font name; cached because a document
    uses a handful of fonts across tens of thousands of spans."""
    return bool(_BOLD_FONT.search(font)), bool(_MONO_FONT.search(font))


def _line_from_spans(raw_line: dict, styled: bool = True) -> _Line | None:
    """Collapse a line's spans into one record: text plus char-weighted style.

    Hot path (a page of TeX output has ~1,000 spans: MuPDF makes every
    synthesised inter-word space its own span), so space-only spans are
    skipped before any other work.  ``styled=False`` (OCR text) ignores font
    names and flags: MuPDF's OCR layer sets every span in a "GlyphLessFont"
    flagged monospace, which would turn every scanned paragraph into code.
    """
    spans = raw_line["spans"]
    text = "".join([span["text"] for span in spans])
    if not text.strip():
        return None
    weights = size_sum = bold_chars = mono_chars = 0
    mono_width = mono_len = 0.0
    starts_mono: bool | None = None
    for span in spans:
        span_text = span["text"]
        if span_text == " ":
            continue
        n = len(span_text) - span_text.count(" ")
        if n <= 0:
            continue
        weights += n
        size_sum += span["size"] * n
        flags = span["flags"] if styled else 0
        bold_name, mono_name = _font_style(span["font"]) if styled else (False, False)
        if flags & _SPAN_BOLD or bold_name:
            bold_chars += n
        is_mono = flags & _SPAN_MONO or mono_name
        if starts_mono is None:
            starts_mono = bool(is_mono)
        if is_mono:
            mono_chars += n
            bbox = span["bbox"]
            mono_width += bbox[2] - bbox[0]
            mono_len += len(span_text)
    if not weights:
        return None
    x0, y0, x1, y1 = raw_line["bbox"]
    return _Line(
        text=text,
        x0=x0,
        y0=y0,
        x1=x1,
        y1=y1,
        size=size_sum / weights,
        bold=bold_chars * 2 > weights,
        mono=mono_chars >= weights * CODE_MONO_SHARE,
        char_width=mono_width / mono_len if mono_len else 0.0,
        chars=weights,
        mono_chars=mono_chars,
        starts_mono=bool(starts_mono),
    )


def _text_blocks(page: pymupdf.Page, textpage: pymupdf.TextPage | None = None) -> list[list[_Line]]:
    """Lines grouped as PyMuPDF's blocks, from the page's own text or from an OCR text page."""
    styled = textpage is None
    blocks: list[list[_Line]] = []
    for raw_block in page.get_text("dict", flags=_TEXT_FLAGS, textpage=textpage)["blocks"]:
        if raw_block.get("type") != 0:
            continue
        lines = [line for line in (_line_from_spans(raw, styled) for raw in raw_block["lines"]) if line is not None]
        if lines:
            blocks.append(lines)
    return blocks


def extract_page(page: pymupdf.Page, number: int) -> _RawPage:
    """Lines grouped as PyMuPDF's blocks; images/drawings only checked on empty pages."""
    rect = page.rect
    blocks = _text_blocks(page)
    raw = _RawPage(number=number, width=rect.width, height=rect.height, blocks=blocks)
    if not blocks:
        raw.has_visuals = bool(page.get_image_info()) or bool(page.get_cdrawings())
    return raw


def ocr_into(page: pymupdf.Page, raw: _RawPage, ocr: DocumentOcr) -> None:
    """Fill a scanned page's lines from OCR, so everything downstream treats it like a digital page.

    Only called for pages that need it (``_RawPage.needs_ocr``); raises
    ``OcrTimeoutError`` when the document's OCR budget is spent.
    """
    result = ocr.ocr_page(page, _TEXT_FLAGS)
    if result is None:
        return
    blocks = _text_blocks(page, result.textpage)
    if blocks:
        raw.blocks = blocks
        raw.ocr = True
        raw.ocr_confidence = result.confidence
        raw.ocr_lines = result.lines
        raw.low_regions = result.low_regions
        ocr.record(raw.number, result)


# --------------------------------------------------------------------------- running headers


def _key(text: str) -> str:
    return _DIGITS.sub("#", _SPACES.sub(" ", text.strip().lower()))


def is_page_number(text: str) -> bool:
    text = text.strip()
    match = _PAGE_NUMBER.match(text)
    if not match:
        return False
    token = match.group(2)
    return token.isdigit() or bool(_ROMAN.match(token))


def _margin_rows(page: _RawPage) -> list[tuple[str, float, _Line]]:
    """The outermost line row at the top and at the bottom, if inside the margins."""
    lines = [line for block in page.blocks for line in block]
    if not lines:
        return []
    rows: list[tuple[str, float, _Line]] = []
    top = min(line.y0 for line in lines)
    if top < page.height * TOP_ZONE:
        rows += [("top", line.y0, line) for line in lines if line.y0 <= top + 3]
    bottom = max(line.y1 for line in lines)
    if bottom > page.height * BOTTOM_ZONE:
        rows += [("bottom", line.y1, line) for line in lines if line.y1 >= bottom - 3 and line.y0 > top + 3]
    return rows


def _isolated(line: _Line, page: _RawPage) -> bool:
    """True when no other line sits within one line-height above or below."""
    gap = max(line.y1 - line.y0, 6.0)
    for block in page.blocks:
        for other in block:
            if other is line or (other.y0 < line.y1 and other.y1 > line.y0):
                continue
            if other.y0 - line.y1 < gap and line.y0 - other.y1 < gap:
                return False
    return True


def running_lines(pages: list[_RawPage]) -> set[int]:
    """ids of lines that are running headers/footers or bare page numbers.

    A margin *band* (same zone, same height on the page) that appears on many
    pages and carries few distinct texts (digits ignored) is page furniture:
    its repeated texts are dropped.  Body text that merely starts at the same
    height on every page has many distinct texts, so it survives.
    """
    rows_by_zone: dict[str, list[tuple[float, int, _Line]]] = defaultdict(list)
    drop: set[int] = set()
    for index, page in enumerate(pages):
        for zone, y, line in _margin_rows(page):
            rows_by_zone[zone].append((y, index, line))
            if is_page_number(line.text) and _isolated(line, page):
                drop.add(id(line))
    text_pages = sum(1 for page in pages if page.blocks)
    needed = max(RUNNING_MIN_PAGES, RUNNING_MIN_SHARE * text_pages)
    for entries in rows_by_zone.values():
        entries.sort(key=lambda entry: entry[0])
        band: list[tuple[float, int, _Line]] = []
        for entry in entries:
            if band and entry[0] - band[-1][0] > 3:
                _drop_band(band, needed, drop)
                band = []
            band.append(entry)
        if band:
            _drop_band(band, needed, drop)
    return drop


def _drop_band(band: list[tuple[float, int, _Line]], needed: float, drop: set[int]) -> None:
    if len({index for _, index, _ in band}) < needed:
        return
    keys = Counter(_key(line.text) for _, _, line in band)
    if len(keys) > 0.5 * len(band):
        return
    for _, _, line in band:
        if keys[_key(line.text)] >= 2 or is_page_number(line.text):
            drop.add(id(line))


# --------------------------------------------------------------------------- reading order


def _bbox(lines: list[_Line]) -> tuple[float, float, float, float]:
    return (min(line.x0 for line in lines), min(line.y0 for line in lines), max(line.x1 for line in lines),
            max(line.y1 for line in lines))


def order_blocks(blocks: list[list[_Line]], width: float) -> list[tuple[str, list[_Line]]]:
    """Blocks in reading order, each tagged "left", "right" or "full".

    Between full-width blocks, the left column is read top to bottom, then
    the right one.  When short left and right blocks sit on the same rows (a
    table or a form rather than columns of prose), plain row order is kept.
    """
    boxes = [(_bbox(lines), lines) for lines in blocks]
    if not boxes:
        return []
    x_min = min(box[0] for box, _ in boxes)
    x_max = max(box[2] for box, _ in boxes)
    mid = (x_min + x_max) / 2 if x_max - x_min > 0.5 * width else width / 2
    tol = 0.03 * width
    tagged: list[tuple[str, tuple[float, float, float, float], list[_Line]]] = []
    for box, lines in boxes:
        if box[2] <= mid + tol:
            column = "left"
        elif box[0] >= mid - tol:
            column = "right"
        else:
            column = "full"
        tagged.append((column, box, lines))
    tagged.sort(key=lambda entry: (entry[1][1], entry[1][0]))

    ordered: list[tuple[str, list[_Line]]] = []
    band: list[tuple[str, tuple[float, float, float, float], list[_Line]]] = []

    def flush() -> None:
        lefts = [entry for entry in band if entry[0] == "left"]
        rights = [entry for entry in band if entry[0] == "right"]
        aligned = sum(1 for r in rights if any(abs(r[1][1] - left[1][1]) <= 2 for left in lefts))
        line_counts = sorted(len(lines) for _, _, lines in band)
        short_blocks = bool(line_counts) and line_counts[len(line_counts) // 2] <= 2
        table_like = aligned >= 2 and aligned >= 0.5 * len(rights) and short_blocks
        if lefts and rights and not table_like:
            band[:] = lefts + rights
        else:
            band.sort(key=lambda entry: (round(entry[1][1] / 3), entry[1][0]))
        ordered.extend((column, lines) for column, _, lines in band)
        band.clear()

    for entry in tagged:
        if entry[0] == "full":
            flush()
            ordered.append((entry[0], entry[2]))
        else:
            band.append(entry)
    flush()
    return ordered


# --------------------------------------------------------------------------- block text


def _clean(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def _join_prose(lines: list[_Line]) -> str:
    """Lines joined with spaces; a word hyphenated at a line end keeps its hyphen
    but loses the break ("exam-" + "ple" -> "exam-ple")."""
    out = ""
    for line in lines:
        text = _clean(line.text)
        if not text:
            continue
        if not out:
            out = text
        elif len(out) > 1 and out[-1] == "-" and out[-2].isalpha() and text[:1].islower():
            out += text
        else:
            out += " " + text
    return out


def _join_code(lines: list[_Line]) -> str:
    """Monospace lines keep their breaks; indentation that the PDF expresses by
    position rather than by space characters is rebuilt from x offsets."""
    left = min(line.x0 for line in lines)
    widths = [line.char_width for line in lines if line.char_width > 0]
    char_width = sorted(widths)[len(widths) // 2] if widths else 0.0
    out: list[str] = []
    previous: _Line | None = None
    for line in lines:
        if previous is not None and line.y0 - previous.y1 > 0.8 * (previous.y1 - previous.y0):
            out.append("")  # a visible blank line inside the listing
        indent = round((line.x0 - left) / char_width) if char_width else 0
        out.append(" " * max(indent, 0) + line.text.rstrip())  # leading spaces in the text are real
        previous = line
    return "\n".join(out)


def item_text(item: _Item) -> str:
    if item.kind == "code":
        return _join_code(item.lines)
    return _join_prose(item.lines)


# --------------------------------------------------------------------------- headings by font size


@dataclass
class _FontStats:
    body_size: float
    heading_sizes: list[float]

    def is_heading_line(self, line: _Line) -> bool:
        text = line.text.strip()
        if line.mono or len(text) > HEADING_MAX_CHARS or not any(ch.isalpha() for ch in text):
            return False
        if line.size >= self.body_size * HEADING_SIZE_RATIO:
            return True
        return line.bold and line.size >= self.body_size * BOLD_HEADING_SIZE_RATIO

    def level(self, size: float) -> int:
        rounded = round(size * 2) / 2
        for rank, candidate in enumerate(self.heading_sizes):
            if rounded >= candidate:
                return min(rank + 1, 6)
        return min(len(self.heading_sizes), 6) or 1


def font_stats(pages: list[_RawPage], dropped: set[int]) -> _FontStats:
    """Body size = the size most characters are set in; heading sizes ranked largest first."""
    sizes: Counter[float] = Counter()
    for page in pages:
        for block in page.blocks:
            for line in block:
                if id(line) not in dropped:
                    sizes[round(line.size * 2) / 2] += len(line.text.strip())
    body = sizes.most_common(1)[0][0] if sizes else 10.0
    stats = _FontStats(body_size=body, heading_sizes=[])
    heading_sizes: set[float] = set()
    for page in pages:
        for block in page.blocks:
            for line in block:
                if id(line) not in dropped and stats.is_heading_line(line):
                    heading_sizes.add(round(line.size * 2) / 2)
    stats.heading_sizes = sorted(heading_sizes, reverse=True)
    return stats


# --------------------------------------------------------------------------- items


def is_code_block(lines: list[_Line]) -> bool:
    """Mostly monospace, or every line starting in monospace with at least
    CODE_MIXED_SHARE of it monospace (listings with italic placeholders)."""
    total = sum(line.chars for line in lines) or 1
    mono = sum(line.mono_chars for line in lines)
    if mono >= CODE_MONO_SHARE * total:
        return True
    return mono >= CODE_MIXED_SHARE * total and all(line.starts_mono for line in lines)


def _split_block(column: str, lines: list[_Line], stats: _FontStats) -> list[_Item]:
    """Turn one PyMuPDF block into items: code, heading lines, list items, prose."""
    if is_code_block(lines):
        return [_Item("code", lines, column)]
    items: list[_Item] = []
    for line in lines:
        heading = stats.is_heading_line(line)
        text = line.text
        if heading:
            kind: BlockKind = "heading"
        elif _BULLET.match(text) or (not items and _NUMBERED.match(text)):
            kind = "list_item"
        else:
            kind = "paragraph"
        previous = items[-1] if items else None
        starts_new = (
            previous is None
            or (kind == "heading") != (previous.kind == "heading")
            or (kind == "list_item" and _BULLET.match(text) is not None)
            or (kind == "heading" and abs(line.size - previous.lines[-1].size) > 0.5)
        )
        if starts_new:
            items.append(_Item(kind, [line], column))
        else:
            previous.extend([line])
    for item in items:
        if item.kind == "heading":
            item.heading_level = stats.level(max(line.size for line in item.lines))
    return items


def _is_label_for(label: _Item, heading: _Item) -> bool:
    """A "1.2" or "Chapter 3" printed as its own block beside or just above a heading."""
    if heading.kind != "heading" or label.kind not in ("paragraph", "heading"):
        return False
    if label.column != heading.column and abs(label.x0 - heading.x0) > 20:
        return False
    if len(label.lines) != 1 or not _LABEL.match(_clean(label.lines[0].text)):
        return False
    height = max(label.y1 - label.y0, 1.0)
    same_row = abs(label.y0 - heading.y0) < 0.5 * height
    just_above = 0 <= heading.y0 - label.y1 < 2.5 * height
    return same_row or (just_above and label.kind == "heading")


def _merge_items(items: list[_Item]) -> list[_Item]:
    """Glue pieces PyMuPDF split apart: a code listing cut at blank lines, and a
    heading number printed as its own block beside the heading text."""
    merged: list[_Item] = []
    for item in items:
        previous = merged[-1] if merged else None
        if previous is not None and _is_label_for(previous, item):
            item.lines[:0] = previous.lines
            item._text = None
            merged[-1] = item
            continue
        if previous is not None and previous.column == item.column and previous.kind == item.kind:
            line_height = max(previous.lines[-1].y1 - previous.lines[-1].y0, 1.0)
            if item.kind == "code" and 0 <= item.y0 - previous.y1 < 2.5 * line_height and abs(item.x0 - previous.x0) < 60:
                previous.extend(item.lines)
                continue
            same_row = abs(item.y0 - previous.lines[-1].y0) < 0.5 * line_height
            if item.kind == "heading" and same_row and item.heading_level == previous.heading_level:
                previous.extend(item.lines)
                continue
        merged.append(item)
    return merged


def build_items(page: _RawPage, dropped: set[int], stats: _FontStats) -> list[_Item]:
    kept = [[line for line in block if id(line) not in dropped] for block in page.blocks]
    items: list[_Item] = []
    for column, lines in order_blocks([block for block in kept if block], page.width):
        items.extend(_split_block(column, lines, stats))
    return _merge_items(items)


# --------------------------------------------------------------------------- sections


@lru_cache(maxsize=16384)
def _norm(text: str) -> str:
    return _NORM.sub("", text.lower())


@dataclass(slots=True)
class _Event:
    level: int
    title: str
    item_index: int  # apply before this item of the page; len(items) = after the page


def _dest_point(doc: pymupdf.Document, entry: list) -> tuple[float | None, float | None]:
    """Target (x, y) of a bookmark in top-down page coordinates, when known.

    PyMuPDF reports explicit GoTo targets in page space but named destinations
    in raw PDF space (origin bottom-left), so the latter are transformed.
    """
    dest = entry[3] if len(entry) > 3 and isinstance(entry[3], dict) else {}
    point = dest.get("to")
    if point is None:
        return None, None
    try:
        page = doc[entry[2] - 1]
        if dest.get("kind") == pymupdf.LINK_NAMED:
            point = pymupdf.Point(point) * page.transformation_matrix
        x, y = float(point.x), float(point.y)
        height = page.rect.height
    except (ValueError, IndexError, RuntimeError, TypeError):
        return None, None
    if not 0 < y < height:
        return None, None
    return x, y


def _match_heading(items: list[_Item], title: str, y: float | None, taken: set[int]) -> int | None:
    """Index of the item on the target page that prints this bookmark's title."""
    wanted = _norm(title)
    if not wanted:
        return None
    candidates: list[int] = []
    for index, item in enumerate(items):
        if index in taken or item.kind == "code":
            continue
        text = item.text
        if len(text) > len(title) + 40:
            continue
        have = _norm(text)
        if not have:
            continue
        if have == wanted or (have.endswith(wanted) and len(have) - len(wanted) <= 12) or (
            wanted.endswith(have) and len(have) >= 0.6 * len(wanted)
        ):
            candidates.append(index)
    if not candidates:
        return None
    if y is not None:
        below = [index for index in candidates if items[index].y0 >= y - 30]
        if below:
            return below[0]
    return candidates[0]


def _position_after(items: list[_Item], x: float | None, y: float | None, width: float) -> int:
    """First item at or below a target point, honouring its column."""
    if y is None:
        return 0
    right = x is not None and x > width / 2
    for index, item in enumerate(items):
        if right and item.column == "left":
            continue
        if item.y0 >= y - 2:
            return index
    return len(items)


def outline_events(doc: pymupdf.Document, pages: list[_RawPage]) -> dict[int, list[_Event]] | None:
    """Section changes per page from the PDF outline, or None without one."""
    try:
        toc = doc.get_toc(simple=False)
    except Exception:  # a damaged outline must not cost us the text
        return None
    events: dict[int, list[_Event]] = defaultdict(list)
    taken: dict[int, set[int]] = defaultdict(set)
    count = 0
    for entry in toc:
        level, title, page_number = int(entry[0]), _clean(str(entry[1])), int(entry[2])
        if not title or not 1 <= page_number <= len(pages):
            continue
        page = pages[page_number - 1]
        x, y = _dest_point(doc, entry)
        match = _match_heading(page.items, title, y, taken[page_number])
        if match is not None:
            taken[page_number].add(match)
            item = page.items[match]
            item.kind, item.heading_level, item.title = "heading", level, title
            index = match
        else:
            index = _position_after(page.items, x, y, page.width)
        previous = events[page_number][-1].item_index if events[page_number] else 0
        events[page_number].append(_Event(level, title, max(index, previous)))
        count += 1
    if not count:
        return None
    # Outline mode: only bookmarked lines are headings; font-guessed ones become prose.
    for page in pages:
        for item in page.items:
            if item.kind == "heading" and item.title is None:
                item.kind, item.heading_level = "paragraph", None
    return events


def font_events(pages: list[_RawPage]) -> dict[int, list[_Event]]:
    events: dict[int, list[_Event]] = defaultdict(list)
    for page in pages:
        for index, item in enumerate(page.items):
            if item.kind == "heading":
                item.title = _clean(item.text)
                events[page.number].append(_Event(item.heading_level or 1, item.title, index))
    return events


# --------------------------------------------------------------------------- assembly


def _meaningful_title(value: str | None) -> str | None:
    if not value:
        return None
    value = _clean(value)
    if len(value) < 3 or _MEANINGLESS_TITLE.search(value) or not any(ch.isalpha() for ch in value):
        return None
    return value


def _cover_title(pages: list[_RawPage], stats: _FontStats) -> str | None:
    """The largest short line on the first page with text, if it is clearly display type."""
    for page in pages:
        lines = [line for item in page.items for line in item.lines if item.kind != "code"]
        if not lines:
            continue
        biggest = max(line.size for line in lines)
        if biggest < stats.body_size * 1.3:
            return None
        parts = [_clean(line.text) for line in lines if abs(line.size - biggest) < 0.5]
        title = " ".join(part for part in parts if part)
        return title if 0 < len(title) <= 200 else None
    return None


def _assemble(pages: list[_RawPage], events: dict[int, list[_Event]]) -> tuple[list[Page], list[Block]]:
    stack: list[tuple[int, str]] = []
    out_pages: list[Page] = []
    blocks: list[Block] = []

    def apply(event: _Event) -> None:
        while stack and stack[-1][0] >= event.level:
            stack.pop()
        stack.append((event.level, event.title))

    for page in pages:
        builder = PageBuilder(page.number)
        pending = list(events.get(page.number, ()))
        for index, item in enumerate(page.items):
            while pending and pending[0].item_index <= index:
                apply(pending.pop(0))
            builder.add(
                item.kind,
                item.text,
                section_path=tuple(title for _, title in stack),
                heading_level=item.heading_level if item.kind == "heading" else None,
            )
        for event in pending:
            apply(event)
        has_text = bool(builder.blocks)
        ocr = page.ocr and has_text
        out_pages.append(
            builder.page(
                has_text_layer=(has_text and not page.ocr) or not page.has_visuals,
                ocr=ocr,
                ocr_confidence=page.ocr_confidence if ocr else None,
                ocr_lines=page.ocr_lines if ocr else None,
                low_confidence_regions=page.low_regions if ocr else (),
            )
        )
        blocks.extend(builder.blocks)
    return out_pages, blocks


def _open(path: Path) -> pymupdf.Document:
    try:
        doc = pymupdf.open(path, filetype="pdf")
    except Exception as exc:
        raise CorruptFileError(path, f"the PDF cannot be opened; it is damaged or truncated ({exc})") from None
    if doc.needs_pass:
        doc.close()
        raise PasswordProtectedError(path, "the PDF is password-protected")
    if doc.page_count == 0:
        doc.close()
        raise CorruptFileError(path, "the PDF has no readable pages; it is damaged or truncated")
    if doc.is_repaired and not _has_eof_marker(path):
        # MuPDF can rebuild a cut-off file, but whatever was after the cut is
        # silently missing; indexing half a document is worse than refusing it.
        doc.close()
        raise CorruptFileError(
            path, "the PDF is truncated (its end is missing); it was probably not completely downloaded or copied"
        )
    return doc


def _has_eof_marker(path: Path) -> bool:
    """Complete PDFs end with ``%%EOF`` (give or take trailing junk)."""
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - 2048))
        return b"%%EOF" in handle.read()


# custom Info dictionary entries document-control systems write for a file's revision; PyMuPDF's
# ``doc.metadata`` holds the standard entries only, so they are read from the dictionary itself
_INFO_REVISION_KEYS = {"revision": "revision", "rev": "revision", "revlabel": "rev_label", "rev_label": "rev_label",
                       "version": "version", "docversion": "version"}


def _info_revision_fields(doc: pymupdf.Document) -> dict[str, str]:
    """``revision``/``rev_label``/``version`` from the PDF Info dictionary's custom entries (first of each kept)."""
    fields: dict[str, str] = {}
    try:
        kind, value = doc.xref_get_key(-1, "Info")
        if kind != "xref":
            return fields
        info = int(value.split()[0])
        for key in doc.xref_get_keys(info):
            target = _INFO_REVISION_KEYS.get(key.lower())
            if target is None or target in fields:
                continue
            key_kind, key_value = doc.xref_get_key(info, key)
            text = _clean(key_value) if key_kind in ("string", "name", "int", "float") else ""
            if text:
                fields[target] = text.lstrip("/") if key_kind == "name" else text
    except (RuntimeError, ValueError, IndexError):  # a damaged trailer: the revision is simply unknown
        return {}
    return fields


def parse_pdf(path: Path | str, ocr: OcrOptions | None = None) -> ParsedDocument:
    """Parse a PDF into one Page per PDF page (1-based, complete) and ordered blocks.

    Pages without a text layer are OCR'd with ``ocr`` (defaults: on, English,
    300 dpi, 5 minutes per document); ``OcrTimeoutError`` when that runs out.
    """
    path = Path(path)
    options = ocr or OcrOptions()
    doc = _open(path)
    document_ocr: DocumentOcr | None = None  # started at the first scanned page only
    try:
        raw_pages: list[_RawPage] = []
        for index in range(doc.page_count):
            try:
                raw = extract_page(doc[index], index + 1)
            except Exception:  # one broken page must not cost the whole document
                raw = _RawPage(index + 1, 612.0, 792.0, [], unreadable=True)
            if raw.needs_ocr:
                document_ocr = document_ocr or DocumentOcr.start(path, options, doc.page_count)
                ocr_into(doc[index], raw, document_ocr)
            raw_pages.append(raw)
        if all(page.unreadable for page in raw_pages):
            raise CorruptFileError(path, "no page of the PDF could be read; it is damaged")
        dropped = running_lines(raw_pages)
        stats = font_stats(raw_pages, dropped)
        for page in raw_pages:
            page.items = build_items(page, dropped, stats)
        events = outline_events(doc, raw_pages)
        heading_source = "outline" if events is not None else "font"
        if events is None:
            events = font_events(raw_pages)
        pages, blocks = _assemble(raw_pages, events)
        metadata_raw = doc.metadata or {}
        revision_fields = _info_revision_fields(doc)
    finally:
        doc.close()

    ocr_metadata = document_ocr.metadata() if document_ocr is not None else {}
    missing = [page.page_number for page in pages if not page.has_text_layer and not page.ocr]
    if not blocks:
        if missing:
            raise NoTextError(path, missing_text_reason(missing, len(pages), ocr_metadata))
        raise NoTextError(path, "the PDF contains no extractable text")
    first_heading = next((block.section_path[-1] for block in blocks if block.kind == "heading"), None)
    title = _meaningful_title(metadata_raw.get("title")) or _cover_title(raw_pages, stats) or first_heading or path.stem
    metadata: dict[str, object] = {
        "author": _clean(metadata_raw.get("author") or "") or None,
        "page_count": len(pages),
        "pages_without_text": missing,
        "heading_source": heading_source,
        **ocr_metadata,
        **revision_fields,
    }
    unreadable = [page.number for page in raw_pages if page.unreadable]
    if unreadable:
        metadata["unreadable_pages"] = unreadable
    return ParsedDocument(
        title=title,
        doc_type="pdf",
        pages=pages,
        blocks=blocks,
        paginated=True,
        metadata=metadata,
    )
