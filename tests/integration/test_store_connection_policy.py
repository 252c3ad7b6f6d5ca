"""One connection policy per process: reads and writes of the store from many threads never clash.

DuckDB refuses, inside one process, a read-only connection to a file while a
read-write one is open (and the reverse).  The server reads the store from
request threads while its ingestion job writes it; these tests hammer exactly
that mix through ``store_connection``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from knowledge_store.core.errors import StoreBusyError, StoreError
from knowledge_store.storage.store import connection_gate, store_connection


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store.duckdb"
    with store_connection(path) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS counter (n INTEGER)")
    return path


def _hammer(store: Path, read_only: bool, rounds: int, errors: list[str]) -> None:
    for i in range(rounds):
        try:
            with store_connection(store, read_only=read_only, timeout_s=10) as conn:
                if read_only:
                    conn.execute("SELECT count(*) FROM counter").fetchone()
                else:
                    conn.execute("INSERT INTO counter VALUES (?)", [i])
        except Exception as error:  # noqa: BLE001 - collected and asserted on
            errors.append(f"{type(error).__name__}: {error}")


def test_concurrent_reads_and_writes_in_one_process_never_clash(store):
    errors: list[str] = []
    threads = [threading.Thread(target=_hammer, args=(store, ro, 40, errors)) for ro in (True, False, True, False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with store_connection(store, read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM counter").fetchone()[0] == 2 * 40  # no write was lost


def test_a_read_joins_an_open_write_connection_instead_of_failing(store):
    with store_connection(store) as writer:
        writer.execute("INSERT INTO counter VALUES (1)")
        # another thread reads while the write connection is open
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(
            _count(store)))
        t.start()
        t.join(timeout=10)
        assert seen == [1]


def _count(store: Path) -> int:
    with store_connection(store, read_only=True, timeout_s=5) as conn:
        return conn.execute("SELECT count(*) FROM counter").fetchone()[0]


def test_a_writer_waits_for_open_reads_and_is_not_starved_by_new_ones(store):
    gate = connection_gate(store)
    release_reader = threading.Event()
    wrote = threading.Event()

    def long_read() -> None:
        with store_connection(store, read_only=True, timeout_s=5):
            release_reader.wait(5)

    def write() -> None:
        with store_connection(store, timeout_s=10) as conn:
            conn.execute("INSERT INTO counter VALUES (7)")
        wrote.set()

    reader = threading.Thread(target=long_read)
    reader.start()
    _wait_for(lambda: gate.mode == "ro")
    writer = threading.Thread(target=write)
    writer.start()
    _wait_for(lambda: gate.writers_waiting == 1)
    # a read arriving now queues behind the writer instead of extending the read-only period
    late: list[int] = []
    late_reader = threading.Thread(target=lambda: late.append(_count(store)))
    late_reader.start()
    time.sleep(0.2)
    assert not wrote.is_set() and late == []
    release_reader.set()
    for t in (reader, writer, late_reader):
        t.join(timeout=10)
    # both got in once the first read closed: the late read joined the writer's read-write mode
    assert wrote.is_set() and len(late) == 1


def test_waiting_longer_than_the_timeout_is_a_typed_busy_error(store):
    hold = threading.Event()
    opened = threading.Event()

    def long_read() -> None:
        with store_connection(store, read_only=True, timeout_s=5):
            opened.set()
            hold.wait(5)

    t = threading.Thread(target=long_read)
    t.start()
    opened.wait(5)
    began = time.monotonic()
    with pytest.raises(StoreBusyError) as caught:
        with store_connection(store, timeout_s=0.3):
            pass
    assert time.monotonic() - began < 3 and str(store) in str(caught.value)
    hold.set()
    t.join()
    assert connection_gate(store).writers_waiting == 0  # the give-up left no phantom waiter


def test_nested_connections_in_one_thread_join_and_a_write_inside_a_read_is_refused_at_once(store):
    with store_connection(store) as outer:
        with store_connection(store, read_only=True) as inner:  # joins the open write connection
            assert inner.execute("SELECT 1").fetchone() == (1,)
        outer.execute("INSERT INTO counter VALUES (1)")
    with store_connection(store, read_only=True):
        with store_connection(store, read_only=True) as inner:
            assert inner.execute("SELECT count(*) FROM counter").fetchone() == (1,)
        with pytest.raises(StoreError, match="inside a read-only"):
            with store_connection(store, timeout_s=5):
                pass
    gate = connection_gate(store)
    assert gate.holders == 0 and gate.mode is None


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)
