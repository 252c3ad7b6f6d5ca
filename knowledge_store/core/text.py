"""Text utilities every layer shares: the two ways the product cuts text into sentences, and markup removal.

- ``plain_inline``: text without Markdown/HTML inline markup, as a reader sees it (heading names, slugs, word
  counts at ingestion; quoted sentences of extractive answers).
- ``sentence_spans``: exact character spans of a text's sentences (abbreviation-aware), for chunking
  (units never cut), snippets, extractive answers and grounding, which all point back into the text.
- ``sentences_to_embed``: the sentences embedded one by one for sentence evidence (``retrieval/sentences.py``):
  short pieces joined, long runs cut, so each has enough words to mean something and none is too long.

They differ on purpose: spans must be exact offsets of whatever a sentence is; embedded sentences must be
useful units.  Changing either changes stored data (chunk boundaries, or the sentence vectors' texts).
"""

from __future__ import annotations

import html
import re
import unicodedata
from functools import lru_cache

_ABBREVIATIONS = {
    "e.g.", "i.e.", "etc.", "vs.", "fig.", "figs.", "eq.", "no.", "dr.", "mr.", "mrs.", "ms.",
    "prof.", "sec.", "ch.", "vol.", "approx.", "cf.", "al.", "st.", "inc.", "ltd.", "jr.", "sr.",
}
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])|\n\s*\n")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences in ``text`` (abbreviation-aware, offsets exact)."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        end = match.start()
        candidate = text[start:end]
        last_word = candidate.rsplit(None, 1)[-1].lower() if candidate.split() else ""
        if last_word in _ABBREVIATIONS or re.fullmatch(r"[a-z]\.", last_word):
            continue
        if candidate.strip():
            spans.append(trim_span(text, start, end))
        start = match.end()
    if text[start:].strip():
        spans.append(trim_span(text, start, len(text)))
    return spans


def trim_span(text: str, start: int, end: int) -> tuple[int, int]:
    """Shrink ``[start, end)`` past leading and trailing whitespace of ``text``."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


SENTENCE_MIN_WORDS = 4  # shorter pieces ("See below.", "- foo") join the next sentence
SENTENCE_MAX_WORDS = 60  # longer runs (code, tables) are cut into windows of this many words
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])|\n\s*\n|\n(?=\s*[-*]\s)")


def sentences_to_embed(text: str) -> list[str]:
    """A chunk text's sentences, in order: sentence ends, blank lines and list items split it; pieces of
    fewer than ``SENTENCE_MIN_WORDS`` words join the next one, runs of more than ``SENTENCE_MAX_WORDS``
    are cut.  Never empty: a text with no split point is one sentence (an empty text gives ``[""]``).
    Each is the text of its ``sentence_spans_to_embed`` span with its whitespace runs made single spaces."""
    return [" ".join(text[start:end].split()) for start, end in sentence_spans_to_embed(text)] or [""]


_WORD = re.compile(r"\S+")


def sentence_spans_to_embed(text: str) -> list[tuple[int, int]]:
    """The character spans of ``sentences_to_embed``'s sentences in ``text`` (every split point is whitespace,
    so a span holds exactly its sentence's words): what a sentence vector pooled from the chunk's own forward
    pass covers (``models.embeddings.OnnxEmbedder.embed_in_context``).  Empty for a text without words."""
    text = text or ""
    out: list[tuple[int, int]] = []
    pending: list[tuple[int, int]] = []  # word spans waiting for enough words
    position = 0
    for separator in [*_SPLIT.finditer(text), None]:
        stop = separator.start() if separator is not None else len(text)
        pending += [m.span() for m in _WORD.finditer(text, position, stop)]
        position = separator.end() if separator is not None else len(text)
        if len(pending) >= SENTENCE_MIN_WORDS:
            out += [(pending[i][0], pending[min(i + SENTENCE_MAX_WORDS, len(pending)) - 1][1])
                    for i in range(0, len(pending), SENTENCE_MAX_WORDS)]
            pending = []
    if pending:
        out = out[:-1] + [(out[-1][0], pending[-1][1])] if out else [(pending[0][0], pending[-1][1])]
    return out


NUL_MESSAGE = "must not contain a NUL character (\\x00): no path, name, URL or text holds one"


def without_nul(value: object) -> object:
    """``value`` unchanged when no string in it (a list's items, a dict's keys and values, at any depth) holds a
    NUL character; ``ValueError`` (``NUL_MESSAGE``) otherwise.  File systems and C libraries end a string at NUL,
    so a path or name holding one means something other than it says: every request field is checked with this."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(NUL_MESSAGE)
    elif isinstance(value, dict):
        for key, item in value.items():
            without_nul(key)
            without_nul(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            without_nul(item)
    return value


# ---------------------------------------------------------------------------
# inline markup

_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_INLINE_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_INLINE_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)|\[([^\]]*)\]\[[^\]]*\]")
_AUTOLINK = re.compile(r"<((?:https?|ftp|mailto):[^<>\s]+)>", re.IGNORECASE)
# only tags HTML has: "GET /devices/<id>" or "a <b> c" in prose must survive
_HTML_TAG_NAMES = (
    "a|abbr|b|big|blockquote|br|caption|cite|code|dd|del|details|dfn|div|dl|dt|em|font|h[1-6]|hr|i|img|ins|kbd|"
    "li|mark|ol|p|pre|q|s|samp|small|span|strike|strong|sub|summary|sup|table|tbody|td|tfoot|th|thead|tr|tt|u|ul|"
    "var|wbr"
)
_INLINE_HTML = re.compile(rf"</?(?:{_HTML_TAG_NAMES})(?:\s[^<>]*)?/?>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
_STAR_MARKS = re.compile(r"(\*\*|\*|~~)(?=\S)(.+?)(?<=\S)\1")
# CommonMark: underscore emphasis never opens or closes inside a word (hvac.min_cycle_minutes stays whole)
_UNDERSCORE_MARKS = re.compile(r"(?<![0-9A-Za-z])(__|_)(?=\S)(.+?)(?<=\S)\1(?![0-9A-Za-z])")
_ESCAPED = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~<])")
_ENTITY = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});")
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")
# a character every piece of inline markup above needs: a text without one has nothing to remove
_MARKUP_CHARACTER = re.compile(r"[`\\\[<*~_&]")
_WHITESPACE_RUN = re.compile(r"\s+")


@lru_cache(maxsize=16384)
def plain_inline(text: str) -> str:
    """``text`` as a reader sees it, whitespace runs collapsed: Markdown inline markup removed (``**a**``,
    ``_a_``, ``~~a~~`` -> a; `` `a` `` -> a, its content untouched; ``[t](u)`` and ``![t](u)`` -> t;
    ``<http://x>`` -> the address; backslash escapes), HTML tags and comments removed and entities decoded
    (``&mdash;`` -> —).  Underscores inside words are not emphasis (``min_cycle_minutes``)."""
    if _MARKUP_CHARACTER.search(text) is None:  # most sentences: only the whitespace to collapse
        return _WHITESPACE_RUN.sub(" ", text).strip()
    spans: list[str] = []

    def keep(match: re.Match) -> str:
        spans.append(match.group(2).strip() or match.group(2))
        return f"\x00{len(spans) - 1}\x00"

    def literal(match: re.Match) -> str:
        spans.append(match.group(1))
        return f"\x00{len(spans) - 1}\x00"

    text = _CODE_SPAN.sub(keep, text)
    text = _ESCAPED.sub(literal, text)  # an escaped mark is text, never emphasis
    text = _INLINE_IMAGE.sub(r"\1", text)
    text = _INLINE_LINK.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    text = _AUTOLINK.sub(r"\1", text)
    text = _INLINE_HTML.sub("", text)
    for _ in range(3):  # nested emphasis such as ***x***
        text = _UNDERSCORE_MARKS.sub(r"\2", _STAR_MARKS.sub(r"\2", text))
    if "&" in text:
        text = _ENTITY.sub(lambda m: html.unescape(m.group(0)), text)
    text = _PLACEHOLDER.sub(lambda m: spans[int(m.group(1))], text)
    return _WHITESPACE_RUN.sub(" ", text).strip()


_WORD_TOKEN = re.compile(r"\w+(?:[.,]\d+)*")


def normalised_words(text: str) -> list[str]:
    """The words of ``text`` for comparing facts: markup removed (``plain_inline``), Unicode-normalised (NFKC),
    case-folded, punctuation dropped; a decimal number stays one word ("1.0", "3.4")."""
    return _WORD_TOKEN.findall(unicodedata.normalize("NFKC", plain_inline(text)).casefold())


def contains_words(text: str, fact: str) -> bool:
    """Whether ``fact``'s normalised words occur in ``text``'s, consecutively (a normalised text match: case,
    markup, punctuation and whitespace aside).  An empty fact is in every text."""
    words = normalised_words(fact)
    if not words:
        return True
    haystack = f" {' '.join(normalised_words(text))} "
    return f" {' '.join(words)} " in haystack
