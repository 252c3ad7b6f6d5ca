"""The source registry: named folders, the uploads folder and web sites, as rows.

A source is a row in ``sources`` with a unique name, a kind (``folder``,
``upload`` or ``web``), a location (folder path or base URL), a kind-specific
configuration, an enabled flag, the time and summary of its last sync and a
soft-delete mark.  Two origins share the table:

- ``settings``: the folders of ``GROUNDWORK_SOURCES`` (or the default corpus)
  and the uploads folder, registered automatically at every sync;
- ``user``: sources added with ``groundwork sources add`` or ``POST /api/sources``.

One location is one source (its id is a hash of kind and location), so the
same folder or site cannot be indexed twice under two names.  Deleting a
source soft-deletes it and every document it holds in one transaction; the
caller publishes a snapshot right after, so its chunks leave the index at once
and are purged with the other deleted documents after the retention period.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import (
    ChromiumNotFoundError,
    InvalidSourceError,
    SourceExistsError,
    SourceNotFoundError,
)
from knowledge_store.ingest.entities import delete_mentions_of_chunks
from knowledge_store.ingest.web.render import check_chromium
from knowledge_store.storage.store import transaction, utcnow

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# Web crawl options a user may set per source, with their defaults.  Changing one
# of RESYNC_KEYS changes what the source would contain: the next sync is needed.
WEB_DEFAULTS: dict[str, Any] = {
    "depth": 2,
    "include": [],
    "exclude": [],
    "respect_robots": True,
    "requests_per_second": 5.0,
    "max_pages": 500,
    "use_llms_txt": True,
    "use_sitemap": True,
    "llms_full_max_mb": 10.0,
    # render HTML pages in headless Chromium before reading them (pages built by JavaScript); off: such a
    # page is reported as needs_js_rendering instead of being indexed empty.  Sources stored before this
    # option existed read as off (the stored config is merged over these defaults).
    "render_js": False,
}
# Who may read a source's documents: ``public`` = anyone who can reach the server's public surface (the
# docs-site widget, anonymous ask/query), ``internal`` = admin callers only (docs/API.md, "Who may call what").
VISIBILITIES = ("public", "internal")
DEFAULT_VISIBILITY = "internal"
RESYNC_KEYS = {"depth", "include", "exclude", "respect_robots", "max_pages", "use_llms_txt", "use_sitemap",
               "llms_full_max_mb", "location", "render_js"}


@dataclass(frozen=True)
class Source:
    source_id: str
    name: str
    kind: str
    location: str
    enabled: bool
    origin: str
    config: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_synced_at: datetime | None = None
    deleted_at: datetime | None = None
    resync_needed: bool = False
    last_sync: dict[str, Any] | None = None
    visibility: str = DEFAULT_VISIBILITY

    @property
    def deleted(self) -> bool:
        return self.deleted_at is not None

    def as_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() + "Z" if value else None

        return {
            "name": self.name, "kind": self.kind, "location": self.location, "enabled": self.enabled,
            "origin": self.origin, "config": self.config, "source_id": self.source_id,
            "created_at": iso(self.created_at), "updated_at": iso(self.updated_at),
            "last_synced_at": iso(self.last_synced_at), "deleted_at": iso(self.deleted_at),
            "resync_needed": self.resync_needed, "last_sync": self.last_sync, "visibility": self.visibility,
        }


def source_id_for(kind: str, location: str | Path) -> str:
    """Stable id of a location.  Folders and the uploads folder keep the ids the
    store has always used (``folder:<path>``), so existing documents stay theirs."""
    prefix = "web" if kind == "web" else "folder"
    return hashlib.sha256(f"{prefix}:{location}".encode()).hexdigest()[:16]


# ------------------------------------------------------------------ validation


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidSourceError(
            "name", name, "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def normalise_base_url(url: str) -> str:
    """An http(s) URL with a host; the path gets a trailing '/' only when it names a folder-like prefix."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidSourceError("url", url, "a web source needs a base URL")
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidSourceError("url", url, "must be an http:// or https:// URL with a host")
    if parts.fragment:
        url = url.split("#", 1)[0]
    path = parts.path or "/"
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{path}" + (f"?{parts.query}" if parts.query else "")


def _check_regexes(key: str, values: object) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)):
        raise InvalidSourceError(key, values, "expected a list of regular expressions")
    out: list[str] = []
    for value in values:
        if not isinstance(value, str) or not value:
            raise InvalidSourceError(key, value, "expected a non-empty regular expression")
        try:
            re.compile(value)
        except re.error as error:
            raise InvalidSourceError(key, value, f"not a valid regular expression: {error}") from error
        out.append(value)
    return out


def check_web_config(config: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults filled in, every value checked; unknown keys refused (a typo must not be silently ignored)."""
    merged = dict(WEB_DEFAULTS if base is None else base)
    for key, value in config.items():
        if key not in WEB_DEFAULTS:
            raise InvalidSourceError(key, value, f"unknown web source option; known: {', '.join(sorted(WEB_DEFAULTS))}")
        if value is None:
            continue
        merged[key] = value
    try:
        depth = int(merged["depth"])
    except (TypeError, ValueError):
        raise InvalidSourceError("depth", merged["depth"], "must be an integer from 0 to 5") from None
    if not 0 <= depth <= 5 or isinstance(merged["depth"], bool):
        raise InvalidSourceError("depth", merged["depth"], "must be an integer from 0 to 5")
    merged["depth"] = depth
    merged["include"] = _check_regexes("include", merged["include"])
    merged["exclude"] = _check_regexes("exclude", merged["exclude"])
    for key, low, kind in (("requests_per_second", 0.01, float), ("max_pages", 1, int), ("llms_full_max_mb", 0.01, float)):
        try:
            number = kind(merged[key])
        except (TypeError, ValueError):
            raise InvalidSourceError(key, merged[key], f"must be a number >= {low}") from None
        if number < low or isinstance(merged[key], bool):
            raise InvalidSourceError(key, merged[key], f"must be >= {low}")
        merged[key] = number
    for key in ("respect_robots", "use_llms_txt", "use_sitemap", "render_js"):
        if not isinstance(merged[key], bool):
            raise InvalidSourceError(key, merged[key], "must be true or false")
    return merged


def check_renderer(settings: Settings, options: dict[str, Any]) -> None:
    """Turning ``render_js`` on needs the Chromium of ``GROUNDWORK_CHROMIUM_PATH``: say so when the option is set,
    not at the next sync."""
    if options.get("render_js") is True:
        try:
            check_chromium(settings.chromium_path)
        except ChromiumNotFoundError as error:
            raise InvalidSourceError("render_js", True, str(error)) from None


def check_visibility(value: object) -> str:
    if value not in VISIBILITIES:
        raise InvalidSourceError("visibility", value, f"must be one of {', '.join(VISIBILITIES)}")
    return str(value)


def check_folder(location: str | Path) -> str:
    path = Path(str(location)).expanduser()
    if not path.is_dir():
        raise InvalidSourceError("folder", str(location), "not an existing folder")
    return str(path.resolve())


# ------------------------------------------------------------------ rows


_COLUMNS = ("source_id", "name", "kind", "location", "enabled", "origin", "config", "created_at", "updated_at",
            "last_synced_at", "deleted_at", "resync_needed", "last_sync", "visibility")


def outside_roots(path: str | Path, roots: tuple[Path, ...] | None) -> str | None:
    """None when ``path``, symbolic links resolved, lies inside one of ``roots`` (``Settings.source_roots_in_force``;
    None: anywhere), else why not - naming where it really leads."""
    if roots is None:
        return None
    resolved = Path(path).expanduser().resolve()
    if any(resolved == root or resolved.is_relative_to(root) for root in roots):
        return None
    return (f"{path} leads to {resolved}, outside every source root ({', '.join(str(r) for r in roots)}); "
            "folders are indexed and files served only inside GROUNDWORK_SOURCE_ROOTS (default: the data folder and "
            "the folders configured at start)")


def _from_row(row: tuple) -> Source:
    values = dict(zip(_COLUMNS, row))
    for key in ("config", "last_sync"):
        raw = values[key]
        values[key] = json.loads(raw) if isinstance(raw, str) else raw
    values["config"] = values["config"] or {}
    values["origin"] = values["origin"] or "settings"
    values["resync_needed"] = bool(values["resync_needed"])
    values["visibility"] = values["visibility"] or DEFAULT_VISIBILITY
    return Source(**values)


def list_sources(conn: duckdb.DuckDBPyConnection, include_deleted: bool = False) -> list[Source]:
    where = "" if include_deleted else "WHERE deleted_at IS NULL"
    rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM sources {where} ORDER BY name").fetchall()
    return [_from_row(row) for row in rows]


def get_source(conn: duckdb.DuckDBPyConnection, name: str, include_deleted: bool = False) -> Source:
    row = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM sources WHERE name = ?", [name]).fetchone()
    if row is None or (row[_COLUMNS.index("deleted_at")] is not None and not include_deleted):
        raise SourceNotFoundError(name, [s.name for s in list_sources(conn)])
    return _from_row(row)


def source_by_id(conn: duckdb.DuckDBPyConnection, source_id: str) -> Source | None:
    row = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM sources WHERE source_id = ?", [source_id]).fetchone()
    return _from_row(row) if row else None


def add_source(
    conn: duckdb.DuckDBPyConnection,
    name: str,
    kind: str,
    location: str,
    config: dict[str, Any] | None = None,
    enabled: bool = True,
    visibility: str = DEFAULT_VISIBILITY,
) -> Source:
    """Register a user source.  Re-adding a deleted source's location brings that source back
    (its documents return on the next sync as 'restored').  ``visibility``: internal (admin callers only)
    unless the caller says public."""
    check_name(name)
    visibility = check_visibility(visibility)
    if kind not in ("folder", "web"):
        raise InvalidSourceError("kind", kind, "sources added by hand are 'folder' or 'web' (uploads have their own folder)")
    if kind == "web":
        location = normalise_base_url(location)
        config = check_web_config(config or {})
    else:
        location = check_folder(location)
        if config:
            raise InvalidSourceError("config", config, "folder sources take no options (use a .groundworkignore file)")
        config = {}
    source_id = source_id_for(kind, location)
    now = utcnow()
    with transaction(conn):
        taken = conn.execute("SELECT source_id, deleted_at FROM sources WHERE name = ?", [name]).fetchone()
        if taken and taken[0] != source_id and taken[1] is None:
            raise SourceExistsError(name, "a source with this name already exists")
        same_place = source_by_id(conn, source_id)
        if same_place is not None and not same_place.deleted:
            raise SourceExistsError(name, f"{location} is already registered as source {same_place.name!r}")
        if taken and taken[0] != source_id:  # a deleted source held the name: free it
            conn.execute("UPDATE sources SET name = ? WHERE source_id = ?", [f"{name}~deleted~{taken[0][:8]}", taken[0]])
        if same_place is not None:
            conn.execute(
                "UPDATE sources SET name = ?, enabled = ?, origin = 'user', config = ?, updated_at = ?, deleted_at = NULL, "
                "resync_needed = TRUE, visibility = ? WHERE source_id = ?",
                [name, enabled, json.dumps(config), now, visibility, source_id],
            )
        else:
            conn.execute(
                "INSERT INTO sources (source_id, name, kind, location, enabled, created_at, config, origin, updated_at, "
                "resync_needed, visibility) VALUES (?, ?, ?, ?, ?, ?, ?, 'user', ?, TRUE, ?)",
                [source_id, name, kind, location, enabled, now, json.dumps(config), now, visibility],
            )
    return get_source(conn, name)


def update_source(
    conn: duckdb.DuckDBPyConnection, name: str, changes: dict[str, Any]
) -> tuple[Source, list[str], bool]:
    """Apply changes (web options, ``enabled``, ``name``, ``visibility``); returns (source, changed keys,
    resync needed).

    A change to what a crawl would include (depth, include/exclude rules, page cap…)
    sets ``resync_needed``: the index keeps its current pages until the next sync.  A change of
    ``visibility`` needs no sync, but the served snapshot carries the old one until the caller publishes
    (``source_actions.update_source_now`` does).
    """
    source = get_source(conn, name)
    changes = dict(changes)
    new_name = changes.pop("name", None)
    enabled = changes.pop("enabled", None)
    visibility = changes.pop("visibility", None)
    if visibility is not None:
        visibility = check_visibility(visibility)
    if enabled is not None and not isinstance(enabled, bool):
        raise InvalidSourceError("enabled", enabled, "must be true or false")
    config = source.config
    changed: list[str] = []
    if changes:
        if source.kind != "web":
            raise InvalidSourceError(next(iter(changes)), next(iter(changes.values())),
                                     f"{source.kind} sources have no crawl options")
        config = check_web_config(changes, base={**WEB_DEFAULTS, **source.config})
        changed = [k for k in config if config[k] != {**WEB_DEFAULTS, **source.config}.get(k)]
    if enabled is not None and enabled != source.enabled:
        changed.append("enabled")
    if visibility is not None and visibility != source.visibility:
        changed.append("visibility")
    if new_name is not None and new_name != source.name:
        check_name(new_name)
        if conn.execute("SELECT 1 FROM sources WHERE name = ?", [new_name]).fetchone():
            raise SourceExistsError(new_name, "a source with this name already exists")
        changed.append("name")
    resync = bool(RESYNC_KEYS & set(changed)) or (enabled is True and "enabled" in changed)
    if not changed:
        return source, [], False
    with transaction(conn):
        conn.execute(
            "UPDATE sources SET name = ?, enabled = ?, config = ?, updated_at = ?, "
            "resync_needed = resync_needed OR ?, visibility = ? WHERE source_id = ?",
            [new_name or source.name, source.enabled if enabled is None else enabled, json.dumps(config), utcnow(),
             resync, visibility or source.visibility, source.source_id],
        )
        if "render_js" in changed:
            # the cached bodies were read the other way: forget the validators and sitemap dates, so the next
            # sync downloads every page again instead of answering "unchanged" from a 304 or <lastmod>
            conn.execute("UPDATE web_pages SET etag = NULL, last_modified = NULL, lastmod = NULL WHERE source_id = ?",
                         [source.source_id])
    return get_source(conn, new_name or source.name), changed, resync


def delete_source(conn: duckdb.DuckDBPyConnection, name: str, configured_ids: set[str] | frozenset[str] = frozenset()) -> tuple[Source, int]:
    """Soft-delete a source and all its documents in one transaction; returns (source, documents deleted).

    A folder the settings name right now (``configured_ids``) cannot be deleted here: the next
    sync would bring it back.  One the settings no longer name can (its documents would otherwise
    stay indexed, never synced).  The caller publishes a snapshot afterwards so the chunks leave
    the index at once.
    """
    source = get_source(conn, name)
    if source.source_id in configured_ids and source.kind != "upload":
        raise SourceExistsError(
            name, "this folder comes from GROUNDWORK_SOURCES (or the default corpus); remove it there instead"
        )
    now = utcnow()
    with transaction(conn):
        deleted = conn.execute(
            "SELECT count(DISTINCT doc_id) FROM documents WHERE source_id = ? AND status IN ('active', 'pending', 'failed')",
            [source.source_id],
        ).fetchone()[0]
        delete_mentions_of_chunks(conn, "(doc_id, version) IN (SELECT doc_id, version FROM documents "
                                  "WHERE source_id = ? AND status = 'pending')", [source.source_id])
        for table in ("pages", "blocks", "chunks", "document_links"):
            conn.execute(
                f"DELETE FROM {table} WHERE (doc_id, version) IN "
                "(SELECT doc_id, version FROM documents WHERE source_id = ? AND status = 'pending')",
                [source.source_id],
            )
        conn.execute("DELETE FROM documents WHERE source_id = ? AND status = 'pending'", [source.source_id])
        conn.execute(
            "UPDATE documents SET status = 'deleted', valid_to = ? WHERE source_id = ? AND status IN ('active', 'failed')",
            [now, source.source_id],
        )
        conn.execute(
            "UPDATE ingestion_failures SET resolved_at = ? WHERE source_id = ? AND resolved_at IS NULL",
            [now, source.source_id],
        )
        conn.execute(
            "UPDATE sources SET deleted_at = ?, enabled = FALSE, updated_at = ? WHERE source_id = ?",
            [now, now, source.source_id],
        )
    return get_source(conn, name, include_deleted=True), int(deleted)


def register_configured_sources(conn: duckdb.DuckDBPyConnection, settings: Settings) -> list[Source]:
    """Make sure the folders from the settings (and the uploads folder) are rows; returns them.

    A configured folder a user deleted through the registry stays deleted only
    while it is absent from the settings: naming it in the settings is explicit.
    A source whose visibility was never set gets its default here: the default corpus (the sample
    documents) is public, every other folder and the uploads internal.
    """
    now = utcnow()
    uploads = settings.uploads_dir.resolve()
    default_visibility = "public" if settings.uses_default_corpus else DEFAULT_VISIBILITY
    wanted: list[tuple[str, str, str]] = []  # (source_id, kind, location)
    for location in settings.source_dirs:
        kind = "upload" if location == uploads else "folder"
        wanted.append((source_id_for(kind, location), kind, str(location)))
    out: list[Source] = []
    with transaction(conn):
        for source_id, kind, location in wanted:
            visibility = default_visibility if kind == "folder" else DEFAULT_VISIBILITY
            conn.execute("UPDATE sources SET visibility = ? WHERE source_id = ? AND visibility IS NULL",
                         [visibility, source_id])
            row = source_by_id(conn, source_id)
            if row is None:
                base = Path(location).name or location
                name = base if NAME_PATTERN.match(base) else re.sub(r"[^A-Za-z0-9._-]", "-", base).strip("-.") or "folder"
                name = "uploads" if kind == "upload" else name
                if conn.execute("SELECT 1 FROM sources WHERE name = ?", [name]).fetchone():
                    name = f"{name}-{source_id[:6]}"
                conn.execute(
                    "INSERT INTO sources (source_id, name, kind, location, enabled, created_at, config, origin, updated_at, "
                    "visibility) VALUES (?, ?, ?, ?, TRUE, ?, '{}', 'settings', ?, ?)",
                    [source_id, name, kind, location, now, now, visibility],
                )
            elif row.kind != kind:
                conn.execute("UPDATE sources SET kind = ? WHERE source_id = ?", [kind, source_id])
            elif row.deleted and row.origin == "settings" and kind != "upload":
                conn.execute("UPDATE sources SET deleted_at = NULL, enabled = TRUE WHERE source_id = ?", [source_id])
    for source_id, _, _ in wanted:
        source = source_by_id(conn, source_id)
        if source is not None:
            out.append(source)
    return out


def sources_to_sync(
    conn: duckdb.DuckDBPyConnection,
    settings: Settings,
    names: list[str] | None = None,
    kinds: list[str] | None = None,
) -> list[Source]:
    """The sources a sync covers: the configured ones (registered on the way) and the enabled user sources.

    ``names`` picks sources explicitly (an unknown, deleted or disabled name is an
    error: syncing it would silently do nothing); ``kinds`` filters by kind
    (the file-change sensor syncs folders and uploads, never web crawls).
    """
    configured = register_configured_sources(conn, settings)
    if names:
        picked = [get_source(conn, name) for name in names]
        for source in picked:
            if not source.enabled:
                raise InvalidSourceError("enabled", False, f"source {source.name!r} is disabled; enable it first")
        return picked
    configured_ids = {s.source_id for s in configured}
    chosen = [s for s in configured if s.enabled and not s.deleted]
    chosen += [
        s for s in list_sources(conn)
        if s.origin == "user" and s.enabled and s.source_id not in configured_ids
    ]
    if kinds:
        chosen = [s for s in chosen if s.kind in kinds]
    return chosen


def record_source_sync(conn: duckdb.DuckDBPyConnection, source_id: str, summary: dict[str, Any]) -> None:
    conn.execute(
        "UPDATE sources SET last_synced_at = ?, last_sync = ?, resync_needed = FALSE WHERE source_id = ?",
        [utcnow(), json.dumps(summary, default=str), source_id],
    )


def source_statistics(conn: duckdb.DuckDBPyConnection, source_id: str) -> dict[str, Any]:
    """Live counts for ``sources show``: documents by status, pages, chunks, open failures."""
    docs = dict(conn.execute(
        "SELECT status, count(DISTINCT doc_id) FROM documents WHERE source_id = ? GROUP BY status", [source_id]
    ).fetchall())
    pages, chunks = conn.execute(
        """
        SELECT coalesce(sum(d.page_count), 0),
               (SELECT count(*) FROM chunks c JOIN documents d2 USING (doc_id, version)
                WHERE d2.source_id = ? AND d2.status = 'active')
        FROM documents d WHERE d.source_id = ? AND d.status = 'active'
        """,
        [source_id, source_id],
    ).fetchone()
    failures = conn.execute(
        "SELECT count(*) FROM ingestion_failures WHERE source_id = ? AND resolved_at IS NULL", [source_id]
    ).fetchone()[0]
    web_pages = conn.execute("SELECT count(*) FROM web_pages WHERE source_id = ?", [source_id]).fetchone()[0]
    return {
        "documents": int(docs.get("active", 0)),
        "pending_versions": int(docs.get("pending", 0)),
        "failed_versions": int(docs.get("failed", 0)),
        "deleted_documents": int(docs.get("deleted", 0)),
        "pages": int(pages or 0),
        "chunks": int(chunks or 0),
        "open_failures": int(failures),
        "web_pages_known": int(web_pages),
    }
