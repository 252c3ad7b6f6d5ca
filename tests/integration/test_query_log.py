"""The query log: redaction, the background writer, spooling under a foreign
lock, export, retention and the feedback table.

The parts that need no model, store or server are in tests/unit/test_query_log.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from knowledge_store.core.errors import StoreLockedError
from knowledge_store.storage.query_log import LOG_MIGRATIONS, QueryLog, QueryLogRecord, default_log_path
from knowledge_store.storage.store import utcnow

LOCK_TIMEOUT_S = 0.3


# ---------------------------------------------------------------------------
# the log
# ---------------------------------------------------------------------------


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return default_log_path(tmp_path / "data")


@pytest.fixture
def qlog(log_path: Path):
    ql = QueryLog(log_path, lock_timeout_s=LOCK_TIMEOUT_S)
    yield ql
    ql.close()


def _record(query: str = "how long is the compressor delay?", **fields) -> QueryLogRecord:
    defaults = dict(
        client="cli",
        params={"alpha": 0.5, "fusion": "rrf", "reranker": "cross-encoder", "filters": {"doc_type": ["pdf"]}, "k": 5},
        results_pre=[
            {"chunk_id": "c1", "doc_id": "d1", "score": 0.031, "bm25_score": 7.2, "vector_score": 0.61, "rank": 1},
            {"chunk_id": "c2", "doc_id": "d2", "score": 0.029, "bm25_score": None, "vector_score": 0.58, "rank": 2},
        ],
        results_post=[
            {"chunk_id": "c2", "score": 0.9, "rerank_score": 4.1, "rank": 1},
            {"chunk_id": "c1", "score": 0.4, "rerank_score": -1.0, "rank": 2},
        ],
        latency_ms={"embed": 5.5, "bm25": 1.25, "vector": 2.0, "fuse": 0.1, "rerank": 30.0, "format": 0.2, "total": 39.05},
        reranker_status="ok",
        coverage="answered",
        snapshot_version=3,
    )
    defaults.update(fields)
    return QueryLogRecord(query=query, **defaults)


def _count(path: Path) -> int:
    with duckdb.connect(str(path)) as conn:
        return conn.execute("SELECT count(*) FROM query_log").fetchone()[0]


def test_append_returns_id_at_once_and_record_is_readable_redacted_after_flush(qlog: QueryLog) -> None:
    start = time.perf_counter()
    request_id = qlog.append(_record("reset for bob@example.com with password=hunter2"))
    assert time.perf_counter() - start < 0.05
    assert len(request_id) == 32 and int(request_id, 16) >= 0  # uuid4 hex

    assert qlog.flush(5)
    stored = qlog.get(request_id)
    assert stored is not None
    assert stored.query == "reset for bob@[REDACTED] with password=[SECRET]"
    assert stored.retrieval_request_id == request_id
    assert qlog.get("no-such-id") is None


def test_json_fields_and_scalars_round_trip(qlog: QueryLog) -> None:
    original = _record(error="timeout talking to sk-ant-api03-AbCdEf0123456789abcdefXYZ")
    request_id = qlog.append(original)
    stored = qlog.get(request_id)
    assert stored is not None
    assert stored.params == original.params
    assert stored.results_pre == original.results_pre
    assert stored.results_post == original.results_post
    assert stored.latency_ms == original.latency_ms
    assert stored.client == "cli"
    assert stored.reranker_status == "ok"
    assert stored.coverage == "answered"
    assert stored.snapshot_version == 3
    assert stored.error == "timeout talking to [SECRET]"
    assert stored.created_at == original.created_at
    assert stored.created_at.tzinfo is None


def test_list_is_newest_first_and_filters_by_client_and_since(qlog: QueryLog) -> None:
    now = utcnow()
    old = qlog.append(_record("old", created_at=now - timedelta(days=3), client="api"))
    mid = qlog.append(_record("mid", created_at=now - timedelta(hours=1), client="mcp"))
    new = qlog.append(_record("new", created_at=now, client="api"))
    assert [r.retrieval_request_id for r in qlog.list()] == [new, mid, old]
    assert [r.retrieval_request_id for r in qlog.list(client="api")] == [new, old]
    assert [r.retrieval_request_id for r in qlog.list(since=now - timedelta(days=1))] == [new, mid]
    assert [r.retrieval_request_id for r in qlog.list(limit=1)] == [new]


def test_appends_from_four_threads_lose_nothing(qlog: QueryLog, log_path: Path) -> None:
    per_thread = 250
    ids: list[str] = []
    ids_lock = threading.Lock()

    def worker(n: int) -> None:
        mine = [qlog.append(_record(f"thread {n} query {i}", client="eval")) for i in range(per_thread)]
        with ids_lock:
            ids.extend(mine)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert qlog.flush(10)
    assert len(set(ids)) == 4 * per_thread
    assert _count(log_path) == 4 * per_thread


def _hold_lock(path: Path) -> subprocess.Popen[str]:
    """Another process that keeps the log file open (locked) until told to stop."""
    code = (
        "import duckdb, sys, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        f"        conn = duckdb.connect({str(path)!r})\n"
        "        break\n"
        "    except duckdb.IOException:\n"
        "        time.sleep(0.05)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
        "conn.close()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "locked"
    return child


def _release(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.write("\n")
    child.stdin.flush()
    child.wait(10)


def test_append_spools_while_another_process_holds_the_lock_and_import_follows(
    qlog: QueryLog, log_path: Path
) -> None:
    first = qlog.append(_record("before the lock"))
    assert qlog.flush()
    child = _hold_lock(log_path)
    try:
        start = time.perf_counter()
        spooled = [qlog.append(_record(f"during the lock {i} token=abc{i}")) for i in range(20)]
        assert time.perf_counter() - start < 0.1  # never waits for the lock
        assert qlog.flush(5)
        spools = list(log_path.parent.glob("query_log.spool-*.jsonl"))
        assert len(spools) == 1
        lines = [json.loads(line) for line in spools[0].read_text().splitlines()]
        assert [line["retrieval_request_id"] for line in lines] == spooled
        assert all("token=[SECRET]" in line["query"] for line in lines)  # the spool is redacted too

        with pytest.raises(StoreLockedError):
            qlog.get(first)  # readers give up after lock_timeout_s with a clear error
    finally:
        _release(child)

    assert qlog.flush(5)  # the next writer imports the spool
    assert not list(log_path.parent.glob("query_log.spool-*.jsonl"))
    assert _count(log_path) == 21
    stored = qlog.get(spooled[-1])
    assert stored is not None and stored.query == "during the lock 19 token=[SECRET]"
    assert stored.results_post == _record().results_post


def test_spool_from_another_process_is_imported_exactly_once(tmp_path: Path, log_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    writer = QueryLog(log_path, lock_timeout_s=LOCK_TIMEOUT_S, spool_dir=spool_dir)
    try:
        ids = [writer.append(_record(f"q{i}")) for i in range(3)]
        assert writer.flush()
        child = _hold_lock(log_path)
        try:
            more = [writer.append(_record(f"locked {i}")) for i in range(3)]
            writer.flush()
        finally:
            _release(child)
        # a stale copy of an already-imported row in someone else's spool is ignored
        (spool_dir / "query_log.spool-999999.jsonl").write_text(
            (spool_dir / next(p.name for p in spool_dir.iterdir())).read_text()
        )
    finally:
        writer.close()
    with QueryLog(log_path, lock_timeout_s=LOCK_TIMEOUT_S, spool_dir=spool_dir) as reader:
        assert {r.retrieval_request_id for r in reader.list()} == set(ids + more)
    assert not list(spool_dir.iterdir())


def test_export_jsonl_and_parquet(qlog: QueryLog, tmp_path: Path) -> None:
    now = utcnow()
    qlog.append(_record("ancient", created_at=now - timedelta(days=10)))
    ids = [qlog.append(_record(f"q{i}", created_at=now + timedelta(seconds=i))) for i in range(5)]

    jsonl = tmp_path / "out" / "log.jsonl"
    assert qlog.export(jsonl, "jsonl") == 6
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(rows) == 6
    assert rows[-1]["retrieval_request_id"] == ids[-1]
    assert rows[-1]["created_at"] == (now + timedelta(seconds=4)).isoformat()
    assert rows[-1]["params"]["filters"] == {"doc_type": ["pdf"]}
    assert rows[-1]["results_pre"][0]["bm25_score"] == 7.2

    parquet = tmp_path / "out" / "log.parquet"
    assert qlog.export(parquet, "parquet", since=now - timedelta(days=1)) == 5
    with duckdb.connect() as conn:
        back = conn.execute(
            f"SELECT retrieval_request_id, query, params, latency_ms, snapshot_version FROM '{parquet}' "
            "ORDER BY created_at"
        ).fetchall()
    assert [row[0] for row in back] == ids
    assert back[0][1] == "q0"
    assert json.loads(back[0][2])["k"] == 5
    assert json.loads(back[0][3])["total"] == 39.05
    assert back[0][4] == 3

    with pytest.raises(ValueError, match="fmt"):
        qlog.export(tmp_path / "x.csv", "csv")  # type: ignore[arg-type]


def test_feedback_is_stored_validated_and_redacted(qlog: QueryLog) -> None:
    request_id = qlog.append(_record())  # not flushed yet: add_feedback must flush first
    row = qlog.add_feedback(request_id, "down", chunk_id="c2", note="wrong page, ask ops@example.com")
    assert row["retrieval_request_id"] == request_id
    assert row["rating"] == "down" and row["chunk_id"] == "c2"
    assert row["note"] == "wrong page, ask ops@[REDACTED]"
    assert isinstance(row["created_at"], str) and "T" in row["created_at"]
    assert len(row["feedback_id"]) == 32

    whole_answer = qlog.add_feedback(request_id, "up")
    assert whole_answer["chunk_id"] is None and whole_answer["note"] is None

    with pytest.raises(KeyError):
        qlog.add_feedback("0" * 32, "up")
    with pytest.raises(ValueError, match="rating"):
        qlog.add_feedback(request_id, "meh")

    assert [f["feedback_id"] for f in qlog.list_feedback()] == [whole_answer["feedback_id"], row["feedback_id"]]
    assert row.pop("replaced") == 0 and row["client"] is None  # no client given: nothing replaced
    assert qlog.list_feedback()[1] == row
    assert [f["feedback_id"] for f in qlog.feedback_for_chunks(["c2", "c9"])] == [row["feedback_id"]]
    assert qlog.feedback_for_chunks([]) == []

    joined = qlog.feedback_with_queries()
    assert len(joined) == 2
    assert joined[1]["query"] == _record().query
    assert joined[1]["results_post"][0]["chunk_id"] == "c2"
    assert joined[1]["params"]["k"] == 5


def test_purge_deletes_old_queries_and_their_feedback(qlog: QueryLog, log_path: Path) -> None:
    now = utcnow()
    old = qlog.append(_record("old", created_at=now - timedelta(days=40)))
    recent = qlog.append(_record("recent", created_at=now - timedelta(days=1)))
    qlog.add_feedback(old, "up")
    qlog.add_feedback(recent, "down")
    assert qlog.purge_older_than(30) == 1
    assert [r.retrieval_request_id for r in qlog.list()] == [recent]
    assert [f["retrieval_request_id"] for f in qlog.list_feedback()] == [recent]
    assert qlog.purge_older_than(30) == 0


def test_the_configured_retention_runs_from_the_cli_and_the_daily_dagster_job(tmp_path: Path, monkeypatch, capsys) -> None:
    import dagster as dg

    from knowledge_store.cli import main
    from knowledge_store.config.settings import Settings
    from pipelines.definitions import build_definitions
    from pipelines.maintenance import PURGE_QUERY_LOG_JOB_NAME
    from pipelines.resources import KnowledgeStoreResource

    monkeypatch.setenv("GROUNDWORK_DATA_DIR", str(tmp_path / "data"))
    settings = Settings()
    settings.data_dir.mkdir(parents=True)
    now = utcnow()

    def log(*ages_days: float) -> None:
        with QueryLog(settings.logs_path, lock_timeout_s=LOCK_TIMEOUT_S) as ql:
            for age in ages_days:
                ql.append(_record(f"{age} days ago", created_at=now - timedelta(days=age)))

    log(200, 100, 10)  # the default retention is 90 days
    assert main(["logs", "purge", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["days"], out["queries_deleted"], out["queries_left"]) == (90.0, 2, 1)

    log(40)
    defs = build_definitions(store=KnowledgeStoreResource(data_dir=str(settings.data_dir)))
    schedule = next(s for s in defs.schedules if s.name == "query_log_retention_daily")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    monkeypatch.setenv("GROUNDWORK_QUERY_LOG_RETENTION_DAYS", "30")
    run = defs.resolve_job_def(PURGE_QUERY_LOG_JOB_NAME).execute_in_process()
    assert run.success
    materialised = run.asset_materializations_for_node("retained_query_log")[0].metadata
    assert (materialised["queries_deleted"].value, materialised["queries_left"].value) == (1, 1)

    monkeypatch.setenv("GROUNDWORK_QUERY_LOG_RETENTION_DAYS", "0")  # retention off: the schedule keeps everything
    log(500)
    assert main(["logs", "purge"]) == 0
    assert "retention is off" in capsys.readouterr().out
    assert main(["logs", "purge", "--older-than-days", "0", "--json"]) == 0  # explicit: everything logged so far
    assert json.loads(capsys.readouterr().out)["queries_left"] == 0
    assert main(["logs", "purge", "--older-than-days", "-1"]) == 2
    assert "--older-than-days=-1.0: must be 0 or more" in capsys.readouterr().err


def test_close_is_idempotent_and_later_appends_are_not_lost(log_path: Path) -> None:
    ql = QueryLog(log_path, lock_timeout_s=LOCK_TIMEOUT_S)
    first = ql.append(_record("one"))
    ql.close()
    ql.close()
    assert _count(log_path) == 1
    late = ql.append(_record("after close"))  # never raises: goes to the spool
    assert late
    assert ql.flush() is True
    with QueryLog(log_path, lock_timeout_s=LOCK_TIMEOUT_S) as again:
        assert {r.retrieval_request_id for r in again.list()} == {first, late}


def test_schema_is_migrated_once_in_its_own_file(qlog: QueryLog, log_path: Path) -> None:
    qlog.append(_record())
    qlog.flush()
    QueryLog(log_path, lock_timeout_s=LOCK_TIMEOUT_S).close()
    with duckdb.connect(str(log_path)) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations").fetchall()
        tables = {row[0] for row in conn.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        with pytest.raises(duckdb.ConstraintException):
            conn.execute(
                "INSERT INTO feedback VALUES ('f', 'r', NULL, 'sideways', NULL, now()::TIMESTAMP, NULL)"
            )
    assert versions == [(v,) for v, _, _ in LOG_MIGRATIONS]  # each once
    assert {"query_log", "feedback", "schema_migrations"} <= tables
    assert log_path.name == "logs.duckdb"
