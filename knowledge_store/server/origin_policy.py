"""Who may talk to the server: the Host and Origin allow-list of every route (REST, console, MCP).

A local server is reachable from every web page its user opens.  Two attacks
follow, and one policy stops both:

* **Cross-site requests.**  A page on ``evil.example`` - or on another port of
  this machine, e.g. a dev server at ``http://127.0.0.1:5173`` - can POST a
  multipart form to ``http://127.0.0.1:8080/api/knowledge/ingest`` (a "simple"
  request: no preflight); the browser sends it with its ``Origin``.  The REST
  API and console accept only their own origin (the console is served by this
  server, so it is same-origin) and ``cors_origins`` (no other origin may
  call the API); any other Origin is refused with **403** - on
  every method, so neither a write nor a CORS-enabled read gets through.
  Other ports of this machine are other origins: they are not trusted.
* **DNS rebinding.**  ``evil.example`` re-resolved to 127.0.0.1 makes the page
  "same-origin" with us, but its requests still carry ``Host: evil.example``.
  A Host outside the allow-list is refused with **421**, before any route runs.
  A request with more than one ``Host`` header is **400**: the allow-list and
  the links and redirects the server writes must read the same, validated one.

Hosts: ``localhost``, ``127.0.0.1``, ``[::1]`` (any port) plus ``allowed_hosts``
(and the bind address under ``allow_remote``).  ``/mcp`` keeps what MCP
clients get from the MCP SDK's own default: local origins on any port (and
those of the allowed hosts) plus ``cors_origins``; ``mcp_transport_security``
hands that list to the SDK, which checks it again.  Its tools only read.
Browsers get CORS headers only for ``cors_origins`` (no wildcard).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from knowledge_store.config.settings import Settings

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# on every response, unless the route set its own (the original-file route's CSP sandbox): no content-type
# guessing, no Referer to other sites, never framed by another page (clickjacking of the console)
SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"))
# over TLS only (a browser ignores it over plain HTTP): stay on HTTPS for a year
HSTS = (b"strict-transport-security", b"max-age=31536000")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _matches(value: str, patterns: Iterable[str]) -> bool:
    """``value`` equals a pattern, or a ``something:*`` pattern with any port (or none)."""
    value = value.lower()
    for pattern in patterns:
        pattern = pattern.lower()
        if value == pattern:
            return True
        if pattern.endswith(":*"):
            base = pattern[:-2]
            if value == base or (value.startswith(base + ":") and value[len(base) + 1:].isdigit()):
                return True
    return False


@dataclass(frozen=True)
class OriginPolicy:
    """The allow-lists; ``check`` says whether one request may proceed (and if not, why).

    ``cors_origins`` are the only foreign origins the REST API and console take; ``mcp_origins`` the ones
    ``mcp_path`` takes (local origins on any port, the allowed hosts' origins, ``cors_origins``)."""

    allowed_hosts: tuple[str, ...]
    cors_origins: tuple[str, ...] = field(default=())
    mcp_origins: tuple[str, ...] = field(default=())
    mcp_path: str = "/mcp"

    @classmethod
    def from_settings(cls, settings: Settings) -> OriginPolicy:
        hosts = [f"{name}:*" for name in LOCAL_HOSTS] + list(settings.allowed_hosts)
        if settings.allow_remote and settings.server_host not in ("0.0.0.0", "::", ""):
            hosts.append(f"{settings.server_host}:*")  # the address it was told to serve on
        local_origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
        return cls(allowed_hosts=tuple(hosts), cors_origins=tuple(settings.cors_origins),
                   mcp_origins=tuple(local_origins) + tuple(settings.cors_origins))

    def host_allowed(self, host: str | None) -> bool:
        return bool(host) and _matches(host, self.allowed_hosts)

    def origin_allowed(self, origin: str, host: str | None, path: str = "/") -> bool:
        """Same origin (``Origin`` is ``http(s)://`` + the ``Host`` served) always; otherwise ``cors_origins``,
        or on ``mcp_path`` ``mcp_origins``."""
        if origin.lower() in (f"http://{host}".lower(), f"https://{host}".lower()):
            return True  # same origin: the console, or a page this server serves
        return _matches(origin.rstrip("/"), self.mcp_origins if path == self.mcp_path else self.cors_origins)

    def check(self, method: str, host: str | None, origin: str | None, fetch_site: str | None,
              path: str = "/") -> tuple[int, str, str] | None:
        """``None`` when the request may proceed, else ``(status, error code, message)``."""
        if not self.host_allowed(host):
            return (421, "host_not_allowed",
                    f"Host {host!r} is not served here (DNS-rebinding protection); allowed: "
                    f"{', '.join(self.allowed_hosts)}. Add it with GROUNDWORK_ALLOWED_HOSTS.")
        if origin is not None:
            if not self.origin_allowed(origin, host, path):
                return (403, "origin_not_allowed",
                        f"requests from origin {origin!r} are refused (cross-site request protection); "
                        "allow a trusted web app with GROUNDWORK_CORS_ORIGINS")
        elif method in STATE_CHANGING and fetch_site == "cross-site":
            return (403, "origin_not_allowed",
                    "a cross-site browser request may not change anything here (Sec-Fetch-Site: cross-site)")
        return None


ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class OriginPolicyMiddleware:
    """Pure ASGI middleware: refuses before any route, body parsing or CORS handling runs."""

    def __init__(self, app: ASGIApp, policy: OriginPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [value for name, value in scope.get("headers", []) if name.lower() == b"host"]
        if len(hosts) > 1:
            # which one counts is up to each reader (the allow-list read the last, URLs the first): none does
            await refuse(scope, send, 400, {"error": "bad_request", "message": f"{len(hosts)} Host headers: a request "
                                            "names exactly one host"}, [(b"vary", b"Origin")])
            return
        headers = headers_of(scope)
        refusal = self.policy.check(scope.get("method", "GET"), headers.get("host"), headers.get("origin"),
                                    headers.get("sec-fetch-site"), scope.get("path", "/"))
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, message = refusal
        await refuse(scope, send, status, {"error": code, "message": message}, [(b"vary", b"Origin")])


def headers_of(scope: dict) -> dict[str, str]:
    """A request's headers by lower-case name (the last of repeated ones)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def refuse(scope: dict, send: Any, status: int, body: dict[str, str],
                 headers: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer a request before any route runs: the JSON error body (a websocket is closed, policy violation)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": raw})


def mcp_transport_security(policy: OriginPolicy):
    """The same hosts, and ``/mcp``'s origins, for the MCP SDK's own Host/Origin check on ``/mcp``."""
    from mcp.server.transport_security import TransportSecuritySettings  # noqa: PLC0415 - the MCP SDK, ~0.7 s

    hosts = [h for pattern in policy.allowed_hosts for h in (pattern, pattern[:-2] if pattern.endswith(":*") else pattern)]
    origins = [o for pattern in policy.mcp_origins for o in (pattern, pattern[:-2] if pattern.endswith(":*") else pattern)]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=sorted(set(hosts)),
                                     allowed_origins=sorted(set(origins)))
