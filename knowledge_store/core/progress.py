"""Progress of long work (parse, chunk, embed, evaluate, tune): counts, rate and ETA, to whoever watches.

Stages report through one tiny interface, ``StageProgress``: ``start(total)``,
``advance(n)``, ``finish()``.  Where the figures go depends on who runs the work:

* a person at a terminal (``groundwork ingest``/``sync``/``eval``/``tune``): a tqdm bar
  on stderr per stage; when stderr is not a terminal (CI, a log file), one plain line
  every ``interval_s`` and one at the end;
* a Dagster run: ``context.log.info`` lines with the same figures (``DagsterLogSink``);
* an API job: the job's ``progress`` field (any callable ``(stage, figures)``).

Sinks are plain callables ``sink(stage, figures)``; the terminal one is installed
process-wide by the CLI (``terminal_progress()``), so work that runs inside a Dagster
job started by the CLI (``execute_in_process``) shows a bar too.  Reporting never
raises into the work it reports on.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from tqdm import tqdm

log = logging.getLogger(__name__)

Sink = Callable[[str, dict[str, Any]], None]

_GLOBAL_SINKS: list[Sink] = []
_GLOBAL_LOCK = threading.Lock()


def figures(done: int, total: int | None, started: float, unit: str) -> dict[str, Any]:
    """``{done, total, unit, rate, eta_s, elapsed_s, percent}`` - the numbers every sink shows."""
    elapsed = max(time.monotonic() - started, 1e-9)
    rate = done / elapsed
    eta = (total - done) / rate if total is not None and rate > 0 and done <= total else None
    return {"done": done, "total": total, "unit": unit, "rate": round(rate, 2), "elapsed_s": round(elapsed, 1),
            "eta_s": round(eta, 1) if eta is not None else None,
            "percent": round(100.0 * done / total, 1) if total else None}


def describe(stage: str, f: dict[str, Any]) -> str:
    """One line for logs: ``embed: 1,200/11,696 chunks (10.3%) 48.1 chunks/s, ETA 3m38s``."""
    if f.get("started"):
        return f"{stage}: {f['total']:,} {f['unit']} to do"
    if f.get("finished"):
        return f"{stage}: {f['done']:,} {f['unit']} done in {_duration(f['elapsed_s'])} ({f['rate']:.1f} {f['unit']}/s)"
    total = f"/{f['total']:,}" if f.get("total") is not None else ""
    percent = f" ({f['percent']}%)" if f.get("percent") is not None else ""
    eta = f", ETA {_duration(f['eta_s'])}" if f.get("eta_s") is not None else ""
    return f"{stage}: {f['done']:,}{total} {f['unit']}{percent} {f['rate']:.1f} {f['unit']}/s{eta}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class StageProgress:
    """Counts of one stage, fanned out to sinks (each at most every ``interval_s``, plus the end)."""

    def __init__(self, stage: str, unit: str, sinks: list[Sink] | None = None, interval_s: float = 2.0) -> None:
        self.stage = stage
        self.unit = unit
        self.sinks = [*(sinks or []), *_global_sinks()]
        self.interval_s = interval_s
        self.total: int | None = None
        self.done = 0
        self.started = time.monotonic()
        self._last = 0.0

    def start(self, total: int | None) -> StageProgress:
        self.total, self.done, self.started, self._last = total, 0, time.monotonic(), 0.0
        self._emit({"started": True})
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._emit({})

    def finish(self) -> None:
        self._emit({"finished": True})

    def _emit(self, extra: dict[str, Any]) -> None:
        snapshot = {**figures(self.done, self.total, self.started, self.unit), **extra}
        for sink in self.sinks:
            try:
                sink(self.stage, snapshot)
            except Exception:  # noqa: BLE001 - progress must never break the work
                log.debug("progress sink failed", exc_info=True)


def stage_progress(stage: str, unit: str, sink: Sink | None = None, interval_s: float = 2.0) -> StageProgress:
    return StageProgress(stage, unit, [sink] if sink else [], interval_s)


def _global_sinks() -> list[Sink]:
    with _GLOBAL_LOCK:
        return list(_GLOBAL_SINKS)


class TerminalSink:
    """A tqdm bar per stage on a terminal; plain periodic lines otherwise."""

    def __init__(self, stream: TextIO | None = None, interval_s: float = 10.0, bars: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.bars = self.stream.isatty() if bars is None else bars
        self.interval_s = interval_s
        self._bars: dict[str, Any] = {}
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, stage: str, f: dict[str, Any]) -> None:
        with self._lock:
            if self.bars:
                self._bar(stage, f)
            else:
                now = time.monotonic()
                if f.get("finished") or f.get("started") or now - self._last.get(stage, 0.0) >= self.interval_s:
                    self._last[stage] = now
                    if f.get("started") and not f.get("total"):
                        return
                    print(describe(stage, f), file=self.stream, flush=True)

    def _bar(self, stage: str, f: dict[str, Any]) -> None:
        bar = self._bars.get(stage)
        if bar is None or f.get("started"):
            if bar is not None:
                bar.close()
            bar = self._bars[stage] = tqdm(total=f.get("total"), desc=stage, unit=f" {f['unit']}", file=self.stream,
                                           dynamic_ncols=True, leave=True)
        bar.update(f["done"] - bar.n)
        if f.get("finished"):
            bar.close()
            del self._bars[stage]


def install_terminal_progress(stream: TextIO | None = None, interval_s: float = 10.0) -> TerminalSink:
    """A terminal sink for every stage run in this process from now on (a process started to run one job)."""
    sink = TerminalSink(stream, interval_s)
    with _GLOBAL_LOCK:
        _GLOBAL_SINKS.append(sink)
    return sink


@contextlib.contextmanager
def terminal_progress(stream: TextIO | None = None, interval_s: float = 10.0) -> Iterator[TerminalSink]:
    """Install a terminal sink for every stage run in this process while the block runs (the CLI's)."""
    sink = TerminalSink(stream, interval_s)
    with _GLOBAL_LOCK:
        _GLOBAL_SINKS.append(sink)
    try:
        yield sink
    finally:
        with _GLOBAL_LOCK:
            _GLOBAL_SINKS.remove(sink)


class DagsterLogSink:
    """Progress lines in a Dagster run's event log (``context.log.info``), at most every ``interval_s``."""

    def __init__(self, logger: Any, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}

    def __call__(self, stage: str, f: dict[str, Any]) -> None:
        now = time.monotonic()
        if f.get("finished") or now - self._last.get(stage, 0.0) >= self.interval_s:
            self._last[stage] = now
            if f.get("started") and not f.get("done"):
                return
            self.logger.info(describe(stage, f))
