"""Revision labels and document families (``rev_label``, supersedence).

A *version* of a document is a new checksum of the same file (same ``doc_id``);
a *revision* is what the people who write documents call one: ``SOP-42-RevB.pdf``
replaced by ``SOP-42-RevC.pdf``, a different file.  This module holds the pure
rules; ``knowledge_store.ingest.relations`` applies them to the store.

**Revision label** (``documents.rev_label``), first found wins:

1. metadata keys ``rev_label``, ``revision``, ``rev``, ``version`` - Markdown front
   matter; DOCX core property ``version`` (the parser stores it as ``version``; the
   core property ``revision`` is *not* used: Word increments it on every save, so a
   file saved 37 times is not "Rev 37"); PDF Info dictionary entries ``Revision`` /
   ``Version`` (custom keys document-control systems write; PyMuPDF's standard
   metadata has none).  ``version`` is last because docs-as-code front matter
   uses it for the product version the page documents - which still orders the
   files of one page correctly.
2. the file name (the last path segment for web pages): ``Rev``/``Revision``
   followed by 1-2 letters or a number anywhere between separators
   (``SOP-42-RevC.pdf`` -> ``Rev C``, ``x_RevB.docx`` -> ``Rev B``, ``rev3`` ->
   ``Rev 3``); ``v``/``version`` + a dotted number only at the end
   (``manual-v2.1.pdf`` -> ``v2.1``; ``aurora-v2-notes.md`` has none: a version
   in the middle of a name is usually the product's, not the document's).
3. the title, ``Rev``/``Revision`` + capital letters or a number only (``SOP-42 Rev C``).
   A version number in a title is not taken: titles such as "Debian Policy
   Manual: Version 2.1.1" name the release a section describes (the Debian
   development set has 64 of them, 63 would have been "superseded").

Values are normalised: ``C``/``rev c``/``Rev.C`` -> ``Rev C``; ``3`` under
``revision``/``rev`` -> ``Rev 3``; ``2.1``/``V2.1``/``version 2.1`` -> ``v2.1``;
anything else is kept as written (and cannot be ordered).  YAML reads an unquoted
``version: 2.10`` as the number 2.1: quote versions in front matter.

**Order**: ``Rev A < Rev B < ... < Rev Z < Rev AA``; ``Rev 2 < Rev 10``;
``v2.0 < v2.1 < v10`` (trailing ``.0`` ignored, so ``v2`` = ``v2.0``).  Labels of
different schemes (``Rev C`` vs ``v2``) are not comparable.

**Family key**: the one key that says two files are revisions of one document.
First found wins: metadata ``asset_id``/``asset``; a document id matched by
``Settings.family_id_pattern`` (default ``SOP-\\d+``/``ASSET-\\d+``) in the title,
then in the file name; else - only for documents that carry a revision label -
the title with its revision label removed, lower-cased, punctuation folded
(``SOP 42 Rev B`` and ``SOP 42 Rev C`` -> ``sop 42``).  A title alone, without a
label, is not enough evidence: many unrelated files share titles such as
"Installation" or a template's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import unquote, urlsplit

# metadata keys holding a revision label, in order of precedence (see the module docstring)
REVISION_METADATA_KEYS: tuple[str, ...] = ("rev_label", "revision", "rev", "version")
# metadata keys naming the asset/document a file is a revision of
ASSET_METADATA_KEYS: tuple[str, ...] = ("asset_id", "asset")
DEFAULT_FAMILY_ID_PATTERN = r"(?<![A-Za-z0-9])(?:SOP|ASSET)-\d+(?!\d)"
MAX_LABEL_CHARS = 60

# "Rev C", "Revision 3", "rev-c", "RevB", "rev3" between separators (or at the ends).  Letters written
# straight after "rev" must be capitals ("RevC"), so "Revisions" is not "Rev S"; in titles letters are
# capitals in every form ("rev up" is not a label)
_REV_START = r"(?:^|(?<=[\s._(\[-]))rev(?:ision)?\.?"
_REV_END = r"(?=$|[\s._)\],-])"
_REV_IN_NAME = re.compile(
    _REV_START + r"(?:[\s._-](\d+|[a-z]{1,2})|(\d+|(?-i:[A-Z]{1,2})))" + _REV_END, re.IGNORECASE)
_REV_IN_TITLE = re.compile(_REV_START + r"[\s._-]?(\d+|(?-i:[A-Z]{1,2}))" + _REV_END, re.IGNORECASE)
# "v2.1", "version 3", "V10" at the end only
_VERSION_AT_END = re.compile(r"(?:^|(?<=[\s._-]))v(?:ersion)?\.?[\s._-]?(\d+(?:\.\d+)*)\s*$", re.IGNORECASE)
_REV_VALUE = re.compile(r"rev(?:ision)?\.?[\s._-]*([a-z]{1,2}|\d+)", re.IGNORECASE)
_VERSION_VALUE = re.compile(r"v(?:ersion)?\.?[\s._-]*(\d+(?:\.\d+)*)", re.IGNORECASE)
_LETTERS = re.compile(r"[a-z]{1,2}", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:\.\d+)*")
_NORMAL_LABEL = re.compile(r"Rev ([A-Z]{1,2}|\d+)|v(\d+(?:\.\d+)*)")
_TITLE_FOLD = re.compile(r"[^0-9a-z]+")
# extensions removed from a file name before looking for a label (files and web page URLs)
_NAME_EXTENSIONS = (".pdf", ".docx", ".md", ".markdown", ".html", ".htm", ".txt", ".text", ".rst", ".php", ".aspx")


@dataclass(frozen=True)
class RevisionLabel:
    """A document's revision label and where it was found (``metadata:<key>``, ``file_name`` or ``title``)."""

    label: str
    source: str


@dataclass(frozen=True)
class FamilyKey:
    """What makes files revisions of one document.

    ``kind`` is ``asset_id`` or ``title``; ``value`` the normalised key; ``found_in``
    where it was read (``metadata:asset_id``, ``title``, ``file_name``); ``phrase``
    the text as written (the relation's evidence); ``confidence`` how sure the rule
    is that equal keys mean "the same document" (1.0 explicit metadata, 0.9 an id
    in the title or file name, 0.8 a title).
    """

    kind: str
    value: str
    found_in: str
    phrase: str
    confidence: float


def _clean(value: object) -> str | None:
    """A scalar metadata value as text; lists, mappings, booleans and blanks are not labels."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    text = re.sub(r"\s+", " ", str(value)).strip()
    return text or None


def normalise_label(value: object, key: str = "rev_label") -> str | None:
    """A metadata value as a label: ``C`` -> ``Rev C``, ``2.1`` -> ``v2.1``, ``Rev.3`` -> ``Rev 3``.

    ``key`` decides what a bare number means: a revision (``revision: 3`` ->
    ``Rev 3``) or a version (``version: 3`` -> ``v3``; a dotted number is always a
    version).  Text that is none of these is kept as written, cut at 60 characters."""
    text = _clean(value)
    if text is None:
        return None
    match = _REV_VALUE.fullmatch(text)
    if match:
        return f"Rev {match.group(1).upper()}"
    match = _VERSION_VALUE.fullmatch(text)
    if match:
        return f"v{match.group(1)}"
    if _LETTERS.fullmatch(text):
        return f"Rev {text.upper()}"
    if _NUMBER.fullmatch(text):
        return f"v{text}" if key == "version" or "." in text else f"Rev {text}"
    return text[:MAX_LABEL_CHARS]


def name_stem(relative_path: str) -> str:
    """The file name without its extension; for a web page, the last path segment of its URL."""
    path = relative_path
    if "://" in path:
        path = unquote(urlsplit(path).path)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    lowered = name.lower()
    for extension in _NAME_EXTENSIONS:
        if lowered.endswith(extension) and len(name) > len(extension):
            return name[: -len(extension)]
    return name


def label_in_text(text: str, in_title: bool = False) -> tuple[str, re.Match[str]] | None:
    """The revision label written in a file name stem (or a title: ``in_title``), with the match (to strip it)."""
    if not text:
        return None
    match = (_REV_IN_TITLE if in_title else _REV_IN_NAME).search(text)
    if match:
        return f"Rev {next(group for group in match.groups() if group).upper()}", match
    if in_title:  # a version in a title names a release the text is about (module docstring)
        return None
    match = _VERSION_AT_END.search(text)
    if match:
        return f"v{match.group(1)}", match
    return None


def revision_label(title: str | None, metadata: dict[str, object] | None, relative_path: str) -> RevisionLabel | None:
    """The document's revision label by the precedence of the module docstring, or None."""
    metadata = metadata or {}
    lowered = {str(key).lower(): value for key, value in metadata.items()}
    for key in REVISION_METADATA_KEYS:
        label = normalise_label(lowered.get(key), key)
        if label:
            return RevisionLabel(label, f"metadata:{key}")
    found = label_in_text(name_stem(relative_path))
    if found:
        return RevisionLabel(found[0], "file_name")
    found = label_in_text(title or "", in_title=True)
    if found:
        return RevisionLabel(found[0], "title")
    return None


def revision_order(label: str | None) -> tuple[str, tuple[int, ...]] | None:
    """(scheme, numbers) that order labels of one scheme; None when the label cannot be ordered.

    Schemes: ``letter`` (Rev A=1 ... Z=26, AA=27), ``number`` (Rev 3), ``version`` (v2.1 -> (2, 1);
    trailing zeros dropped so v2 = v2.0)."""
    if not label:
        return None
    match = _NORMAL_LABEL.fullmatch(label)
    if match is None:
        return None
    if match.group(2) is not None:
        numbers = [int(part) for part in match.group(2).split(".")]
        while len(numbers) > 1 and numbers[-1] == 0:
            numbers.pop()
        return "version", tuple(numbers)
    rev = match.group(1)
    if rev.isdigit():
        return "number", (int(rev),)
    value = 0
    for letter in rev:
        value = value * 26 + (ord(letter) - ord("A") + 1)
    return "letter", (value,)


def fold_title(title: str) -> str:
    """A title as a comparable key: lower case, anything but letters and digits as one space."""
    return _TITLE_FOLD.sub(" ", title.lower()).strip()


def title_without_label(title: str) -> str:
    """The title with its revision label (and the separator before it) removed: ``SOP-42 Rev C`` -> ``SOP-42``."""
    found = label_in_text(title, in_title=True)
    if not found:
        return title
    match = found[1]
    return (title[: match.start()].rstrip(" \t._-–—,:(") + " " + title[match.end():].lstrip(" \t._-–—,:)")).strip()


def family_key(
    title: str | None, metadata: dict[str, object] | None, relative_path: str, rev_label: str | None,
    id_pattern: re.Pattern[str],
) -> FamilyKey | None:
    """The document's family key (see the module docstring), or None when it has none."""
    metadata = metadata or {}
    lowered = {str(key).lower(): value for key, value in metadata.items()}
    for key in ASSET_METADATA_KEYS:
        value = _clean(lowered.get(key))
        if value:
            return FamilyKey("asset_id", value.upper(), f"metadata:{key}", value, 1.0)
    for text, found_in in ((title or "", "title"), (name_stem(relative_path), "file_name")):
        match = id_pattern.search(text)
        if match:
            return FamilyKey("asset_id", match.group(0).upper(), found_in, match.group(0), 0.9)
    if rev_label and title:
        folded = fold_title(title_without_label(title))
        if folded:
            return FamilyKey("title", folded, "title", title, 0.8)
    return None


@dataclass(frozen=True)
class FamilyMember:
    """A live document (active, or superseded by another file) as family resolution sees it."""

    doc_id: str
    version: int
    source_id: str
    relative_path: str
    title: str
    rev_label: str | None
    modified_at: datetime | None
    status: str
    superseded_by: str | None
    key: FamilyKey


def order_family(members: list[FamilyMember]) -> tuple[list[FamilyMember], str]:
    """Members oldest first, and what decided the order: ``rev_label`` when every member's
    label is of one orderable scheme, else ``modified_at`` (ties: ``modified_at``, then doc_id)."""
    orders = [revision_order(m.rev_label) for m in members]
    oldest = datetime.min
    if all(order is not None for order in orders) and len({order[0] for order in orders}) == 1:  # type: ignore[index]
        ranked = sorted(zip(orders, members), key=lambda pair: (pair[0][1], pair[1].modified_at or oldest,  # type: ignore[index]
                                                                pair[1].doc_id))
        return [member for _, member in ranked], "rev_label"
    return sorted(members, key=lambda m: (m.modified_at or oldest, m.doc_id)), "modified_at"


def compile_family_pattern(pattern: str) -> re.Pattern[str]:
    """The family id pattern, matched case-insensitively (file names are often lower case)."""
    return re.compile(pattern, re.IGNORECASE)
