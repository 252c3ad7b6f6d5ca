"""What a parser hands to the chunker: pages of text and the structural blocks inside them.

Parsers never chunk and never touch the store.  They turn one file into a
``ParsedDocument``: a list of ``Page`` objects (the exact text a citation's
character offsets point into) and an ordered list of ``Block`` objects
(headings, paragraphs, code, tables, list items) that carry their page, their
section path and their ``[char_start, char_end)`` span inside that page's text.
Keeping the page text and the block spans together is what lets a citation
point at "page 12, characters 340-910" and be checked against the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

BlockKind = Literal["heading", "paragraph", "code", "table", "list_item", "quote"]

BLOCK_KINDS: tuple[str, ...] = ("heading", "paragraph", "code", "table", "list_item", "quote")


@dataclass(frozen=True)
class Block:
    """One structural unit of a page, in reading order.

    ``text`` must equal ``page.text[char_start:char_end]`` for the page it sits
    on; ``section_path`` lists the enclosing headings from the top level down
    (a heading block's own path ends with its own title).  ``anchor`` is the
    closest HTML id / Markdown slug a link can jump to, when the format has one.
    """

    kind: BlockKind
    text: str
    page_number: int
    char_start: int
    char_end: int
    section_path: tuple[str, ...] = ()
    anchor: str | None = None
    heading_level: int | None = None


@dataclass
class Page:
    """The text of one page exactly as citations index into it.

    ``page_number`` is 1-based and is the real page number of the source for
    paginated formats (PDF).  Formats without pages (Markdown, HTML, DOCX,
    TXT) have a single page numbered 1 and ``ParsedDocument.paginated`` is
    False.  ``has_text_layer`` is False for a scanned PDF page with no
    extractable text.  Such a page is OCR'd when OCR is available: then
    ``ocr`` is True, ``text`` is the OCR text and ``ocr_confidence`` the mean
    Tesseract word confidence (0..1, None when unknown).  Otherwise it is kept
    with empty text so it is reported, not lost.
    """

    page_number: int
    text: str
    has_text_layer: bool = True
    ocr: bool = False
    ocr_confidence: float | None = None
    ocr_lines: int | None = None  # text lines OCR read on the page (None: not OCR'd, or confidences unknown)
    low_confidence_regions: tuple[OcrRegion, ...] = ()  # of them, those under the low-confidence threshold


@dataclass(frozen=True)
class OcrRegion:
    """A text line OCR read with low confidence: its box on the page (PDF points, origin top left), the mean
    confidence of its words (0..1), how many words and what was read."""

    x0: float
    y0: float
    x1: float
    y1: float
    confidence: float
    words: int
    text: str


@dataclass(frozen=True)
class DocumentLink:
    """A link written in the document, as the author wrote it (``href`` unresolved).

    ``text`` is the link text a reader sees; ``char_start``/``char_end`` locate it in
    page ``page_number``'s text (None when the text could not be found there, e.g. an
    image link).  Links to other documents of the store become ``seeAlso`` relations
    (``knowledge_store.ingest.relations``) whose evidence is this phrase and span.
    """

    href: str
    text: str
    page_number: int
    char_start: int | None = None
    char_end: int | None = None


@dataclass
class ParsedDocument:
    """A parsed file: its title, pages, blocks, format-level metadata and the links it contains."""

    title: str
    doc_type: str  # pdf | markdown | docx | html | text
    pages: list[Page]
    blocks: list[Block]
    paginated: bool = False
    metadata: dict[str, object] = field(default_factory=dict)
    links: list[DocumentLink] = field(default_factory=list)

    @property
    def pages_without_text(self) -> list[int]:
        """Pages with no text layer that OCR did not fill (unavailable, off, or nothing found)."""
        return [p.page_number for p in self.pages if not p.has_text_layer and not p.ocr]

    def page(self, page_number: int) -> Page:
        for candidate in self.pages:
            if candidate.page_number == page_number:
                return candidate
        raise KeyError(page_number)


class PageBuilder:
    """Accumulates one page's text while recording each block's exact span.

    Parsers append blocks in reading order; the builder joins them with a
    blank line and computes offsets, so ``Block.text`` always matches the page
    text slice by construction instead of by convention.
    """

    def __init__(self, page_number: int, separator: str = "\n\n") -> None:
        self.page_number = page_number
        self.separator = separator
        self._parts: list[str] = []
        self._length = 0
        self.blocks: list[Block] = []

    def add(
        self,
        kind: BlockKind,
        text: str,
        section_path: tuple[str, ...] = (),
        anchor: str | None = None,
        heading_level: int | None = None,
    ) -> Block | None:
        text = text.strip("\n")
        if not text.strip():
            return None
        if self._parts:
            self._parts.append(self.separator)
            self._length += len(self.separator)
        start = self._length
        self._parts.append(text)
        self._length += len(text)
        block = Block(
            kind=kind,
            text=text,
            page_number=self.page_number,
            char_start=start,
            char_end=self._length,
            section_path=section_path,
            anchor=anchor,
            heading_level=heading_level,
        )
        self.blocks.append(block)
        return block

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def page(self, has_text_layer: bool = True, ocr: bool = False, ocr_confidence: float | None = None,
             ocr_lines: int | None = None, low_confidence_regions: tuple[OcrRegion, ...] = ()) -> Page:
        return Page(
            page_number=self.page_number, text=self.text, has_text_layer=has_text_layer,
            ocr=ocr, ocr_confidence=ocr_confidence, ocr_lines=ocr_lines,
            low_confidence_regions=low_confidence_regions,
        )
