"""The rotated query.log file: size-bounded, a bounded number of files, nothing lost at the end."""

from __future__ import annotations

import json
import logging

from knowledge_store.query_log import _DailyAndSizeRotatingHandler


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
