"""Source management: registry rules, one-source syncs, soft delete, retries, CLI, API and Dagster partitions."""

from __future__ import annotations

import json
import time
from pathlib import Path

import dagster as dg
import pytest
from fastapi.testclient import TestClient

from knowledge_store.cli import main
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import CorruptFileError, InvalidSourceError, SourceExistsError, SourceNotFoundError
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.source_actions import delete_source_now, retry_failure
from knowledge_store.ingest.sources import add_source, get_source, list_sources, update_source
from knowledge_store.storage.index import read_pointer
from knowledge_store.storage.store import store_connection
from tests.helpers import MARKDOWN_FILLER

pytestmark = pytest.mark.slow


def write_docs(folder: Path, topic: str, n: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"{topic}-{i}.md").write_text(
            f"# {topic.title()} {i}\n\nThe {topic} procedure {i} needs a torque of {10 + i} newton metres "
            f"and a {topic} check before the cover is closed.\n" + MARKDOWN_FILLER
        )


def setup(tmp_path: Path, **overrides) -> Settings:
    write_docs(tmp_path / "base", "baseline")
    return Settings(data_dir=tmp_path / "data", sources=[tmp_path / "base"], **overrides)


def rows(settings: Settings, sql: str, params=None):
    with store_connection(settings.store_path, read_only=True) as conn:
        return conn.execute(sql, params or []).fetchall()


def active_docs_by_source(settings: Settings) -> dict[str, int]:
    return dict(rows(settings, "SELECT s.name, count(*) FROM documents d JOIN sources s USING (source_id) "
                               "WHERE d.status = 'active' GROUP BY s.name"))


# ------------------------------------------------------------------ registry rules


def test_registry_validates_names_urls_options_and_refuses_duplicates(tmp_path):
    settings = setup(tmp_path)
    write_docs(tmp_path / "manuals", "manual")
    with store_connection(settings.store_path) as conn:
        add_source(conn, "site", "web", "https://Docs.Example.com/guide/#intro", {"depth": 3, "exclude": ["/changelog/"]})
        site = get_source(conn, "site")
        assert site.location == "https://docs.example.com/guide/"
        assert site.config["depth"] == 3 and site.config["exclude"] == ["/changelog/"] and site.config["max_pages"] == 500
        assert site.resync_needed  # never synced
        with pytest.raises(SourceExistsError, match="already exists"):
            add_source(conn, "site", "folder", str(tmp_path / "manuals"))
        with pytest.raises(SourceExistsError, match="already registered as source 'site'"):
            add_source(conn, "site2", "web", "https://docs.example.com/guide/")
        bad = [
            ("bad name!", "web", "https://x.org/", {}, "name"),
            ("b", "web", "ftp://x.org/", {}, "url"),
            ("b", "web", "https://x.org/", {"depth": 6}, "depth"),
            ("b", "web", "https://x.org/", {"exclude": ["(unclosed"]}, "exclude"),
            ("b", "web", "https://x.org/", {"max_pagez": 3}, "max_pagez"),
            ("b", "web", "https://x.org/", {"requests_per_second": 0}, "requests_per_second"),
            ("b", "folder", str(tmp_path / "nope"), None, "folder"),
        ]
        for name, kind, location, options, field in bad:
            with pytest.raises(InvalidSourceError) as info:
                add_source(conn, name, kind, location, options)
            assert info.value.field == field
        assert [s.name for s in list_sources(conn)] == ["site"]  # nothing half-added

        source, changed, resync = update_source(conn, "site", {"requests_per_second": 2})
        assert changed == ["requests_per_second"] and not resync  # politeness does not change content
        source, changed, resync = update_source(conn, "site", {"include": ["/guide/api/"]})
        assert changed == ["include"] and resync
        with pytest.raises(SourceNotFoundError, match="known sources: site"):
            get_source(conn, "nope")


def test_one_source_sync_leaves_the_other_sources_untouched(tmp_path, counting_embedder):
    settings = setup(tmp_path)
    write_docs(tmp_path / "manuals", "manual", 3)
    with store_connection(settings.store_path) as conn:
        add_source(conn, "manuals", "folder", str(tmp_path / "manuals"))
    report = run_sync(settings, counting_embedder, names=["manuals"])
    assert (report.raw.added, report.raw.sources) == (3, ["manuals"])
    assert active_docs_by_source(settings) == {"manuals": 3}  # 'base' not scanned at all

    # change both folders, sync only 'base'
    (tmp_path / "manuals" / "manual-0.md").write_text("# Manual 0\n\nRewritten: the gasket is replaced yearly.\n" + MARKDOWN_FILLER)
    (tmp_path / "base" / "baseline-9.md").write_text("# Extra\n\nA new baseline page about the fuse box.\n" + MARKDOWN_FILLER)
    report = run_sync(settings, counting_embedder, names=["base"])
    assert (report.raw.added, report.raw.updated, report.raw.unchanged) == (3, 0, 0)
    assert active_docs_by_source(settings) == {"base": 3, "manuals": 3}
    version = rows(settings, "SELECT max(version) FROM documents WHERE relative_path = 'manual-0.md'")[0][0]
    assert version == 1  # manuals' change is not seen until manuals syncs
    scope = rows(settings, "SELECT scope FROM sync_runs WHERE sync_run_id = ?", [report.raw.sync_run_id])[0][0]
    assert json.loads(scope) == ["base"]

    report = run_sync(settings, counting_embedder)  # all sources
    assert (report.raw.updated, report.raw.unchanged) == (1, 5)
    assert rows(settings, "SELECT count(*) FROM documents WHERE status = 'active'")[0][0] == 6
    assert rows(settings, "SELECT count(*) FROM chunks c JOIN documents d USING (doc_id, version) "
                          "WHERE d.status = 'active'")[0][0] == read_pointer(settings.index_dir).chunk_count


def test_delete_removes_chunks_from_the_index_at_once_and_purges_after_retention(tmp_path, counting_embedder):
    from knowledge_store.retrieval.engine import RetrievalEngine

    settings = setup(tmp_path)
    write_docs(tmp_path / "manuals", "gearbox", 2)
    with store_connection(settings.store_path) as conn:
        add_source(conn, "manuals", "folder", str(tmp_path / "manuals"))
    run_sync(settings, counting_embedder)
    engine = RetrievalEngine(settings, embedder=counting_embedder)
    hits = engine.search("gearbox procedure torque", k=5, answer="none", min_relevance=0.0)
    assert any("gearbox" in hit.title.lower() for hit in hits.results)
    before = read_pointer(settings.index_dir).chunk_count

    result = delete_source_now(settings, "manuals")
    assert result["documents_deleted"] == 2
    assert read_pointer(settings.index_dir).chunk_count == before - 2
    engine.snapshots.refresh()  # what the API's delete does; other processes see it within a second
    hits = engine.search("gearbox procedure torque", k=5, answer="none", min_relevance=0.0)
    assert hits.results and not any("gearbox" in hit.title.lower() for hit in hits.results)
    assert rows(settings, "SELECT count(*) FROM documents d JOIN sources s USING (source_id) "
                          "WHERE s.name = 'manuals' AND d.status = 'deleted'")[0][0] == 2
    with store_connection(settings.store_path) as conn:
        with pytest.raises(SourceNotFoundError):
            get_source(conn, "manuals")
        assert get_source(conn, "manuals", include_deleted=True).deleted
    run_sync(settings, counting_embedder)  # a full sync does not bring it back
    assert "manuals" not in active_docs_by_source(settings)

    purged = settings.model_copy(update={"deleted_retention_days": 0.0})
    time.sleep(0.01)
    run_sync(purged, counting_embedder)
    assert rows(settings, "SELECT count(*) FROM documents WHERE source_id IN "
                          "(SELECT source_id FROM sources WHERE name = 'manuals')")[0][0] == 0
    assert rows(settings, "SELECT count(*) FROM sources WHERE name = 'manuals'")[0][0] == 0


def test_configured_folders_can_be_deleted_only_once_the_settings_stop_naming_them(tmp_path, counting_embedder):
    settings = setup(tmp_path)
    run_sync(settings, counting_embedder)
    with pytest.raises(SourceExistsError, match="GROUNDWORK_SOURCES"):
        delete_source_now(settings, "base")
    # once the settings stop naming it, its documents stay indexed (not synced) until deleted here
    write_docs(tmp_path / "other", "other", 1)
    moved = settings.model_copy(update={"sources": [tmp_path / "other"]})
    run_sync(moved, counting_embedder)
    assert active_docs_by_source(settings) == {"base": 2, "other": 1}
    assert delete_source_now(moved, "base")["documents_deleted"] == 2
    assert active_docs_by_source(settings) == {"other": 1}


def test_retry_reruns_a_failed_parse_and_resolves_the_failure(tmp_path, counting_embedder, monkeypatch):
    import knowledge_store.ingest.parse as parse_stage

    settings = setup(tmp_path)
    real = parse_stage.parse_file

    def flaky(path, **kwargs):
        if Path(path).name == "baseline-1.md":
            raise CorruptFileError(path, "simulated parser crash")
        return real(path, **kwargs)

    monkeypatch.setattr(parse_stage, "parse_file", flaky)
    report = run_sync(settings, counting_embedder)
    assert report.parse.failed == 1
    (failure_id,) = rows(settings, "SELECT failure_id FROM ingestion_failures WHERE resolved_at IS NULL")[0]
    outcome = retry_failure(settings, failure_id, counting_embedder)
    assert not outcome["resolved"] and "simulated" in outcome["still_failing"]["reason"]

    monkeypatch.setattr(parse_stage, "parse_file", real)
    outcome = retry_failure(settings, failure_id, counting_embedder)
    assert outcome["resolved"], outcome
    assert rows(settings, "SELECT count(*) FROM documents WHERE status = 'active'")[0][0] == 2
    assert rows(settings, "SELECT count(*) FROM ingestion_failures WHERE resolved_at IS NULL")[0][0] == 0


def test_retry_of_a_refused_file_rescans_its_source_with_current_settings(tmp_path, counting_embedder):
    settings = setup(tmp_path, max_file_mb=0.0001)  # ~100 bytes: the docs are refused as oversize
    report = run_sync(settings, counting_embedder)
    assert report.raw.failed == 2
    failure_id = rows(settings, "SELECT failure_id FROM ingestion_failures WHERE kind = 'oversize' ORDER BY path")[0][0]
    outcome = retry_failure(settings.model_copy(update={"max_file_mb": 50.0}), failure_id, counting_embedder)
    assert outcome["resolved"] and outcome["stage"] == "scan"
    assert rows(settings, "SELECT count(*) FROM documents WHERE status = 'active'")[0][0] == 2


# ------------------------------------------------------------------ CLI


def test_cli_sources_lifecycle_and_one_source_sync(tmp_path, capsys, monkeypatch):
    settings = setup(tmp_path)
    write_docs(tmp_path / "manuals", "pump", 2)
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("GROUNDWORK_SOURCES", str(tmp_path / "base"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)

    assert main(["sources", "add", "manuals", "--folder", str(tmp_path / "manuals")]) == 0
    assert "added source manuals (folder)" in capsys.readouterr().out
    assert main(["sources", "add", "web", "--url", "https://docs.example.org/", "--depth", "7"]) == 2
    assert "depth=7" in capsys.readouterr().err
    assert main(["sources", "add", "x", "--url", "https://a.org/", "--folder", str(tmp_path)]) == 2
    capsys.readouterr()

    assert main(["sync", "manuals", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {k: report[k] for k in ("added", "updated", "removed", "unchanged", "excluded", "failed")} == \
        {"added": 2, "updated": 0, "removed": 0, "unchanged": 0, "excluded": 0, "failed": 0}
    assert report["documents"] == 2 and report["source"] == "manuals"
    assert active_docs_by_source(settings) == {"manuals": 2}

    assert main(["sync", "nope"]) == 2
    assert "no source named 'nope'" in capsys.readouterr().err

    assert main(["sources", "list", "--json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert listed["manuals"]["documents"] == 2 and listed["base"]["documents"] == 0

    assert main(["sources", "show", "manuals"]) == 0
    shown = capsys.readouterr().out
    assert "2 documents" in shown and "2 added" in shown

    assert main(["sources", "update", "manuals", "--disable"]) == 0
    capsys.readouterr()
    assert main(["sync", "manuals"]) == 2
    assert "is disabled" in capsys.readouterr().err
    assert main(["sources", "update", "manuals", "--enable", "--rename", "pumps"]) == 0
    assert "updated pumps: enabled, name" in capsys.readouterr().out
    assert main(["sources", "delete", "pumps", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["documents_deleted"] == 2
    assert active_docs_by_source(settings) == {}


# ------------------------------------------------------------------ API


def test_api_source_crud_sync_job_and_errors(tmp_path, embedder):
    from knowledge_store.retrieval.engine import RetrievalEngine
    from knowledge_store.server.app import create_app

    settings = setup(tmp_path)
    run_sync(settings, embedder)
    write_docs(tmp_path / "manuals", "valve", 2)
    engine = RetrievalEngine(settings, embedder=embedder)
    with TestClient(create_app(settings, engine=engine, mount_mcp=False), base_url="http://127.0.0.1:8080") as client:
        created = client.post("/api/sources", json={"name": "manuals", "kind": "folder", "folder": str(tmp_path / "manuals")})
        assert created.status_code == 201, created.text
        assert client.post("/api/sources", json={"name": "manuals", "kind": "folder",
                                                 "folder": str(tmp_path / "manuals")}).status_code == 409
        bad = client.post("/api/sources", json={"name": "w", "url": "https://x.org/", "depth": 9})
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "depth"
        assert client.post("/api/sources", json={"name": "w", "url": "https://x.org/", "bogus": 1}).status_code == 422
        assert client.get("/api/sources/nope").status_code == 404

        job = client.post("/api/sources/manuals/sync")
        assert job.status_code == 202
        status = job.json()
        for _ in range(300):
            status = client.get(f"/api/knowledge/jobs/{status['job_id']}").json()
            if status["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.1)
        assert status["status"] == "succeeded", status
        assert (status["added"], status["removed"], status["source"]) == (2, 0, "manuals")

        shown = client.get("/api/sources/manuals").json()
        assert shown["statistics"]["documents"] == 2 and shown["last_sync"]["added"] == 2
        names = [s["name"] for s in client.get("/api/sources").json()["sources"]]
        assert names == ["base", "manuals", "uploads"]  # the server creates the uploads folder

        client.post("/api/sources", json={"name": "site", "url": "https://docs.example.org/"})
        patched = client.patch("/api/sources/site", json={"exclude": ["/blog/"]}).json()
        assert patched["changed"] == ["exclude"] and patched["resync_needed"]

        hits = client.post("/api/knowledge/query", json={"query": "valve procedure torque", "answer": "none",
                                                         "min_relevance": 0}).json()
        assert any("Valve" in r["title"] for r in hits["results"])
        deleted = client.delete("/api/sources/manuals")
        assert deleted.status_code == 200 and deleted.json()["documents_deleted"] == 2
        hits = client.post("/api/knowledge/query", json={"query": "valve procedure torque", "answer": "none",
                                                         "min_relevance": 0}).json()
        assert not any("Valve" in r["title"] for r in hits["results"])


# ------------------------------------------------------------------ Dagster


def test_sources_are_dagster_partitions_and_a_partition_syncs_one_source(tmp_path, embedder):
    from pipelines.definitions import SYNC_SOURCE_JOB_NAME, build_definitions
    from pipelines.resources import KnowledgeStoreResource
    from pipelines.sources import SOURCE_PARTITIONS, build_source_registry_sensor

    settings = setup(tmp_path)
    write_docs(tmp_path / "manuals", "filter", 2)
    store = KnowledgeStoreResource(data_dir=str(settings.data_dir), sources=str(tmp_path / "base"))
    defs = build_definitions(store=store)
    instance = dg.DagsterInstance.ephemeral()
    sensor = build_source_registry_sensor()

    def tick():
        return sensor(dg.build_sensor_context(instance=instance, resources={"store": store}))

    def apply(result):
        for request in result.dynamic_partitions_requests:
            if isinstance(request, dg.AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            else:
                for key in request.partition_keys:
                    instance.delete_dynamic_partition(request.partitions_def_name, key)

    apply(tick())
    assert instance.get_dynamic_partitions(SOURCE_PARTITIONS.name) == ["base"]
    with store_connection(settings.store_path) as conn:  # added "through the API" while Dagster runs
        add_source(conn, "manuals", "folder", str(tmp_path / "manuals"))
    apply(tick())
    assert sorted(instance.get_dynamic_partitions(SOURCE_PARTITIONS.name)) == ["base", "manuals"]
    assert isinstance(tick(), dg.SkipReason)

    result = defs.resolve_job_def(SYNC_SOURCE_JOB_NAME).execute_in_process(instance=instance, partition_key="manuals")
    assert result.success
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.partition == "manuals"
    meta = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    assert (meta["added"], meta["documents"], meta["source"]) == (2, 2, "manuals")
    assert active_docs_by_source(settings) == {"manuals": 2}

    delete_source_now(settings, "manuals")
    apply(tick())
    assert instance.get_dynamic_partitions(SOURCE_PARTITIONS.name) == ["base"]
