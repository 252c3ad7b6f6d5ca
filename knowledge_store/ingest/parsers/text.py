"""Plain-text files: decode robustly, split paragraphs on blank lines.

Also home of ``decode_text`` / ``read_source``, which the Markdown and HTML
parsers reuse so every text format decodes the same way.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from knowledge_store.core.text import plain_inline
from knowledge_store.ingest.documents import PageBuilder, ParsedDocument

_BLANK_LINE = re.compile(r"\n[ \t\f\v]*\n")
TITLE_MAX_CHARS = 100
UNTITLED = "untitled"


def decode_text(data: bytes) -> tuple[str, dict[str, object]]:
    """Decode bytes as UTF-8 (BOM-aware), else Windows-1252, else Latin-1.

    Returns the text with newlines normalised to ``\\n`` and metadata saying
    which encoding was used; a non-UTF-8 fallback adds an ``encoding_note``
    because some characters may then be wrong and a reader should know why.
    Windows-1252 is tried before Latin-1 because it is what "Latin-1" files
    written on Windows really are (curly quotes live in 0x80-0x9F).
    """
    metadata: dict[str, object] = {}
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = data.decode("utf-16", errors="replace")
        metadata["encoding"] = "utf-16"
    else:
        try:
            text = data.decode("utf-8-sig")
            metadata["encoding"] = "utf-8"
        except UnicodeDecodeError:
            try:
                text = data.decode("cp1252")
                metadata["encoding"] = "windows-1252"
            except UnicodeDecodeError:
                text = data.decode("latin-1")
                metadata["encoding"] = "latin-1"
            metadata["encoding_note"] = (
                f"the file is not valid UTF-8; it was decoded as {metadata['encoding']}, "
                "so a few characters may be wrong"
            )
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return text, metadata


def read_source(path_or_text: str | os.PathLike[str]) -> tuple[str, dict[str, object], str]:
    """Accept a path (``os.PathLike``) or the document text itself (``str``).

    Returns ``(text, metadata, stem)``; ``stem`` is the fallback title, the
    file stem for a path and ``"untitled"`` for literal text.  A ``str`` is
    always treated as content: guessing "is this a file name?" would make the
    same call behave differently depending on the current directory.
    """
    if isinstance(path_or_text, os.PathLike):
        path = Path(path_or_text)
        text, metadata = decode_text(path.read_bytes())
        return text, metadata, path.stem
    return path_or_text.replace("\r\n", "\n").replace("\r", "\n"), {}, UNTITLED


def short_title(text: str) -> str | None:
    """The first non-blank line, when it is short enough to be a title."""
    for line in text.split("\n"):
        line = line.strip()
        if line:
            return line if len(line) < TITLE_MAX_CHARS else None
    return None


def parse_text(path_or_text: str | os.PathLike[str]) -> ParsedDocument:
    """One page, one paragraph block per blank-line-separated chunk of text."""
    text, metadata, stem = read_source(path_or_text)
    builder = PageBuilder(1)
    for paragraph in _BLANK_LINE.split(text):
        builder.add("paragraph", paragraph.rstrip())
    return ParsedDocument(
        title=short_title(text) or stem,
        doc_type="text",
        pages=[builder.page()],
        blocks=builder.blocks,
        paginated=False,
        metadata=metadata,
    )


def count_words(text: str) -> int:
    """Words a reader sees in a block of Markdown or text: inline markup and link targets dropped, and only
    tokens with a letter or digit counted (list bullets, ``#`` and table rules are not words)."""
    return sum(1 for token in plain_inline(text).split() if any(c.isalnum() for c in token))
