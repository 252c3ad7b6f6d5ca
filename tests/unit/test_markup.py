"""Markup removal (core.text.plain_inline) and the normalised text match of facts (core.text.contains_words)."""

from __future__ import annotations

import pytest

from knowledge_store.core.text import contains_words, normalised_words, plain_inline


@pytest.mark.parametrize("marked,plain", [
    ("**fictional** products", "fictional products"),
    ("`hvac.min_cycle_minutes`", "hvac.min_cycle_minutes"),  # intraword underscores are not emphasis
    ("snake_case and _emphasis_ and __strong__", "snake_case and emphasis and strong"),
    ("***both*** and ~~gone~~", "both and gone"),
    ("see [the guide](https://x.org/a_b) and ![logo](l.png)", "see the guide and logo"),
    ("<https://example.org/x>", "https://example.org/x"),
    ("Menu &rsaquo; About &amp; <strong>Diagnostics</strong>", "Menu › About & Diagnostics"),
    ("GET /devices/<id> and a <b>bold</b> word", "GET /devices/<id> and a bold word"),
    (r"\*not emphasis\* and `a*b*c`", "*not emphasis* and a*b*c"),
    ("two\n  lines<!-- note -->", "two lines"),
])
def test_plain_inline_removes_markup_and_keeps_the_words(marked, plain):
    assert plain_inline(marked) == plain


def test_a_markdown_heading_with_underscores_keeps_its_name_and_slug(tmp_path):
    from knowledge_store.ingest.parsers import parse_file

    page = tmp_path / "p.md"
    page.write_text("# Parameters\n\n### `hvac.min_cycle_minutes`\n\nMinimum on and off time of the compressor.\n")
    block = next(b for b in parse_file(page).blocks if "Minimum" in b.text)
    assert block.section_path == ("Parameters", "hvac.min_cycle_minutes")
    assert block.anchor == "hvacmin_cycle_minutes"  # GitHub's slug of the heading


def test_facts_match_across_case_markup_and_punctuation():
    assert normalised_words("Pre-charge: **1.0 bar**, ±0.1") == ["pre", "charge", "1.0", "bar", "0.1"]
    assert contains_words("It must be 1.0 bar, plus or minus 0.1 bar.", "1.0 BAR plus or minus 0.1 bar")
    assert contains_words("answered with `429 Too Many Requests`", "429 too many requests")
    assert not contains_words("answered with 429", "429 Too Many Requests")
    assert not contains_words("10 requests per second", "0 requests per second")  # whole words only
    assert not contains_words("Default: 15 minutes", "Default: 5 minutes")
    assert contains_words("anything", "")
