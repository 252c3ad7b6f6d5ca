"""End-to-end ingestion: Dagster materialisation, re-sync rules, bad inputs, crash safety."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import duckdb
import pymupdf
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.storage.index import open_snapshot, read_pointer
from knowledge_store.storage.store import store_connection
from pipelines.definitions import ingest_job
from pipelines.ingestion import INGESTION_ASSETS, INGESTION_CHECKS
from pipelines.resources import EmbeddingModelResource, KnowledgeStoreResource
from pipelines.sensors import build_sensor
from tests.helpers import MARKDOWN_FILLER

pytestmark = pytest.mark.slow


def paragraph(topic: str, n: int = 4) -> str:
    return " ".join(f"The {topic} procedure step {i} requires checking terminal {i} before continuing." for i in range(n))


def write_corpus(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "install.md").write_text(
        "---\ntitle: Install guide\nproduct: aurora\n---\n# Install\n\n" + paragraph("mounting") +
        "\n\n## Wiring\n\n" + paragraph("wiring") + "\n\n```bash\nhub-cli pair --code 1234\n```\n"
    )
    (folder / "reset.md").write_text("# Reset\n\n" + paragraph("factory reset") + "\n\n## Network\n\n" + paragraph("network reset"))
    (folder / "notes.txt").write_text("Release notes\n\n" + paragraph("upgrade", 3))
    doc = pymupdf.open()
    for number in range(1, 4):
        page = doc.new_page()
        page.insert_text((72, 72), f"Chapter {number}", fontsize=18)
        page.insert_textbox(pymupdf.Rect(72, 100, 520, 700), paragraph(f"chapter {number} calibration", 6), fontsize=11)
    doc.save(folder / "manual.pdf")
    doc.close()


def make_settings(tmp_path: Path, **overrides) -> Settings:
    return Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"], **overrides)


def query(settings: Settings, sql: str, params=None):
    with store_connection(settings.store_path, read_only=True) as conn:
        return conn.execute(sql, params or []).fetchall()


def active_chunk_count(settings: Settings) -> int:
    return query(settings, "SELECT count(*) FROM chunks JOIN documents USING (doc_id, version) WHERE status = 'active'")[0][0]


def snapshot_count(settings: Settings) -> int:
    conn, _ = open_snapshot(settings.index_dir)
    try:
        return conn.execute("SELECT count(*) FROM chunks WHERE status = 'active'").fetchone()[0]
    finally:
        conn.close()


def assert_index_consistent(settings: Settings) -> None:
    active = active_chunk_count(settings)
    assert snapshot_count(settings) == active
    dupes = query(settings, """
        SELECT count(*) FROM (SELECT doc_id, chunk_index FROM chunks JOIN documents USING (doc_id, version)
        WHERE status = 'active' GROUP BY ALL HAVING count(*) > 1)""")[0][0]
    assert dupes == 0
    per_doc_active = query(settings, "SELECT doc_id, count(*) FROM documents WHERE status = 'active' GROUP BY doc_id HAVING count(*) > 1")
    assert per_doc_active == []


def materialize(tmp_path: Path) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [*INGESTION_ASSETS, *INGESTION_CHECKS],
        resources={
            "store": KnowledgeStoreResource(data_dir=str(tmp_path / "data"), sources=str(tmp_path / "docs")),
            "model": EmbeddingModelResource(torch_threads=2),
        },
    )


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    events = result.asset_materializations_for_node(asset)
    return {k: getattr(v, "value", v) for k, v in events[-1].metadata.items()}


def test_materialize_modify_delete_add_resync(tmp_path):
    docs = tmp_path / "docs"
    write_corpus(docs)
    settings = make_settings(tmp_path)

    first = materialize(tmp_path)
    assert first.success
    assert all(e.passed for e in first.get_asset_check_evaluations()), [
        (e.check_name, e.metadata) for e in first.get_asset_check_evaluations() if not e.passed]
    assert len(first.get_asset_check_evaluations()) == 4
    index_meta = metadata(first, "search_index")
    assert index_meta["sync_summary"] == "4 added, 0 updated, 0 removed, 0 unchanged, 0 excluded, 0 failed"
    assert index_meta["documents_indexed"] == 4
    assert metadata(first, "parsed_documents")["pages"] == 3 + 3  # 3 PDF pages + 3 single-page docs
    first_chunks = active_chunk_count(settings)
    assert index_meta["chunks_indexed"] == first_chunks > 0
    embedded_first = metadata(first, "embeddings")["embeddings_computed"]
    assert embedded_first == query(settings, "SELECT count(DISTINCT content_hash) FROM chunks")[0][0]

    # modify one paragraph of install.md, delete reset.md, add faq.md
    install = docs / "install.md"
    install.write_text(install.read_text().replace("mounting procedure step 0", "mounting procedure step zero"))
    (docs / "reset.md").unlink()
    (docs / "faq.md").write_text("# FAQ\n\n" + paragraph("pairing", 3) + MARKDOWN_FILLER)
    hashes_before = {h for (h,) in query(settings, "SELECT content_hash FROM chunks")}

    second = materialize(tmp_path)
    assert second.success
    assert all(e.passed for e in second.get_asset_check_evaluations())
    meta = metadata(second, "search_index")
    assert meta["sync_summary"] == "1 added, 1 updated, 1 removed, 2 unchanged, 0 excluded, 0 failed"
    assert meta["snapshot_version"] == 2

    versions = query(settings, "SELECT relative_path, version, status, supersedes, valid_to IS NOT NULL FROM documents ORDER BY 1, 2")
    assert ("install.md", 1, "superseded", None, True) in versions
    assert ("install.md", 2, "active", 1, False) in versions
    assert ("reset.md", 1, "deleted", None, True) in versions
    assert ("faq.md", 1, "active", None, False) in versions
    assert ("manual.pdf", 1, "active", None, False) in versions

    # only genuinely new chunk texts were embedded: the unchanged Wiring section of install.md was reused
    new_hashes = {h for (h,) in query(settings, "SELECT content_hash FROM chunks")} - hashes_before
    assert metadata(second, "embeddings")["embeddings_computed"] == len(new_hashes)
    assert 0 < len(new_hashes) < 4
    reused = query(settings, "SELECT embeddings_reused FROM sync_runs WHERE sync_run_id = ?", [second.run_id])[0][0]
    assert reused >= 1
    assert_index_consistent(settings)
    assert meta["chunks_indexed"] == active_chunk_count(settings)


def test_no_change_resync_only_hashes(tmp_path, counting_embedder):
    write_corpus(tmp_path / "docs")
    settings = make_settings(tmp_path)
    run_sync(settings, counting_embedder)
    embedded = len(counting_embedder.texts)
    before = read_pointer(settings.index_dir)

    report = run_sync(settings, counting_embedder)
    assert report.summary == "0 added, 0 updated, 0 removed, 4 unchanged, 0 excluded, 0 failed"
    assert len(counting_embedder.texts) == embedded  # nothing re-embedded
    assert report.parse.parsed == 0 and report.chunk.chunks == 0
    assert not report.publish.snapshot_built
    assert read_pointer(settings.index_dir) == before
    assert_index_consistent(settings)


def test_the_in_process_sync_runs_the_checks_the_dagster_assets_run_and_reports_a_failing_one(tmp_path, counting_embedder):
    from knowledge_store.ingest.checks import INDEX_CHECKS, run_index_checks

    write_corpus(tmp_path / "docs")
    settings = make_settings(tmp_path)
    report = run_sync(settings, counting_embedder)
    assert [c.name for c in report.checks] == list(INDEX_CHECKS)
    assert {spec.name for check in INGESTION_CHECKS for spec in check.check_specs} == set(INDEX_CHECKS)
    assert report.failed_checks == []
    with store_connection(settings.store_path) as conn:  # a chunk emptied behind the sequence's back
        conn.execute("UPDATE chunks SET text = '   ' WHERE chunk_id = (SELECT min(chunk_id) FROM chunks)")
    failed = [c for c in run_index_checks(settings) if not c.passed]
    assert [(c.name, c.offending_rows) for c in failed] == [("no_empty_chunks", 1)]


def test_changing_chunk_size_rechunks_from_stored_blocks_without_reparsing(tmp_path, counting_embedder):
    write_corpus(tmp_path / "docs")
    run_sync(make_settings(tmp_path), counting_embedder)
    smaller = make_settings(tmp_path, chunk_size_tokens=60, chunk_overlap_tokens=8, chunk_min_tokens=8, header_max_tokens=20)
    before = active_chunk_count(smaller)
    report = run_sync(smaller, counting_embedder)
    assert report.parse.parsed == 0
    assert report.chunk.documents == 4
    assert active_chunk_count(smaller) > before
    assert max(report.chunk.token_counts) <= 60 + 20
    assert report.publish.snapshot_built
    assert_index_consistent(smaller)


def _bad_inputs(folder: Path) -> dict[str, str]:
    """Writes one file per bad-input kind; returns file name -> expected failure kind."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.md").write_text("")
    (folder / "blank.txt").write_text("   \n\n  ")
    (folder / "corrupt.pdf").write_bytes(b"%PDF-1.7\n" + os.urandom(2000))
    (folder / "really-text.pdf").write_text("this is plain text pretending to be a PDF\n" * 20)
    (folder / "not-a-zip.docx").write_text("plain text in a docx\n" * 10)
    (folder / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    (folder / "huge.txt").write_text("big file line\n" * 6000)  # ~84 KB, over the test limit
    locked = pymupdf.open()
    locked.new_page().insert_text((72, 72), "secret manual")
    locked.save(folder / "locked.pdf", encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="user", owner_pw="owner")
    locked.close()
    return {
        "empty.md": "empty", "blank.txt": "empty", "corrupt.pdf": "corrupt", "really-text.pdf": "wrong_extension",
        "not-a-zip.docx": "wrong_extension", "picture.png": "unsupported_type", "huge.txt": "oversize",
        "locked.pdf": "password_protected",
    }


def test_each_bad_input_gets_a_failure_row_and_good_files_still_index(tmp_path, counting_embedder):
    docs = tmp_path / "docs"
    write_corpus(docs)
    expected = _bad_inputs(docs)
    settings = make_settings(tmp_path, max_file_mb=0.05)
    report = run_sync(settings, counting_embedder)
    rows = query(settings, "SELECT path, kind, reason, last_seen_at FROM ingestion_failures WHERE resolved_at IS NULL")
    by_name = {Path(path).name: (kind, reason, seen) for path, kind, reason, seen in rows}
    for name, kind in expected.items():
        assert name in by_name, f"{name} has no failure row"
        assert by_name[name][0] == kind, (name, by_name[name])
        assert len(by_name[name][1]) > 10 and by_name[name][2] is not None
    assert report.summary.startswith("4 added") and report.summary.endswith(f"{len(expected)} failed")
    assert read_pointer(settings.index_dir).document_count == 4
    assert_index_consistent(settings)

    # the same bad files on the next sync: no duplicate rows, nothing re-parsed
    again = run_sync(settings, counting_embedder)
    count = query(settings, "SELECT count(*) FROM ingestion_failures")[0][0]
    assert count == len(rows)
    assert again.parse.parsed == 0


def test_a_file_that_turns_corrupt_keeps_its_indexed_version(tmp_path, counting_embedder):
    docs = tmp_path / "docs"
    write_corpus(docs)
    settings = make_settings(tmp_path)
    run_sync(settings, counting_embedder)
    before = snapshot_count(settings)
    (docs / "manual.pdf").write_bytes(b"%PDF-1.4\n" + b"garbage" * 300)
    report = run_sync(settings, counting_embedder)
    assert report.summary == "0 added, 0 updated, 0 removed, 3 unchanged, 0 excluded, 1 failed"
    statuses = query(settings, "SELECT version, status FROM documents WHERE relative_path = 'manual.pdf' ORDER BY version")
    assert statuses == [(1, "active"), (2, "failed")]
    assert snapshot_count(settings) == before
    # fixing the file resolves the failure
    write_corpus(docs)
    fixed = run_sync(settings, counting_embedder)
    assert "1 updated" in fixed.summary
    assert query(settings, "SELECT count(*) FROM ingestion_failures WHERE resolved_at IS NULL")[0][0] == 0


def test_a_missing_source_folder_deletes_nothing(tmp_path, counting_embedder):
    write_corpus(tmp_path / "docs")
    settings = make_settings(tmp_path)
    run_sync(settings, counting_embedder)
    shutil.move(tmp_path / "docs", tmp_path / "elsewhere")
    report = run_sync(settings, counting_embedder)
    assert report.raw.removed == 0
    assert read_pointer(settings.index_dir).document_count == 4
    reasons = query(settings, "SELECT kind FROM ingestion_failures WHERE resolved_at IS NULL")
    assert reasons == [("missing_source",)]


def test_deleted_documents_are_purged_after_retention(tmp_path, counting_embedder):
    docs = tmp_path / "docs"
    write_corpus(docs)
    run_sync(make_settings(tmp_path), counting_embedder)
    (docs / "notes.txt").unlink()
    run_sync(make_settings(tmp_path), counting_embedder)
    settings = make_settings(tmp_path)
    assert query(settings, "SELECT status FROM documents WHERE relative_path = 'notes.txt'") == [("deleted",)]
    purge = make_settings(tmp_path, deleted_retention_days=0)
    report = run_sync(purge, counting_embedder)
    assert report.publish.purged_documents == 1
    assert query(settings, "SELECT count(*) FROM documents WHERE relative_path = 'notes.txt'")[0][0] == 0


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest import run as run_module
    from knowledge_store.storage import index as index_module
    from knowledge_store.models.embeddings import Embedder
    point = sys.argv[1]
    settings = Settings()
    if point == "embed":
        real_embed = Embedder.embed
        calls = {"n": 0}
        def embed(self, texts):
            calls["n"] += 1
            if calls["n"] == 2:  # one batch is already written to the store
                os.kill(os.getpid(), signal.SIGKILL)
            return real_embed(self, texts)
        Embedder.embed = embed
    elif point == "sentences":  # kill while the sentence vectors are written, one batch already stored
        from knowledge_store.ingest import embed as embed_module
        real_table = embed_module.sentence_table
        calls = {"n": 0}
        def table(embedder, part):
            calls["n"] += 1
            if calls["n"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_table(embedder, part)
        embed_module.sentence_table = table
    elif point == "snapshot":
        real_build = index_module.build_snapshot
        def build(store, index_dir, info, *_vocabulary, **_options):
            store.execute(f"ATTACH '{index_dir}/.{info.file}.tmp' AS snap")
            store.execute("CREATE TABLE snap.chunks AS SELECT * FROM chunks")
            os.kill(os.getpid(), signal.SIGKILL)
        import knowledge_store.ingest.publish as publish_module
        publish_module.build_snapshot = build
    run_module.run_sync(settings)
    """
)


@pytest.mark.parametrize("kill_point", ["embed", "sentences", "snapshot"])
def test_kill_9_midway_keeps_previous_index_and_next_run_completes(tmp_path, counting_embedder, kill_point):
    docs = tmp_path / "docs"
    write_corpus(docs)
    settings = make_settings(tmp_path, write_batch_chunks=2)
    run_sync(settings, counting_embedder)
    published = read_pointer(settings.index_dir)
    count_before = snapshot_count(settings)

    for i in range(6):
        (docs / f"extra-{i}.md").write_text(f"# Extra {i}\n\n" + paragraph(f"extra topic {i}", 8))
    env = {**os.environ, "GROUNDWORK_DATA_DIR": str(settings.data_dir), "GROUNDWORK_SOURCES": str(docs),
           "GROUNDWORK_WRITE_BATCH_CHUNKS": "2", "GROUNDWORK_TORCH_THREADS": "1",
           "GROUNDWORK_DOCUMENT_ENCODER": "torch"}  # the Embedder patched above (ONNX: same vectors, same model id)
    proc = subprocess.run([sys.executable, "-c", KILLER, kill_point], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]

    # readers still see the previous snapshot, complete
    assert read_pointer(settings.index_dir) == published
    assert snapshot_count(settings) == count_before
    conn, _ = open_snapshot(settings.index_dir)
    hits = conn.execute(
        "SELECT count(*) FROM (SELECT fts_main_chunks.match_bm25(chunk_id, 'calibration') AS s FROM chunks) WHERE s IS NOT NULL"
    ).fetchone()[0]
    conn.close()
    assert hits > 0

    report = run_sync(settings, counting_embedder)
    assert report.publish.snapshot_built
    assert read_pointer(settings.index_dir).document_count == 10
    assert_index_consistent(settings)
    total_hashes = query(settings, "SELECT count(DISTINCT content_hash) FROM chunks")[0][0]
    assert query(settings, "SELECT count(*) FROM embeddings")[0][0] == total_hashes
    # every chunk text has all of its sentences (ordinals 0..n-1), and the new snapshot carries them
    assert query(settings, "SELECT count(DISTINCT content_hash) FROM sentence_embeddings")[0][0] == total_hashes
    assert query(settings, "SELECT count(*) FROM (SELECT content_hash FROM sentence_embeddings GROUP BY content_hash "
                           "HAVING max(ordinal) + 1 <> count(*))")[0][0] == 0
    assert report.publish.sentence_vectors and read_pointer(settings.index_dir).fingerprint.endswith(":sentences")
    if kill_point == "embed":
        assert report.embed.computed < 6  # the batch written before the kill was reused
    if kill_point == "sentences":
        assert report.embed.computed == 0 and 0 < report.embed.sentence_texts < 6  # one batch of sentences reused


def test_sensor_requests_a_run_only_when_files_change(tmp_path):
    docs = tmp_path / "docs"
    write_corpus(docs)
    sensor = build_sensor(ingest_job, 30)
    store = KnowledgeStoreResource(data_dir=str(tmp_path / "data"), sources=str(docs))
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance, resources={"store": store})
        first = sensor(context)
        assert isinstance(first, dg.RunRequest)
        context = dg.build_sensor_context(instance=instance, cursor=context.cursor, resources={"store": store})
        assert isinstance(sensor(context), dg.SkipReason)
        (docs / "new.md").write_text("# New\n\nfresh content" + MARKDOWN_FILLER)
        context = dg.build_sensor_context(instance=instance, cursor=context.cursor, resources={"store": store})
        second = sensor(context)
        assert isinstance(second, dg.RunRequest) and second.run_key != first.run_key


def test_definitions_load_with_jobs_sensor_and_schedule():
    from pipelines import defs

    repo = defs.get_repository_def()
    assert {"ingest", "evaluate"} <= set(repo.job_names)
    assert repo.has_sensor_def("source_files_changed")
    assert repo.has_schedule_def("daily_resync") and repo.has_schedule_def("nightly_eval")
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert {"raw_documents", "parsed_documents", "chunks", "embeddings", "search_index"} <= keys
    assert {"eval_datasets", "retrieval_eval_hybrid", "retrieval_eval_bm25", "eval_scorecard"} <= keys


def test_snapshot_is_readable_while_the_store_is_locked_by_a_writer(tmp_path, counting_embedder):
    write_corpus(tmp_path / "docs")
    settings = make_settings(tmp_path)
    run_sync(settings, counting_embedder)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(settings.store_path)!r}); print('locked', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(duckdb.IOException):
            duckdb.connect(str(settings.store_path), read_only=True)
        assert snapshot_count(settings) == active_chunk_count_from_snapshot(settings)
    finally:
        holder.kill()
        holder.wait()


def active_chunk_count_from_snapshot(settings: Settings) -> int:
    return read_pointer(settings.index_dir).chunk_count


def test_groundworkignore_excludes_files_without_failure_rows(tmp_path, counting_embedder):
    docs = tmp_path / "docs"
    write_corpus(docs)
    (docs / "results").mkdir()
    (docs / "results" / "scores.json").write_text("{}")
    (docs / "results" / "notes.md").write_text("# Notes\n\nignored folder content")
    (docs / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (docs / ".groundworkignore").write_text("# data, not documents\n*.png\nresults/\n")
    settings = make_settings(tmp_path)
    report = run_sync(settings, counting_embedder)
    assert report.summary == "4 added, 0 updated, 0 removed, 0 unchanged, 3 excluded, 0 failed"
    assert query(settings, "SELECT count(*) FROM ingestion_failures")[0][0] == 0


def test_scan_failures_are_resolved_when_the_file_goes_or_is_ignored(tmp_path, counting_embedder):
    docs = tmp_path / "docs"
    write_corpus(docs)
    (docs / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (docs / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    settings = make_settings(tmp_path)
    run_sync(settings, counting_embedder)
    open_rows = "SELECT count(*) FROM ingestion_failures WHERE resolved_at IS NULL"
    assert query(settings, open_rows)[0][0] == 2
    (docs / "a.png").unlink()
    (docs / ".groundworkignore").write_text("b.png\n")
    report = run_sync(settings, counting_embedder)
    assert query(settings, open_rows)[0][0] == 0 and report.summary.endswith("0 failed")
