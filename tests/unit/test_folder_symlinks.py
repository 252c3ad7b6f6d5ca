"""Scanning folder sources with symbolic links: links leaving the folder are followed only when a setting
says so, loops end, the uploads folder never follows links out (the store's record of the excluded links
is in tests/integration/test_folder_symlinks.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.raw_documents import scan_sources
from tests.helpers import symlink_layout


def settings_for(tmp_path: Path, docs: Path, **overrides) -> Settings:
    return Settings(data_dir=tmp_path / "data", sources=[docs], **overrides)


def test_a_setting_allows_links_that_leave_the_folder(tmp_path):
    docs, _outside = symlink_layout(tmp_path)
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
