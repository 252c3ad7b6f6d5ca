"""HTML: keep the readable content, drop page chrome, remember anchors.

Navigation bars, banners, footers, scripts and forms are noise for retrieval
and would be repeated across every page of a site, so they are removed before
walking.  The walk is in document order and treats text that sits directly in
containers (``<div>text</div>``) as paragraphs, so visible text is never lost
just because the author did not use ``<p>``.  Each block carries the id of its
nearest preceding heading so a citation can deep-link into the page.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

from bs4 import BeautifulSoup, NavigableString, Tag
from bs4.element import CData, Comment, Declaration, Doctype, ProcessingInstruction

from knowledge_store.core.errors import NestingTooDeepError
from knowledge_store.ingest.documents import BlockKind, PageBuilder, ParsedDocument
from knowledge_store.ingest.parsers.links import locate_links
from knowledge_store.ingest.parsers.text import UNTITLED, read_source

# Deepest element nesting a page may have.  Real pages nest a few dozen levels and browsers flatten
# anything past 512 (Blink's HTML parser limit); deeper trees made parsing quadratic (30 000 levels took
# minutes) and overflow the recursive walk, so they are refused while the tree is being built.
MAX_HTML_NESTING_DEPTH = 512

# <button>: "Copy", "Toggle navigation", "Was this helpful?" - interface words, not content.
_DROP_TAGS = ("script", "style", "noscript", "template", "svg", "iframe", "nav", "aside", "form", "head", "button")
_CHROME_TAGS = ("header", "footer")  # dropped unless they belong to the article itself
_DROP_ROLES = {"navigation", "banner", "contentinfo"}
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_LEAF_BLOCKS: dict[str, BlockKind] = {
    "p": "paragraph",
    "pre": "code",
    "blockquote": "quote",
    "table": "table",
    "dt": "paragraph",
    "dd": "paragraph",
    "figcaption": "paragraph",
    "caption": "paragraph",
}
# Elements that are display:block by default: their text must not run into a neighbour's.
_CONTAINERS = {
    "html", "body", "main", "article", "section", "div", "ul", "ol", "dl", "li", "figure",
    "details", "summary", "address", "center", "fieldset", "hgroup", "header", "footer",
    "menu", "dialog", "search", "hr", "tr", "td", "th", "tbody", "thead", "tfoot", "picture",
}
_SKIPPED_STRINGS = (Comment, CData, Declaration, Doctype, ProcessingInstruction)
_SPACES = re.compile(r"[ \t\r\n\f\v\u200b]+")
# Permalink glyphs that doc generators append to headings ("Install¶", "Usage #").
_HEADING_MARKS = re.compile(r"(?:\s*[¶§\U0001f517])+\s*$|\s+#\s*$")


def _collapse(text: str) -> str:
    return _SPACES.sub(" ", text)


def inline_text(node: Tag) -> str:
    """Visible text of an element with whitespace collapsed and ``<br>`` kept as newlines."""
    parts: list[str] = []
    for descendant in node.descendants:
        if isinstance(descendant, NavigableString):
            if not isinstance(descendant, _SKIPPED_STRINGS):
                parts.append(_collapse(str(descendant)))
        elif isinstance(descendant, Tag) and descendant.name == "br":
            parts.append("\n")
    return _tidy("".join(parts))


def _tidy(text: str) -> str:
    lines = [_collapse(line).strip() for line in text.split("\n")]
    return "\n".join(line for line in lines if line)


def list_marker(item: Tag) -> str:
    """What a reader sees before a list item: its number in an ``<ol>`` (``start`` and ``value`` honoured, as
    browsers count), else a bullet; kept in the text so a quoted step stays a numbered step."""
    parent = item.parent
    if not isinstance(parent, Tag) or parent.name != "ol":
        return "\u2022 "
    try:
        number = int(str(parent.get("start", "1")).strip()) - 1
    except ValueError:
        number = 0
    for sibling in parent.find_all("li", recursive=False):
        try:
            number = int(str(sibling.get("value")).strip()) if sibling.get("value") is not None else number + 1
        except ValueError:
            number += 1
        if sibling is item:
            break
    return f"{number}. "


def _is_hidden(tag: Tag) -> bool:
    if tag.attrs is None:
        return False
    if tag.has_attr("hidden") or tag.get("aria-hidden") == "true":
        return True
    style = str(tag.get("style", "")).replace(" ", "").lower()
    return "display:none" in style or "visibility:hidden" in style


def _is_decomposed(tag: Tag) -> bool:
    """``tag.decomposed`` without its cost: bs4 only sets ``_decomposed`` on destroyed tags, and on a live
    one the lookup falls through to ``Tag.__getattr__``, i.e. ``tag.find("_decomposed")`` - a search of
    the whole subtree, which made stripping quadratic in the page's depth."""
    return bool(vars(tag).get("_decomposed", False))


def _strip_chrome(soup: BeautifulSoup) -> None:
    """Remove everything a reader would not consider the page's content."""
    for tag in soup.find_all(_DROP_TAGS):
        tag.decompose()
    for tag in soup.find_all(_CHROME_TAGS):
        if tag.find_parent(("article", "main")) is None:
            tag.decompose()
    for tag in soup.find_all(True):
        if _is_decomposed(tag):
            continue
        role = str(tag.get("role", "")).lower() if tag.attrs else ""
        if role in _DROP_ROLES or _is_hidden(tag):
            tag.decompose()
    # permalink glyphs doc generators put in headings: Sphinx/MkDocs (headerlink), Jupyter (anchor-link),
    # Docusaurus (hash-link), VuePress/VitePress (header-anchor)
    for tag in soup.select("a.headerlink, a.anchor-link, a.heading-anchor, a.hash-link, a.header-anchor"):
        tag.decompose()


def _content_root(soup: BeautifulSoup) -> Tag:
    """``<main>`` (or ``role="main"``, as Sphinx themes mark it) - its one ``<article>`` when it has
    exactly one - or the single ``<article>``, else the body: the part worth indexing."""
    main = soup.find("main") or soup.find(attrs={"role": "main"})
    if isinstance(main, Tag) and inline_text(main):
        # Docusaurus-style layouts put the table of contents and pager beside the one article inside <main>
        inner = [a for a in main.find_all("article") if inline_text(a)]
        return inner[0] if len(inner) == 1 else main
    articles = [a for a in soup.find_all("article") if inline_text(a)]
    if len(articles) == 1:
        return articles[0]
    body = soup.find("body")
    return body if isinstance(body, Tag) else soup


def heading_anchor(heading: Tag) -> str | None:
    """The id a link can target for this heading.

    In order: the heading's own id; an ``<a id|name>`` inside it; an empty
    ``<a id|name>`` just before it (old-style anchors); the id of a
    ``<section>``/``<div>`` the heading opens (Sphinx, many static sites).
    """
    if heading.get("id"):
        return str(heading["id"])
    inner = heading.find("a", attrs={"id": True}) or heading.find("a", attrs={"name": True})
    if isinstance(inner, Tag):
        return str(inner.get("id") or inner.get("name"))
    previous = heading.find_previous_sibling(True)
    if (
        isinstance(previous, Tag)
        and previous.name == "a"
        and (previous.get("id") or previous.get("name"))
        and not previous.get_text(strip=True)
    ):
        return str(previous.get("id") or previous.get("name"))
    parent = heading.parent
    if isinstance(parent, Tag) and parent.name in ("section", "div", "article") and parent.get("id"):
        if parent.find(True) is heading:
            return str(parent["id"])
    return None


def table_text(table: Tag) -> str:
    """Rows as lines, cells joined with `` | ``; nested tables stay inside their cell."""
    rows: list[str] = []
    for row in table.find_all("tr"):
        if row.find_parent("table") is not table:
            continue
        cells = [inline_text(cell).replace("\n", " ") for cell in row.find_all(("td", "th"), recursive=False)]
        if any(cells):
            rows.append(" | ".join(cells))
    caption = table.find("caption")
    if isinstance(caption, Tag) and caption.find_parent("table") is table and inline_text(caption):
        rows.insert(0, inline_text(caption))
    return "\n".join(rows)


def pre_text(pre: Tag) -> str:
    """Preformatted text exactly as shown; HTML drops one newline after ``<pre>``."""
    text = "".join(
        str(s) for s in pre.descendants if isinstance(s, NavigableString) and not isinstance(s, _SKIPPED_STRINGS)
    )
    return text[1:] if text.startswith("\n") else text


@dataclass
class _Walker:
    builder: PageBuilder = field(default_factory=lambda: PageBuilder(1))
    stack: list[tuple[int, str]] = field(default_factory=list)
    anchor: str | None = None
    first_h1: str | None = None
    buffer: list[str] = field(default_factory=list)
    marker: str | None = None  # "1. " or "• ": put before the first text of the list item being walked

    def path(self) -> tuple[str, ...]:
        return tuple(title for _, title in self.stack)

    def add(self, kind: BlockKind, text: str) -> None:
        if self.marker is not None and kind not in ("heading", "code", "table", "quote"):
            text, self.marker = self.marker + text, None
        self.builder.add(kind, text, section_path=self.path(), anchor=self.anchor)

    def flush(self, kind: BlockKind) -> None:
        text = _tidy("".join(self.buffer))
        self.buffer = []
        if text:
            self.add(kind, text)

    def heading(self, tag: Tag, level: int) -> None:
        text = _HEADING_MARKS.sub("", inline_text(tag)).strip()
        if not text:
            return
        while self.stack and self.stack[-1][0] >= level:
            self.stack.pop()
        title = text.replace("\n", " ")
        self.stack.append((level, title))
        self.anchor = heading_anchor(tag) or self.anchor
        if level == 1 and self.first_h1 is None:
            self.first_h1 = title
        self.builder.add("heading", text, section_path=self.path(), anchor=self.anchor, heading_level=level)

    def walk(self, node: Tag, kind: BlockKind = "paragraph") -> None:
        for child in node.children:
            if isinstance(child, NavigableString):
                if not isinstance(child, _SKIPPED_STRINGS):
                    self.buffer.append(_collapse(str(child)))
                continue
            if not isinstance(child, Tag):
                continue
            name = child.name
            if name in _HEADINGS:
                self.flush(kind)
                self.heading(child, _HEADINGS[name])
            elif name in _LEAF_BLOCKS:
                self.flush(kind)
                self.leaf(child, name, kind)
            elif name == "br":
                self.buffer.append("\n")
            elif name == "li":
                self.flush(kind)
                self.marker = list_marker(child)
                self.walk(child, "list_item")
                self.flush("list_item")
                self.marker = None
            elif name in _CONTAINERS:
                self.flush(kind)
                self.walk(child, kind)
                self.flush(kind)
            else:
                self.walk(child, kind)

    def leaf(self, tag: Tag, name: str, context: BlockKind) -> None:
        block_kind = _LEAF_BLOCKS[name]
        if name == "pre":
            self.add("code", pre_text(tag))
        elif name == "table":
            self.add("table", table_text(tag))
        elif name == "blockquote":
            self.add("quote", _blockquote_text(tag))
        elif tag.find(tuple(_HEADINGS) + ("pre", "table", "ul", "ol")):
            # Invalid but common nesting (<dd><pre>, <p><table> after repair): walk it.
            self.walk(tag, context if context != "paragraph" else block_kind)
            self.flush(context if context != "paragraph" else block_kind)
        else:
            self.add(context if context != "paragraph" else block_kind, inline_text(tag))


def _blockquote_text(tag: Tag) -> str:
    """A quote stays one block, its paragraphs on separate lines."""
    paragraphs = tag.find_all(("p", "li", "pre"))
    if not paragraphs:
        return inline_text(tag)
    return "\n".join(text for text in (inline_text(p) for p in paragraphs if p.find_parent("blockquote") is tag) if text)


class _NestingLimitReached(Exception):
    def __init__(self, depth: int) -> None:
        self.depth = depth


class _DepthLimitedSoup(BeautifulSoup):
    """BeautifulSoup that stops building the moment an element would open deeper than
    ``MAX_HTML_NESTING_DEPTH``.  Counted on the parser's own start/end events, so tags the
    parser closes implicitly (``<p>``, ``<li>``, ``<td>``...) never add up to a false depth,
    and the refusal costs only the markup read up to that point."""

    def handle_starttag(self, name, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        depth = len(self.tagStack)  # tagStack[0] is the document itself: this is the new element's depth
        if depth > MAX_HTML_NESTING_DEPTH:
            raise _NestingLimitReached(depth)
        return super().handle_starttag(name, *args, **kwargs)


def _build_soup(markup: str | bytes, label: str | os.PathLike[str]) -> BeautifulSoup:
    try:
        return _DepthLimitedSoup(markup, "lxml")
    except _NestingLimitReached as exc:
        raise NestingTooDeepError(label, exc.depth, MAX_HTML_NESTING_DEPTH) from None


def parse_html(path_or_text: str | os.PathLike[str], base_url: str | None = None) -> ParsedDocument:
    """Parse an HTML file (``Path``) or HTML source (``str``).

    ``base_url`` resolves a relative ``<link rel="canonical">`` and is kept in
    the metadata so anchors can be turned into links later.  Elements nested
    deeper than ``MAX_HTML_NESTING_DEPTH`` raise ``NestingTooDeepError``.
    """
    if isinstance(path_or_text, os.PathLike):
        data = Path(path_or_text).read_bytes()
        soup = _build_soup(data, path_or_text)  # bytes: lets <meta charset> choose the encoding
        stem = Path(path_or_text).stem
        metadata: dict[str, object] = {}
        if soup.original_encoding:
            metadata["encoding"] = soup.original_encoding
    else:
        text, metadata, _ = read_source(path_or_text)
        soup = _build_soup(text, "<html source>")
        stem = UNTITLED

    html_tag = soup.find("html")
    if isinstance(html_tag, Tag) and html_tag.get("lang"):
        metadata["lang"] = str(html_tag["lang"])
    canonical = soup.find("link", rel=lambda value: value is not None and "canonical" in value)
    if isinstance(canonical, Tag) and canonical.get("href"):
        href = str(canonical["href"]).strip()
        metadata["canonical"] = urljoin(base_url, href) if base_url else href
    if base_url:
        metadata["base_url"] = base_url
    title_tag = soup.find("title")
    page_title = _collapse(title_tag.get_text()).strip() if isinstance(title_tag, Tag) else ""

    _strip_chrome(soup)
    walker = _Walker()
    root = _content_root(soup)
    walker.walk(root)
    walker.flush("paragraph")
    page = walker.builder.page()
    anchors = [(str(a.get("href") or ""), inline_text(a)) for a in root.find_all("a", href=True)]
    return ParsedDocument(
        title=page_title or walker.first_h1 or stem,
        doc_type="html",
        pages=[page],
        blocks=walker.builder.blocks,
        paginated=False,
        metadata=metadata,
        links=locate_links(page.text, 1, anchors),
    )
