"""Behaviour of the file parsers (knowledge_store.ingest.parsers).

Fixtures are generated inside each test (PyMuPDF, python-docx, plain strings)
so the tests say exactly what input produces which output.  A few tests read
the real PDFs in ../shared/datasets and skip when that folder is absent.
"""

from __future__ import annotations

import re
import unicodedata
import zipfile
from pathlib import Path

import docx
import pymupdf
import pytest

from knowledge_store.core.errors import (
    CorruptFileError,
    EmptyFileError,
    IngestionError,
    NoTextError,
    OversizeFileError,
    PasswordProtectedError,
    UnsupportedTypeError,
    WrongExtensionError,
)
from knowledge_store.ingest.documents import ParsedDocument
from knowledge_store.ingest.parsers import SUPPORTED_EXTENSIONS, OcrOptions, detect_type, parse_file
from knowledge_store.ingest.parsers.docx import parse_docx
from knowledge_store.ingest.parsers.html import parse_html
from knowledge_store.ingest.parsers.markdown import parse_markdown
from knowledge_store.ingest.parsers.pdf import parse_pdf
from knowledge_store.ingest.parsers.text import parse_text
from tests.helpers import SHARED_DATASETS

SHARED_PDFS = SHARED_DATASETS / "pdfs"

LOREM = (
    "Retrieval systems must cite the exact page that supports an answer, "
    "so every block keeps its offsets into the text of its own page."
)


# --------------------------------------------------------------------------- helpers


def assert_block_spans_match_page_text(doc: ParsedDocument) -> None:
    """The contract every parser must keep: a block is a slice of its page."""
    assert doc.blocks, "parser produced no blocks"
    for block in doc.blocks:
        page = doc.page(block.page_number)
        assert page.text[block.char_start : block.char_end] == block.text, block
        assert block.text.strip(), block


def normalise(text: str) -> str:
    """Compare PDF text modulo whitespace, ligatures and line-end hyphen joins."""
    text = unicodedata.normalize("NFKC", text)
    text = re.sub(r"\s+", " ", text)
    return re.sub(r"(?<=\w)- (?=\w)", "-", text).strip()


def texts(doc: ParsedDocument, kind: str | None = None) -> list[str]:
    return [block.text for block in doc.blocks if kind is None or block.kind == kind]


def make_outline_pdf(path: Path) -> Path:
    """3 pages; page 2 has a bookmarked sub-heading halfway down the page."""
    doc = pymupdf.open()
    for title, body in (("Introduction", "Intro body text."), ("Methods", "Methods top text."), ("Results", "Results text.")):
        page = doc.new_page()
        page.insert_text((72, 80), title, fontsize=20)
        page.insert_textbox(pymupdf.Rect(72, 100, 520, 300), f"{body} {LOREM}", fontsize=11)
    page = doc[1]
    page.insert_text((72, 420), "Details", fontsize=16)
    page.insert_textbox(pymupdf.Rect(72, 440, 520, 600), f"Details body text. {LOREM}", fontsize=11)
    doc.set_toc(
        [
            [1, "Introduction", 1],
            [1, "Methods", 2],
            [2, "Details", 2, {"kind": pymupdf.LINK_GOTO, "page": 1, "to": pymupdf.Point(72, 400)}],
            [1, "Results", 3],
        ]
    )
    doc.set_metadata({"title": "Outline Test Document", "author": "Test Author"})
    doc.save(path)
    return path


def make_two_column_pdf(path: Path) -> Path:
    """A title across the page, then two columns written into the content
    stream in zig-zag order (right, left, right, ...) so that correct output
    cannot come from stream order by accident."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_textbox(pymupdf.Rect(50, 40, 560, 70), "Newsletter spanning both columns at the top", fontsize=14)
    for row in range(4):
        y = 100 + row * 150
        right = f"RIGHTCOL{row} " + "right side words here. " * 6
        left = f"LEFTCOL{row} " + "left side words here. " * 6
        page.insert_textbox(pymupdf.Rect(320, y, 560, y + 130), right, fontsize=10)
        page.insert_textbox(pymupdf.Rect(50, y, 290, y + 130), left, fontsize=10)
    doc.save(path)
    return path


def make_image_page_pdf(path: Path) -> Path:
    """Page 1 has text; page 2 is a picture of a text page (like a scan)."""
    source = pymupdf.open()
    text_page = source.new_page()
    text_page.insert_textbox(pymupdf.Rect(72, 72, 520, 400), "Scanned words " * 40, fontsize=12)
    pixmap = text_page.get_pixmap(dpi=72)

    doc = pymupdf.open()
    first = doc.new_page()
    first.insert_textbox(pymupdf.Rect(72, 72, 520, 300), f"A real text layer. {LOREM}", fontsize=11)
    scanned = doc.new_page()
    scanned.insert_image(scanned.rect, pixmap=pixmap)
    doc.save(path)
    return path


def make_docx(path: Path) -> Path:
    document = docx.Document()
    document.core_properties.author = "Docx Author"
    document.add_paragraph("Quarterly Report", style="Title")
    document.add_heading("Overview", level=1)
    document.add_paragraph("The overview paragraph comes before the table.")
    table = document.add_table(rows=3, cols=2)
    for row, (name, value) in enumerate((("Metric", "Value"), ("Uptime", "99.9%"), ("Latency", "12 ms"))):
        table.cell(row, 0).text = name
        table.cell(row, 1).text = value
    document.add_paragraph("This paragraph follows the table.")
    document.add_heading("Details", level=2)
    document.add_paragraph("First bullet", style="List Bullet")
    document.add_paragraph("Second bullet", style="List Bullet")
    document.add_paragraph("Open the lid.", style="List Number")
    document.add_paragraph("Press reset.", style="List Number")
    document.add_heading("Appendix", level=1)
    document.add_paragraph("Closing words.")
    document.save(str(path))
    return path


HTML_PAGE = """<!DOCTYPE html>
<html lang="en-GB">
<head>
  <title>Widget Guide</title>
  <link rel="canonical" href="/docs/widgets">
  <style>body { color: red; } .STYLE_MARKER {}</style>
  <script>var SCRIPT_MARKER = 1;</script>
</head>
<body>
  <header><div class="logo">BANNER_MARKER</div></header>
  <nav><ul><li><a href="/">NAV_MARKER Home</a></li></ul></nav>
  <div role="navigation">ROLE_NAV_MARKER</div>
  <main>
    <h1 id="top">Widgets</h1>
    <p>Widgets are small. They <em>spin</em>.</p>
    Loose text directly in main.
    <h2 id="install">Installing</h2>
    <ul><li>Download the widget</li><li>Unpack it</li></ul>
    <pre>pip install widget
    indented line</pre>
    <a name="legacy"></a><h2>Legacy anchor</h2>
    <table><tr><th>Name</th><th>Size</th></tr><tr><td>Small</td><td>1 cm</td></tr></table>
    <section id="faq"><h3>FAQ</h3><p>Ask away.</p></section>
    <h2>No id here</h2>
    <blockquote><p>Quoted wisdom.</p></blockquote>
    <noscript>NOSCRIPT_MARKER</noscript>
  </main>
  <aside>ASIDE_MARKER</aside>
  <footer>FOOTER_MARKER</footer>
</body>
</html>
"""

MARKDOWN_DOC = """---
title: Front Matter Title
tags: [alpha, beta]
date: 2024-05-01
---
# Guide

Intro paragraph
over two lines.

## Setup

```python
# this is a comment, not a heading
import os

print(os.getcwd())
```

### Options

| Option | Meaning |
|--------|---------|
| -v     | verbose |

- first item
- second item

> A quoted line.

## Setup

Second setup section.

Usage
-----

Setext section body.
"""


# --------------------------------------------------------------------------- PDF


def test_pdf_pages_are_one_based_and_complete(tmp_path: Path) -> None:
    doc = parse_pdf(make_outline_pdf(tmp_path / "outline.pdf"))
    assert doc.paginated and doc.doc_type == "pdf"
    assert [page.page_number for page in doc.pages] == [1, 2, 3]
    assert doc.metadata["page_count"] == 3
    assert_block_spans_match_page_text(doc)


def test_pdf_outline_builds_section_paths_from_the_bookmark_position(tmp_path: Path) -> None:
    doc = parse_pdf(make_outline_pdf(tmp_path / "outline.pdf"))
    by_text = {block.text.split(".")[0]: block for block in doc.blocks}
    assert by_text["Intro body text"].section_path == ("Introduction",)
    assert by_text["Methods top text"].section_path == ("Methods",)  # above the mid-page bookmark
    assert by_text["Details body text"].section_path == ("Methods", "Details")  # below it
    assert by_text["Results text"].section_path == ("Results",)
    headings = [block for block in doc.blocks if block.kind == "heading"]
    assert [block.section_path[-1] for block in headings] == ["Introduction", "Methods", "Details", "Results"]
    assert [block.heading_level for block in headings] == [1, 1, 2, 1]
    assert doc.metadata["heading_source"] == "outline"


def test_pdf_title_and_author_come_from_metadata(tmp_path: Path) -> None:
    doc = parse_pdf(make_outline_pdf(tmp_path / "outline.pdf"))
    assert doc.title == "Outline Test Document"
    assert doc.metadata["author"] == "Test Author"


def test_pdf_without_outline_uses_font_size_headings(tmp_path: Path) -> None:
    pdf = pymupdf.open()
    page = pdf.new_page()
    page.insert_text((72, 72), "Big Chapter", fontsize=22)
    page.insert_textbox(pymupdf.Rect(72, 90, 520, 200), LOREM * 2, fontsize=10)
    page.insert_text((72, 240), "Smaller Section", fontsize=15)
    page.insert_textbox(pymupdf.Rect(72, 255, 520, 400), "Section body. " + LOREM * 2, fontsize=10)
    pdf.save(tmp_path / "fonts.pdf")

    doc = parse_pdf(tmp_path / "fonts.pdf")
    headings = [(block.text, block.heading_level) for block in doc.blocks if block.kind == "heading"]
    assert headings == [("Big Chapter", 1), ("Smaller Section", 2)]
    section_body = next(block for block in doc.blocks if block.text.startswith("Section body"))
    assert section_body.section_path == ("Big Chapter", "Smaller Section")
    assert doc.title == "Big Chapter"  # no metadata title: first heading / cover text
    assert doc.metadata["heading_source"] == "font"


def test_pdf_two_column_page_reads_left_column_before_right(tmp_path: Path) -> None:
    doc = parse_pdf(make_two_column_pdf(tmp_path / "columns.pdf"))
    text = doc.pages[0].text
    assert text.startswith("Newsletter spanning both columns")
    last_left = max(text.index(f"LEFTCOL{row}") for row in range(4))
    first_right = min(text.index(f"RIGHTCOL{row}") for row in range(4))
    assert last_left < first_right
    assert [text.index(f"LEFTCOL{row}") for row in range(4)] == sorted(text.index(f"LEFTCOL{row}") for row in range(4))
    assert_block_spans_match_page_text(doc)


def test_pdf_image_only_page_is_kept_without_text_layer_when_ocr_is_off(tmp_path: Path) -> None:
    doc = parse_pdf(make_image_page_pdf(tmp_path / "scan.pdf"), ocr=OcrOptions(enabled=False))
    assert [page.page_number for page in doc.pages] == [1, 2]
    assert doc.pages[0].has_text_layer and doc.pages[0].text
    assert doc.pages[1].has_text_layer is False
    assert doc.pages[1].text == "" and doc.pages[1].ocr is False
    assert doc.metadata["pages_without_text"] == [2]
    assert doc.metadata["ocr_status"] == "disabled"
    assert all(block.page_number == 1 for block in doc.blocks)


def test_pdf_where_every_page_is_an_image_raises_no_text_when_ocr_is_off(tmp_path: Path) -> None:
    source = pymupdf.open(make_image_page_pdf(tmp_path / "scan.pdf"))
    source.delete_page(0)
    source.save(tmp_path / "all_scanned.pdf")
    with pytest.raises(NoTextError, match="no text layer .* OCR is switched off"):
        parse_file(tmp_path / "all_scanned.pdf", ocr=OcrOptions(enabled=False))


def test_pdf_running_headers_and_page_numbers_are_dropped(tmp_path: Path) -> None:
    pdf = pymupdf.open()
    for number in range(1, 7):
        page = pdf.new_page()
        page.insert_text((72, 40), "ACME Handbook - Confidential", fontsize=9)
        page.insert_textbox(pymupdf.Rect(72, 100, 520, 400), f"Body of page {number}. {LOREM}", fontsize=11)
        page.insert_text((300, 810), str(number), fontsize=9)
    pdf.save(tmp_path / "headers.pdf")

    doc = parse_pdf(tmp_path / "headers.pdf")
    for page in doc.pages:
        assert "ACME Handbook" not in page.text
        assert page.text.startswith(f"Body of page {page.page_number}.")
        assert not re.search(r"(^|\n)\d+$", page.text), page.text


def test_pdf_monospace_block_becomes_one_code_block_with_line_breaks(tmp_path: Path) -> None:
    pdf = pymupdf.open()
    page = pdf.new_page()
    page.insert_textbox(pymupdf.Rect(72, 72, 520, 140), LOREM, fontsize=11)
    listing = "def main():\n    value = compute()\n    return value"
    page.insert_textbox(pymupdf.Rect(72, 160, 520, 260), listing, fontsize=10, fontname="cour")
    pdf.save(tmp_path / "code.pdf")

    doc = parse_pdf(tmp_path / "code.pdf")
    code = [block for block in doc.blocks if block.kind == "code"]
    assert len(code) == 1
    assert code[0].text.split("\n") == ["def main():", "    value = compute()", "    return value"]


def test_pdf_password_protected_raises_typed_error(tmp_path: Path) -> None:
    pdf = pymupdf.open()
    pdf.new_page().insert_text((72, 72), "secret", fontsize=12)
    pdf.save(tmp_path / "locked.pdf", encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="x", owner_pw="y")
    with pytest.raises(PasswordProtectedError, match="password-protected"):
        parse_file(tmp_path / "locked.pdf")


def test_pdf_truncated_file_is_corrupt(tmp_path: Path) -> None:
    data = make_outline_pdf(tmp_path / "whole.pdf").read_bytes()
    (tmp_path / "cut.pdf").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match="truncated|damaged"):
        parse_file(tmp_path / "cut.pdf")


def test_pdf_garbage_bytes_are_corrupt(tmp_path: Path) -> None:
    (tmp_path / "junk.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 8)
    with pytest.raises(CorruptFileError):
        parse_file(tmp_path / "junk.pdf")
    (tmp_path / "noheader.pdf").write_bytes(bytes(range(1, 256)) * 8)
    with pytest.raises(CorruptFileError, match="PDF header"):
        parse_file(tmp_path / "noheader.pdf")


# --------------------------------------------------------------------------- Markdown


def test_markdown_front_matter_becomes_metadata_and_title(tmp_path: Path) -> None:
    path = tmp_path / "guide.md"
    path.write_text(MARKDOWN_DOC, encoding="utf-8")
    doc = parse_markdown(path)
    assert doc.title == "Front Matter Title"
    assert doc.metadata["tags"] == ["alpha", "beta"]
    assert doc.metadata["date"] == "2024-05-01"  # dates made JSON-safe
    assert "title:" not in doc.pages[0].text
    assert_block_spans_match_page_text(doc)


def test_markdown_fenced_code_is_one_block_and_its_hash_line_is_not_a_heading(tmp_path: Path) -> None:
    path = tmp_path / "guide.md"
    path.write_text(MARKDOWN_DOC, encoding="utf-8")
    doc = parse_markdown(path)
    code = [block for block in doc.blocks if block.kind == "code"]
    assert len(code) == 1
    assert code[0].text.startswith("```python\n# this is a comment")
    assert code[0].text.endswith("print(os.getcwd())\n```")
    assert "\n\nprint" in code[0].text  # the blank line inside the fence did not split it
    heading_texts = texts(doc, "heading")
    assert not any("comment" in text for text in heading_texts)
    assert code[0].section_path == ("Guide", "Setup")


def test_markdown_section_paths_anchors_and_block_kinds(tmp_path: Path) -> None:
    path = tmp_path / "guide.md"
    path.write_text(MARKDOWN_DOC, encoding="utf-8")
    doc = parse_markdown(path)
    headings = [(b.text.split("\n")[0], b.section_path, b.anchor, b.heading_level) for b in doc.blocks if b.kind == "heading"]
    assert headings == [
        ("# Guide", ("Guide",), "guide", 1),
        ("## Setup", ("Guide", "Setup"), "setup", 2),
        ("### Options", ("Guide", "Setup", "Options"), "options", 3),
        ("## Setup", ("Guide", "Setup"), "setup-1", 2),
        ("Usage", ("Guide", "Usage"), "usage", 2),
    ]
    table = next(b for b in doc.blocks if b.kind == "table")
    assert table.text.splitlines()[0] == "| Option | Meaning |" and len(table.text.splitlines()) == 3
    assert table.section_path == ("Guide", "Setup", "Options") and table.anchor == "options"
    assert texts(doc, "list_item") == ["- first item", "- second item"]
    assert texts(doc, "quote") == ["> A quoted line."]
    assert "Intro paragraph\nover two lines." in texts(doc, "paragraph")
    setext_body = next(b for b in doc.blocks if b.text == "Setext section body.")
    assert setext_body.section_path == ("Guide", "Usage")


def test_markdown_bad_front_matter_is_recorded_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "broken.md"
    path.write_text("---\ntitle: [unclosed\n---\n# Real Title\n\nBody.\n", encoding="utf-8")
    doc = parse_markdown(path)
    assert "front_matter_error" in doc.metadata
    assert doc.title == "Real Title"
    assert texts(doc) == ["# Real Title", "Body."]


def test_markdown_without_title_falls_back_to_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "release-notes.md"
    path.write_text("## Only a second-level heading\n\ntext\n", encoding="utf-8")
    assert parse_markdown(path).title == "release-notes"


def test_markdown_unclosed_fence_runs_to_end_of_document() -> None:
    doc = parse_markdown("Intro.\n\n~~~\n# inside\n\nstill inside\n")
    assert [b.kind for b in doc.blocks] == ["paragraph", "code"]
    assert doc.blocks[1].text == "~~~\n# inside\n\nstill inside"


# --------------------------------------------------------------------------- DOCX


def test_docx_keeps_tables_in_document_order_with_sections(tmp_path: Path) -> None:
    doc = parse_docx(make_docx(tmp_path / "report.docx"))
    assert doc.title == "Quarterly Report"
    assert doc.metadata["author"] == "Docx Author"
    kinds = [(b.kind, b.text) for b in doc.blocks]
    table_index = next(i for i, (kind, _) in enumerate(kinds) if kind == "table")
    assert kinds[table_index - 1][1] == "The overview paragraph comes before the table."
    assert kinds[table_index + 1][1] == "This paragraph follows the table."
    assert kinds[table_index][1] == "Metric | Value\nUptime | 99.9%\nLatency | 12 ms"
    table = doc.blocks[table_index]
    assert table.section_path == ("Overview",)
    bullets = [b for b in doc.blocks if b.kind == "list_item" and "bullet" in b.text]
    steps = [b.text for b in doc.blocks if b.kind == "list_item" and "bullet" not in b.text]
    assert steps == ["1. Open the lid.", "2. Press reset."]  # a numbered step stays a step
    assert [b.text for b in bullets] == ["\u2022 First bullet", "\u2022 Second bullet"]  # the marker a reader sees
    assert bullets[0].section_path == ("Overview", "Details")
    closing = next(b for b in doc.blocks if b.text == "Closing words.")
    assert closing.section_path == ("Appendix",)
    details = next(b for b in doc.blocks if b.text == "Details")
    assert details.kind == "heading" and details.heading_level == 2
    assert details.section_path == ("Overview", "Details")
    assert_block_spans_match_page_text(doc)


def test_docx_that_is_not_a_zip_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "binary.docx").write_bytes(bytes(range(1, 256)) * 4)
    with pytest.raises(CorruptFileError, match="ZIP"):
        parse_file(tmp_path / "binary.docx")
    (tmp_path / "notes.docx").write_text("just some notes typed into a file", encoding="utf-8")
    with pytest.raises(WrongExtensionError, match="plain text"):
        parse_file(tmp_path / "notes.docx")


def test_docx_zip_without_word_document_is_wrong_extension(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "archive.docx", "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(WrongExtensionError, match="ZIP archive"):
        parse_file(tmp_path / "archive.docx")


def test_docx_in_ole_container_is_password_protected(tmp_path: Path) -> None:
    # Encrypted Office files are OLE compound files holding an "EncryptedPackage" stream.
    header = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 504
    (tmp_path / "locked.docx").write_bytes(header + "EncryptedPackage".encode("utf-16-le") + b"\x00" * 512)
    with pytest.raises(PasswordProtectedError):
        parse_file(tmp_path / "locked.docx")


def test_docx_damaged_zip_is_corrupt(tmp_path: Path) -> None:
    data = make_docx(tmp_path / "ok.docx").read_bytes()
    (tmp_path / "cut.docx").write_bytes(data[: len(data) // 3])
    with pytest.raises(CorruptFileError):
        parse_file(tmp_path / "cut.docx")


# --------------------------------------------------------------------------- HTML


def test_html_drops_page_chrome_and_scripts(tmp_path: Path) -> None:
    path = tmp_path / "widgets.html"
    path.write_text(HTML_PAGE, encoding="utf-8")
    doc = parse_html(path)
    text = doc.pages[0].text
    for marker in ("SCRIPT_MARKER", "STYLE_MARKER", "BANNER_MARKER", "NAV_MARKER", "ROLE_NAV_MARKER",
                   "ASIDE_MARKER", "FOOTER_MARKER", "NOSCRIPT_MARKER"):
        assert marker not in text, marker
    assert "Loose text directly in main." in texts(doc, "paragraph")
    assert "Widgets are small. They spin." in texts(doc, "paragraph")
    assert_block_spans_match_page_text(doc)


def test_html_headings_anchors_and_block_kinds(tmp_path: Path) -> None:
    path = tmp_path / "widgets.html"
    path.write_text(HTML_PAGE, encoding="utf-8")
    doc = parse_html(path, base_url="https://example.org/guide/")
    assert doc.title == "Widget Guide"
    assert doc.metadata["lang"] == "en-GB"
    assert doc.metadata["canonical"] == "https://example.org/docs/widgets"
    headings = [(b.text, b.anchor, b.section_path) for b in doc.blocks if b.kind == "heading"]
    assert headings == [
        ("Widgets", "top", ("Widgets",)),
        ("Installing", "install", ("Widgets", "Installing")),
        ("Legacy anchor", "legacy", ("Widgets", "Legacy anchor")),
        ("FAQ", "faq", ("Widgets", "Legacy anchor", "FAQ")),
        ("No id here", "faq", ("Widgets", "No id here")),  # nearest preceding anchor
    ]
    items = [b for b in doc.blocks if b.kind == "list_item"]
    assert [b.text for b in items] == ["\u2022 Download the widget", "\u2022 Unpack it"]  # the marker a reader sees
    assert items[0].anchor == "install"
    code = next(b for b in doc.blocks if b.kind == "code")
    assert code.text == "pip install widget\n    indented line"
    table = next(b for b in doc.blocks if b.kind == "table")
    assert table.text == "Name | Size\nSmall | 1 cm" and table.anchor == "legacy"
    assert texts(doc, "quote") == ["Quoted wisdom."]


def test_html_list_items_keep_the_marker_a_reader_sees() -> None:
    """Ordered items keep their number (``start`` and ``value`` as browsers count), so a quoted step stays a step;
    an item whose text is in a nested paragraph gets its marker too."""
    doc = parse_html("<main><h1>Steps</h1><ol start='3'><li>Open the lid.</li><li value='7'>Press reset.</li>"
                     "<li><p>Wait.</p></li></ol><ul><li>Any order</li></ul></main>")
    assert [b.text for b in doc.blocks if b.kind == "list_item"] == ["3. Open the lid.", "7. Press reset.",
                                                                      "8. Wait.", "\u2022 Any order"]


def test_html_without_title_uses_first_h1() -> None:
    doc = parse_html("<html><body><div>Lead text</div><h1>Heading One</h1><p>Body</p></body></html>")
    assert doc.title == "Heading One"
    assert texts(doc) == ["Lead text", "Heading One", "Body"]


# --------------------------------------------------------------------------- text


def test_text_paragraphs_and_title(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("Meeting notes\n\nFirst paragraph\ncontinues here.\n\n\n   \nSecond paragraph.\n", encoding="utf-8")
    doc = parse_text(path)
    assert doc.title == "Meeting notes"
    assert texts(doc) == ["Meeting notes", "First paragraph\ncontinues here.", "Second paragraph."]
    assert_block_spans_match_page_text(doc)


def test_text_long_first_line_falls_back_to_stem(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_text("word " * 40 + "\n\nmore\n", encoding="utf-8")
    assert parse_text(path).title == "long"


def test_text_that_is_not_utf8_is_decoded_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "legacy.txt"
    path.write_bytes("Café crème à la carte\n".encode("latin-1"))
    doc = parse_file(path)
    assert doc.blocks[0].text == "Café crème à la carte"
    assert "not valid UTF-8" in str(doc.metadata["encoding_note"])


# --------------------------------------------------------------------------- parse_file gatekeeping


def test_parse_file_dispatches_every_supported_format(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(MARKDOWN_DOC, encoding="utf-8")
    (tmp_path / "b.html").write_text(HTML_PAGE, encoding="utf-8")
    (tmp_path / "c.txt").write_text("Plain\n\ntext", encoding="utf-8")
    make_docx(tmp_path / "d.docx")
    make_outline_pdf(tmp_path / "e.pdf")
    expected = {"a.md": "markdown", "b.html": "html", "c.txt": "text", "d.docx": "docx", "e.pdf": "pdf"}
    for name, doc_type in expected.items():
        assert detect_type(tmp_path / name) == doc_type
        doc = parse_file(tmp_path / name)
        assert doc.doc_type == doc_type
        assert_block_spans_match_page_text(doc)
    assert set(SUPPORTED_EXTENSIONS) == {".pdf", ".md", ".markdown", ".docx", ".html", ".htm", ".txt", ".text"}


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "empty.md").write_bytes(b"")
    with pytest.raises(EmptyFileError, match="file is empty"):
        parse_file(tmp_path / "empty.md")


def test_whitespace_only_file_is_rejected_as_empty(tmp_path: Path) -> None:
    for name in ("blank.txt", "blank.pdf"):
        (tmp_path / name).write_bytes(b"  \n\t\r\n   \n")
        with pytest.raises(EmptyFileError, match="file is empty"):
            parse_file(tmp_path / name)


def test_pdf_extension_with_text_content_is_wrong_extension(tmp_path: Path) -> None:
    (tmp_path / "report.pdf").write_text("This is really a text file.\n", encoding="utf-8")
    with pytest.raises(WrongExtensionError) as caught:
        parse_file(tmp_path / "report.pdf")
    assert caught.value.reason == "extension .pdf does not match the content, which looks like plain text"


def test_pdf_extension_with_html_content_is_wrong_extension(tmp_path: Path) -> None:
    (tmp_path / "download.pdf").write_text("<!DOCTYPE html><html><body>Login required</body></html>")
    with pytest.raises(WrongExtensionError, match="HTML page"):
        parse_file(tmp_path / "download.pdf")


def test_unsupported_extension_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    with pytest.raises(UnsupportedTypeError) as caught:
        parse_file(tmp_path / "photo.png")
    assert caught.value.reason.startswith("unsupported file type '.png'; supported: .pdf")


def test_oversize_file_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_text("x" * 5000, encoding="utf-8")
    with pytest.raises(OversizeFileError) as caught:
        parse_file(path, max_bytes=1024)
    assert caught.value.reason == "file is 4.9 KB, over the 1 KB limit"


def test_oversize_reason_uses_megabytes(tmp_path: Path) -> None:
    path = tmp_path / "big.pdf"
    with open(path, "wb") as handle:  # sparse file: 62.3 MB without writing it
        handle.truncate(int(62.3 * 1024 * 1024))
    with pytest.raises(OversizeFileError) as caught:
        parse_file(path)
    assert caught.value.reason == "file is 62.3 MB, over the 50 MB limit"


def test_binary_content_in_text_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_bytes(b"\x00\x01\x02binary\x00" * 50)
    with pytest.raises(CorruptFileError, match="binary"):
        parse_file(tmp_path / "data.txt")
    make_outline_pdf(tmp_path / "paper.pdf")
    (tmp_path / "paper.md").write_bytes((tmp_path / "paper.pdf").read_bytes())
    with pytest.raises(WrongExtensionError, match="PDF"):
        parse_file(tmp_path / "paper.md")


def test_missing_file_raises_an_ingestion_error(tmp_path: Path) -> None:
    with pytest.raises(IngestionError, match="does not exist"):
        parse_file(tmp_path / "gone.pdf")


def test_markup_without_text_raises_no_text(tmp_path: Path) -> None:
    (tmp_path / "shell.html").write_text("<html><head><script>x=1</script></head><body><nav>Menu</nav></body></html>")
    with pytest.raises(NoTextError):
        parse_file(tmp_path / "shell.html")


@pytest.mark.parametrize("suffix", [".pdf", ".docx", ".md", ".html", ".txt"])
def test_parse_file_only_ever_raises_typed_errors(tmp_path: Path, suffix: str) -> None:
    payloads = [
        b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF",
        b"PK\x03\x04" + b"\x00" * 100,
        bytes(range(256)) * 3,
        "\ufeff# Titel\n\nKörper".encode("utf-8"),
        b"<html><body><table><tr><td><pre>" * 50,
    ]
    for index, payload in enumerate(payloads):
        path = tmp_path / f"fuzz{index}{suffix}"
        path.write_bytes(payload)
        try:
            parse_file(path)
        except IngestionError as exc:
            assert exc.reason and "Traceback" not in exc.reason


# --------------------------------------------------------------------------- real shared PDFs


def _shared_pdf(name: str) -> Path:
    path = SHARED_PDFS / name
    if not path.exists():
        pytest.skip(f"shared dataset not available: {path} (expected ../shared/datasets next to the repo)")
    return path


@pytest.mark.parametrize("name", ["project-history.en.pdf", "R-intro.pdf"])
def test_real_pdf_blocks_sit_on_their_own_page(name: str) -> None:
    path = _shared_pdf(name)
    doc = parse_file(path)
    reference = pymupdf.open(path)
    count = reference.page_count
    assert [page.page_number for page in doc.pages] == list(range(1, count + 1))
    assert_block_spans_match_page_text(doc)

    page_texts = [normalise(reference[index].get_text()) for index in range(count)]
    sample = sorted({2, count // 4, count // 2, (3 * count) // 4, count - 1})
    checked = 0
    for number in sample:
        far = page_texts[(number - 1 + count // 2) % count]
        for block in doc.blocks:
            if block.page_number != number:
                continue
            text = normalise(block.text)
            assert text in page_texts[number - 1], (number, block.text[:80])
            if len(text) >= 60:
                assert text not in far, (number, block.text[:80])
                checked += 1
    assert checked >= 5


def test_real_pdf_outline_sections_and_header_removal() -> None:
    path = _shared_pdf("project-history.en.pdf")
    doc = parse_file(path)
    beginning = next(b for b in doc.blocks if b.kind == "heading" and b.section_path[-1] == "In the Beginning")
    assert beginning.page_number == 7
    assert beginning.section_path == ("Introduction -- What is the Debian Project?", "In the Beginning")
    after = doc.blocks[doc.blocks.index(beginning) + 1]
    assert after.section_path[-1] == "In the Beginning" and after.text.startswith("The Debian Project was officially")
    # The running header "A Brief History of Debian  N / 21" is gone from body pages.
    assert all("A Brief History of Debian" not in page.text for page in doc.pages[6:])
    assert doc.title == "A Brief History of Debian"


def test_real_two_column_newsletter_reads_left_column_first() -> None:
    doc = parse_file(_shared_pdf("ltnews.pdf"))
    text = doc.page(5).text
    left_bottom = text.index("Processing documents with LATEX2ε")
    right_top = text.index("Unfortunately, this will not always work")
    assert text.index("Welcome to LATEX News") < left_bottom < right_top < text.index("New packages")


# --------------------------------------------------------------------------- more gatekeeping


def test_legacy_word_doc_is_unsupported(tmp_path: Path) -> None:
    (tmp_path / "old.doc").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 600)
    with pytest.raises(UnsupportedTypeError, match="re-save the file as .docx"):
        parse_file(tmp_path / "old.doc")
    ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 504 + "WordDocument".encode("utf-16-le") + b"\x00" * 256
    (tmp_path / "renamed.docx").write_bytes(ole)
    with pytest.raises(UnsupportedTypeError, match="legacy Word"):
        parse_file(tmp_path / "renamed.docx")


def test_unexpected_parser_exception_becomes_corrupt_file_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import knowledge_store.ingest.parsers.markdown as markdown_module

    def explode(path: object) -> ParsedDocument:
        raise ValueError("parser library blew up")

    monkeypatch.setattr(markdown_module, "parse_markdown", explode)
    (tmp_path / "note.md").write_text("# Hi\n\ntext\n", encoding="utf-8")
    with pytest.raises(CorruptFileError) as caught:
        parse_file(tmp_path / "note.md")
    assert caught.value.reason == "the markdown parser could not read the file: parser library blew up"


# Trimmed from what real documentation generators emit (the structure, not the prose).
SPHINX_RTD_PAGE = """<!DOCTYPE html><html><head><title>Configuration &mdash; Example 2.1 documentation</title></head>
<body class="wy-body-for-nav"><div class="wy-grid-for-nav">
<nav data-toggle="wy-nav-shift" class="wy-nav-side"><div class="wy-side-scroll">SIDEBAR_MARKER</div></nav>
<section data-toggle="wy-nav-shift" class="wy-nav-content-wrap">
<div class="wy-nav-content"><div class="rst-content">
<div role="navigation" aria-label="Page navigation"><ul class="wy-breadcrumbs"><li>BREADCRUMB_MARKER</li></ul></div>
<div role="main" class="document" itemscope="itemscope">
<div itemprop="articleBody">
<section id="configuration"><h1>Configuration<a class="headerlink" href="#configuration" title="Permalink">¶</a></h1>
<p>Settings are read from <code class="docutils literal">example.toml</code> at start-up.</p>
<section id="timeouts"><h2>Timeouts<a class="headerlink" href="#timeouts">¶</a></h2>
<p>The request timeout defaults to 30 seconds.</p>
<div class="highlight-python notranslate"><div class="highlight"><pre>client = Client(timeout=30)</pre></div></div>
</section></section></div></div>
<footer><div class="rst-footer-buttons" role="navigation">PREV_NEXT_MARKER</div><p>FOOTER_MARKER</p></footer>
</div></div></section></div></body></html>"""

DOCUSAURUS_PAGE = """<!doctype html><html><head><title>Install | Example</title></head><body>
<div id="__docusaurus"><nav class="navbar">NAVBAR_MARKER</nav>
<div class="main-wrapper"><div class="docsWrapper"><aside class="theme-doc-sidebar-container">SIDEBAR_MARKER</aside>
<main class="docMainContainer"><div class="container"><div class="row"><div class="col">
<nav aria-label="Breadcrumbs">BREADCRUMB_MARKER</nav>
<article><div class="theme-doc-markdown markdown"><header><h1>Install</h1></header>
<h2 class="anchor" id="requirements">Requirements<a href="#requirements" class="hash-link" aria-label="Direct link to Requirements">&#8203;</a></h2>
<p>Node 18 or newer is required.</p>
<div class="codeBlockContainer"><pre><code>npm install example</code></pre>
<button type="button" aria-label="Copy code to clipboard" class="copyButton">COPY_BUTTON_MARKER</button></div>
</div><footer class="theme-doc-footer"><a href="https://github.com/x/edit">EDIT_MARKER</a></footer></article>
<nav class="pagination-nav">PAGINATION_MARKER</nav>
</div><div class="col col--3"><div class="tableOfContents">TOC_MARKER</div></div></div></div></main></div></div>
<footer class="footer">SITE_FOOTER_MARKER</footer></div></body></html>"""


def test_html_from_a_sphinx_read_the_docs_theme_keeps_only_the_article() -> None:
    doc = parse_html(SPHINX_RTD_PAGE)
    text = doc.pages[0].text
    for marker in ("SIDEBAR_MARKER", "BREADCRUMB_MARKER", "PREV_NEXT_MARKER", "FOOTER_MARKER", "¶"):
        assert marker not in text, marker
    headings = [(b.text, b.anchor) for b in doc.blocks if b.kind == "heading"]
    assert headings == [("Configuration", "configuration"), ("Timeouts", "timeouts")]
    assert "The request timeout defaults to 30 seconds." in texts(doc, "paragraph")
    assert "client = Client(timeout=30)" in texts(doc, "code")
    assert_block_spans_match_page_text(doc)


def test_html_from_docusaurus_drops_copy_buttons_toc_and_permalinks() -> None:
    doc = parse_html(DOCUSAURUS_PAGE)
    text = doc.pages[0].text
    for marker in ("NAVBAR_MARKER", "SIDEBAR_MARKER", "BREADCRUMB_MARKER", "COPY_BUTTON_MARKER",
                   "PAGINATION_MARKER", "TOC_MARKER", "SITE_FOOTER_MARKER", "\u200b"):
        assert marker not in text, marker
    headings = [(b.text, b.anchor) for b in doc.blocks if b.kind == "heading"]
    assert ("Requirements", "requirements") in headings
    assert "npm install example" in texts(doc, "code")
    assert_block_spans_match_page_text(doc)


def test_an_empty_single_page_app_shell_says_it_needs_javascript(tmp_path: Path) -> None:
    from knowledge_store.core.errors import NoTextError
    from knowledge_store.ingest.parsers import parse_file

    shell = tmp_path / "index.html"
    shell.write_text('<!doctype html><html><head><title>Docs</title><script src="/assets/app.js" defer></script>'
                     '</head><body><div id="root"></div><noscript>Enable JavaScript</noscript></body></html>')
    with pytest.raises(NoTextError, match="no text until JavaScript runs"):
        parse_file(shell)
    plain = tmp_path / "empty.html"
    plain.write_text("<html><head><title>x</title></head><body><p> </p></body></html>")
    with pytest.raises(NoTextError, match="only markup"):
        parse_file(plain)
