"""Entities: extraction and canonical values, configurable patterns, the
``entities`` / ``chunk_entities`` rows with the document model's field names, no orphans after re-syncs
and purges, the snapshot carrying them to results, citations, MCP and ``filters.entities``,
the ranking boost, and the chunks asset's Dagster metadata.

The parts that need no model, store or server are in tests/unit/test_entities.py.
"""

from __future__ import annotations

import anyio
import pytest
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.core.entities import DEFAULT_VOCABULARY, EntityRef
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS, MAINTENANCE_SOP
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.index import read_pointer
from knowledge_store.storage.store import store_connection
from tests.helpers import MARKDOWN_FILLER

# ------------------------------------------------------------------ the sample corpus, end to end

@pytest.fixture(scope="module")
def sample(shared_sample_index, embedder):
    """The session's sample index: these tests only search it and read its entity rows."""
    settings = shared_sample_index
    engine = RetrievalEngine(settings, embedder=embedder)
    engine.snapshots.check_interval_s = 0.0
    return {"settings": settings, "engine": engine}


def _columns(conn, table: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in conn.execute(f"SELECT column_name, column_type FROM (DESCRIBE {table})").fetchall()]


def test_mentions_are_stored_per_chunk_with_the_seed_field_names(sample):
    with store_connection(sample["settings"].store_path, read_only=True) as conn:
        assert _columns(conn, "entities") == [("entity_id", "VARCHAR"), ("type", "VARCHAR"),
                                              ("canonical_value", "VARCHAR"), ("alt_labels", "VARCHAR[]")]
        assert _columns(conn, "chunk_entities") == [("chunk_id", "VARCHAR"), ("entity_id", "VARCHAR"),
                                                    ("span_start", "INTEGER"), ("span_end", "INTEGER"),
                                                    ("confidence", "DOUBLE")]
        rows = conn.execute(
            "SELECT c.text, ce.span_start, ce.span_end, e.type, e.canonical_value, c.source_path "
            "FROM chunk_entities ce JOIN chunks c USING (chunk_id) JOIN entities e USING (entity_id)"
        ).fetchall()
        catalog = {(t, v) for t, v in conn.execute("SELECT type, canonical_value FROM entities").fetchall()}
    for text, start, end, entity_type, value, _path in rows:  # every span points at a spelling of its entity
        assert (entity_type, value) in {(m.type, m.canonical_value) for m in DEFAULT_VOCABULARY.extract(text[start:end])}
    sop = {(t, v) for _, _, _, t, v, path in rows if path.endswith(MAINTENANCE_SOP)}
    assert {("procedure", "SOP-42"), ("procedure", "SOP-17"), ("asset", "ASSET-104"), ("equipment", "EQP-P101"),
            ("standard", "API 510"), ("standard", "ISO 9001")} <= sop
    assert catalog == {(t, v) for _, _, _, t, v, _ in rows}  # no catalog row without a mention


def test_hits_and_citations_carry_the_entities_their_chunk_mentions(sample):
    response = sample["engine"].search("circulation pump bearing noise", k=3, log=False)
    top_hit, top_citation = response.hits[0], response.results[0]
    assert top_hit.section.endswith("Circulation pump")
    assert top_hit.entities == [EntityRef(type="equipment", value="EQP-P101")] == top_citation.entities
    assert top_citation.model_dump()["entities"] == [{"type": "equipment", "value": "EQP-P101"}]


def test_an_entity_query_brings_the_mentioning_chunk_first(sample, embedder):
    settings = sample["settings"]
    query = "API 510"
    boosted = sample["engine"].search(query, k=3, log=False)
    assert settings.entity_boost == 0.75
    top = boosted.hits[0]
    assert EntityRef(type="standard", value="API 510") in top.entities and top.entity_boost > 0
    assert boosted.results[0].entity_boost == pytest.approx(top.entity_boost)
    # without the boost (and its relevance floor) the passage naming API 510 is not first
    plain = RetrievalEngine(settings.model_copy(update={"entity_boost": 0.0, "min_relevance": 0.0}), embedder=embedder)
    unboosted = plain.search(query, k=3, log=False)
    assert EntityRef(type="standard", value="API 510") not in unboosted.hits[0].entities
    assert all(h.entity_boost == 0.0 for h in unboosted.hits)


def test_a_question_naming_an_entity_is_answered_even_when_the_model_misses_it(sample, embedder):
    # MiniLM sees no meaning in "API 510": without the relevance floor this is "No relevant content found."
    response = sample["engine"].search("what does API 510 require", k=3, log=False)
    assert response.coverage != "none"
    assert EntityRef(type="standard", value="API 510") in response.hits[0].entities
    assert response.hits[0].relevance >= sample["settings"].min_relevance


def test_a_query_s_entities_are_extracted_once_per_snapshot_and_the_memory_is_bounded(sample, monkeypatch):
    from knowledge_store.retrieval import snapshot_reader

    snapshot = sample["engine"].snapshots.current()
    snapshot.query_entity_cache.clear()
    calls = []
    extract = snapshot.entity_vocabulary.extract
    monkeypatch.setattr(snapshot, "entity_vocabulary", type("Counting", (), {
        "extract": lambda self, text: calls.append(text) or extract(text)})())
    sample["engine"].search("what does API 510 require", k=3, log=False)  # query_form and the entity boost both ask
    assert calls == ["what does API 510 require"]
    first = snapshot.query_entity_rows("what does API 510 require")
    assert len(first) == 1 and len(calls) == 1
    monkeypatch.setattr(snapshot_reader, "QUERY_ENTITY_CACHE", 3)
    for i in range(5):
        snapshot.query_entity_rows(f"API {600 + i}")
    assert len(snapshot.query_entity_cache) == 3 and "API 604" in snapshot.query_entity_cache
    snapshot.query_entity_cache.clear()


def test_queries_naming_no_entity_rank_exactly_as_without_the_boost(sample, embedder):
    # the identifier boost (E42, E47 in the example questions) is off in both: this is the entity boost's contract
    boosted = RetrievalEngine(sample["settings"].model_copy(update={"identifier_boost": 0.0}), embedder=embedder)
    plain = RetrievalEngine(sample["settings"].model_copy(update={"entity_boost": 0.0, "identifier_boost": 0.0}),
                            embedder=embedder)
    for question in [q.question for q in EXAMPLE_QUESTIONS] + ["inspection of the expansion vessel"]:
        assert not DEFAULT_VOCABULARY.extract(question)
        a = boosted.search(question, k=5, log=False)
        b = plain.search(question, k=5, log=False)
        assert [(h.chunk_id, h.score, h.relevance) for h in a.hits] == [(h.chunk_id, h.score, h.relevance) for h in b.hits]
        assert all(h.entity_boost == 0.0 for h in a.hits)


def test_filters_entities_over_the_api_keeps_passages_mentioning_one(sample):
    from knowledge_store.server.app import create_app

    with TestClient(create_app(sample["settings"], sample["engine"]), base_url="http://127.0.0.1:8080") as client:
        def query(**filters):
            response = client.post("/api/knowledge/query", json={"query": "inspection", "k": 10, "filters": filters})
            assert response.status_code == 200, response.text
            return response.json()

        spelled = query(entities=["api-510"])  # any spelling of the filter value works
        assert spelled["results"] and spelled["params"]["filters"] == {"entities": ["api-510"]}
        for result in spelled["results"]:
            assert {"type": "standard", "value": "API 510"} in result["entities"]
        either = query(entities=["ASSET-104", "EQP-P101"])
        assert len(either["results"]) > len(spelled["results"])
        for result in either["results"]:
            assert {e["value"] for e in result["entities"]} & {"ASSET-104", "EQP-P101"}
        assert query(entities=["SOP-999"])["results"] == []  # names no known entity: matches nothing
        bad = client.post("/api/knowledge/query", json={"query": "inspection", "filters": {"entities": [7]}})
        assert bad.status_code == 422 and "entities" in bad.text


def test_mcp_search_results_list_the_entities(sample):
    from mcp.client.client import Client

    from knowledge_store.server.mcp_server import build_mcp_server

    async def main():
        async with Client(build_mcp_server(sample["engine"])) as client:
            return await client.call_tool("search", {"query": "pre-charge pressure of the expansion vessel", "k": 1,
                                                     "filters": {"entities": ["asset-104"]}})

    result = anyio.run(main)
    [item] = result.structured_content["results"]
    assert {"type": "asset", "value": "ASSET-104"} in item["entities"]
    assert "mentions: ASSET-104 (asset)" in result.content[0].text


# ------------------------------------------------------------------ re-syncs, purges, pattern changes

def _entity_state(settings: Settings) -> dict[str, object]:
    with store_connection(settings.store_path, read_only=True) as conn:
        one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
        return {
            "mentions": one("SELECT count(*) FROM chunk_entities"),
            "orphan_mentions": one("SELECT count(*) FROM chunk_entities ce ANTI JOIN chunks c USING (chunk_id)"),
            "orphan_entities": one("SELECT count(*) FROM entities e ANTI JOIN chunk_entities ce USING (entity_id)"),
            "values": sorted(r[0] for r in conn.execute("SELECT canonical_value FROM entities").fetchall()),
            "stale": one("SELECT count(*) FROM documents WHERE chunker_signature IS NOT NULL "
                         "AND status IN ('active', 'superseded', 'pending') AND entity_signature IS DISTINCT FROM "
                         f"'{settings.entity_vocabulary.signature}'"),
        }


def _snapshot_values(settings: Settings) -> list[str]:
    from knowledge_store.retrieval.snapshot_reader import load_snapshot

    snapshot = load_snapshot(settings.index_dir)
    try:
        return sorted({e.value for refs in snapshot.row_entities.values() for e in refs})
    finally:
        snapshot.close()


def test_resyncs_replace_mentions_and_leave_no_orphans(tmp_path, counting_embedder):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "pump.md").write_text("# Pump\n\nPump EQP-P7 feeds vessel ASSET-7. Follow SOP-3 before opening it.\n"
                                  + MARKDOWN_FILLER)
    (docs / "vessel.md").write_text("# Vessel\n\nThe vessel ASSET-9 is inspected as API 510 requires.\n" + MARKDOWN_FILLER)
    settings = Settings(data_dir=tmp_path / "data", sources=[docs], deleted_retention_days=0)
    run_sync(settings, counting_embedder)
    state = _entity_state(settings)
    assert state["values"] == ["API 510", "ASSET-7", "ASSET-9", "EQP-P7", "SOP-3"]
    assert (state["mentions"], state["orphan_mentions"], state["orphan_entities"], state["stale"]) == (5, 0, 0, 0)
    assert _snapshot_values(settings) == state["values"]

    # a changed file: new version, the old one purged (retention 0) with its mentions and the entity only it named
    (docs / "pump.md").write_text("# Pump\n\nPump EQP-P7 feeds vessel ASSET-8. Follow SOP-3 before opening it.\n"
                                  + MARKDOWN_FILLER)
    run_sync(settings, counting_embedder)
    state = _entity_state(settings)
    assert state["values"] == ["API 510", "ASSET-8", "ASSET-9", "EQP-P7", "SOP-3"]
    assert (state["mentions"], state["orphan_mentions"], state["orphan_entities"]) == (5, 0, 0)
    assert _snapshot_values(settings) == state["values"]

    # a deleted file: its chunks and mentions go with the purge
    (docs / "vessel.md").unlink()
    run_sync(settings, counting_embedder)
    state = _entity_state(settings)
    assert state["values"] == ["ASSET-8", "EQP-P7", "SOP-3"]
    assert (state["mentions"], state["orphan_mentions"], state["orphan_entities"]) == (3, 0, 0)
    assert _snapshot_values(settings) == state["values"]


def test_changing_the_patterns_re_extracts_on_the_next_sync_without_re_embedding(tmp_path, counting_embedder):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "valves.md").write_text("# Valves\n\nTest both relief valves on ASSET-5 as API 520 asks.\n" + MARKDOWN_FILLER)
    settings = Settings(data_dir=tmp_path / "data", sources=[docs])
    run_sync(settings, counting_embedder)
    first = read_pointer(settings.index_dir).snapshot_version
    assert _snapshot_values(settings) == ["API 520", "ASSET-5"]

    embedded = len(counting_embedder.texts)
    changed = settings.model_copy(update={"entity_patterns": {
        "standard": None, "term": {"pattern": "relief valves?", "canonical": "relief valve", "case": "lower"}}})
    report = run_sync(changed, counting_embedder)
    assert report.chunk.documents == 0 and report.chunk.entities.documents == 1  # re-extracted, not re-chunked
    assert len(counting_embedder.texts) == embedded  # nothing re-embedded
    assert report.publish.snapshot_built and read_pointer(settings.index_dir).snapshot_version == first + 1
    assert _snapshot_values(settings) == ["ASSET-5", "relief valve"]
    state = _entity_state(changed)
    assert state["values"] == ["ASSET-5", "relief valve"] and state["stale"] == 0 and state["orphan_entities"] == 0

    engine = RetrievalEngine(changed, embedder=counting_embedder)
    hits = engine.search("valves", k=1, log=False, filters={"entities": ["Relief Valves"]}).hits
    assert hits and EntityRef(type="term", value="relief valve") in hits[0].entities
    assert run_sync(changed, counting_embedder).chunk.entities.documents == 0  # nothing left to re-extract


# ------------------------------------------------------------------ Dagster

def test_chunks_asset_metadata_counts_entities_per_type(tmp_path):
    import dagster as dg

    from pipelines.ingestion import chunks, parsed_documents, raw_documents
    from pipelines.resources import EmbeddingModelResource, KnowledgeStoreResource

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "plant.md").write_text("# Plant\n\nVessel ASSET-1 and ASSET-2 follow SOP-4 and ISO 9001; "
                                   "the second check of ASSET-1 too.\n" + MARKDOWN_FILLER)
    result = dg.materialize(
        [raw_documents, parsed_documents, chunks],
        resources={"store": KnowledgeStoreResource(data_dir=str(tmp_path / "data"), sources=str(docs)),
                   "model": EmbeddingModelResource()},
    )
    assert result.success
    [materialization] = [m for m in result.asset_materializations_for_node("chunks")]
    metadata = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    assert metadata["entities_distinct"] == 4 and metadata["entity_mentions"] == 5
    assert (metadata["entities_asset"], metadata["entities_procedure"], metadata["entities_standard"]) == (2, 1, 1)
    assert "entities_equipment" not in metadata
    assert metadata["entity_documents_extracted"] == 1
    assert "| asset | 2 | 3 | 1 |" in metadata["entities_by_type"]


def test_a_question_naming_a_code_is_answered_from_the_passage_that_names_it(sample, embedder):
    """E47 is no entity of the vocabulary: it counts as an identifier (letters and digits) the corpus holds, and the
    table row naming it ranks first (the sections about E42 and E55 read much the same to an embedding model)."""
    response = sample["engine"].search("what does E47 mean", k=3, log=False)
    assert "E47" in response.hits[0].text and response.hits[0].entity_boost > 0
    assert "No contact with the Aurora Hub for more than 15 minutes" in response.answer.text
    plain = RetrievalEngine(sample["settings"].model_copy(update={"identifier_boost": 0.0}), embedder=embedder)
    assert all(h.entity_boost == 0.0 for h in plain.search("what does E47 mean", k=3, log=False).hits)
