"""The document model: revision labels, supersedence across renamed files, relations, validity in citations.

Field names are the model's: ``documents.rev_label``, ``status 'active'|'superseded'``, ``valid_from``/``valid_to``,
``relations(src_type, src_id, rel_type, dst_type, dst_id, confidence, evidence)`` with evidence
``{"phrase", "page", "span"}``, and the citation ``{doc_id, title, rev_label, section, pages[], chunk_id, source_path}``.

The parts that need no model, store or server are in tests/unit/test_document_revisions.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import duckdb
import pytest
from fastapi.testclient import TestClient

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.relations import relation_id
from knowledge_store.ingest.run import run_sync
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.store import MIGRATIONS, migrate, store_connection
from tests.helpers import MARKDOWN_FILLER

SEED_RELATION_COLUMNS = ("src_type", "src_id", "rel_type", "dst_type", "dst_id", "confidence", "evidence")
SEED_CITATION_FIELDS = ("doc_id", "title", "rev_label", "section", "pages", "chunk_id", "source_path")


# ------------------------------------------------------------------ migrations (no model)

def test_migration_6_lands_before_or_after_migration_5_in_either_order(tmp_path: Path) -> None:
    """Migrations are applied by number, not by position: a store that got 6 before 5 existed still gets 5."""
    numbers = [number for number, _, _ in MIGRATIONS]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers) and 6 in numbers
    conn = duckdb.connect(str(tmp_path / "store.duckdb"))
    try:
        without_5 = [m for m in MIGRATIONS if m[0] != 5]
        assert migrate(conn, without_5) == MIGRATIONS[-1][0]  # the newest applied, 5 still missing
        migrate(conn)  # 5 lands later
        applied = [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()]
        assert applied == numbers
        columns = {row[0] for row in conn.execute("DESCRIBE documents").fetchall()}
        assert {"rev_label", "rev_label_source", "superseded_by"} <= columns
        relation_columns = [row[0] for row in conn.execute("DESCRIBE relations").fetchall()]
        assert set(SEED_RELATION_COLUMNS) <= set(relation_columns)
    finally:
        conn.close()


# ------------------------------------------------------------------ whole pipeline (embedding model)

def _settings(root: Path, **overrides) -> Settings:
    return Settings(data_dir=root / "data", sources=[root / "docs"], **overrides)


def _rows(settings: Settings, sql: str, params=None) -> list[dict]:
    with store_connection(settings.store_path, read_only=True) as conn:
        cursor = conn.execute(sql, params or [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def _documents(settings: Settings) -> dict[str, dict]:
    """Latest version per relative path."""
    rows = _rows(settings, "SELECT * FROM documents ORDER BY relative_path, version")
    return {row["relative_path"]: row for row in rows}


def _relations(settings: Settings, rel_type: str) -> list[dict]:
    return _rows(settings, "SELECT relation_id, " + ", ".join(SEED_RELATION_COLUMNS) + ", created_at FROM relations "
                 "WHERE rel_type = ? ORDER BY src_id, dst_id", [rel_type])


def _write(path: Path, text: str, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


STARTUP_B = ("# SOP-42 Compressor startup\n\nOpen the suction valve slowly. Check the crankcase heater has run for "
             "twelve hours.\n" + MARKDOWN_FILLER)
STARTUP_C = ("# SOP-42 Compressor startup\n\nOpen the suction valve slowly and confirm the oil pressure gauge reads "
             "normal.\n" + MARKDOWN_FILLER)


@pytest.mark.slow
def test_renamed_revision_supersedes_the_older_file_and_resync_adds_nothing(tmp_path: Path, embedder) -> None:
    docs = tmp_path / "docs"
    now = time.time()
    # the newer revision has the OLDER file date: the labels decide, not the dates
    _write(docs / "SOP-42-RevB.md", STARTUP_B, now - 3600)
    _write(docs / "SOP-42-RevC.md", STARTUP_C, now - 7200)
    _write(docs / "other.md", "# Boiler\n\nBleed the radiators once a year before the heating season starts.\n"
           + MARKDOWN_FILLER)
    settings = _settings(tmp_path)
    report = run_sync(settings, embedder)

    documents = _documents(settings)
    old, new = documents["SOP-42-RevB.md"], documents["SOP-42-RevC.md"]
    assert (old["status"], new["status"], documents["other.md"]["status"]) == ("superseded", "active", "active")
    assert (old["rev_label"], new["rev_label"]) == ("Rev B", "Rev C")
    assert old["valid_to"] is not None and new["valid_to"] is None and new["valid_from"] is not None
    assert old["superseded_by"] == new["doc_id"]
    assert report.publish.revisions["superseded"] == 1 and "1 superseded by a newer revision" in report.summary

    relations = _relations(settings, "supersedes")
    assert len(relations) == 1
    relation = relations[0]
    assert (relation["src_type"], relation["src_id"], relation["dst_type"], relation["dst_id"]) == \
        ("document", new["doc_id"], "document", old["doc_id"])
    assert relation["relation_id"] == relation_id("document", new["doc_id"], "supersedes", "document", old["doc_id"])
    evidence = json.loads(relation["evidence"])
    assert (evidence["reason"], evidence["key"], evidence["ordered_by"]) == ("same asset id", "SOP-42", "rev_label")
    assert (evidence["new"]["rev_label"], evidence["old"]["rev_label"]) == ("Rev C", "Rev B")
    assert relation["confidence"] == pytest.approx(0.9)

    # the snapshot's active mask leaves the old revision out; include_superseded brings it back, marked
    engine = RetrievalEngine(settings, embedder=embedder)
    hits = engine.search("crankcase heater twelve hours", k=5).results
    assert all(hit.doc_id != old["doc_id"] for hit in hits)
    assert any(hit.doc_id == new["doc_id"] and hit.supersedes == [old["doc_id"]] for hit in
               engine.search("suction valve oil pressure", k=5).results)
    history = engine.search("crankcase heater twelve hours", k=5, filters={"include_superseded": True}).results
    superseded = next(hit for hit in history if hit.doc_id == old["doc_id"])
    assert (superseded.status, superseded.rev_label, superseded.superseded_by) == ("superseded", "Rev B", new["doc_id"])
    assert superseded.valid_to is not None and superseded.valid_to.endswith("Z")

    # a re-sync changes nothing: no new relation rows, no new snapshot, same ids and creation times
    again = run_sync(settings, embedder)
    assert again.publish.snapshot_built is False
    assert again.publish.revisions["relations_added"] == 0 and again.publish.revisions["superseded"] == 0
    assert _relations(settings, "supersedes") == relations
    assert _rows(settings, "SELECT count(*) AS n FROM relations")[0]["n"] == 1


@pytest.mark.slow
def test_deleting_the_newest_revision_makes_the_older_one_active_again(tmp_path: Path, embedder) -> None:
    docs = tmp_path / "docs"
    _write(docs / "SOP-42-RevB.md", STARTUP_B)
    _write(docs / "SOP-42-RevC.md", STARTUP_C)
    settings = _settings(tmp_path)
    run_sync(settings, embedder)
    (docs / "SOP-42-RevC.md").unlink()
    report = run_sync(settings, embedder)

    documents = _documents(settings)
    assert documents["SOP-42-RevC.md"]["status"] == "deleted"
    older = documents["SOP-42-RevB.md"]
    assert (older["status"], older["valid_to"], older["superseded_by"]) == ("active", None, None)
    assert report.publish.revisions["reactivated"] == 1 and "1 active again" in report.summary
    assert _relations(settings, "supersedes") == []
    engine = RetrievalEngine(settings, embedder=embedder)
    assert any(hit.doc_id == older["doc_id"] for hit in engine.search("crankcase heater twelve hours", k=3).results)

    # the old revision's own file going too deletes it like any other
    (docs / "SOP-42-RevB.md").unlink()
    run_sync(settings, embedder)
    assert _documents(settings)["SOP-42-RevB.md"]["status"] == "deleted"


@pytest.mark.slow
def test_superseded_revision_file_changing_or_vanishing_is_tracked(tmp_path: Path, embedder) -> None:
    docs = tmp_path / "docs"
    _write(docs / "SOP-42-RevB.md", STARTUP_B)
    _write(docs / "SOP-42-RevC.md", STARTUP_C)
    settings = _settings(tmp_path)
    run_sync(settings, embedder)
    # an edit of the superseded file is a new version of it, still superseded by Rev C
    _write(docs / "SOP-42-RevB.md", STARTUP_B + "\nAdded a note about the discharge valve.\n")
    report = run_sync(settings, embedder)
    assert report.raw.updated == 1
    rows = _rows(settings, "SELECT version, status, superseded_by FROM documents WHERE relative_path = 'SOP-42-RevB.md' "
                           "ORDER BY version")
    assert [(r["version"], r["status"]) for r in rows] == [(1, "superseded"), (2, "superseded")]
    assert len(_relations(settings, "supersedes")) == 1
    # and its file going away deletes it (it was out of the index already: nothing counted as removed)
    (docs / "SOP-42-RevB.md").unlink()
    report = run_sync(settings, embedder)
    assert _documents(settings)["SOP-42-RevB.md"]["status"] == "deleted" and report.raw.removed == 0
    assert _relations(settings, "supersedes") == []


@pytest.mark.slow
def test_same_title_families_need_labels_and_fall_back_to_file_dates(tmp_path: Path, embedder) -> None:
    docs = tmp_path / "docs"
    now = time.time()
    # same title in front matter, revision labels 2 and 3: Rev 3 wins
    _write(docs / "boiler/service.md", "---\ntitle: Boiler service\nrevision: 3\n---\n# Service\n\nDescale the heat "
                                        "exchanger every spring.\n" + MARKDOWN_FILLER, now - 7200)
    _write(docs / "archive/boiler-service-old.md", "---\ntitle: Boiler service\nrevision: 2\n---\n# Service\n\n"
                                                   "Descale the heat exchanger every autumn.\n" + MARKDOWN_FILLER, now - 60)
    # labels of different schemes cannot be compared: the newer file date decides
    _write(docs / "pump-Rev B.md", "---\ntitle: Pump manual\n---\n# Pump\n\nPrime the pump before the first start.\n"
           + MARKDOWN_FILLER, now - 7200)
    _write(docs / "pump-v2.md", "---\ntitle: Pump manual\n---\n# Pump\n\nPrime the pump and vent the casing.\n"
           + MARKDOWN_FILLER, now - 60)
    # same title, no labels at all: two different documents
    _write(docs / "a/installation.md", "# Installation\n\nMount the hub on a wall near a socket.\n" + MARKDOWN_FILLER)
    _write(docs / "b/installation.md", "# Installation\n\nMount the thermostat 1.5 m above the floor.\n" + MARKDOWN_FILLER)
    # versions named in titles are releases the sections describe, not revisions of one document
    _write(docs / "checklist-version-2-1-1.md", "# Policy Manual: Version 2.1.1\n\nPackages must declare a "
                                                "priority field.\n" + MARKDOWN_FILLER)
    _write(docs / "checklist-version-2-2-0.md", "# Policy Manual: Version 2.2.0\n\nThe menu entry format "
                                                "changed.\n" + MARKDOWN_FILLER)
    settings = _settings(tmp_path)
    run_sync(settings, embedder)

    documents = _documents(settings)
    assert documents["boiler/service.md"]["status"] == "active"
    assert documents["archive/boiler-service-old.md"]["status"] == "superseded"
    assert documents["pump-v2.md"]["status"] == "active" and documents["pump-Rev B.md"]["status"] == "superseded"
    assert documents["a/installation.md"]["status"] == documents["b/installation.md"]["status"] == "active"
    assert documents["checklist-version-2-1-1.md"]["status"] == documents["checklist-version-2-2-0.md"]["status"] \
        == "active"
    by_old = {row["dst_id"]: json.loads(row["evidence"]) for row in _relations(settings, "supersedes")}
    title_evidence = by_old[documents["archive/boiler-service-old.md"]["doc_id"]]
    assert (title_evidence["reason"], title_evidence["key"], title_evidence["ordered_by"]) == \
        ("same title", "boiler service", "rev_label")
    assert by_old[documents["pump-Rev B.md"]["doc_id"]]["ordered_by"] == "modified_at"

    # switched off: every file is its own document again
    run_sync(_settings(tmp_path, revision_families=False), embedder)
    assert {row["status"] for row in _documents(settings).values()} == {"active"}
    assert _relations(settings, "supersedes") == []


@pytest.mark.slow
def test_links_to_other_documents_become_see_also_relations_with_evidence(tmp_path: Path, embedder) -> None:
    docs = tmp_path / "docs"
    _write(docs / "start.md", "# Start here\n\nBefore wiring, read the [wiring guide](guide/wiring.md#terminals) and "
                              "the [missing page](guide/later.md). Mail [us](mailto:help@example.org).\n" + MARKDOWN_FILLER)
    _write(docs / "guide/wiring.md", "# Wiring\n\nConnect the R and C terminals first. Back to [the start](../start.md).\n"
           + MARKDOWN_FILLER)
    _write(docs / "guide/reset.html", "<html><head><title>Reset</title></head><body><main><h1>Reset</h1><p>Hold the "
                                      "button for ten seconds. Wiring questions: see <a href='wiring.md'>the wiring "
                                      "page</a>.</p></main></body></html>")
    settings = _settings(tmp_path)
    run_sync(settings, embedder)
    documents = _documents(settings)
    ids = {path: row["doc_id"] for path, row in documents.items()}

    rows = {(row["src_id"], row["dst_id"]): row for row in _relations(settings, "seeAlso")}
    assert set(rows) == {(ids["start.md"], ids["guide/wiring.md"]), (ids["guide/wiring.md"], ids["start.md"]),
                         (ids["guide/reset.html"], ids["guide/wiring.md"])}
    for (src, _dst), row in rows.items():
        evidence = json.loads(row["evidence"])
        assert set(evidence) >= {"phrase", "page", "span"} and row["confidence"] == 1.0
        page_text = _rows(settings, "SELECT p.text FROM pages p JOIN documents d USING (doc_id, version) "
                                    "WHERE p.doc_id = ? AND d.status = 'active' AND p.page_number = ?",
                          [src, evidence["page"]])[0]["text"]
        start, end = evidence["span"]
        assert page_text[start:end] == evidence["phrase"]
    assert json.loads(rows[(ids["guide/reset.html"], ids["guide/wiring.md"])]["evidence"])["phrase"] == "the wiring page"
    assert json.loads(rows[(ids["start.md"], ids["guide/wiring.md"])]["evidence"])["phrase"] == "wiring guide"

    # the link to a page that does not exist yet resolves once it does (links are resolved at publish)
    _write(docs / "guide/later.md", "# Later\n\nThe page the start page promised.\n" + MARKDOWN_FILLER)
    report = run_sync(settings, embedder)
    assert report.publish.revisions["relations_added"] == 1
    assert (ids["start.md"], _documents(settings)["guide/later.md"]["doc_id"]) in \
        {(row["src_id"], row["dst_id"]) for row in _relations(settings, "seeAlso")}
    # and a removed link takes its relation with it
    _write(docs / "guide/wiring.md", "# Wiring\n\nConnect the R and C terminals first.\n" + MARKDOWN_FILLER)
    report = run_sync(settings, embedder)
    assert report.publish.revisions["relations_removed"] == 1
    assert (ids["guide/wiring.md"], ids["start.md"]) not in \
        {(row["src_id"], row["dst_id"]) for row in _relations(settings, "seeAlso")}


@pytest.mark.slow
def test_api_and_mcp_citations_carry_rev_label_validity_and_relations(tmp_path: Path, embedder) -> None:
    from knowledge_store.server.app import create_app
    from knowledge_store.server.mcp_server import build_mcp_server

    docs = tmp_path / "docs"
    _write(docs / "SOP-42-RevB.md", STARTUP_B)
    _write(docs / "SOP-42-RevC.md", STARTUP_C + "\nBefore maintenance follow the [lockout procedure](lockout.md).\n")
    _write(docs / "lockout.md", "# Lockout\n\nIsolate the compressor and attach a personal padlock to the breaker.\n"
           + MARKDOWN_FILLER)
    settings = _settings(tmp_path)
    run_sync(settings, embedder)
    documents = _documents(settings)
    new, old = documents["SOP-42-RevC.md"], documents["SOP-42-RevB.md"]

    engine = RetrievalEngine(settings, embedder=embedder)
    app = create_app(settings, engine, mount_mcp=False)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        response = client.post("/api/knowledge/query", json={"query": "suction valve oil pressure gauge", "k": 3})
        assert response.status_code == 200, response.text
        top = response.json()["results"][0]
        assert top["doc_id"] == new["doc_id"]
        assert set(SEED_CITATION_FIELDS) <= set(top)
        assert (top["rev_label"], top["valid_to"], top["status"]) == ("Rev C", None, "active")
        assert top["valid_from"].endswith("Z") and top["source_path"].startswith("file://")
        assert top["supersedes"] == [old["doc_id"]] and top["see_also"] == [documents["lockout.md"]["doc_id"]]

        response = client.post("/api/knowledge/query", json={"query": "crankcase heater twelve hours", "k": 3,
                                                               "filters": {"include_superseded": True}})
        superseded = next(r for r in response.json()["results"] if r["doc_id"] == old["doc_id"])
        assert (superseded["status"], superseded["rev_label"], superseded["superseded_by"]) == \
            ("superseded", "Rev B", new["doc_id"])
        assert superseded["valid_to"] is not None

        response = client.post("/api/ask", json={"query": "suction valve oil pressure gauge"})
        assert response.status_code == 200, response.text
        source = response.json()["sources"][0]
        assert set(source) >= {"file", "section", "url", "pages"}  # the ask contract's fields stay
        assert (source["rev_label"], source["valid_to"], source["superseded_by"]) == ("Rev C", None, None)
        assert source["valid_from"].endswith("Z") and source["source_path"].startswith("file://")
        assert source["supersedes"] == [old["doc_id"]] and source["see_also"] == [documents["lockout.md"]["doc_id"]]
        assert source["entities"] == top["entities"] and any(e["value"] == "SOP-42" for e in source["entities"])

        response = client.get(f"/api/knowledge/documents/{new['doc_id']}/relations")
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["rev_label"], body["status"], body["valid_to"]) == ("Rev C", "active", None)
        kinds = {(r["rel_type"], r["direction"], r["other"]["doc_id"]) for r in body["relations"]}
        assert kinds == {("supersedes", "outgoing", old["doc_id"]), ("seeAlso", "outgoing", documents["lockout.md"]["doc_id"])}
        assert all(set(SEED_RELATION_COLUMNS) <= set(r) for r in body["relations"])
        old_view = client.get(f"/api/knowledge/documents/{old['doc_id']}/relations").json()
        assert (old_view["status"], old_view["superseded_by"]) == ("superseded", new["doc_id"])
        assert old_view["relations"][0]["direction"] == "incoming"
        missing = client.get("/api/knowledge/documents/no-such-doc/relations")
        assert missing.status_code == 404 and "no-such-doc" in missing.json()["message"]

        listed = client.get("/api/knowledge/documents").json()["documents"]
        row = next(d for d in listed if d["doc_id"] == old["doc_id"])
        assert (row["rev_label"], row["superseded_by"]) == ("Rev B", new["doc_id"])

    server = build_mcp_server(engine)
    result = asyncio.run(server.call_tool("search", {"query": "suction valve oil pressure gauge", "k": 2}))
    structured = result.structured_content if hasattr(result, "structured_content") else result[1]
    first = structured["results"][0]
    assert (first["rev_label"], first["valid_to"], first["status"]) == ("Rev C", None, "active")
    assert first["valid_from"].endswith("Z")


@pytest.mark.slow
def test_web_page_links_and_links_to_web_pages_become_see_also(tmp_path: Path, embedder) -> None:
    from knowledge_store.ingest.sources import add_source
    from tests.doc_site import DocSite

    site = DocSite()
    site.page("/docs/", "Pump docs", [("intro", "Intro", "Welcome to the pump documentation.")],
              [("install", "the install guide")])
    site.page("/docs/install", "Install", [("steps", "Steps", "Mount the pump on the base plate with four bolts.")],
              [("/docs/", "the docs home")])
    _write(tmp_path / "docs" / "notes.md", f"# Notes\n\nOur pump follows [the vendor's install page]"
                                           f"({site.url('/docs/install')}).\n" + MARKDOWN_FILLER)
    settings = _settings(tmp_path, web_backoff_base_s=0.05)
    with store_connection(settings.store_path) as conn:
        add_source(conn, "pumps", "web", site.url("/docs/"), {"depth": 1, "requests_per_second": 500.0})
    with site:
        run_sync(settings, embedder)
    ids = {row["url"]: row["doc_id"] for row in _rows(settings, "SELECT url, doc_id FROM documents WHERE status = 'active'")}
    home, install = ids[site.url("/docs/")], ids[site.url("/docs/install")]
    notes = next(doc_id for url, doc_id in ids.items() if url.endswith("/notes.md"))
    found = {(row["src_id"], row["dst_id"]): json.loads(row["evidence"])["phrase"] for row in _relations(settings, "seeAlso")}
    assert found == {(home, install): "the install guide", (install, home): "the docs home",
                     (notes, install): "the vendor's install page"}
