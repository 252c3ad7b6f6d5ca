"""Build the Debian documentation dev set: FAQ questions vs. short answers hidden among long manual sections.

A documentation-style retrieval set in BEIR format, built at run time from Debian packages
(nothing of it is committed; only this builder is):

- **queries** are the question headings of *The Debian GNU/Linux FAQ* (package ``debian-faq``),
  e.g. "How do I put a package on hold?";
- the **relevant document** of a question is that question's answer section, *without its
  heading* (the text under the heading, up to the next heading);
- the **Securing Debian Manual**'s FAQ chapter (``harden-doc``) adds its questions the same way;
- **distractors** are the sections of ten other Debian manuals (:data:`BOOKS`: Debian Reference,
  the Administrator's Handbook, the Installation Guide, Policy, the Developer's Reference, …), so
  the answers are a few percent of the corpus, as on a documentation site where FAQ answers sit
  beside long manual pages.

Every FAQ answer section (question or not) is in the corpus, so a question competes with the
other answers of its own FAQ as well as with the manuals.

Queries are split into ``train`` and ``test`` by a hash of the question id (stable across
rebuilds): tune on train, report on test, as with SciFact.

    .venv/bin/python -m evals.experiments.debian_docs            # builds data/datasets/debian-docs/
    .venv/bin/python -m evals.experiments.debian_docs --out DIR  # elsewhere

Needs ``apt-get download`` (Debian/Ubuntu with the bookworm archive reachable) and ``dpkg-deb``;
:func:`apt_available` says whether this machine can build it (tests skip with that reason).
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from bs4 import BeautifulSoup, NavigableString, Tag

from evals.experiments import devset_files
from evals.experiments.devset_files import DatasetBuildError, DevSet, DevSetBuilder, median, readme_tail, split_of
from knowledge_store.config.settings import PROJECT_ROOT

__all__ = ["BOOKS", "DatasetBuildError", "DevSet", "apt_available", "build", "build_devset", "split_of"]


@dataclass(frozen=True)
class Book:
    """One Debian manual: where its HTML lies in its package, and which pages are FAQ chapters."""

    title: str
    slug: str
    package: str
    folder: str
    pattern: str
    exclude: frozenset[str] = frozenset({"index.html", "index.en.html", "search.html", "genindex.html"})
    faq_pages: frozenset[str] | None = None  # pages whose question headings are queries (None: none; "*": all)

    def pages(self, root: Path) -> list[Path]:
        return [p for p in sorted((root / self.folder).glob(self.pattern)) if p.name not in self.exclude]

    def is_faq(self, page: Path) -> bool:
        return self.faq_pages is not None and ("*" in self.faq_pages or page.name in self.faq_pages)


BOOKS = (
    Book("The Debian GNU/Linux FAQ", "faq", "debian-faq", "usr/share/doc/debian/FAQ", "*.en.html",
         exclude=frozenset({"index.en.html", "faqinfo.en.html"}), faq_pages=frozenset({"*"})),
    Book("Securing Debian Manual", "harden", "harden-doc", "usr/share/doc/harden-doc/html/en-US", "*.html",
         faq_pages=frozenset({"ch12.html", "ch12s02.html", "debian-sec-team-faq.html"})),
    Book("Debian Reference", "ref", "debian-reference-en", "usr/share/debian-reference", "*.en.html"),
    Book("The Debian Administrator's Handbook", "dah", "debian-handbook", "usr/share/doc/debian-handbook/html/en-US", "*.html"),
    Book("Debian GNU/Linux Installation Guide", "install", "installation-guide-amd64",
         "usr/share/doc/installation-guide-amd64/en", "*.html"),
    Book("Debian Developer's Reference", "devref", "developers-reference", "usr/share/developers-reference", "*.html",
         exclude=frozenset({"index.html", "search.html", "genindex.html", "developers-reference.html"})),
    Book("Debian Policy Manual", "policy", "debian-policy", "usr/share/doc/debian-policy/policy.html", "*.html"),
    Book("Debian New Maintainers' Guide", "maint", "maint-guide", "usr/share/doc/maint-guide/html", "*.en.html"),
    Book("Debian Linux Kernel Handbook", "kernel", "debian-kernel-handbook",
         "usr/share/doc/debian-kernel-handbook/kernel-handbook.html", "*.html"),
    Book("Guide for Debian Maintainers", "debmake", "debmake-doc", "usr/share/doc/debmake-doc/html", "*.en.html"),
    Book("Debian Live Manual", "live", "live-manual-html", "usr/share/doc/live-manual/html/live-manual", "*.en.html"),
    Book("Debian Edu Bookworm Manual", "edu", "debian-edu-doc-en", "usr/share/doc/debian-edu-doc-en",
         "debian-edu-bookworm-manual.html"),
)
PACKAGES = tuple(book.package for book in BOOKS)
DEFAULT_OUT = PROJECT_ROOT / "data" / "datasets" / "debian-docs"
BUILDER_VERSION = "1"
MIN_ANSWER_CHARS = 40  # an answer shorter than this is a pointer ("See below."), not an answer
MIN_SECTION_CHARS = 80  # distractor sections shorter than this are headings with a sentence

_BLOCK_TAGS = {"p", "li", "dt", "dd", "tr", "blockquote", "table", "ul", "ol", "dl", "h1", "h2", "h3", "h4", "h5", "h6",
               "div", "caption"}
_NUMBERING = re.compile(r"^\s*(?:Chapter\s+\d+\.|Appendix\s+[A-Z]\.|[A-Z]?\d+(?:\.\d+)*\.)\s*")
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")


@dataclass(frozen=True)
class Section:
    """One section of a DocBook HTML book: its own text, without its heading and without subsections."""

    book: Book
    file: str
    anchor: str
    number: str  # "7.12" (empty when the heading has none)
    heading: str  # heading text without its number
    chapter: str  # chapter title without its number
    text: str

    @property
    def doc_id(self) -> str:
        return f"{self.book.slug}-{Path(self.file).stem.replace('.en', '')}-{self.anchor or self.number}"

    @property
    def is_question(self) -> bool:
        return self.heading.rstrip().endswith("?")


# --------------------------------------------------------------------------- packages


def apt_available() -> tuple[bool, str]:
    """(True, "") when ``apt-get download`` and ``dpkg-deb`` can fetch the packages, else (False, reason)."""
    return devset_files.apt_available(PACKAGES[0], "the Debian docs dev set")


# --------------------------------------------------------------------------- HTML -> sections


def _heading_parts(title: Tag) -> tuple[str, str]:
    """(number, heading text without its number) of a heading element."""
    text = _SPACES.sub(" ", title.get_text(" ")).strip()
    text = re.sub(r"\s+([?.,:;!)])", r"\1", text)
    match = _NUMBERING.match(text)
    number = match.group(0).strip().rstrip(".").replace("Chapter ", "").replace("Appendix ", "") if match else ""
    return number, text[match.end():].strip() if match else text


_SKIP_CLASSES = {"navheader", "navfooter", "toc", "list-of-tables", "list-of-figures", "list-of-examples", "docnav",
                 "headerlink", "indexterm", "sphinxsidebar", "related", "footer", "titlepage-extra"}
_SKIP_IDS = {"banner", "title", "breadcrumbs"}
_HEADING = re.compile(r"^h[1-6]$")


def _content_root(soup: BeautifulSoup) -> Tag:
    """The article: Sphinx's ``div.body[role=main]``, else ``<body>``."""
    return soup.find("div", attrs={"role": "main"}) or soup.body or soup


def _split_by_headings(root: Tag) -> list[tuple[Tag | None, str]]:
    """(heading, text under it up to the next heading) in document order; text before the first heading has None.

    Paragraph-like elements end with a blank line, list items start with "- ", table cells are joined
    with " | " on one line, and ``<pre>`` blocks are kept verbatim.
    """
    sections: list[tuple[Tag | None, list[str]]] = [(None, [])]
    verbatim: list[str] = []  # <pre> blocks, kept as they are; a placeholder holds their place

    def emit(text: str) -> None:
        sections[-1][1].append(text)

    def walk(node, in_cell: bool) -> None:
        if isinstance(node, NavigableString):
            if node.__class__.__name__ in ("Comment", "ProcessingInstruction", "Doctype", "Declaration", "CData"):
                return
            emit(str(node))
            return
        if not isinstance(node, Tag):
            return
        classes = set(node.get("class") or [])
        if node.name in ("script", "style", "img", "nav", "head") or classes & _SKIP_CLASSES or node.get("id") in _SKIP_IDS:
            return
        if _HEADING.match(node.name):
            sections.append((node, []))
            return
        if node.name == "pre":
            verbatim.append("\n".join(line.rstrip() for line in node.get_text().strip("\n").splitlines()))
            emit(f" \x00{len(verbatim) - 1}\x00 " if in_cell else f"\n\n\x00{len(verbatim) - 1}\x00\n\n")
            return
        block = not in_cell and (node.name in _BLOCK_TAGS or "para" in classes)
        if block:
            emit("\n\n")
        if node.name == "li" and not in_cell:
            emit("- ")
        cell = in_cell or node.name in ("td", "th")
        for child in node.children:
            walk(child, cell)
        if node.name in ("td", "th"):
            emit(" | ")
        if block:
            emit("\n\n")

    walk(root, False)
    out: list[tuple[Tag | None, str]] = []
    for heading, pieces in sections:
        paragraphs = []
        for paragraph in re.split(r"\n\s*\n", "".join(pieces)):
            cleaned = _SPACES.sub(" ", paragraph.replace("\n", " ")).strip()
            held = re.fullmatch(r"\x00(\d+)\x00", cleaned)
            if held:
                paragraphs.append(verbatim[int(held.group(1))])
                continue
            cleaned = re.sub(r"\x00(\d+)\x00", lambda m: verbatim[int(m.group(1))].replace("\n", " "), cleaned)
            cleaned = re.sub(r"\s+([?.,:;!)])", r"\1", cleaned).strip(" |")
            if cleaned and cleaned != "-":
                paragraphs.append(cleaned)
        out.append((heading, "\n\n".join(p for p in paragraphs if p.strip())))
    return out


def _anchor_of(heading: Tag) -> str:
    """The id a link to this heading uses: its own, an anchor inside it, or its section's."""
    if heading.get("id"):
        return heading["id"]
    inner = heading.find("a", id=True)
    if inner is not None:
        return inner["id"]
    previous = heading.find_previous_sibling("span", id=True)
    if previous is not None:
        return previous["id"]
    parent = heading.parent
    while parent is not None and parent.name not in ("section", "div"):
        parent = parent.parent
    return parent.get("id", "") if parent is not None else ""


def book_sections(html_file: Path, book: Book) -> list[Section]:
    """Every headed section of one HTML page, with the text up to the next heading (subsections excluded)."""
    import warnings

    from bs4 import XMLParsedAsHTMLWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(html_file.read_bytes(), "lxml")
    for link in soup.find_all("a", class_="headerlink"):
        link.decompose()
    chapter = ""
    sections: list[Section] = []
    for heading, text in _split_by_headings(_content_root(soup)):
        if heading is None:
            continue
        anchor = _anchor_of(heading)
        number, title = _heading_parts(heading)
        if heading.name in ("h1",) or not chapter:
            chapter = title
        sections.append(Section(book=book, file=html_file.name, anchor=anchor, number=number, heading=title,
                                chapter=chapter, text=text))
    return sections


# --------------------------------------------------------------------------- the set


def build_devset(root: Path) -> DevSet:
    """Sections -> BEIR rows.  ``root`` holds the unpacked packages."""
    corpus: list[dict] = []
    seen_ids: set[str] = set()
    seen_texts: set[str] = set()
    queries: list[dict] = []
    qrels: list[tuple[str, str, int]] = []
    per_book: dict[str, int] = {}
    for book in BOOKS:
        pages = book.pages(root)
        if not pages:
            raise DatasetBuildError(f"no pages of {book.title!r} ({book.pattern}) under {root / book.folder}")
        for page in pages:
            faq = book.is_faq(page)
            for section in book_sections(page, book):
                floor = MIN_ANSWER_CHARS if faq else MIN_SECTION_CHARS
                digest = hashlib.sha256(section.text.encode()).hexdigest()
                if len(section.text) < floor or section.doc_id in seen_ids or digest in seen_texts:
                    continue
                seen_ids.add(section.doc_id)
                seen_texts.add(digest)
                if faq:
                    # an answer's title names its FAQ chapter, never the question (that would leak the query)
                    title = f"{book.title}: {section.chapter}"
                else:
                    title = f"{book.title}: {section.heading}" if section.heading else book.title
                corpus.append({"_id": section.doc_id, "title": title, "text": section.text,
                               "metadata": {"book": book.title, "file": page.name, "anchor": section.anchor,
                                            "kind": "faq_answer" if faq else "manual"}})
                per_book[book.slug] = per_book.get(book.slug, 0) + 1
                if faq and section.is_question:
                    query_id = f"q-{section.doc_id}"
                    queries.append({"_id": query_id, "text": section.heading})
                    qrels.append((query_id, section.doc_id, 1))
    splits = {q["_id"]: split_of(q["_id"]) for q in queries}
    relevant = {doc_id for _, doc_id, _ in qrels}
    lengths = sorted(len(d["text"]) for d in corpus)
    answer_lengths = sorted(len(d["text"]) for d in corpus if d["_id"] in relevant)
    manual_lengths = sorted(len(d["text"]) for d in corpus if d["metadata"]["kind"] == "manual")
    stats = {
        "documents": len(corpus), "faq_answer_sections": sum(1 for d in corpus if d["metadata"]["kind"] == "faq_answer"),
        "manual_sections": len(manual_lengths), "queries": len(queries),
        "train_queries": sum(1 for v in splits.values() if v == "train"),
        "test_queries": sum(1 for v in splits.values() if v == "test"),
        "relevant_share_of_corpus": round(len(relevant) / len(corpus), 4),
        "chars_median_all": median(lengths), "chars_median_relevant": median(answer_lengths),
        "chars_median_manual": median(manual_lengths), "chars_max_manual": manual_lengths[-1] if manual_lengths else 0,
        **{f"sections_{slug}": n for slug, n in per_book.items()},
    }
    return DevSet(corpus, queries, qrels, splits, stats)


def _readme(devset: DevSet, packages: dict[str, str], checksums: dict[str, str]) -> str:
    lines = [
        "# Debian documentation dev set (built, not committed)",
        "",
        "Built by `python -m evals.experiments.debian_docs` from Debian packages; see that module for the rules.",
        "Queries: the question headings of the FAQ chapters below (those ending in '?'). Relevant document:",
        "that question's answer section without its heading. Distractors: every other section of these",
        "Debian manuals (one document per heading, text up to the next heading):",
        "",
        *(f"- {book.title} (`{book.package}`){' - FAQ pages give the queries' if book.faq_pages else ''}" for book in BOOKS),
        "",
        *readme_tail(devset, packages, checksums),
    ]
    return "\n".join(lines)


BUILDER = DevSetBuilder("the Debian docs dev set", lambda: PACKAGES, build_devset, _readme, BUILDER_VERSION, DEFAULT_OUT)
build, ensure_built = BUILDER.build, BUILDER.ensure_built


def main(argv: list[str] | None = None) -> int:
    return BUILDER.main(argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
