"""Links written in a document, located in its page text.

Parsers keep every link an author wrote (Markdown inline and reference links,
HTML ``<a href>``, DOCX hyperlinks) with its link text and where that text sits
in the page, unresolved: whether a link points at another document of the store
is only known once every document is recorded, so the publish stage resolves
them into ``seeAlso`` relations (``knowledge_store.ingest.relations``) whose
evidence is the phrase, the page and the span.  ``web/links.py`` is a different
thing: the crawler's list of URLs to follow, without text or positions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from knowledge_store.ingest.documents import Block, DocumentLink
from knowledge_store.ingest.parsers.text import plain_inline

# links that can never name a document of the store
_SKIPPED_SCHEMES = ("mailto:", "javascript:", "tel:", "data:", "sms:", "ftp:")
# a document with more links than this keeps the first ones (a generated link farm is not evidence)
MAX_LINKS_PER_DOCUMENT = 2000
MAX_LINK_TEXT_CHARS = 300

_MD_INLINE = re.compile(
    r"(?<!!)\[((?:[^\[\]\n]|\[[^\]\n]*\])*)\]\(\s*(?:<([^>\n]*)>|([^)\s]+))(?:\s+[\"'(][^)\n]*)?\s*\)"
)
_MD_REFERENCE_USE = re.compile(r"(?<!!)\[((?:[^\[\]\n]|\[[^\]\n]*\])+)\]\[([^\]\n]*)\]")
_MD_REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[([^\]\n]+)\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_SPACES = re.compile(r"\s+")


def followable(href: str | None) -> bool:
    """True for a link that could name another document: not empty, not an in-page ``#anchor``,
    not mail/script/phone/data."""
    if not href:
        return False
    href = href.strip()
    return bool(href) and not href.startswith("#") and not href.lower().startswith(_SKIPPED_SCHEMES)


def _phrase(text: str) -> str:
    return _SPACES.sub(" ", text).strip()[:MAX_LINK_TEXT_CHARS]


def locate_links(page_text: str, page_number: int, found: Iterable[tuple[str, str]]) -> list[DocumentLink]:
    """Links given in reading order as (href, text), located in ``page_text``.

    Each text is searched from where the previous one was found (the same words
    can appear earlier as plain text), then anywhere; a text that is not in the
    page (an image link) keeps no span."""
    links: list[DocumentLink] = []
    cursor = 0
    for href, text in found:
        if not followable(href) or len(links) >= MAX_LINKS_PER_DOCUMENT:
            continue
        phrase = _phrase(text)
        start = page_text.find(phrase, cursor) if phrase else -1
        if start < 0 and phrase:
            start = page_text.find(phrase)
        if start >= 0:
            cursor = start + len(phrase)
            links.append(DocumentLink(href.strip(), phrase, page_number, start, start + len(phrase)))
        else:
            links.append(DocumentLink(href.strip(), phrase, page_number))
    return links


def markdown_links(page_text: str, blocks: Sequence[Block], page_number: int = 1) -> list[DocumentLink]:
    """Inline ``[text](href)`` and reference ``[text][ref]`` links of a Markdown page, outside code blocks;
    the span is the link text's (between the brackets) in the page text."""
    code = [(b.char_start, b.char_end) for b in blocks if b.kind == "code" and b.page_number == page_number]

    def in_code(position: int) -> bool:
        return any(start <= position < end for start, end in code)

    definitions = {label.strip().lower(): url for label, url in _MD_REFERENCE_DEFINITION.findall(page_text)}
    found: list[tuple[int, DocumentLink]] = []
    for match in _MD_INLINE.finditer(page_text):
        href = match.group(2) or match.group(3)
        if in_code(match.start()) or not followable(href):
            continue
        found.append((match.start(1), DocumentLink(href.strip(), _phrase(plain_inline(match.group(1))), page_number,
                                                   match.start(1), match.end(1))))
    for match in _MD_REFERENCE_USE.finditer(page_text):
        href = definitions.get((match.group(2) or match.group(1)).strip().lower())
        if in_code(match.start()) or not followable(href):
            continue
        found.append((match.start(1), DocumentLink(str(href).strip(), _phrase(plain_inline(match.group(1))),
                                                   page_number, match.start(1), match.end(1))))
    found.sort(key=lambda pair: pair[0])
    return [link for _, link in found[:MAX_LINKS_PER_DOCUMENT]]
