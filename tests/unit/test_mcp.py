"""How the MCP server formats results as text (the server itself: tests/integration/test_mcp.py)."""

from __future__ import annotations

from knowledge_store.retrieval.engine import NO_RESULTS
from knowledge_store.server.mcp_server import format_results


def test_format_results_pages_and_sections():
    from knowledge_store.retrieval.citations import Citation

    cite = Citation(n=2, chunk_id="c", doc_id="d", version=1, title="Manual", section="Manual > Setup", pages=[4, 5],
                    url="file:///m.pdf#page=4", snippet="Hold the dial.", snippet_start=0, snippet_end=14, score=0.931,
                    relevance=0.8)
    text = format_results([cite])
    assert text.splitlines()[:3] == ["[2] Manual \u2014 Setup (pp. 4\u20135) score 0.93 (relevance 0.80)",
                                     "Hold the dial.", "file:///m.pdf#page=4"]
    assert format_results([]) == NO_RESULTS
    # words no document contains are named, with or without passages
    assert format_results([cite], coverage="low", missing_terms=["solar"]).endswith("Coverage: low\nNo document mentions: solar")
    assert format_results([], missing_terms=["solar", "panels"]) == NO_RESULTS + "\nNo document mentions: solar, panels"

