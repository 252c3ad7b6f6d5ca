"""How a page URL names its crawled document for ``/api/ask-local`` (the widget's server side:
tests/integration/test_widget.py)."""

from __future__ import annotations

import pytest

from knowledge_store.retrieval.filters import SearchFilters, document_matches
from knowledge_store.server.ask import source_file_patterns

# ------------------------------------------------------------------ ask-local: a page URL names its document

WEB_DOC = {"doc_id": "d1", "source_id": "s1", "source_name": "site", "metadata": {},
           "path": "https://docs.example.org/guide/backups", "relative_path": "https://docs.example.org/guide/backups"}


@pytest.mark.parametrize("page_url", [
    "https://docs.example.org/guide/backups",
    "https://docs.example.org/guide/backups#restore",                       # the reader followed an anchor
    "https://docs.example.org/guide/backups?utm_source=newsletter#restore",  # ... from a tracked link
    "https://DOCS.example.org:443/guide/backups",                           # host case, default port
    "https://docs.example.org/guide/backups/",                              # the site answers both spellings
    "https://docs.example.org/guide/./backups",
])
def test_a_page_url_in_any_spelling_stands_for_its_crawled_web_document(page_url):
    assert document_matches(WEB_DOC, SearchFilters(paths=source_file_patterns(page_url)))


@pytest.mark.parametrize("page_url", [
    "https://docs.example.org/guide/backups-old",
    "https://docs.example.org/guide/backups?version=2",  # a real query parameter is a different page
    "https://docs.example.org/guide",
    "https://other.example.org/guide/backups",
])
def test_another_page_url_does_not_stand_for_it(page_url):
    assert not document_matches(WEB_DOC, SearchFilters(paths=source_file_patterns(page_url)))


def test_file_names_and_globs_are_left_as_they_are():
    assert source_file_patterns(" manuals/aurora.pdf ") == ["manuals/aurora.pdf"]
    assert source_file_patterns("*/docs/intro.md*") == ["*/docs/intro.md*"]
    assert source_file_patterns("http://[bad") == ["http://[bad"]  # not a URL the crawler could have stored
