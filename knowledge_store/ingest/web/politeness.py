"""Per-host request spacing.

Every request to a host (pages, robots.txt, sitemaps, retries) waits until
``interval`` seconds have passed since the previous request to that host
started.  ``sleep`` and ``clock`` are injected so tests can assert the waits
without really waiting.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path


class RateLimiter:
    def __init__(self, interval_s: float, sleep: Callable[[float], None], clock: Callable[[], float]) -> None:
        self.default_interval_s = interval_s
        self._intervals: dict[str, float] = {}
        self._last_start: dict[str, float] = {}
        self._sleep = sleep
        self._clock = clock

    def interval_for(self, host: str) -> float:
        return self._intervals.get(host, self.default_interval_s)

    def slow_down(self, host: str, interval_s: float) -> None:
        """Raise the spacing for one host (robots.txt ``Crawl-delay``); never lowers it."""
        self._intervals[host] = max(self.interval_for(host), interval_s)

    def wait(self, host: str) -> float:
        """Block until the next request to ``host`` may start; returns the seconds waited."""
        waited = 0.0
        last = self._last_start.get(host)
        if last is not None:
            remaining = last + self.interval_for(host) - self._clock()
            if remaining > 0:
                self._sleep(remaining)
                waited = remaining
        self._last_start[host] = self._clock()
        return waited


class SharedRateLimiter(RateLimiter):
    """The same spacing, shared by every process crawling from one data folder.

    Two writers can crawl at once (a Dagster run and a sync started through the API, or
    two sources on one host): each would keep its own 5 requests/s and the host would
    see 10.  Here the last request start per host lives in a small file under
    ``directory``; ``wait`` takes an exclusive ``flock`` on it, sleeps out the interval
    and records its own start before releasing, so all crawlers queue on one clock
    (wall time, comparable across processes).
    """

    def __init__(self, directory: str | os.PathLike[str], interval_s: float, sleep: Callable[[float], None],
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(interval_s, sleep, clock)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _file(self, host: str) -> Path:
        return self.directory / (hashlib.sha256(host.encode()).hexdigest()[:24] + ".last")

    def wait(self, host: str) -> float:
        with open(self._file(host), "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.seek(0)
                try:
                    last = float(handle.read().strip() or "nan")
                except ValueError:
                    last = float("nan")
                waited = 0.0
                if last == last:  # not NaN
                    remaining = last + self.interval_for(host) - self._clock()
                    if remaining > 0:
                        self._sleep(remaining)
                        waited = remaining
                handle.seek(0)
                handle.truncate()
                handle.write(repr(self._clock()))
                handle.flush()
                return waited
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
