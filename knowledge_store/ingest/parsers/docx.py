"""Word .docx: paragraphs and tables in document order, headings from styles.

``python-docx`` exposes ``doc.paragraphs`` and ``doc.tables`` as two separate
lists, which loses where each table sits; walking the body element's children
keeps them interleaved as the reader sees them.  Headings are recognised by
style name ("Heading N", "Title") and, for localised or custom styles, by the
outline level Word itself uses to build its navigation pane.
"""

from __future__ import annotations

import re
from pathlib import Path

import docx
from docx.document import Document as DocxDocument
from docx.oxml.ns import qn
from docx.table import Table
from docx.text.paragraph import Paragraph

from knowledge_store.core.errors import CorruptFileError
from knowledge_store.ingest.documents import BlockKind, PageBuilder, ParsedDocument
from knowledge_store.ingest.parsers.links import locate_links

_HEADING_STYLE = re.compile(r"^heading\s*(\d)$", re.IGNORECASE)
_CODE_STYLES = {"html preformatted", "macro text", "code", "source code", "plain text", "verbatim"}
_QUOTE_STYLES = {"quote", "intense quote", "block text"}
_MEANINGLESS_TITLES = {"", "untitled", "document", "microsoft word", "title"}
_MAX_STYLE_DEPTH = 10


def _style_name(paragraph: Paragraph) -> str:
    try:
        style = paragraph.style
    except (KeyError, ValueError, AttributeError):
        return ""
    return (style.name or "") if style is not None else ""


def _outline_level(paragraph: Paragraph) -> int | None:
    """Word's outline level (0-8) from the paragraph or its style chain, if any."""
    values = paragraph._p.xpath("./w:pPr/w:outlineLvl/@w:val")
    try:
        style = paragraph.style
    except (KeyError, ValueError, AttributeError):
        style = None
    depth = 0
    while not values and style is not None and depth < _MAX_STYLE_DEPTH:
        values = style.element.xpath("./w:pPr/w:outlineLvl/@w:val")
        style = style.base_style
        depth += 1
    if not values:
        return None
    try:
        level = int(values[0])
    except ValueError:
        return None
    return level if 0 <= level <= 8 else None


def heading_level(paragraph: Paragraph) -> int | None:
    """1-9 for headings ("Title" counts as level 1), None for body text."""
    name = _style_name(paragraph)
    if name.lower() == "title":
        return 1
    match = _HEADING_STYLE.match(name.strip())
    if match:
        return max(1, int(match.group(1)))
    level = _outline_level(paragraph)
    return level + 1 if level is not None else None


def _numbered_style(paragraph: Paragraph) -> bool:
    """A "List Number" paragraph (Word's numbered-list styles); other list paragraphs show a bullet."""
    return "number" in _style_name(paragraph).lower()


def paragraph_kind(paragraph: Paragraph) -> BlockKind:
    name = _style_name(paragraph).lower()
    if name.startswith("list") or paragraph._p.xpath("./w:pPr/w:numPr"):
        return "list_item"
    if name in _CODE_STYLES:
        return "code"
    if name in _QUOTE_STYLES:
        return "quote"
    return "paragraph"


def table_text(table: Table) -> str:
    """One line per row, cells joined by `` | ``; merged cells are not repeated."""
    rows: list[str] = []
    for tr in table._tbl.tr_lst:
        cells: list[str] = []
        for tc in tr.tc_lst:
            text = " ".join("".join(t.text or "" for t in p.iter(qn("w:t"))) for p in tc.iter(qn("w:p")))
            cells.append(re.sub(r"\s+", " ", text).strip())
        if any(cells):
            rows.append(" | ".join(cells))
    return "\n".join(rows)


def iter_body(doc: DocxDocument):
    """Paragraphs and tables of the body in reading order, including those
    wrapped in content controls (``w:sdt``, e.g. a generated table of contents)."""
    stack = [iter(doc.element.body.iterchildren())]
    while stack:
        element = next(stack[-1], None)
        if element is None:
            stack.pop()
            continue
        if element.tag == qn("w:p"):
            yield Paragraph(element, doc)
        elif element.tag == qn("w:tbl"):
            yield Table(element, doc)
        elif element.tag == qn("w:sdt"):
            content = element.find(qn("w:sdtContent"))
            if content is not None:
                stack.append(iter(content.iterchildren()))


def _meaningful(title: str | None) -> str | None:
    if not title:
        return None
    title = re.sub(r"\s+", " ", title).strip()
    return None if title.lower() in _MEANINGLESS_TITLES else title


def parse_docx(path: Path | str) -> ParsedDocument:
    """Parse a .docx file; a file python-docx cannot open is a CorruptFileError."""
    path = Path(path)
    try:
        doc = docx.Document(str(path))
    except Exception as exc:  # python-docx raises many types for damaged packages
        raise CorruptFileError(path, f"the Word document cannot be opened ({type(exc).__name__}: {exc})") from None

    builder = PageBuilder(1)
    stack: list[tuple[int, str]] = []
    styled_title: str | None = None
    first_heading: str | None = None
    hyperlinks: list[tuple[str, str]] = []  # (target, text) in reading order, located in the page text below
    numbered = 0  # the number of the last item of the numbered list being read (0: none)
    for item in iter_body(doc):
        path_now = tuple(title for _, title in stack)
        if isinstance(item, Table):
            numbered = 0
            builder.add("table", table_text(item), section_path=path_now)
            continue
        text = item.text.replace("\r", "\n")
        if not text.strip():
            continue
        hyperlinks.extend(_hyperlinks(item))
        level = heading_level(item)
        if level is None:
            kind = paragraph_kind(item)
            numbered = numbered + 1 if kind == "list_item" and _numbered_style(item) else 0
            if kind == "list_item":  # the marker a reader sees, so a quoted step stays a numbered step
                text = f"{numbered}. {text}" if numbered else f"\u2022 {text}"
            builder.add(kind, text, section_path=path_now)
            continue
        numbered = 0
        title = re.sub(r"\s+", " ", text).strip()
        if _style_name(item).lower() == "title" and styled_title is None:
            styled_title = title
        first_heading = first_heading or title
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        builder.add("heading", text, section_path=tuple(t for _, t in stack), heading_level=level)

    props = doc.core_properties
    metadata: dict[str, object] = {}
    if props.author:
        metadata["author"] = props.author
    for key in ("created", "modified"):
        value = getattr(props, key, None)
        if value is not None:
            metadata[key] = value.isoformat()
    # the "version" core property is the author's revision label ("Rev C", "2.1"); "revision" is not kept:
    # Word counts every save in it, so it says nothing about which revision of a document this is
    if (props.version or "").strip():
        metadata["version"] = props.version.strip()
    page = builder.page()
    return ParsedDocument(
        title=_meaningful(props.title) or styled_title or first_heading or path.stem,
        doc_type="docx",
        pages=[page],
        blocks=builder.blocks,
        paginated=False,
        metadata=metadata,
        links=locate_links(page.text, 1, hyperlinks),
    )


def _hyperlinks(paragraph: Paragraph) -> list[tuple[str, str]]:
    """(target, text) of the paragraph's hyperlinks: external address (+ ``#fragment``); internal
    bookmarks alone are in-document jumps and are left out."""
    found: list[tuple[str, str]] = []
    try:
        links = paragraph.hyperlinks
    except (KeyError, ValueError, AttributeError):  # a relationship id missing from a damaged package
        return found
    for link in links:
        try:
            address, fragment, text = link.address, link.fragment, link.text
        except (KeyError, ValueError, AttributeError):
            continue
        if address:
            found.append((address + (f"#{fragment}" if fragment else ""), text))
    return found
