"""The rotated query.log file: size-bounded, a bounded number of files, nothing lost at the end."""

from __future__ import annotations

import json
import logging

from knowledge_store.storage.query_log import _DailyAndSizeRotatingHandler


def test_query_log_rotates_by_size_and_keeps_a_bounded_number_of_files(tmp_path):
    handler = _DailyAndSizeRotatingHandler(tmp_path / "query.log", max_bytes=300, backup_count=3)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("test.rotation")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for i in range(40):
            logger.info(json.dumps({"n": i, "pad": "x" * 50}))
    finally:
        logger.removeHandler(handler)
        handler.close()
    rotated = sorted(p.name for p in tmp_path.iterdir() if p.name != "query.log")
    assert 1 <= len(rotated) <= 3 and all(name.startswith("query.log.20") for name in rotated)
    assert (tmp_path / "query.log").stat().st_size <= 300
    assert json.loads((tmp_path / "query.log").read_text().splitlines()[-1])["n"] == 39  # nothing lost at the end


def test_processes_sharing_query_log_follow_each_others_rotation(tmp_path):
    """The server, the CLI and MCP over stdio each append to one query.log with a handler of their own: a
    handler whose file another one rotated away writes on in the new file, and never rotates it again."""
    def handler():
        h = _DailyAndSizeRotatingHandler(tmp_path / "query.log", max_bytes=300, backup_count=5)
        h.setFormatter(logging.Formatter("%(message)s"))
        return h

    def emit(h, n):
        h.handle(logging.LogRecord("lines", logging.INFO, __file__, 0, json.dumps({"n": n, "pad": "x" * 50}), None, None))

    server, cli = handler(), handler()
    try:
        emit(cli, 0)
        for n in range(1, 5):  # the server fills the file and rotates it (size)
            emit(server, n)
        rotated = sorted(p for p in tmp_path.iterdir() if p.name.startswith("query.log.20"))
        assert len(rotated) == 1
        emit(cli, 5)  # the CLI's open file was renamed: its line goes to the new query.log, nothing rotates
        assert sorted(p for p in tmp_path.iterdir() if p.name.startswith("query.log.20")) == rotated
        current = [json.loads(line)["n"] for line in (tmp_path / "query.log").read_text().splitlines()]
        assert current[-1] == 5
        everything = [json.loads(line)["n"] for path in [*rotated, tmp_path / "query.log"]
                      for line in path.read_text().splitlines()]
        assert sorted(everything) == list(range(6))  # nothing lost, nothing twice
        # past midnight, a handler whose trigger is stale leaves a file another process wrote today alone
        cli.rolloverAt = 0
        emit(cli, 6)
        assert sorted(p for p in tmp_path.iterdir() if p.name.startswith("query.log.20")) == rotated
        assert cli.rolloverAt > 0
    finally:
        server.close()
        cli.close()
