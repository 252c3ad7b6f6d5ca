"""docs/API.md is the served OpenAPI schema rendered: a route or field added without
regenerating the reference fails here (fix: python -m knowledge_store.server.api_reference --write)."""

from __future__ import annotations

from knowledge_store.server.api_reference import REFERENCE, render, served_schema


def test_api_reference_matches_the_served_schema(embedder) -> None:
    schema = served_schema(embedder)
    assert REFERENCE.is_file(), "docs/API.md is missing: python -m knowledge_store.server.api_reference --write"
    assert REFERENCE.read_text() == render(schema), \
        "docs/API.md is stale: python -m knowledge_store.server.api_reference --write"


def test_api_reference_lists_every_route_and_the_seed_field_names(embedder) -> None:
    schema = served_schema(embedder)
    text = render(schema)
    for path, item in schema["paths"].items():
        for method in ("get", "post", "put", "patch", "delete"):
            if method in item:
                assert f"### `{method.upper()} {path}`" in text
    # the knowledge-base articles and ask contracts
    for field in ("`articles`", "`total`", "`updated_at`", "`last_updated`", "`intent`", "`device`",
                  "`answer`", "`sources`", "`source_file`", "`context`",
                  # the document model: the citation's revision label, link and validity; relations with their evidence
                  "`rev_label`", "`source_path`", "`valid_from`", "`valid_to`", "`src_type`", "`rel_type`",
                  "`dst_id`", "`confidence`", "`evidence`",
                  # entities: the entities a result's passage mentions, and the filter on them
                  "`entities`", "`entity_boost`", "EntityRef"):
        assert field in text, field
    assert "### `GET /metrics`" in text
    # the operations contract: the metric names and the query line's fields, in /metrics' description
    metrics = text.split("### `GET /metrics`", 1)[1].split("\n### ", 1)[0]
    for name in ("`http_request_duration_seconds{endpoint}`", "`pages_ingested_total`", "`timestamp`", "`query`",
                 "`num_results`", "`latency_ms`", "`reranker`", "`top_score`",
                 "`results[{chunk_id, source, score, text_preview}]`", "`user@[REDACTED]`"):
        assert name in metrics, name
