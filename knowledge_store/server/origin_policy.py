"""Who may talk to the server: the Host and Origin allow-list of every route (REST, console, MCP).

A local server is reachable from every web page its user opens.  Two attacks
follow, and one policy stops both:

* **Cross-site requests.**  A page on ``evil.example`` can POST a form to
  ``http://127.0.0.1:8080/api/knowledge/ingest``; the browser sends it with
  ``Origin: https://evil.example`` (and ``Sec-Fetch-Site: cross-site``).  A
  request whose Origin is not this server's own, a local origin or a configured
  CORS origin is refused with **403** - on every method, so neither a write nor
  a CORS-enabled read gets through.
* **DNS rebinding.**  ``evil.example`` re-resolved to 127.0.0.1 makes the page
  "same-origin" with us, but its requests still carry ``Host: evil.example``.
  A Host outside the allow-list is refused with **421**, before any route runs.

The allow-list is the one ``/mcp`` always had (``localhost``, ``127.0.0.1``,
``[::1]``, any port) plus ``allowed_hosts`` and ``cors_origins`` from
``Settings``; ``mcp_transport_security`` hands the same list to the MCP SDK.
Browsers get CORS headers only for ``cors_origins`` (no wildcard).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from knowledge_store.settings import Settings

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
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
    """The allow-lists; ``check`` says whether one request may proceed (and if not, why)."""

    allowed_hosts: tuple[str, ...]
    allowed_origins: tuple[str, ...]
    cors_origins: tuple[str, ...] = field(default=())

    @classmethod
    def from_settings(cls, settings: Settings) -> OriginPolicy:
        hosts = [f"{name}:*" for name in LOCAL_HOSTS] + list(settings.allowed_hosts)
        if settings.allow_remote and settings.server_host not in ("0.0.0.0", "::", ""):
            hosts.append(f"{settings.server_host}:*")  # the address it was told to serve on
        origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
        return cls(allowed_hosts=tuple(hosts), allowed_origins=tuple(origins) + tuple(settings.cors_origins),
                   cors_origins=tuple(settings.cors_origins))

    def host_allowed(self, host: str | None) -> bool:
        return bool(host) and _matches(host, self.allowed_hosts)

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        if origin.lower() in (f"http://{host}".lower(), f"https://{host}".lower()):
            return True  # same origin
        return _matches(origin.rstrip("/"), self.allowed_origins)

    def check(self, method: str, host: str | None, origin: str | None, fetch_site: str | None) -> tuple[int, str, str] | None:
        """``None`` when the request may proceed, else ``(status, error code, message)``."""
        if not self.host_allowed(host):
            return (421, "host_not_allowed",
                    f"Host {host!r} is not served here (DNS-rebinding protection); allowed: "
                    f"{', '.join(self.allowed_hosts)}. Add it with GROUNDWORK_ALLOWED_HOSTS.")
        if origin is not None:
            if not self.origin_allowed(origin, host):
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
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self.policy.check(scope.get("method", "GET"), headers.get("host"), headers.get("origin"),
                                    headers.get("sec-fetch-site"))
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, message = refusal
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": code, "message": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"vary", b"Origin")]})
        await send({"type": "http.response.body", "body": body})


def mcp_transport_security(policy: OriginPolicy):
    """The same allow-list for the MCP SDK's own Host/Origin check on ``/mcp``."""
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = [h for pattern in policy.allowed_hosts for h in (pattern, pattern[:-2] if pattern.endswith(":*") else pattern)]
    origins = [o for pattern in policy.allowed_origins for o in (pattern, pattern[:-2] if pattern.endswith(":*") else pattern)]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=sorted(set(hosts)),
                                     allowed_origins=sorted(set(origins)))
