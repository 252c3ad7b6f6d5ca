"""Folder sources and symbolic links: a link whose target leaves the source folder is not indexed
(it is counted as excluded, with its reason), links inside the folder keep working, loops end.

The parts that need no model, store or server are in tests/unit/test_folder_symlinks.py.
"""

from __future__ import annotations

from pathlib import Path

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import record_sources
from knowledge_store.ingest.sources import get_source
from knowledge_store.ingest.sync_runs import get_sync_run
from knowledge_store.storage.store import store_connection
from tests.helpers import symlink_layout


def settings_for(tmp_path: Path, docs: Path, **overrides) -> Settings:
    return Settings(data_dir=tmp_path / "data", sources=[docs], **overrides)


def test_links_leaving_a_folder_source_are_excluded_with_their_reason(tmp_path):
    docs, outside = symlink_layout(tmp_path)
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
