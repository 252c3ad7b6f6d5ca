"""Per-host request spacing.

Every request to a host (pages, robots.txt, sitemaps, retries) waits until
``interval`` seconds have passed since the previous request to that host
started.  ``sleep`` and ``clock`` are injected so tests can assert the waits
without really waiting.
"""

from __future__ import annotations

from collections.abc import Callable


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
