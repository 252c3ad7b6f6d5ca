"""``/llms.txt`` (llmstxt.org): a Markdown file in which a site lists the pages worth reading.

The format is an H1 title, an optional blockquote, then H2 sections of link
lists: ``- [Title](url): notes``.  The crawler fetches the listed pages first
because the site itself chose them; relative URLs resolve against the
llms.txt URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from knowledge_store.ingest.web.errors import InvalidUrlError
from knowledge_store.ingest.web.urls import canonical_url

_ITEM = re.compile(
    r"^\s*(?:[-*+]|\d+[.)])\s+\[(?P<title>[^\]]*)\]\(\s*<?(?P<url>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
    r"\s*(?::\s*(?P<notes>.*))?$"
)
_SECTION = re.compile(r"^\s{0,3}##\s+(?P<name>.+?)\s*#*\s*$")


@dataclass(frozen=True)
class LlmsTxtLink:
    url: str  # canonical
    title: str
    notes: str
    section: str


def parse_llms_txt(text: str, llms_url: str) -> list[LlmsTxtLink]:
    """The listed links in file order (first listing wins), canonicalised; non-http(s) links skipped."""
    links: list[LlmsTxtLink] = []
    seen: set[str] = set()
    section = ""
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = _SECTION.match(line)
        if heading:
            section = heading.group("name")
            continue
        match = _ITEM.match(line)
        if match is None:
            continue
        try:
            url = canonical_url(match.group("url"), llms_url)
        except InvalidUrlError:
            continue
        if url in seen:
            continue
        seen.add(url)
        links.append(LlmsTxtLink(url, match.group("title").strip(), (match.group("notes") or "").strip(), section))
    return links
