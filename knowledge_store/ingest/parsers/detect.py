"""Decide how a file must be parsed, trusting its bytes over its name.

The extension says what the user *thinks* the file is; the first bytes say
what it *is*.  A mismatch is reported as its own error (``WrongExtensionError``)
because the fix is different from a damaged file: rename it, or re-export it.
Only the head of the file is read here (plus the ZIP directory for ``.docx``),
so detection stays cheap even for large files.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from knowledge_store.core.errors import (
    CorruptFileError,
    PasswordProtectedError,
    UnsupportedTypeError,
    WrongExtensionError,
)

EXTENSION_TYPES: dict[str, str] = {
    ".pdf": "pdf",
    ".md": "markdown",
    ".markdown": "markdown",
    ".docx": "docx",
    ".html": "html",
    ".htm": "html",
    ".txt": "text",
    ".text": "text",
}

SUPPORTED_EXTENSIONS: tuple[str, ...] = tuple(EXTENSION_TYPES)

# The media type a file of each type is served as (the API's original-file route).  Markdown and
# text as text/plain: browsers show that inline, where text/markdown would be downloaded.
MEDIA_TYPES: dict[str, str] = {
    "pdf": "application/pdf",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "html": "text/html",
    "markdown": "text/plain",
    "text": "text/plain",
}


def media_type_of(path: Path | str) -> str | None:
    """The media type a supported file is served as, from its extension; None for other files."""
    doc_type = EXTENSION_TYPES.get(Path(path).suffix.lower())
    return MEDIA_TYPES[doc_type] if doc_type else None

# Extensions we recognise but cannot parse, with the advice a user needs.
_UNSUPPORTED_ADVICE: dict[str, str] = {
    ".doc": "legacy Word 97-2003 .doc files are not supported; re-save the file as .docx",
    ".rtf": "RTF files are not supported; re-save the file as .docx",
    ".odt": "OpenDocument .odt files are not supported; re-save the file as .docx",
}

HEAD_BYTES = 8192

_CFB_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_BINARY_MAGICS: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"\x7fELF", "an executable program"),
    (b"MZ", "a Windows executable"),
    (b"{\\rtf", "an RTF document"),
)
_HTML_SNIFF = re.compile(
    rb"^\s*(<!--.*?-->\s*)*(<!doctype\s+html|<html[\s>]|<head[\s>]|<body[\s>])",
    re.IGNORECASE | re.DOTALL,
)
_TEXT_CONTROL_OK = {9, 10, 12, 13, 27}  # tab, LF, FF, CR, ESC (ANSI colours in logs)


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(size)


def is_pdf(head: bytes, lenient: bool = False) -> bool:
    """PDF readers accept up to 1 KB of junk before ``%PDF-``; so do we when
    the extension already says PDF (``lenient``).  Otherwise the header must
    come first, so a text file that merely mentions "%PDF-" is still text."""
    if lenient:
        return b"%PDF-" in head[:1024]
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"%PDF-")


def is_zip(head: bytes) -> bool:
    return head.startswith((b"PK\x03\x04", b"PK\x05\x06"))


def is_cfb(head: bytes) -> bool:
    return head.startswith(_CFB_MAGIC)


def looks_like_html(head: bytes) -> bool:
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    return bool(_HTML_SNIFF.match(head[:2048]))


def _valid_utf8_prefix(head: bytes) -> bool:
    """True when ``head`` is UTF-8, tolerating a character cut at the end."""
    try:
        head.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data" and exc.start >= len(head) - 3


def looks_like_text(head: bytes) -> bool:
    """Heuristic used for text formats: no NUL bytes and few control bytes.

    Non-UTF-8 text (Latin-1, Windows-1252) still counts as text; the text
    parser decodes it with a note.  UTF-16 with a byte-order mark is text too.
    """
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    if b"\x00" in head:
        return False
    if _valid_utf8_prefix(head):
        return True
    controls = sum(1 for byte in head if byte < 32 and byte not in _TEXT_CONTROL_OK)
    return controls <= max(1, len(head) // 100)


def describe_content(path: Path, head: bytes) -> str | None:
    """A short noun phrase for what the bytes are, or None when unknown binary."""
    if is_pdf(head):
        return "a PDF document"
    if is_zip(head):
        try:
            with zipfile.ZipFile(path) as archive:
                names = set(archive.namelist())
        except (zipfile.BadZipFile, OSError, ValueError):
            return "a ZIP archive"
        if "word/document.xml" in names:
            return "a Word .docx document"
        if "xl/workbook.xml" in names:
            return "an Excel .xlsx workbook"
        if "ppt/presentation.xml" in names:
            return "a PowerPoint .pptx presentation"
        if "content.xml" in names:
            return "an OpenDocument file"
        return "a ZIP archive"
    if is_cfb(head):
        return "a Microsoft Office (OLE) file"
    for magic, label in _BINARY_MAGICS:
        if head.startswith(magic):
            return label
    if looks_like_html(head):
        return "an HTML page"
    if looks_like_text(head):
        return "plain text"
    return None


def _wrong(path: Path, ext: str, what: str) -> WrongExtensionError:
    return WrongExtensionError(path, f"extension {ext} does not match the content, which looks like {what}")


def _detect_pdf(path: Path, ext: str, head: bytes) -> str:
    if is_pdf(head, lenient=True):
        return "pdf"
    what = describe_content(path, head)
    if what is None:
        raise CorruptFileError(path, "the file does not start with a PDF header (%PDF-); it is damaged or not a PDF")
    raise _wrong(path, ext, what)


def _cfb_streams(path: Path) -> bytes:
    """The raw bytes of an OLE file, enough to look for stream names in its directory."""
    with open(path, "rb") as handle:
        return handle.read(4 * 1024 * 1024)


def _detect_docx(path: Path, ext: str, head: bytes) -> str:
    if is_cfb(head):
        data = _cfb_streams(path)
        if "WordDocument".encode("utf-16-le") in data and "EncryptedPackage".encode("utf-16-le") not in data:
            raise UnsupportedTypeError(
                path,
                "this is a legacy Word 97-2003 .doc file with a .docx extension; "
                "only .docx is supported, re-save it as .docx",
            )
        raise PasswordProtectedError(path, "the Word document is password-protected (encrypted)")
    if is_zip(head):
        try:
            with zipfile.ZipFile(path) as archive:
                names = set(archive.namelist())
        except (zipfile.BadZipFile, OSError, ValueError):
            raise CorruptFileError(path, "the .docx file is damaged: its ZIP structure cannot be read") from None
        if "word/document.xml" in names:
            return "docx"
        raise _wrong(path, ext, describe_content(path, head) or "a ZIP archive")
    what = describe_content(path, head)
    if what is None:
        raise CorruptFileError(path, "a .docx file must be a ZIP archive and this one is not; it is damaged or not a Word document")
    raise _wrong(path, ext, what)


def _detect_textual(path: Path, ext: str, head: bytes, doc_type: str) -> str:
    what = describe_content(path, head)
    if what in ("plain text", "an HTML page"):
        return doc_type
    if what is None:
        raise CorruptFileError(path, "the file contains binary data, not text; it is damaged or not a text file")
    raise _wrong(path, ext, what)


def detect_type(path: Path | str) -> str:
    """Return "pdf", "markdown", "docx", "html" or "text" for ``path``.

    Raises ``UnsupportedTypeError`` for an extension we do not parse,
    ``WrongExtensionError`` when the bytes are clearly another format,
    ``PasswordProtectedError`` for an encrypted .docx (Office stores those in
    an OLE container) and ``CorruptFileError`` for unrecognisable bytes.
    """
    path = Path(path)
    ext = path.suffix.lower()
    doc_type = EXTENSION_TYPES.get(ext)
    if doc_type is None:
        advice = _UNSUPPORTED_ADVICE.get(ext)
        shown = ext or "(no extension)"
        reason = advice or f"unsupported file type '{shown}'; supported: {', '.join(SUPPORTED_EXTENSIONS)}"
        raise UnsupportedTypeError(path, reason)
    head = read_head(path)
    if doc_type == "pdf":
        return _detect_pdf(path, ext, head)
    if doc_type == "docx":
        return _detect_docx(path, ext, head)
    return _detect_textual(path, ext, head, doc_type)
