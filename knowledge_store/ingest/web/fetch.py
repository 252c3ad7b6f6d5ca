"""One HTTP GET with politeness, retries and a body-size limit.

Redirects are *not* followed here: the crawler checks every hop against the
scope and robots.txt, so it follows them itself.  Transient trouble (timeouts,
connection errors, 408, 429, 5xx) is retried with exponential backoff
(``backoff_base_s * 2**n``, or the server's ``Retry-After`` when that is
longer), never waiting more than ``max_backoff_s``: if the server asks for a
longer pause we give up on that URL for this crawl rather than come back early.
No jitter: one crawler per site gains nothing from it, and tests can assert
exact waits.
Bodies are streamed and reading stops once ``max_bytes`` is passed, so an
unexpected multi-gigabyte file costs at most ``max_bytes`` of download.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpx

from knowledge_store.ingest.web.politeness import RateLimiter
from knowledge_store.ingest.web.results import CrawlFailure
from knowledge_store.ingest.web.urls import host_key

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504}) | frozenset(range(520, 530))
ACCEPT = "text/html,application/xhtml+xml,text/markdown;q=0.9,text/plain;q=0.8,application/pdf;q=0.7,*/*;q=0.1"


@dataclass
class Response:
    """A final (non-retried) answer.  ``body`` is read only for 2xx answers."""

    url: str
    status: int
    headers: httpx.Headers
    body: bytes | None
    attempts: int


# A GET that produced no usable answer is already a crawl failure (same fields); one type, two names
# so the fetch layer reads naturally.
FetchError = CrawlFailure


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        return max(0.0, when.timestamp() - now)
    return max(0.0, seconds) if seconds == seconds else None


def status_error(url: str, status: int, attempts: int, *, permanent: bool | None = None) -> FetchError:
    """A failure for an HTTP status; 404/410 get their own words because they mean "gone"."""
    if status in (404, 410):
        reason = f"HTTP {status}: the page does not exist (any more)"
    elif status == 429:
        reason = "HTTP 429: the server says we are sending too many requests"
    elif status >= 500:
        reason = f"HTTP {status}: the server failed to answer"
    elif status in (401, 403):
        reason = f"HTTP {status}: the server refuses access"
    else:
        reason = f"HTTP {status}: unexpected answer"
    if permanent is None:
        permanent = status not in TRANSIENT_STATUSES
    return FetchError(url=url, kind=f"http_{status}", reason=reason, permanent=permanent, http_status=status,
                      attempts=attempts)


class Fetcher:
    """Sends every request of a crawl, so it also keeps the request/retry counters."""

    def __init__(
        self,
        client: httpx.Client,
        limiter: RateLimiter,
        *,
        user_agent: str,
        max_retries: int,
        backoff_base_s: float,
        max_backoff_s: float,
        sleep: Callable[[float], None],
        wall_time: Callable[[], float] = time.time,
        on_request: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.limiter = limiter
        self.user_agent = user_agent
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.max_backoff_s = max_backoff_s
        self.sleep = sleep
        self.wall_time = wall_time
        self.on_request = on_request
        self.requests = 0
        self.retries = 0
        self.reached = False  # any HTTP answer at all: the site exists and is up

    def get(
        self,
        url: str,
        *,
        max_bytes: int,
        headers: dict[str, str] | None = None,
        refuse: Callable[[httpx.Response], FetchError | None] | None = None,
        truncate: bool = False,
    ) -> Response | FetchError:
        """GET ``url``.  ``refuse`` may reject a 2xx answer from its status and headers before
        the body is read (unsupported content type).  With ``truncate`` an
        oversized body is cut at ``max_bytes`` instead of failing (robots.txt)."""
        request_headers = {"User-Agent": self.user_agent, "Accept": ACCEPT, **(headers or {})}
        attempt = 0
        while True:
            attempt += 1
            self.limiter.wait(host_key(url))
            self.requests += 1
            retry_after: float | None = None
            try:
                # follow_redirects=False even on an injected client: every hop must be checked by the crawler
                with self.client.stream("GET", url, headers=request_headers, follow_redirects=False) as response:
                    self.reached = True
                    if response.status_code in TRANSIENT_STATUSES:
                        error = status_error(url, response.status_code, attempt)
                        retry_after = parse_retry_after(response.headers.get("retry-after"), self.wall_time())
                    else:
                        return self._finish(response, url, attempt, max_bytes, refuse, truncate)
            except httpx.TimeoutException as exc:
                error = FetchError(url, "timeout", f"no answer in time ({type(exc).__name__})", False, None, attempt)
            except (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError) as exc:
                error = FetchError(url, "connection", f"connection failed: {exc or type(exc).__name__}", False, None,
                                   attempt)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:  # bad URL, undecodable body: retrying cannot help
                return FetchError(url, "request_error", f"{type(exc).__name__}: {exc}", True, None, attempt)
            finally:
                if self.on_request is not None:
                    self.on_request()
            if attempt > self.max_retries:
                error.reason += f" (gave up after {attempt} attempts)"
                return error
            if retry_after is not None and retry_after > self.max_backoff_s:
                error.reason += (f"; the server asked to retry after {retry_after:.0f} s, more than max_backoff_s="
                                 f"{self.max_backoff_s:g}, so it is left for the next sync")
                return error
            delay = max(retry_after or 0.0, self.backoff_base_s * 2 ** (attempt - 1))
            self.retries += 1
            self.sleep(min(delay, self.max_backoff_s))

    def _finish(
        self,
        response: httpx.Response,
        url: str,
        attempt: int,
        max_bytes: int,
        refuse: Callable[[httpx.Response], FetchError | None] | None,
        truncate: bool,
    ) -> Response | FetchError:
        status = response.status_code
        if not 200 <= status < 300:
            return Response(url, status, response.headers, None, attempt)
        if refuse is not None:
            problem = refuse(response)
            if problem is not None:
                problem.attempts = attempt
                return problem
        declared = _content_length(response.headers)
        if declared is not None and declared > max_bytes and not truncate:
            return _too_large(url, status, attempt, f"the server announces {declared} bytes, over the "
                                                    f"{max_bytes}-byte limit; nothing was downloaded")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                if truncate:
                    return Response(url, status, response.headers, b"".join(chunks)[:max_bytes], attempt)
                return _too_large(url, status, attempt, f"the body passed the {max_bytes}-byte limit; "
                                                        f"stopped reading after {size} bytes")
        return Response(url, status, response.headers, b"".join(chunks), attempt)


def _content_length(headers: httpx.Headers) -> int | None:
    try:
        value = int(headers.get("content-length", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def _too_large(url: str, status: int, attempts: int, reason: str) -> FetchError:
    return FetchError(url=url, kind="too_large", reason=reason, permanent=True, http_status=status, attempts=attempts)
