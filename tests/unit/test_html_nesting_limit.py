"""Deeply nested HTML is refused quickly with a typed error; normal pages are not.

Before the limit, parse time grew with the square of the nesting depth (30 000
nested ``<div>`` took minutes before failing), and one such upload blocked all
ingestion.  These tests are hang guards, not benchmarks: the bounds are generous.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from knowledge_store.core import errors
from knowledge_store.ingest.parsers import html as html_parser
from knowledge_store.ingest.parsers import parse_file
from knowledge_store.ingest.parsers.html import parse_html


def _nested(depth: int, tag: str = "div", text: str = "deep text") -> str:
    return f"<html><body><p>Intro</p>{f'<{tag}>' * depth}{text}{f'</{tag}>' * depth}<p>Outro</p></body></html>"


def test_html_nested_30000_deep_is_refused_in_seconds_with_a_typed_error_naming_depth_and_limit(tmp_path: Path) -> None:
    path = tmp_path / "deep.html"
    path.write_text(_nested(30_000), encoding="utf-8")
    started = time.perf_counter()
    with pytest.raises(errors.IngestionError) as caught:
        parse_file(path)
    elapsed = time.perf_counter() - started
    assert elapsed < 5.0, f"refusing a 30 000-deep page took {elapsed:.1f} s"
    error = caught.value
    limit = html_parser.MAX_HTML_NESTING_DEPTH
    assert error.kind == "nested_too_deeply"
    assert error.limit == limit and error.depth > limit
    assert f"{error.depth}" in error.reason and f"{limit}" in error.reason
    assert error.path == str(path)


def test_html_source_text_nested_too_deeply_is_refused_in_seconds() -> None:
    started = time.perf_counter()
    with pytest.raises(errors.IngestionError) as caught:
        parse_html(_nested(30_000, tag="span"))
    assert time.perf_counter() - started < 5.0
    assert caught.value.kind == "nested_too_deeply"


@pytest.mark.parametrize("depth", [200, 480])
def test_html_with_deep_but_legal_nesting_still_parses(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "legal.html"
    path.write_text(_nested(depth), encoding="utf-8")
    doc = parse_file(path)
    assert [block.text for block in doc.blocks] == ["Intro", "deep text", "Outro"]


def test_html_deep_list_and_definition_nesting_under_the_limit_still_parses() -> None:
    # leaf blocks that hold lists walk recursively too: the limit must leave room for them
    depth = html_parser.MAX_HTML_NESTING_DEPTH // 2 - 4  # two levels (<dl><dd>) per repeat
    page = "<html><body>" + "<dl><dd><pre>x</pre>" * depth + "bottom" + "</dd></dl>" * depth + "</body></html>"
    doc = parse_html(page)
    assert doc.blocks[-1].text == "bottom"


def test_html_with_many_unclosed_auto_closing_tags_is_not_mistaken_for_deep_nesting() -> None:
    # <p>, <li>, <dt>/<dd>, <tr>/<td>, <option> close themselves: thousands of them are a long page, not a deep one
    n = 3_000
    page = (
        "<html><head><title>Long page</title><meta charset=utf-8><link rel=stylesheet href=a.css></head><body>"
        + "<p>paragraph <b>bold</b> <img src=x.png> <br> text" * n
        + "<ul>" + "<li>item <a href=#x>link</a>" * n + "</ul>"
        + "<dl>" + "<dt>term<dd>definition" * n + "</dl>"
        + "<table>" + "<tr><td>cell<td>cell" * n + "</table>"
        + "<select>" + "<option>choice" * n + "</select>"
        + "<p>last paragraph</body></html>"
    )
    started = time.perf_counter()
    doc = parse_html(page)
    assert time.perf_counter() - started < 30.0
    texts = [block.text for block in doc.blocks]
    assert texts[-1] == "last paragraph"
    assert texts.count("paragraph bold\ntext") == n


def test_html_nested_too_deeply_is_a_failure_row_kind_not_a_corrupt_file() -> None:
    error = errors.NestingTooDeepError("page.html", depth=513, limit=512)
    assert isinstance(error, errors.IngestionError)
    assert error.kind == "nested_too_deeply"
    assert "513" in error.reason and "512" in error.reason


def test_crawler_link_extraction_on_a_deeply_nested_page_returns_quickly() -> None:
    from knowledge_store.ingest.web.links import html_links

    body = ("<html><body><a href='/first'>a</a>" + "<div>" * 100_000 + "x" + "</div>" * 100_000 + "</body></html>")
    started = time.perf_counter()
    found = html_links(body.encode(), "https://example.org/")
    assert time.perf_counter() - started < 5.0
    assert "https://example.org/first" in found.links
