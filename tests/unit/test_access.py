"""The access policy's pieces without a server: surfaces of paths, the admin token, the rate limiter, the client
address behind proxies, the generated token file, visibility in search filters."""

from __future__ import annotations

import ipaddress
import stat

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError, InvalidSourceError
from knowledge_store.retrieval.filters import SearchFilters, document_matches
from knowledge_store.server.access import (
    ADMIN,
    PUBLIC,
    ROUTE_SURFACES,
    AccessPolicy,
    RateLimiter,
    bearer_token,
    check_classified,
    client_address,
    document_surfaces,
    load_or_create_token,
    tokens_match,
)


def policy(**kwargs) -> AccessPolicy:
    return AccessPolicy(token=kwargs.pop("token", "s3cret-token"), remote=kwargs.pop("remote", True), **kwargs)


def test_routes_are_public_or_admin_by_method_and_template():
    p = policy()
    assert p.surface_of("POST", "/api/ask") == PUBLIC
    assert p.surface_of("POST", "/api/knowledge/feedback") == PUBLIC
    assert p.surface_of("GET", "/api/knowledge/feedback") == ADMIN  # lists every note
    assert p.surface_of("GET", "/api/knowledge/sources/abc123/file") == PUBLIC
    assert p.surface_of("HEAD", "/api/knowledge/sources/abc123/file") == PUBLIC
    assert p.surface_of("DELETE", "/api/sources/docs") == ADMIN
    assert p.surface_of("POST", "/api/sources/docs/sync") == ADMIN
    assert p.surface_of("POST", "/api/failures/f1/retry") == ADMIN
    assert p.surface_of("GET", "/api/kb/articles") == ADMIN
    assert p.surface_of("POST", "/mcp") == ADMIN and p.surface_of("GET", "/mcp/") == ADMIN
    assert p.surface_of("GET", "/static/admin.js") == PUBLIC and p.surface_of("GET", "/") == PUBLIC
    assert p.surface_of("GET", "/widget.js") == PUBLIC and p.surface_of("GET", "/openapi.json") == PUBLIC
    # a path or method no route serves gets its 404/405 on the public side
    assert p.surface_of("GET", "/nothing/here") == PUBLIC and p.surface_of("PUT", "/api/sources") == PUBLIC
    assert p.surface_of("GET", "/metrics") == ADMIN
    assert policy(public_metrics=True).surface_of("GET", "/metrics") == PUBLIC


def test_metrics_labels_are_route_templates_not_ids():
    p = policy()
    assert p.template_of("DELETE", "/api/sources/some-name") == "/api/sources/{name}"
    assert p.template_of("GET", "/static/x.css") == "/static/"
    assert p.template_of("GET", "/random/123") == "unmatched"


def test_a_route_without_a_surface_is_refused():
    check_classified(list(ROUTE_SURFACES))
    with pytest.raises(RuntimeError, match="GET /api/new-thing"):
        check_classified([*ROUTE_SURFACES, ("GET", "/api/new-thing")])
    schema = {"paths": {"/api/new-thing": {"get": {"responses": {}}}}}
    with pytest.raises(RuntimeError, match="ROUTE_SURFACES"):
        document_surfaces(schema, policy())


def test_schema_states_surface_security_401_and_429():
    schema = {"paths": {"/api/ask": {"post": {"responses": {}}}, "/api/sources": {"get": {"responses": {}}},
                        "/health": {"get": {"responses": {}}}}}
    document_surfaces(schema, policy())
    ask, sources, health = (schema["paths"][p][m] for p, m in (("/api/ask", "post"), ("/api/sources", "get"),
                                                               ("/health", "get")))
    assert ask["x-surface"] == PUBLIC and "429" in ask["responses"] and "401" in ask["responses"]
    assert sources["x-surface"] == ADMIN and sources["security"] == [{"adminToken": []}]
    assert "429" not in sources["responses"] and "429" not in health["responses"]
    assert schema["components"]["securitySchemes"]["adminToken"]["scheme"] == "bearer"


def test_the_caller_is_admin_with_the_token_public_without_and_refused_with_a_wrong_one():
    p = policy()
    assert p.caller("Bearer s3cret-token", "10.0.0.1").admin is True
    assert p.caller("bearer   s3cret-token ", "10.0.0.1").admin is True
    assert p.caller(None, "10.0.0.1").admin is False
    assert p.caller("Basic czNjcmV0", "10.0.0.1").admin is False  # not a bearer token: no token
    assert p.caller("Bearer s3cret-tokenX", "10.0.0.1") is None
    assert p.caller("Bearer s3cret", "10.0.0.1") is None
    open_surface = policy(token=None, remote=False)
    assert open_surface.caller(None, "127.0.0.1").admin is True and not open_surface.token_required


def test_bearer_parsing_and_constant_time_comparison():
    assert bearer_token("Bearer abc") == "abc" and bearer_token("BEARER abc") == "abc"
    assert bearer_token("Bearer ") is None and bearer_token("Token abc") is None and bearer_token(None) is None
    assert tokens_match("abc", "abc") and not tokens_match("abc", "abd") and not tokens_match("ab", "abc")


def test_rate_limiter_allows_the_burst_then_the_rate_and_says_how_long_to_wait():
    now = [0.0]
    limiter = RateLimiter(rate=5.0, burst=20, clock=lambda: now[0])
    assert all(limiter.take("a") is None for _ in range(20))
    wait = limiter.take("a")
    assert wait == pytest.approx(0.2)
    assert limiter.take("b") is None  # another client has its own bucket
    now[0] += 0.2
    assert limiter.take("a") is None and limiter.take("a") is not None
    now[0] += 100.0  # an idle client is back to a full burst, not more
    assert all(limiter.take("a") is None for _ in range(20)) and limiter.take("a") is not None


def test_rate_limiter_remembers_a_bounded_number_of_clients():
    limiter = RateLimiter(rate=1.0, burst=1, max_clients=3, clock=lambda: 0.0)
    for client in "abcd":
        assert limiter.take(client) is None
    assert len(limiter._buckets) == 3
    assert limiter.take("d") is not None and limiter.take("a") is None  # "a" was forgotten: a fresh bucket


def test_only_trusted_proxies_name_the_client():
    proxies = (ipaddress.ip_network("10.0.0.0/8"),)
    assert client_address("203.0.113.9", "1.2.3.4", proxies) == "203.0.113.9"  # not a proxy: header ignored
    assert client_address("10.0.0.5", "198.51.100.7", proxies) == "198.51.100.7"
    # the right-most untrusted hop; what the client wrote to the left is not believed
    assert client_address("10.0.0.5", "6.6.6.6, 198.51.100.7, 10.0.0.9", proxies) == "198.51.100.7"
    assert client_address("10.0.0.5", None, proxies) == "10.0.0.5"
    assert client_address("10.0.0.5", "1.1.1.1", ()) == "10.0.0.5"


def test_loopback_clients_are_limited_only_in_remote_mode():
    limiter = RateLimiter(5.0, 20)
    remote, local = policy(limiter=limiter), policy(limiter=limiter, remote=False)
    reader = remote.caller(None, "127.0.0.1")
    assert remote.limited(reader, PUBLIC, "/api/ask") and not local.limited(reader, PUBLIC, "/api/ask")
    assert local.limited(local.caller(None, "203.0.113.1"), PUBLIC, "/api/ask")
    assert not remote.limited(remote.caller("Bearer s3cret-token", "203.0.113.1"), PUBLIC, "/api/ask")
    assert not remote.limited(reader, PUBLIC, "/widget.js") and not remote.limited(reader, PUBLIC, "/health")


def test_generated_token_file_is_private_reused_and_narrowed(tmp_path):
    token, path = load_or_create_token(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) >= 32
    assert load_or_create_token(tmp_path) == (token, path)
    path.chmod(0o644)
    assert load_or_create_token(tmp_path)[0] == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("\n")
    with pytest.raises(ConfigError, match="admin_token"):
        load_or_create_token(tmp_path)


def test_policy_from_settings(tmp_path):
    local = AccessPolicy.from_settings(Settings(data_dir=tmp_path / "a"))
    assert local.token is None and local.source_roots is None and not (tmp_path / "a" / "admin_token").exists()
    remote = AccessPolicy.from_settings(Settings(data_dir=tmp_path / "b", allow_remote=True, sources=[tmp_path]))
    assert remote.token_file == tmp_path / "b" / "admin_token" and remote.token
    assert remote.source_roots == ((tmp_path / "b").resolve(), tmp_path.resolve())
    configured = AccessPolicy.from_settings(Settings(data_dir=tmp_path / "c", allow_remote=True, admin_token="t" * 40))
    assert configured.token == "t" * 40 and configured.token_file is None


def test_source_roots_refuse_folders_outside_and_links_leading_out(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "manuals").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    p = policy(source_roots=(root.resolve(),))
    p.check_source_folder(str(root / "manuals"))
    p.check_source_folder(str(root))
    for bad in (outside, root / "escape", root / ".." / "outside"):
        with pytest.raises(InvalidSourceError) as refused:
            p.check_source_folder(str(bad))
        assert refused.value.field == "folder"
    policy(source_roots=None).check_source_folder(str(outside))  # loopback, no token: anywhere


def test_settings_check_tls_pairs_and_proxy_networks(tmp_path):
    with pytest.raises(ConfigError, match="ssl_keyfile"):
        Settings(data_dir=tmp_path, ssl_certfile=tmp_path / "cert.pem")
    with pytest.raises(ValueError, match="not an IP address"):
        Settings(data_dir=tmp_path, trusted_proxies="proxy.example.com")
    assert Settings(data_dir=tmp_path, trusted_proxies="127.0.0.1, 10.0.0.0/8").trusted_proxies == ["127.0.0.1", "10.0.0.0/8"]


def test_public_filters_select_public_documents_only():
    public_doc = {"doc_id": "a", "source_name": "docs", "source_id": "s1", "visibility": "public", "path": "/d/a.md",
                  "relative_path": "a.md", "metadata": {}}
    internal_doc = {**public_doc, "doc_id": "b", "visibility": "internal"}
    old_snapshot_doc = {k: v for k, v in public_doc.items() if k != "visibility"}
    scoped = SearchFilters(sources=["docs"]).public_only()
    assert scoped.visibility == ["public"] and scoped.sources == ["docs"] and scoped.selects_documents
    assert document_matches(public_doc, scoped) and not document_matches(internal_doc, scoped)
    assert not document_matches(old_snapshot_doc, scoped)  # no visibility recorded: internal
    assert SearchFilters(visibility="internal").public_only().visibility == ["public"]
    assert document_matches(internal_doc, SearchFilters())


def test_a_forwarded_for_entry_that_is_not_an_address_names_no_client():
    proxies = (ipaddress.ip_network("10.0.0.0/8"),)
    for claimed in ("unknown", "evil.example", "198.51.100.7:4242", "", "1.2.3.4, bogus"):
        assert client_address("10.0.0.5", claimed, proxies) == "10.0.0.5", claimed  # the proxy's own bucket
    assert client_address("10.0.0.5", "bogus, 198.51.100.7", proxies) == "198.51.100.7"  # left of it: not read
    assert client_address("10.0.0.5", "2001:DB8::1", proxies) == "2001:db8::1"  # one spelling per address


def test_a_short_configured_admin_token_is_refused_in_remote_mode_only(tmp_path):
    with pytest.raises(ConfigError, match="16 characters") as refused:
        AccessPolicy.from_settings(Settings(data_dir=tmp_path / "a", allow_remote=True, admin_token="letmein"))
    assert "letmein" not in str(refused.value) and "7 characters" in str(refused.value)
    assert AccessPolicy.from_settings(Settings(data_dir=tmp_path / "b", admin_token="letmein")).token == "letmein"
    assert AccessPolicy.from_settings(Settings(data_dir=tmp_path / "c", allow_remote=True, admin_token="x" * 16)).token


def test_public_path_filters_match_paths_relative_to_the_source_only():
    doc = {"doc_id": "a", "source_name": "docs", "source_id": "s1", "visibility": "public", "path": "/srv/kb/docs/a.md",
           "relative_path": "guides/a.md", "metadata": {}}
    for pattern in ("/srv/kb/docs/a.md", "/srv/*", "*kb*"):
        assert document_matches(doc, SearchFilters(paths=pattern))  # the admin's search: the path on disk too
        assert not document_matches(doc, SearchFilters(paths=pattern).public_only()), pattern
    for pattern in ("guides/a.md", "guides/*", "a.md"):
        assert document_matches(doc, SearchFilters(paths=pattern).public_only()), pattern


def test_error_messages_to_public_callers_name_no_server_folder(tmp_path):
    data = tmp_path / "data"
    scrubbed = AccessPolicy.from_settings(Settings(data_dir=data, sources=[tmp_path / "docs"]))
    message = f"no published index snapshot in {data.resolve()}/index; see {tmp_path / 'docs'}/a.md"
    assert scrubbed.scrub(message) == "no published index snapshot in <server folder>/index; see <server folder>/a.md"
