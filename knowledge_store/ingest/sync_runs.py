"""Sync runs: one row per ingestion run, holding the summary people read
("3 added, 1 updated, 1 removed, 12 unchanged, 2 failed").

A run row names the process working on it (pid, host, heartbeat), so a run
whose process is gone - ``kill -9``, a crash, a reboot - reads as
``interrupted`` rather than ``running`` for ever; the next run marks it so for
good and completes its work (see ``raw_documents`` and ``publish``).
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from datetime import datetime, timedelta, timezone

import duckdb

from knowledge_store.storage.store import utcnow

COUNTERS = (
    "added", "updated", "removed", "unchanged", "excluded", "failed",
    "chunks_created", "embeddings_computed", "embeddings_reused", "pages_parsed",
)


def this_host() -> str:
    return socket.gethostname()


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _process_started_at(fields: list[str]) -> datetime | None:
    """When the process of these ``/proc/<pid>/stat`` fields started (naive UTC), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        ticks = int(fields[19])  # field 22, starttime, in clock ticks since boot
        return datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"), timezone.utc).replace(tzinfo=None)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_alive(pid: int, seen_at: datetime | None = None) -> bool | None:
    """Is process ``pid`` of this host still running?  None when that cannot be told.

    ``seen_at`` is a moment the process was known alive (its last heartbeat): a process with
    that pid started later is another program that got the pid of a dead one.  A zombie is dead."""
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process there
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return None
    fields = _proc_stat(pid)
    if fields is None:
        return True
    if fields and fields[0] in ("Z", "X"):
        return False
    if seen_at is not None:
        started = _process_started_at(fields)
        if started is not None and started > seen_at + timedelta(seconds=2):
            return False
    return True


def run_process_state(row: dict[str, object]) -> tuple[str, str | None]:
    """The real state of a run row: its status, but ``interrupted`` for a 'running' run whose
    process (on this host) is gone.  Returns (status, reason when interrupted)."""
    status = str(row.get("status"))
    pid, host = row.get("pid"), row.get("hostname")
    if status != "running" or pid is None or host != this_host():
        return status, None
    seen = row.get("heartbeat_at") or row.get("started_at")
    if process_alive(int(pid), seen if isinstance(seen, datetime) else None) is False:
        return "interrupted", (f"process {pid} on {host}, which ran this sync, is no longer running "
                               "(killed or crashed); the next sync completes its work")
    return status, None


def close_stale_runs(conn: duckdb.DuckDBPyConnection, keep: str | None = None) -> list[str]:
    """Runs left 'running' by a process that is gone become 'interrupted' (this host) or
    'abandoned' (no process recorded, or another host's); a live run stays as it is."""
    cursor = conn.execute("SELECT * FROM sync_runs WHERE status = 'running' AND sync_run_id <> ?", [keep or ""])
    columns = [d[0] for d in cursor.description]
    closed: list[str] = []
    for values in cursor.fetchall():
        row = dict(zip(columns, values))
        pid, seen = row.get("pid"), row.get("heartbeat_at") or row.get("started_at")
        alive = (process_alive(int(pid), seen if isinstance(seen, datetime) else None)
                 if pid is not None and row.get("hostname") == this_host() else None)
        if alive:
            continue  # its process is still at work: it is running
        if alive is False:
            status = "interrupted"
            summary = (f"interrupted: process {row['pid']} on {row['hostname']} stopped before the sync finished "
                       f"(killed or crashed); sync {keep or '?'} completes its work; counts so far: {summary_line(row)}")
        else:
            status = "abandoned"
            summary = f"abandoned: its process cannot be checked from here; counts so far: {summary_line(row)}"
        conn.execute(
            "UPDATE sync_runs SET status = ?, finished_at = ?, summary = ? WHERE sync_run_id = ? AND status = 'running'",
            [status, utcnow(), summary, row["sync_run_id"]],
        )
        closed.append(str(row["sync_run_id"]))
    return closed


def start_sync_run(
    conn: duckdb.DuckDBPyConnection, sync_run_id: str | None = None, trigger: str = "manual",
    scope: list[str] | None = None,
) -> str:
    """Open a run, owned by this process; runs left 'running' by a killed process are closed
    (``close_stale_runs``).

    ``scope`` names the sources the run syncs (None = every enabled source)."""
    sync_run_id = sync_run_id or uuid.uuid4().hex
    close_stale_runs(conn, keep=sync_run_id)
    exists = conn.execute("SELECT 1 FROM sync_runs WHERE sync_run_id = ?", [sync_run_id]).fetchone()
    if not exists:
        conn.execute(
            "INSERT INTO sync_runs (sync_run_id, trigger, status, started_at, scope) VALUES (?, ?, 'running', ?, ?)",
            [sync_run_id, trigger, utcnow(), json.dumps(scope) if scope is not None else None],
        )
    _claim(conn, sync_run_id)
    return sync_run_id


def current_sync_run(conn: duckdb.DuckDBPyConnection, sync_run_id: str | None = None) -> str:
    """The run a later stage belongs to: the given id if known, else the open one, else a new one."""
    if sync_run_id and conn.execute("SELECT 1 FROM sync_runs WHERE sync_run_id = ?", [sync_run_id]).fetchone():
        _claim(conn, sync_run_id)
        return sync_run_id
    row = conn.execute(
        "SELECT sync_run_id FROM sync_runs WHERE status = 'running' ORDER BY started_at DESC LIMIT 1"
    ).fetchone()
    if row:
        _claim(conn, row[0])
        return row[0]
    return start_sync_run(conn, sync_run_id, trigger="partial")


def _claim(conn: duckdb.DuckDBPyConnection, sync_run_id: str) -> None:
    """This process now works on the open run (a later stage may run in another process)."""
    conn.execute(
        "UPDATE sync_runs SET pid = ?, hostname = ?, heartbeat_at = ? WHERE sync_run_id = ? AND status = 'running'",
        [os.getpid(), this_host(), utcnow(), sync_run_id],
    )


def end_sync_run(conn: duckdb.DuckDBPyConnection, sync_run_id: str, status: str, reason: str) -> None:
    """Close a run that stopped on an error ('failed') or was stopped ('interrupted')."""
    row = get_sync_run(conn, sync_run_id)
    if row["status"] != "running":
        return
    conn.execute(
        "UPDATE sync_runs SET status = ?, finished_at = ?, summary = ? WHERE sync_run_id = ?",
        [status, utcnow(), f"{status}: {reason}; counts so far: {summary_line(row)}", sync_run_id],
    )


def add_counts(conn: duckdb.DuckDBPyConnection, sync_run_id: str, **deltas: int) -> None:
    unknown = set(deltas) - set(COUNTERS)
    if unknown:
        raise ValueError(f"unknown sync counters: {sorted(unknown)}")
    if not deltas:
        return
    assignments = ", ".join(f"{name} = coalesce({name}, 0) + ?" for name in deltas)
    conn.execute(f"UPDATE sync_runs SET {assignments}, heartbeat_at = ? WHERE sync_run_id = ?",
                 [*deltas.values(), utcnow(), sync_run_id])


def add_details(conn: duckdb.DuckDBPyConnection, sync_run_id: str, key: str, counts: dict[str, int]) -> None:
    """Add ``counts`` to the run's ``details[key]`` (e.g. skipped documents per kind), summing with what is there."""
    row = conn.execute("SELECT details FROM sync_runs WHERE sync_run_id = ?", [sync_run_id]).fetchone()
    if row is None:
        return
    details = json.loads(row[0]) if isinstance(row[0], str) else (row[0] or {})
    merged = dict(details.get(key) or {})
    for name, count in counts.items():
        merged[name] = int(merged.get(name, 0)) + int(count)
    details[key] = merged
    conn.execute("UPDATE sync_runs SET details = ? WHERE sync_run_id = ?", [json.dumps(details, default=str), sync_run_id])


def summary_line(row: dict[str, object]) -> str:
    details = row.get("details")
    if isinstance(details, str):
        details = json.loads(details)
    resumed = (details or {}).get("resumed") if isinstance(details, dict) else None
    revisions = (details or {}).get("revisions") if isinstance(details, dict) else None
    revisions = revisions if isinstance(revisions, dict) else {}
    skipped = (details or {}).get("skipped") if isinstance(details, dict) else None
    skipped = skipped if isinstance(skipped, dict) else {}
    # files that left (or re-entered) the index because of another file: a newer revision (ingest/relations.py)
    moves = [f"{revisions[key]} {words}" for key, words in (("superseded", "superseded by a newer revision"),
                                                            ("reactivated", "active again (newer revision gone)"))
             if revisions.get(key)]
    return (
        f"{row.get('added') or 0} added, {row.get('updated') or 0} updated, "
        f"{row.get('removed') or 0} removed, {row.get('unchanged') or 0} unchanged, "
        f"{row.get('excluded') or 0} excluded, {row.get('failed') or 0} failed"
        + (f" ({resumed} resumed from an interrupted sync)" if resumed else "")
        + (f"; {', '.join(moves)}" if moves else "")
        # parsed but left out on purpose (a Markdown stub: too_short), each with a warning row
        + (f"; {sum(skipped.values())} skipped ({', '.join(f'{n} {kind}' for kind, n in sorted(skipped.items()))})"
           if skipped else "")
    )


def get_sync_run(conn: duckdb.DuckDBPyConnection, sync_run_id: str) -> dict[str, object]:
    cursor = conn.execute("SELECT * FROM sync_runs WHERE sync_run_id = ?", [sync_run_id])
    row = cursor.fetchone()
    if row is None:
        raise KeyError(sync_run_id)
    result = dict(zip([d[0] for d in cursor.description], row))
    if isinstance(result.get("details"), str):
        result["details"] = json.loads(result["details"])
    return result


def finish_sync_run(
    conn: duckdb.DuckDBPyConnection, sync_run_id: str, snapshot_version: int | None, details: dict[str, object]
) -> dict[str, object]:
    row = get_sync_run(conn, sync_run_id)
    details = {**(row.get("details") or {}), **details}
    summary = summary_line({**row, "details": details})
    conn.execute(
        "UPDATE sync_runs SET status = 'succeeded', finished_at = ?, snapshot_version = ?, summary = ?, details = ? "
        "WHERE sync_run_id = ?",
        [utcnow(), snapshot_version, summary, json.dumps(details, default=str), sync_run_id],
    )
    return get_sync_run(conn, sync_run_id)


# runs that ended without finishing: versions they recorded or activated are completed by a later run
STOPPED_RUN_STATUSES = ("interrupted", "abandoned", "failed")


def unpublished_active_versions(
    conn: duckdb.DuckDBPyConnection, source_ids: list[str] | None = None
) -> dict[str, tuple[int, int | None]]:
    """Active versions with chunks that no published snapshot can hold yet: activated after the
    last snapshot was recorded, by a run stopped before it published (a run that activates
    chunks always builds a snapshot).  doc_id -> (version, supersedes)."""
    rows = conn.execute(
        """
        SELECT d.doc_id, d.version, d.supersedes FROM documents d
        WHERE d.status = 'active' AND (? IS NULL OR list_contains(?, d.source_id))
          AND d.valid_from > (SELECT coalesce(max(created_at), TIMESTAMP '1970-01-01') FROM index_snapshots)
          AND EXISTS (SELECT 1 FROM chunks c WHERE c.doc_id = d.doc_id AND c.version = d.version)
        """,
        [source_ids, source_ids],
    ).fetchall()
    return {doc_id: (version, supersedes) for doc_id, version, supersedes in rows}
