"""Folder sources and symbolic links: a link whose target leaves the source folder is not indexed
(it is counted as excluded, with its reason), links inside the folder keep working, loops end."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from knowledge_store.ingest.raw_documents import scan_sources
from knowledge_store.ingest.run import record_sources
from knowledge_store.ingest.sync_runs import get_sync_run
from knowledge_store.settings import Settings
from knowledge_store.sources import get_source
from knowledge_store.store import store_connection


def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A source folder with a real document, an outside folder with a secret, and links."""
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "guides" / "install.md").write_text("# Install\n\nMount the hub on the wall.\n")
    outside = tmp_path / "outside"
    (outside / "private").mkdir(parents=True)
    (outside / "secret.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (outside / "private" / "keys.md").write_text("# Keys\n\nnot for the index\n")
    (docs / "passwd.txt").symlink_to(outside / "secret.txt")          # file link leaving the folder
    (docs / "more").symlink_to(outside / "private", target_is_directory=True)  # folder link leaving it
    (docs / "setup.md").symlink_to(docs / "guides" / "install.md")    # file link inside: kept
    (docs / "latest").symlink_to(docs / "guides", target_is_directory=True)  # folder link inside
    return docs, outside


def settings_for(tmp_path: Path, docs: Path, **overrides) -> Settings:
    return Settings(data_dir=tmp_path / "data", sources=[docs], **overrides)


def test_links_leaving_a_folder_source_are_excluded_with_their_reason(tmp_path):
    docs, outside = layout(tmp_path)
    settings = settings_for(tmp_path, docs)
    result = record_sources(settings)

    with store_connection(settings.store_path, read_only=True) as conn:
        indexed = sorted(r[0] for r in conn.execute("SELECT relative_path FROM documents").fetchall())
        paths = [r[0] for r in conn.execute("SELECT path FROM documents").fetchall()]
        run = get_sync_run(conn, result.sync_run_id)
        source = get_source(conn, docs.name)
    assert indexed == ["guides/install.md", "setup.md"]  # the inside link still works
    assert not any("secret" in p or "private" in p for p in paths)
    assert result.excluded == 2 and run["excluded"] == 2
    assert result.per_source[source.source_id]["excluded"] == 2

    # the reason is reported where the excluded items are: the run, the source's last sync
    items = {item["path"]: item["reason"] for item in run["details"]["excluded_items"][source.source_id]}
    assert set(items) == {"passwd.txt", "more/"}
    assert "outside the source folder" in items["passwd.txt"] and str(outside / "secret.txt") in items["passwd.txt"]
    assert "outside the source folder" in items["more/"]
    last = source.last_sync
    assert last["excluded"] == 2
    assert {item["path"] for item in last["excluded_items"]} == {"passwd.txt", "more/"}


def test_a_setting_allows_links_that_leave_the_folder(tmp_path):
    docs, _outside = layout(tmp_path)
    settings = settings_for(tmp_path, docs, follow_external_symlinks=True)
    scan = scan_sources(settings)
    relative = sorted(f.relative_path for f in scan.files)
    assert relative == ["guides/install.md", "more/keys.md", "passwd.txt", "setup.md"]
    assert scan.excluded[scan.folders[0].source_id] == 0


def test_the_environment_variable_sets_follow_external_symlinks(monkeypatch):
    monkeypatch.setenv("GROUNDWORK_FOLLOW_EXTERNAL_SYMLINKS", "true")
    assert Settings().follow_external_symlinks is True
    monkeypatch.delenv("GROUNDWORK_FOLLOW_EXTERNAL_SYMLINKS")
    assert Settings().follow_external_symlinks is False


@pytest.mark.parametrize("follow", [False, True])
def test_symlink_loops_cannot_hang_the_scan(tmp_path, follow):
    docs = tmp_path / "docs"
    (docs / "a").mkdir(parents=True)
    (docs / "a" / "note.md").write_text("# Note\n\ntext\n")
    (docs / "a" / "back").symlink_to(docs, target_is_directory=True)       # loop to the source root
    (docs / "a" / "self").symlink_to(docs / "a", target_is_directory=True)  # loop to itself
    ring = tmp_path / "ring"
    (ring / "inner").mkdir(parents=True)
    (ring / "inner" / "ring.md").write_text("# Ring\n\noutside text\n")
    (ring / "inner" / "up").symlink_to(ring, target_is_directory=True)      # outside loop
    (ring / "inner" / "home").symlink_to(docs, target_is_directory=True)    # outside, back into the source
    (docs / "ring").symlink_to(ring, target_is_directory=True)
    (docs / "x.md").symlink_to(docs / "y.md")                                # file link cycle x -> y -> x
    (docs / "y.md").symlink_to(docs / "x.md")
    settings = settings_for(tmp_path, docs, follow_external_symlinks=follow)

    outcome: dict[str, object] = {}
    worker = threading.Thread(target=lambda: outcome.update(scan=scan_sources(settings)), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the scan did not finish: a symlink loop was followed"
    relative = sorted(f.relative_path for f in outcome["scan"].files)
    if follow:
        assert relative == ["a/note.md", "ring/inner/ring.md"]
    else:
        assert relative == ["a/note.md"]
        assert outcome["scan"].excluded[outcome["scan"].folders[0].source_id] == 1  # the ring/ link


def test_the_uploads_folder_does_not_follow_links_out_of_it(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\ntext\n")
    settings = settings_for(tmp_path, docs)
    settings.uploads_dir.mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("secret\n")
    (settings.uploads_dir / "upload.txt").symlink_to(tmp_path / "secret.txt")
    scan = scan_sources(settings)
    assert [f.relative_path for f in scan.files] == ["a.md"]
    uploads = next(f for f in scan.folders if f.kind == "upload")
    assert scan.excluded[uploads.source_id] == 1
