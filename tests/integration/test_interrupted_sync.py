"""A sync killed half-way: status says it was interrupted (not "running" for ever), and the run that
completes its work counts the documents it brings into the index."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from knowledge_store.app.status import store_status
from knowledge_store.cli import main
from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.ingest.sources import get_source
from knowledge_store.ingest.sync_runs import get_sync_run, start_sync_run
from knowledge_store.storage.index import open_snapshot, read_pointer
from knowledge_store.storage.store import store_connection
from tests.helpers import MARKDOWN_FILLER

FAKE_EMBEDDER = textwrap.dedent(
    """
    import hashlib
    import numpy as np

    class HashEmbedder:
        '''Deterministic vectors from text hashes: the pipeline without loading the model.'''

        model_id = "test-hash-embedder"
        dim = 384
        torch_threads = 1

        def load(self):
            return None

        def embed(self, texts):
            rows = []
            for text in texts:
                seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
                vector = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
                rows.append(vector / np.linalg.norm(vector))
            return np.stack(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)
    """
)
namespace: dict[str, object] = {"hashlib": hashlib, "np": np}
exec(FAKE_EMBEDDER, namespace)
HashEmbedder = namespace["HashEmbedder"]

# kill -9 of a sync at a chosen point: after the raw documents are recorded ("scan"), or after the
# new versions were activated while the index snapshot was being written ("snapshot")
KILLER = FAKE_EMBEDDER + textwrap.dedent(
    """
    import os, signal, sys
    from knowledge_store.config.settings import Settings
    import knowledge_store.ingest.run as run_module
    import knowledge_store.ingest.publish as publish_module

    def kill(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if sys.argv[1] == "scan":
        run_module.process_pending = kill
    else:
        publish_module.build_snapshot = kill
    run_module.run_sync(Settings(), HashEmbedder())
    """
)


def write_doc(folder: Path, name: str, topic: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(f"# {topic.title()}\n\nThe {topic} procedure needs a torque of 12 newton metres "
                               f"and a {topic} check before the cover is closed.\n" + MARKDOWN_FILLER)


def settings_for(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", sources=[tmp_path / "docs"])


def kill_a_sync(tmp_path: Path, point: str) -> int:
    env = {**os.environ, "GROUNDWORK_DATA_DIR": str(tmp_path / "data"), "GROUNDWORK_SOURCES": str(tmp_path / "docs"),
           "GROUNDWORK_TORCH_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", KILLER, point], env=env, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, stderr[-2000:]
    return proc.pid


def run_rows(settings: Settings) -> list[tuple]:
    with store_connection(settings.store_path, read_only=True) as conn:
        return conn.execute("SELECT sync_run_id, status FROM sync_runs ORDER BY started_at").fetchall()


def test_status_reports_a_killed_sync_as_interrupted_with_its_start_time(tmp_path, capsys):
    write_doc(tmp_path / "docs", "install.md", "mounting")
    settings = settings_for(tmp_path)
    pid = kill_a_sync(tmp_path, "scan")

    last = store_status(settings)["last_sync"]
    assert last["status"] == "interrupted"
    assert last["pid"] == pid and last["hostname"]
    assert last["started_at"] and "no longer running" in last["interrupted_reason"]

    assert main(["status", "--data-dir", str(settings.data_dir)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("last sync:"))
    assert "interrupted" in line and last["started_at"] in line and "in progress" not in line

    # a run whose process is alive is running; opening it marks the dead one interrupted for good
    with store_connection(settings.store_path) as conn:
        live = start_sync_run(conn)
    assert store_status(settings)["last_sync"]["status"] == "running"
    assert dict(run_rows(settings)) == {next(r for r, _ in run_rows(settings) if r != live): "interrupted",
                                        live: "running"}


def test_the_sync_after_a_kill_counts_the_documents_it_brings_into_the_index(tmp_path):
    write_doc(tmp_path / "docs", "install.md", "mounting")
    settings = settings_for(tmp_path)
    kill_a_sync(tmp_path, "scan")  # install.md recorded as a pending version, then kill -9

    report = run_sync(settings, HashEmbedder())
    assert report.raw.added == 1
    assert report.raw.changes == [{"doc_id": report.raw.changes[0]["doc_id"], "path": "install.md",
                                   "change": "added", "resumed": True}]
    assert report.summary.startswith("1 added, 0 updated, 0 removed, 0 unchanged")
    assert "1 resumed from an interrupted sync" in report.summary
    with store_connection(settings.store_path, read_only=True) as conn:
        source = get_source(conn, "docs")
        killed = get_sync_run(conn, run_rows(settings)[0][0])
    assert source.last_sync["added"] == 1
    assert killed["status"] == "interrupted"
    assert read_pointer(settings.index_dir).document_count == 1
    assert store_status(settings)["last_sync"]["status"] == "succeeded"


def test_a_sync_killed_while_publishing_is_completed_and_counted_by_the_next(tmp_path):
    docs = tmp_path / "docs"
    write_doc(docs, "install.md", "mounting")
    settings = settings_for(tmp_path)
    run_sync(settings, HashEmbedder())
    write_doc(docs, "reset.md", "factory reset")
    kill_a_sync(tmp_path, "snapshot")  # reset.md is active in the store but not in the published index
    assert read_pointer(settings.index_dir).document_count == 1

    report = run_sync(settings, HashEmbedder())
    assert report.publish.snapshot_built and read_pointer(settings.index_dir).document_count == 2
    assert report.summary.startswith("1 added, 0 updated, 0 removed, 1 unchanged")
    assert "1 resumed from an interrupted sync" in report.summary
    assert [c["path"] for c in report.raw.changes] == ["reset.md"]
    conn, _ = open_snapshot(settings.index_dir)
    try:
        assert conn.execute("SELECT count(*) FROM documents WHERE relative_path = 'reset.md'").fetchone()[0] == 1
    finally:
        conn.close()

    # nothing left over: the sync after that is a plain no-change sync
    again = run_sync(settings, HashEmbedder())
    assert again.summary == "0 added, 0 updated, 0 removed, 2 unchanged, 0 excluded, 0 failed"


def test_a_sync_that_raises_is_recorded_as_failed_not_running(tmp_path, monkeypatch):
    import knowledge_store.ingest.run as run_module

    write_doc(tmp_path / "docs", "install.md", "mounting")
    settings = settings_for(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(run_module, "process_pending", broken)
    try:
        run_sync(settings, HashEmbedder())
    except RuntimeError:
        pass
    last = store_status(settings)["last_sync"]
    assert last["status"] == "failed"
    assert "disk full" in last["summary"]


def test_a_dead_zombie_or_reused_pid_is_not_taken_for_a_running_sync():
    from datetime import timedelta

    from knowledge_store.ingest.sync_runs import process_alive, run_process_state, this_host
    from knowledge_store.storage.store import utcnow

    now = utcnow()
    assert process_alive(os.getpid(), now) is True
    # the pid of a process that started after the run last heard from its own: a reused pid
    assert process_alive(os.getpid(), now - timedelta(hours=1)) is False
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = now + timedelta(seconds=30)
        while process_alive(child.pid) and utcnow() < deadline:  # exited, not reaped yet: a zombie
            pass
        assert process_alive(child.pid) is False
    finally:
        child.wait()
    assert process_alive(child.pid) is False

    row = {"status": "running", "pid": child.pid, "hostname": this_host(), "started_at": now, "heartbeat_at": now}
    assert run_process_state(row)[0] == "interrupted"
    assert run_process_state({**row, "pid": os.getpid()}) == ("running", None)
    # another host's process cannot be checked from here: it stays running
    assert run_process_state({**row, "hostname": "elsewhere"}) == ("running", None)
    assert run_process_state({**row, "status": "succeeded"}) == ("succeeded", None)
