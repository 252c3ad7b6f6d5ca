"""Render pages whose content is built by JavaScript: headless Chromium through Playwright.

Used for web sources with ``render_js`` on.  The crawler still fetches every page itself (politeness,
robots.txt, redirects, size limits, conditional requests all apply as for any page); the renderer then
loads that body into Chromium as the answer to the page's own URL, so the page is not downloaded twice,
and lets its scripts run (their requests go to the network; images, media and fonts are not loaded:
they add nothing to the text).  What is kept is the DOM after the wait condition (``load``,
``domcontentloaded`` or ``networkidle``) as HTML, which the parse stage reads like any page.

One browser per crawl, started at the first page that needs it and closed when the crawl ends; one fresh
browser context per page, so no page sees another's cookies or storage.  A page that has not reached its
wait condition within ``timeout_s`` has its scripts stopped (``Runtime.terminateExecution``, even a busy
loop) and its DOM as it stands is kept: partial content beats none, and the caller counts it as a timeout.

Only the system Chromium is used (``executable_path``): nothing here downloads a browser.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knowledge_store.core.errors import ChromiumNotFoundError

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SKIPPED_RESOURCES = frozenset({"image", "media", "font"})
WAIT_CONDITIONS = ("load", "domcontentloaded", "networkidle")


@dataclass
class RenderedPage:
    """The DOM after rendering, as UTF-8 HTML; ``timed_out``: the wait condition was not reached in time."""

    html: bytes
    seconds: float
    timed_out: bool


def check_chromium(path: str | Path) -> Path:
    """The Chromium executable at ``path``, or ``ChromiumNotFoundError`` naming the setting."""
    executable = Path(path)
    if not executable.is_file() or not executable.stat().st_mode & 0o111:
        raise ChromiumNotFoundError(path)
    return executable


class ChromiumRenderer:
    """Renders one page at a time in a browser it starts on first use; ``close`` ends it."""

    def __init__(self, executable: str | Path, timeout_s: float = 30.0, wait_until: str = "networkidle",
                 user_agent: str | None = None) -> None:
        if wait_until not in WAIT_CONDITIONS:
            raise ValueError(f"wait_until={wait_until!r}: must be one of {', '.join(WAIT_CONDITIONS)}")
        self.executable = executable
        self.timeout_s = timeout_s
        self.wait_until = wait_until
        self.user_agent = user_agent
        self._playwright: Any = None
        self._browser: Any = None
        self.pages = 0
        self.timeouts = 0
        self.seconds = 0.0
        self.launch_seconds = 0.0

    def _start(self) -> Any:
        if self._browser is None:
            executable = check_chromium(self.executable)
            started = time.perf_counter()
            from playwright.sync_api import sync_playwright  # noqa: PLC0415 - playwright, ~0.2 s, only with render_js

            self._playwright = sync_playwright().start()
            try:
                self._browser = self._playwright.chromium.launch(executable_path=str(executable), args=CHROMIUM_ARGS)
            except Exception:
                self._playwright.stop()
                self._playwright = None
                raise
            self.launch_seconds = time.perf_counter() - started
        return self._browser

    def render(self, url: str, body: bytes, content_type: str | None) -> RenderedPage:
        """Load ``body`` as the answer to ``url``, run its scripts, return the DOM (see the module docstring)."""
        from playwright.sync_api import Error as PlaywrightError  # noqa: PLC0415 - playwright, loaded by _start

        browser = self._start()
        started = time.perf_counter()
        context = browser.new_context(user_agent=self.user_agent, service_workers="block")
        served = [False]

        def route(route: Any) -> None:
            request = route.request
            if not served[0] and request.is_navigation_request():
                served[0] = True  # the body the crawler fetched answers the page's own URL
                route.fulfill(status=200, headers={"content-type": content_type or "text/html"}, body=body)
            elif request.resource_type in SKIPPED_RESOURCES:
                route.abort()
            else:
                route.continue_()

        timed_out = False
        try:
            page = context.new_page()
            page.route("**/*", route)
            cdp = context.new_cdp_session(page)  # opened before the scripts run: it still answers during a busy loop
            try:
                page.goto(url, wait_until=self.wait_until, timeout=self.timeout_s * 1000)
            except PlaywrightError as error:
                if "Timeout" not in type(error).__name__ and "timeout" not in str(error).lower():
                    raise
                timed_out = True
                cdp.send("Runtime.terminateExecution")
                cdp.send("Emulation.setScriptExecutionDisabled", {"value": True})
            html = page.content()
        finally:
            context.close()
        seconds = time.perf_counter() - started
        self.pages += 1
        self.timeouts += int(timed_out)
        self.seconds += seconds
        return RenderedPage(html=html.encode("utf-8"), seconds=seconds, timed_out=timed_out)

    def close(self) -> None:
        if self._browser is not None:
            try:
                self._browser.close()
            finally:
                self._browser = None
                self._playwright.stop()
                self._playwright = None
