"""Progress of long work: counts, rate and ETA reach a terminal, a log, a Dagster run and an API job."""

from __future__ import annotations

import io
import time

from knowledge_store.core.progress import DagsterLogSink, TerminalSink, describe, stage_progress, terminal_progress


def test_figures_carry_counts_rate_and_eta():
    seen = []
    counts = stage_progress("embed", "chunks", lambda stage, f: seen.append((stage, f)), interval_s=0.0).start(100)
    time.sleep(0.05)
    counts.advance(25)
    counts.finish()
    stage, mid = seen[1]
    assert stage == "embed" and mid["done"] == 25 and mid["total"] == 100 and mid["percent"] == 25.0
    assert mid["rate"] > 0 and mid["eta_s"] is not None and mid["eta_s"] > 0
    assert seen[-1][1]["finished"] is True
    line = describe("embed", mid)
    assert line.startswith("embed: 25/100 chunks (25.0%)") and "chunks/s" in line and "ETA" in line


def test_without_a_terminal_progress_is_plain_periodic_lines():
    stream = io.StringIO()  # not a tty
    sink = TerminalSink(stream, interval_s=3600)
    counts = stage_progress("parse", "documents", sink, interval_s=0.0).start(3)
    for _ in range(3):
        counts.advance()
    counts.finish()
    lines = stream.getvalue().splitlines()
    # the first and the last, none in between (interval not reached), and no tqdm control characters
    assert lines[0] == "parse: 3 documents to do" and lines[-1].startswith("parse: 3 documents done in")
    assert len(lines) == 2 and "\r" not in stream.getvalue()


def test_on_a_terminal_progress_is_a_bar():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    counts = stage_progress("embed", "chunks", TerminalSink(stream), interval_s=0.0).start(10)
    counts.advance(10)
    counts.finish()
    out = stream.getvalue()
    assert "embed" in out and "10/10" in out and "\r" in out


def test_the_cli_sink_hears_stages_that_run_anywhere_in_the_process():
    stream = io.StringIO()
    with terminal_progress(stream, interval_s=0.0):
        counts = stage_progress("eval", "queries").start(2)  # no sink passed: the global one hears it
        counts.advance(2)
        counts.finish()
    after = stage_progress("eval", "queries").start(1)  # uninstalled afterwards
    after.finish()
    assert "eval: 2/2 queries" in stream.getvalue() and "eval: 2 queries done in" in stream.getvalue()
    # the 1-query stage ran after the sink was uninstalled: none of its lines (a bare "1 queries" would also
    # match a rate such as "78376.1 queries/s" of the stage that was heard)
    assert "eval: 1 queries" not in stream.getvalue() and "eval: 1/1 queries" not in stream.getvalue()


def test_dagster_runs_get_log_lines_and_a_failing_sink_never_breaks_the_work():
    class Log:
        def __init__(self):
            self.lines = []

        def info(self, text):
            self.lines.append(text)

    log = Log()

    def broken(stage, f):
        raise RuntimeError("sink down")

    counts = stage_progress("chunk", "documents", DagsterLogSink(log, interval_s=0.0), interval_s=0.0)
    counts.sinks.append(broken)
    counts.start(4)
    counts.advance(4)
    counts.finish()
    assert log.lines and log.lines[-1].startswith("chunk: 4 documents done in")
