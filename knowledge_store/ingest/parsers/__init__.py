"""File parsers: one entry point, ``parse_file``, that either returns a
``ParsedDocument`` or raises one of the typed ``IngestionError`` subclasses.

The cheap checks (size, emptiness, extension, magic bytes) run before any
parser library touches the file, so a 2 GB video renamed ``.pdf`` is refused
in microseconds and with a sentence a user can act on.  Whatever a parser
library throws beyond that is turned into ``CorruptFileError``: ingestion of a
folder must record a failure row and move on, never die on a traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

from knowledge_store.core.errors import (
    CorruptFileError,
    EmptyFileError,
    FileReadError,
    IngestionError,
    NoTextError,
    OversizeFileError,
)
from knowledge_store.ingest.documents import ParsedDocument
from knowledge_store.ingest.parsers import docx as docx_parser
from knowledge_store.ingest.parsers import html as html_parser
from knowledge_store.ingest.parsers import markdown as markdown_parser
from knowledge_store.ingest.parsers import text as text_parser
from knowledge_store.ingest.parsers.detect import SUPPORTED_EXTENSIONS, detect_type
from knowledge_store.ingest.parsers.ocr import OcrOptions
from knowledge_store.ingest.retry import TRANSIENT_ERRNOS

__all__ = ["DEFAULT_MAX_BYTES", "SUPPORTED_EXTENSIONS", "OcrOptions", "detect_type", "parse_file"]

DEFAULT_MAX_BYTES = 50 * 1024 * 1024
_WHITESPACE_BYTES = b" \t\r\n\x0b\x0c"
_SCAN_CHUNK = 64 * 1024


def format_size(num_bytes: float) -> str:
    """"62.3 MB", "50 MB", "512 bytes": what a person expects to read."""
    if num_bytes < 1024:
        return f"{int(num_bytes)} bytes"
    for unit, scale in (("KB", 1024), ("MB", 1024**2), ("GB", 1024**3)):
        value = num_bytes / scale
        if value < 1024 or unit == "GB":
            text = f"{value:.1f}"
            return f"{text[:-2] if text.endswith('.0') else text} {unit}"
    raise AssertionError("unreachable")


def _is_blank(path: Path) -> bool:
    """True when the file holds only whitespace (a BOM counts as whitespace).

    Reads in chunks and stops at the first real byte, so it is cheap for
    normal files whatever their size.
    """
    with open(path, "rb") as handle:
        first = True
        while chunk := handle.read(_SCAN_CHUNK):
            if first:
                chunk = chunk.removeprefix(b"\xef\xbb\xbf")
                first = False
            if chunk.strip(_WHITESPACE_BYTES):
                return False
    return True


def _parser_for(doc_type: str, ocr: OcrOptions | None = None) -> Callable[[Path], ParsedDocument]:
    # the parser modules' functions are looked up per call, so a replaced one (tests) is the one used
    if doc_type == "pdf":
        # a text-only ingestion does not pay for PyMuPDF
        from knowledge_store.ingest.parsers.pdf import parse_pdf  # noqa: PLC0415 - PyMuPDF, ~1 s to import

        return partial(parse_pdf, ocr=ocr)
    if doc_type == "markdown":
        return markdown_parser.parse_markdown
    if doc_type == "docx":
        return docx_parser.parse_docx
    if doc_type == "html":
        return html_parser.parse_html
    return text_parser.parse_text


def _check_size(path: Path, max_bytes: int) -> None:
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise IngestionError(path, "the file does not exist (it may have been moved or deleted)") from None
    except OSError as exc:
        if exc.errno in TRANSIENT_ERRNOS:
            raise FileReadError(path, f"reading the file failed: {exc.strerror or exc}", errno=exc.errno) from exc
        raise IngestionError(path, f"the file cannot be read: {exc.strerror or exc}") from None
    if not path.is_file():
        raise IngestionError(path, "this is not a regular file")
    if size > max_bytes:
        raise OversizeFileError(path, f"file is {format_size(size)}, over the {format_size(max_bytes)} limit")
    if size == 0:
        raise EmptyFileError(path, "file is empty")


def parse_file(path: Path | str, max_bytes: int = DEFAULT_MAX_BYTES, ocr: OcrOptions | None = None) -> ParsedDocument:
    """Parse any supported file, or raise a typed ``IngestionError``.

    Order matters: size first (never read a file we will refuse), then
    emptiness, then type, then content.  ``IngestionError`` (the base class)
    is only used for files that cannot be read at all (missing, a folder,
    permission denied); everything else gets its specific subclass.
    ``ocr`` applies to PDF pages without a text layer (None: ``OcrOptions()``
    defaults); an OCR time-out is an ``OcrTimeoutError``.
    """
    path = Path(path)
    _check_size(path, max_bytes)
    doc_type = path.suffix.lower().lstrip(".") or "file"
    try:
        if _is_blank(path):
            raise EmptyFileError(path, "file is empty (it contains only whitespace)")
        doc_type = detect_type(path)
        parsed = _parser_for(doc_type, ocr)(path)
    except IngestionError:
        raise
    except OSError as exc:
        if exc.errno in TRANSIENT_ERRNOS:  # the device or network file system hiccuped: worth another attempt
            raise FileReadError(path, f"reading the file failed: {exc.strerror or exc}", errno=exc.errno) from exc
        raise IngestionError(path, f"the file cannot be read: {exc.strerror or exc}") from exc
    except RecursionError:
        raise CorruptFileError(path, "the file is nested too deeply to parse") from None
    except MemoryError:
        raise CorruptFileError(path, "the file needs more memory to parse than is available") from None
    except Exception as exc:  # any parser-library failure is a damaged file to the user
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # chained: the failure row's traceback shows where in the parser library it broke
        raise CorruptFileError(path, f"the {doc_type} parser could not read the file: {detail[:300]}") from exc
    if not any(block.text.strip() for block in parsed.blocks):
        if doc_type == "html" and _looks_like_script_rendered(path):
            raise NoTextError(path, "the page has no text until JavaScript runs (a single-page-app shell); Groundwork "
                                    "does not run scripts - index the site's llms.txt, llms-full.txt or a static/"
                                    "server-rendered version of the docs instead")
        raise NoTextError(path, "the file has no text content to index (only markup, scripts or metadata)")
    return parsed


_APP_ROOTS = re.compile(rb"<(?:div|main)[^>]+id=[\"']?(?:root|app|__next|__nuxt|___gatsby|svelte)[\"' >]", re.I)


def _looks_like_script_rendered(path: Path) -> bool:
    """An empty page that loads scripts into an app root: content rendered client-side."""
    head = path.read_bytes()[:262144]
    return b"<script" in head.lower() and bool(_APP_ROOTS.search(head))
