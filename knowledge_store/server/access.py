"""Who may call what: the public and admin surfaces, the admin token and the public rate limit.

A server put on a network for a docs site's readers must answer their questions and nothing else.
Every route belongs to one of two surfaces (``ROUTE_SURFACES``, the table docs/API.md prints):

* **public** - ask, ask-local, query, feedback, the widget, ``/health``, the console's static shell,
  the API docs and the original files of documents that public answers cite.  Callers without the
  admin token see only documents of sources whose visibility is ``public``
  (``SearchFilters.public_only``), and the public API routes are rate-limited per client address.
* **admin** - everything that registers, changes, syncs, uploads, deletes, retries, reads settings,
  jobs, logs or evaluation results, or lists the whole store; ``/mcp`` (its tools list documents);
  ``/metrics`` unless ``GROUNDWORK_PUBLIC_METRICS`` is set.

The admin token (``GROUNDWORK_ADMIN_TOKEN``, sent as ``Authorization: Bearer <token>``) is required
whenever one is configured and always in remote mode (``GROUNDWORK_ALLOW_REMOTE``), where a token is
generated into ``<data_dir>/admin_token`` (mode 0600) when none is set.  On loopback with no token the
admin surface is open, as a local user already owns the files.  A missing or wrong token is one
answer, 401, whatever the reason; tokens are compared in constant time.

``AccessMiddleware`` runs before routing (inside the origin policy and CORS, so a 401 or 429 still
carries CORS headers a widget can read) and leaves the caller in ``scope["state"]["caller"]``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError, InvalidSourceError
from knowledge_store.ingest.sources import outside_roots
from knowledge_store.server.origin_policy import ASGIApp, headers_of, refuse

PUBLIC = "public"
ADMIN = "admin"
TOKEN_FILE = "admin_token"
MIN_TOKEN_CHARS = 16  # a configured admin token in remote mode (the generated one has 43)

# Every route of the API schema, by method and path template.  A route missing here fails ``create_app``
# (``check_classified``) and the test that walks the OpenAPI schema: nothing is exposed by omission.
ROUTE_SURFACES: dict[tuple[str, str], str] = {
    ("POST", "/api/knowledge/query"): PUBLIC,
    ("POST", "/api/ask"): PUBLIC,
    ("POST", "/api/ask-local"): PUBLIC,
    ("POST", "/api/knowledge/feedback"): PUBLIC,
    ("GET", "/api/knowledge/sources/{doc_id}/file"): PUBLIC,
    ("GET", "/health"): PUBLIC,
    ("GET", "/api/knowledge/feedback"): ADMIN,
    ("GET", "/api/knowledge/config"): ADMIN,
    ("GET", "/api/knowledge/ranking"): ADMIN,
    ("PUT", "/api/knowledge/ranking"): ADMIN,
    ("DELETE", "/api/knowledge/ranking"): ADMIN,
    ("POST", "/api/knowledge/ingest"): ADMIN,
    ("GET", "/api/knowledge/jobs/{job_id}"): ADMIN,
    ("GET", "/api/sources"): ADMIN,
    ("POST", "/api/sources"): ADMIN,
    ("GET", "/api/sources/{name}"): ADMIN,
    ("PATCH", "/api/sources/{name}"): ADMIN,
    ("DELETE", "/api/sources/{name}"): ADMIN,
    ("POST", "/api/sources/{name}/sync"): ADMIN,
    ("GET", "/api/failures"): ADMIN,
    ("POST", "/api/failures/{failure_id}/retry"): ADMIN,
    ("GET", "/api/knowledge/documents"): ADMIN,
    ("GET", "/api/knowledge/documents/{doc_id}/relations"): ADMIN,
    ("GET", "/api/kb/articles"): ADMIN,
    ("GET", "/api/evaluation/summary"): ADMIN,
    ("GET", "/metrics"): ADMIN,  # public when GROUNDWORK_PUBLIC_METRICS is set
}
# Paths outside the schema, by prefix: the console's shell and files (they hold no data: every page asks the
# API, which checks), the widget, the API docs; MCP is admin.
PATH_SURFACES: tuple[tuple[str, str], ...] = (
    ("/mcp", ADMIN),
    ("/", PUBLIC),
    ("/static/", PUBLIC),
    ("/widget.js", PUBLIC),
    ("/docs", PUBLIC),
    ("/redoc", PUBLIC),
    ("/openapi.json", PUBLIC),
)
WHY_PUBLIC = {
    "/api/knowledge/query": "searches public sources only, unless the admin token is sent",
    "/api/ask": "answers from public sources only, unless the admin token is sent",
    "/api/ask-local": "answers from public sources only, unless the admin token is sent",
    "/api/knowledge/feedback": "rates a result a caller was shown",
    "/api/knowledge/sources/{doc_id}/file": "only documents of public sources, unless the admin token is sent",
    "/health": "status, each service's state and the version only; the details need the admin token",
}
UNAUTHORIZED = {"error": "unauthorized",
                "message": "this needs the admin token: send it as 'Authorization: Bearer <token>' "
                           "(GROUNDWORK_ADMIN_TOKEN, or the admin_token file in the data folder)"}


def prefix_matches(path: str, prefix: str) -> bool:
    """``/docs`` covers ``/docs`` and ``/docs/...``; ``/static/`` what is under it; ``/`` only itself."""
    if prefix == "/" or not prefix.endswith("/"):
        return path == prefix or (prefix != "/" and path.startswith(prefix + "/"))
    return path.startswith(prefix)


def _template_regex(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def tokens_match(presented: str, expected: str) -> bool:
    """Constant time, lengths included (both sides are hashed first)."""
    return hmac.compare_digest(hashlib.sha256(presented.encode()).digest(), hashlib.sha256(expected.encode()).digest())


def load_or_create_token(data_dir: Path) -> tuple[str, Path]:
    """The generated admin token of ``data_dir``: read from ``admin_token``, or created there (mode 0600,
    never readable by others) when absent.  A file others can read is narrowed to 0600 first."""
    path = Path(data_dir) / TOKEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        token = path.read_text().strip()
        if not token:
            raise ConfigError("admin_token", str(path), "the token file is empty: delete it and restart to generate "
                              "a new one, or set GROUNDWORK_ADMIN_TOKEN") from None
        return token, path
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return token, path


def _networks(values: Iterable[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(value, strict=False) for value in values)


def _in(address: str, networks: tuple) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def client_address(peer: str, forwarded_for: str | None, trusted: tuple) -> str:
    """Who the client is: the peer, unless the peer is a trusted proxy; then the right-most address of
    ``X-Forwarded-For`` that is not a trusted proxy (proxies append, so entries left of the first untrusted
    one are the client's own claims and never believed).  That entry must be an IP address (written in its
    canonical form): anything else (``unknown``, a name, ``1.2.3.4:80``) is no client identity, and the peer
    answers for the request."""
    if not trusted or not _in(peer, trusted) or not forwarded_for:
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        try:
            address = ipaddress.ip_address(hop)
        except ValueError:
            return peer
        if not any(address in network for network in trusted):
            return str(address)
    return str(ipaddress.ip_address(hops[0])) if hops else peer


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address in ("localhost", "testclient")  # Starlette's TestClient peer is "testclient"


class RateLimiter:
    """A token bucket per client: ``rate`` requests per second on average, ``burst`` at once.

    Memory is bounded: the ``max_clients`` most recently seen clients are remembered (a client forgotten
    starts again with a full bucket, which is what an idle one would have)."""

    def __init__(self, rate: float, burst: int, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_clients, self.clock = rate, burst, max_clients, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)

    def take(self, client: str) -> float | None:
        """None when ``client`` may go ahead (one token taken), else the seconds until it may."""
        now = self.clock()
        tokens, at = self._buckets.pop(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[client] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return None if allowed else (1.0 - tokens) / self.rate


@dataclass(frozen=True)
class Caller:
    """Who is asking: ``admin`` (the token, or an open admin surface) or a public caller, and from where."""

    admin: bool
    address: str

    def scope(self, filters: Any) -> Any:
        """``filters`` (a ``SearchFilters``) as this caller may search: public callers see public sources only."""
        return filters if self.admin else filters.public_only()


@dataclass
class AccessPolicy:
    """The surfaces, the token and the limit of one app (``ServerState.access``)."""

    token: str | None
    remote: bool
    token_file: Path | None = None
    public_metrics: bool = False
    limiter: RateLimiter | None = None
    trusted_proxies: tuple = ()
    source_roots: tuple[Path, ...] | None = None  # None: folders anywhere (loopback, no token, no roots set)
    tls: bool = False
    # this machine's folders (the data folder, the configured sources, the roots): no public answer names them
    private_paths: tuple[str, ...] = ()
    _routes: list[tuple[re.Pattern[str], str, str]] = field(default_factory=list)  # (path regex, method, template)
    _public_docs: tuple[int | None, frozenset[str]] = (None, frozenset())

    @classmethod
    def from_settings(cls, settings: Settings) -> AccessPolicy:
        """The policy of ``settings``; ``ConfigError`` naming ``admin_token`` for a configured token shorter than
        ``MIN_TOKEN_CHARS`` in remote mode (the token is never repeated)."""
        token_file = None
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        if token is not None and settings.allow_remote and len(token) < MIN_TOKEN_CHARS:
            raise ConfigError("admin_token", f"({len(token)} characters)",
                              f"is too short for remote mode: a server others can reach needs at least "
                              f"{MIN_TOKEN_CHARS} characters, or a guessable token opens the admin surface; unset "
                              "GROUNDWORK_ADMIN_TOKEN to have one generated, or set e.g. "
                              "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        if token is None and settings.allow_remote:
            token, token_file = load_or_create_token(settings.data_dir)
        limiter = RateLimiter(settings.public_rate, settings.public_burst) if settings.public_rate > 0 else None
        # roots bind whoever holds the token (resolved once, at start); a local user with no token set already owns
        # every file
        return cls(token=token, remote=settings.allow_remote, token_file=token_file,
                   public_metrics=settings.public_metrics, limiter=limiter,
                   trusted_proxies=_networks(settings.trusted_proxies),
                   source_roots=settings.source_roots_in_force,
                   tls=bool(settings.ssl_certfile),
                   private_paths=private_paths([settings.data_dir, *settings.source_dirs, *settings.source_roots]))

    def __post_init__(self) -> None:
        self._routes = [(_template_regex(path), method, path) for method, path in ROUTE_SURFACES]

    def route_surface(self, method: str, template: str) -> str:
        """The surface of one route of the schema (``/metrics`` as configured)."""
        if template == "/metrics":
            return PUBLIC if self.public_metrics else ADMIN
        return ROUTE_SURFACES[(method, template)]

    def template_of(self, method: str, path: str) -> str:
        """The route template a request addresses (a metrics label that ids cannot explode), else the
        matching ``PATH_SURFACES`` prefix, else ``unmatched``."""
        method = "GET" if method == "HEAD" else method
        for pattern, route_method, template in self._routes:
            if route_method == method and pattern.match(path):
                return template
        return next((prefix for prefix, _ in PATH_SURFACES if prefix_matches(path, prefix)), "unmatched")

    def surface_of(self, method: str, path: str) -> str:
        """The surface of a request.  A path no route serves, or a method its path does not serve, is public:
        it gets its 404 or 405 there, which says nothing the published schema does not."""
        method = "GET" if method == "HEAD" else method
        for pattern, route_method, template in self._routes:
            if route_method == method and pattern.match(path):
                return self.route_surface(method, template)
        for prefix, surface in PATH_SURFACES:
            if prefix_matches(path, prefix):
                return surface
        return PUBLIC

    @property
    def token_required(self) -> bool:
        return self.token is not None

    def caller(self, authorization: str | None, address: str) -> Caller | None:
        """The caller of a request, or None when it presented a token that is not the admin token."""
        presented = bearer_token(authorization)
        if self.token is None:
            return Caller(admin=True, address=address)
        if presented is None:
            return Caller(admin=False, address=address)
        return Caller(admin=True, address=address) if tokens_match(presented, self.token) else None

    def limited(self, caller: Caller, surface: str, path: str) -> bool:
        """Public API calls of public callers; loopback clients only in remote mode (a reverse proxy on this
        host is a loopback client)."""
        return (self.limiter is not None and surface == PUBLIC and not caller.admin and path.startswith("/api/")
                and (self.remote or not is_loopback(caller.address)))

    def public_documents(self, snapshot: Any) -> frozenset[str]:
        """The doc_ids of ``snapshot`` a public caller may see (one set per snapshot version)."""
        version = snapshot.info.snapshot_version
        if self._public_docs[0] != version:
            self._public_docs = (version, frozenset(d["doc_id"] for d in snapshot.documents
                                                    if d.get("visibility") == "public"))
        return self._public_docs[1]

    def hide_internal_relations(self, items: list[dict[str, Any]], snapshot: Any) -> None:
        """A public answer's citations name no internal document: their ``supersedes``, ``see_also`` and
        ``superseded_by`` keep only public doc_ids."""
        visible = self.public_documents(snapshot)
        for item in items:
            for key in ("supersedes", "see_also"):
                if key in item:
                    item[key] = [doc_id for doc_id in item[key] if doc_id in visible]
            if item.get("superseded_by") and item["superseded_by"] not in visible:
                item["superseded_by"] = None

    def scrub(self, text: str) -> str:
        """``text`` with this machine's folders (``private_paths``) replaced by ``<server folder>``: what an error
        message tells a public caller."""
        for path in self.private_paths:
            text = text.replace(path, "<server folder>")
        return text

    def check_source_folder(self, folder: str) -> None:
        """A folder source must lie inside a source root (symbolic links resolved): 422 naming ``folder``."""
        if outside_roots(folder, self.source_roots) is not None:
            raise InvalidSourceError("folder", folder, "is outside every source root; the server indexes folders only "
                                     "inside GROUNDWORK_SOURCE_ROOTS (default: its data folder and the folders "
                                     "configured at start)")

    def servable(self, path: Path) -> bool:
        """A file may be served: its real path lies inside a source root (or no roots are in force)."""
        return outside_roots(path, self.source_roots) is None


def private_paths(folders: Iterable[Path]) -> tuple[str, ...]:
    """Each folder as written, absolute and resolved, longest first (a folder inside another is replaced whole)."""
    spelled: set[str] = set()
    for folder in folders:
        folder = Path(folder).expanduser()
        spelled |= {str(folder), str(folder.absolute()), str(folder.resolve())}
    return tuple(sorted((p for p in spelled if p not in ("", ".", "/")), key=len, reverse=True))


def check_classified(routes: Iterable[tuple[str, str]]) -> None:
    """Fail at start-up when a route of the schema has no surface (``ROUTE_SURFACES``)."""
    missing = sorted(f"{method} {path}" for method, path in routes if (method, path) not in ROUTE_SURFACES)
    if missing:
        raise RuntimeError("routes with no surface (add them to knowledge_store/server/access.py ROUTE_SURFACES): "
                           + ", ".join(missing))


def schema_routes(schema: dict[str, Any]) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, operations in schema.get("paths", {}).items() for method in operations]


def document_surfaces(schema: dict[str, Any], policy: AccessPolicy) -> dict[str, Any]:
    """State each operation's surface in the schema (``x-surface``), the bearer scheme on admin operations,
    401 everywhere (a wrong token is refused on any route) and 429 on rate-limited public ones."""
    check_classified(schema_routes(schema))
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    schema.setdefault("components", {}).setdefault("securitySchemes", {})["adminToken"] = {
        "type": "http", "scheme": "bearer",
        "description": "GROUNDWORK_ADMIN_TOKEN (or the generated <data_dir>/admin_token in remote mode)."}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            surface = policy.route_surface(method.upper(), path)
            operation["x-surface"] = surface
            responses = operation.setdefault("responses", {})
            responses["401"] = {"description": "Admin token missing or wrong (one answer for both)." if surface == ADMIN
                                else "A token was sent and it is not the admin token.", **error}
            if surface == ADMIN:
                operation["security"] = [{"adminToken": []}]
            elif path.startswith("/api/"):
                operation["security"] = [{}, {"adminToken": []}]
                responses["429"] = {"description": "Too many requests from this client (GROUNDWORK_PUBLIC_RATE); "
                                    "Retry-After says when to try again.",
                                    "headers": {"Retry-After": {"schema": {"type": "integer"}}}, **error}
    return schema


class AccessMiddleware:
    """Pure ASGI: decides the caller, refuses admin requests without the token (401) and over-limit public
    requests (429 + Retry-After), and hands the caller to the routes in ``scope["state"]["caller"]``."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy, observe: Callable[[str, str, int], None] | None = None) -> None:
        self.app = app
        self.policy = policy
        self.observe = observe

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = headers_of(scope)
        peer = (scope.get("client") or ("", 0))[0] or ""
        address = client_address(peer, headers.get("x-forwarded-for"), self.policy.trusted_proxies)
        method, path = scope.get("method", "GET"), scope.get("path", "/")
        caller = self.policy.caller(headers.get("authorization"), address)
        surface = self.policy.surface_of(method, path)
        if method == "OPTIONS":  # a CORS preflight carries no credentials; CORS (outside) answers it
            caller = caller or Caller(admin=False, address=address)
        elif caller is None or (surface == ADMIN and not caller.admin):
            await self._refuse(scope, send, 401, UNAUTHORIZED, [(b"www-authenticate", b'Bearer realm="groundwork"')])
            return
        elif self.policy.limited(caller, surface, path):
            wait = self.policy.limiter.take(caller.address)
            if wait is not None:
                seconds = max(1, math.ceil(wait))
                await self._refuse(scope, send, 429, {
                    "error": "rate_limited",
                    "message": f"too many requests from this client; try again in {seconds} s"},
                    [(b"retry-after", str(seconds).encode())])
                return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)

    async def _refuse(self, scope: dict, send: Any, status: int, body: dict[str, str],
                      headers: list[tuple[bytes, bytes]]) -> None:
        if self.observe is not None:
            method = scope.get("method", "GET")
            self.observe(method, self.policy.template_of(method, scope.get("path", "/")), status)
        await refuse(scope, send, status, body, headers)


def caller_of(request: Request) -> Caller:
    """The caller ``AccessMiddleware`` decided; a request that did not pass through it is a public one."""
    caller = getattr(request.state, "caller", None)
    return caller if isinstance(caller, Caller) else Caller(admin=False, address=request.client.host if request.client else "")
