"""Stage 1: find the files, hash them and record document versions.

Re-sync rules, decided here by checksum alone (no parsing):
- a new path -> version 1, status ``pending``;
- same checksum as the latest version -> unchanged, costs one hash;
- a different checksum -> version n+1 ``pending`` that will supersede the
  active one once it is parsed, chunked and embedded (so a file that turns
  corrupt never takes its good, indexed version down with it);
- a path gone from a scanned source -> the active version is soft-deleted
  (``deleted``, ``valid_to`` set) and purged after the retention period.
A source folder that is missing altogether deletes nothing: an unmounted disk
must not wipe an index.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import OversizeFileError, UnsupportedTypeError
from knowledge_store.ingest.entities import delete_mentions_of_chunks
from knowledge_store.ingest.failures import failure_id, record_failure, resolve_failures
from knowledge_store.ingest.parsers import SUPPORTED_EXTENSIONS
from knowledge_store.ingest.sources import outside_roots, source_id_for
from knowledge_store.ingest.sync_runs import STOPPED_RUN_STATUSES, add_counts, unpublished_active_versions
from knowledge_store.storage.store import transaction, utcnow

HASH_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class SourceFolder:
    """One source as the scan sees it: a folder (or the uploads folder) or a web site."""

    source_id: str
    name: str
    location: Path | str
    exists: bool  # folder present / crawl completed: only then may documents be deleted
    kind: str = "folder"


@dataclass(frozen=True)
class SourceFile:
    source_id: str
    path: Path
    relative_path: str  # path inside the folder, or the canonical URL of a web page
    size_bytes: int
    modified_at: datetime | None
    checksum: str
    url: str | None = None  # the page URL for web documents (file:// link otherwise)

    @property
    def doc_id(self) -> str:
        return doc_id_for(self.source_id, self.relative_path)


@dataclass(frozen=True)
class ScanFailure:
    source_id: str
    path: Path | str  # file path, or the URL for web failures
    relative_path: str
    kind: str
    reason: str
    identity: str
    stage: str = "scan"  # scan (files) | fetch (web)
    keeps_document: bool = True  # False: the item is known gone (HTTP 404/410): its document is removed
    attempts: int = 1  # requests made for it (a fetch retries transient trouble itself)
    failure_class: str = "permanent"  # retry.FailureClass: a transient fetch failure is tried again next sync


@dataclass
class ScanResult:
    folders: list[SourceFolder]
    files: list[SourceFile] = field(default_factory=list)
    failures: list[ScanFailure] = field(default_factory=list)
    bytes_hashed: int = 0
    excluded: dict[str, int] = field(default_factory=dict)  # source_id -> items left out by rules (.groundworkignore, include/exclude, robots)
    excluded_items: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # source_id -> first (path, reason) of them
    partial: bool = False  # a retry of single items: nothing else is deleted or resolved
    keep_unseen: set[str] = field(default_factory=set)  # sources whose unseen documents stay (crawl stopped by the page cap)


@dataclass
class RawDocumentsResult:
    sync_run_id: str
    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    restored: int = 0
    failed: int = 0
    excluded: int = 0
    pending: int = 0
    resumed: int = 0  # of added/updated: versions a stopped (killed) run had recorded or activated, completed now
    files_seen: int = 0
    bytes_hashed: int = 0
    missing_sources: list[str] = field(default_factory=list)
    changes: list[dict[str, object]] = field(default_factory=list)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)
    excluded_items: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # source_id -> [{path, reason}]
    crawls: dict[str, dict[str, object]] = field(default_factory=dict)  # per web source: crawl statistics
    sources: list[str] = field(default_factory=list)  # names of the sources synced


def doc_id_for(source_id: str, relative_path: str) -> str:
    return hashlib.sha256(f"{source_id}/{relative_path}".encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(HASH_CHUNK):
            digest.update(block)
    return digest.hexdigest()


IGNORE_FILE = ".groundworkignore"
EXCLUDED_PREVIEW = 50  # excluded items listed (with their reason) per source and sync


def ignore_patterns(folder: Path) -> list[str]:
    """Glob patterns from ``<source>/.groundworkignore`` (one per line, ``#`` comments).

    Patterns match the path relative to the source (``evaluation/*.json``) or the
    file name (``*.png``); a pattern ending in ``/`` matches a folder and all below it.
    Ignored files are neither indexed nor reported as failures.
    """
    file = folder / IGNORE_FILE
    if not file.is_file():
        return []
    lines = (line.strip() for line in file.read_text(encoding="utf-8", errors="replace").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _ignored(relative: str, patterns: list[str]) -> bool:
    name = relative.rsplit("/", 1)[-1]
    for pattern in patterns:
        if pattern.endswith("/"):
            if relative.startswith(pattern) or fnmatch.fnmatch(relative, pattern + "*"):
                return True
        elif fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(name, pattern):
            return True
    return False


def _inside(target: str, folder: str) -> bool:
    return target == folder or target.startswith(folder.rstrip(os.sep) + os.sep)


def _walk(
    folder: Path, skip: set[Path], ignored: list[str] | None = None,
    links: list[tuple[str, str]] | None = None, follow_external_links: bool = False,
) -> list[Path]:
    """Every regular file under ``folder``: hidden files and folders and ``.groundworkignore`` matches excluded, sorted.

    Relative paths left out by ``.groundworkignore`` are appended to ``ignored`` (the sync reports them as excluded).

    Symbolic links: a link to a file inside ``folder`` is a file like any other; a link to a folder
    inside it is not entered (its files are indexed where they really are, once).  A link (to a
    file or a folder) whose target resolves outside ``folder`` is left out - a ``passwd.txt ->
    /etc/passwd`` must not be indexed and served - and appended to ``links`` as (relative path,
    reason), unless ``follow_external_links``.  No real folder is entered twice and a link to a
    folder the walk is already inside is never followed, so link loops cannot make it go round."""
    patterns = ignore_patterns(folder)
    real_folder = os.path.realpath(folder)
    real_skip = {str(p) for p in skip}
    visited: set[str] = set()
    found: list[Path] = []

    def leave_out(relative: str, reason: str) -> None:
        if links is not None:
            links.append((relative, reason))

    for root, dirs, files in os.walk(folder, followlinks=follow_external_links):
        root_path = Path(root)
        real_root = os.path.realpath(root)
        if real_root in visited:
            dirs[:] = []
            continue
        visited.add(real_root)
        kept: list[str] = []
        for name in sorted(dirs):
            if name.startswith("."):
                continue
            path = root_path / name
            real = os.path.realpath(path)
            if real in real_skip:
                continue
            if path.is_symlink():
                relative = path.relative_to(folder).as_posix() + "/"
                if _inside(real, real_folder) or not os.path.isdir(real):
                    continue  # indexed at its real place (or broken / a loop): never entered
                if _ignored(relative, patterns):
                    if ignored is not None:
                        ignored.append(relative)
                    continue
                if not follow_external_links:
                    leave_out(relative, f"symbolic link to a folder outside the source folder ({real}); "
                                        "set GROUNDWORK_FOLLOW_EXTERNAL_SYMLINKS=true to index it")
                    continue
                if real in visited or _inside(real_root, real):
                    continue  # a link back to a folder being walked: a loop
            kept.append(name)
        dirs[:] = kept
        for name in sorted(files):
            if name.startswith(".") or name.endswith("~"):
                continue
            path = root_path / name
            if not path.is_file():
                continue  # broken links and link loops included
            relative = path.relative_to(folder).as_posix()
            if _ignored(relative, patterns):
                if ignored is not None:
                    ignored.append(relative)
                continue
            if not follow_external_links and path.is_symlink():  # the folders walked are real ones: only the name can link out
                real = os.path.realpath(path)
                if not _inside(real, real_folder):
                    leave_out(relative, f"symbolic link to a file outside the source folder ({real}); "
                                        "set GROUNDWORK_FOLLOW_EXTERNAL_SYMLINKS=true to index it")
                    continue
            found.append(path)
    return found


def configured_folders(settings: Settings) -> list[SourceFolder]:
    """The settings' folders as scan targets (names as the registry gives them)."""
    folders: list[SourceFolder] = []
    names: set[str] = set()
    uploads = settings.uploads_dir.resolve()
    for location in settings.source_dirs:
        name = location.name or str(location)
        if name in names:
            name = f"{name}-{source_id_for('folder', location)[:6]}"
        names.add(name)
        kind = "upload" if location == uploads else "folder"
        folders.append(SourceFolder(source_id_for("folder", location), name, location, location.is_dir(), kind))
    return folders


def scan_sources(settings: Settings, folders: list[SourceFolder] | None = None) -> ScanResult:
    """Hash every candidate file in the folders (default: the configured ones); refuse oversize and unsupported ones unread."""
    folders = configured_folders(settings) if folders is None else folders
    result = ScanResult(folders=folders)
    skip = {settings.data_dir.resolve()}
    roots = settings.source_roots_in_force
    for folder in folders:
        if not folder.exists:
            continue
        ignored: list[str] = []
        links: list[tuple[str, str]] = []
        location = Path(folder.location)
        for path in _walk(location, skip, ignored, links, settings.follow_external_symlinks):
            relative = path.relative_to(location).as_posix()
            outside = outside_roots(path, roots)
            if outside is not None:  # a followed link out of the folder that leads out of every root too
                links.append((relative, outside))
                continue
            stat = path.stat()
            suffix = path.suffix.lower()
            if suffix not in SUPPORTED_EXTENSIONS:
                error = UnsupportedTypeError(
                    path, f"unsupported file type '{suffix or '(none)'}'; supported: {', '.join(sorted(SUPPORTED_EXTENSIONS))}"
                )
                result.failures.append(ScanFailure(folder.source_id, path, relative, error.kind, error.reason, f"{stat.st_size}"))
                continue
            if stat.st_size > settings.max_file_bytes:
                error = OversizeFileError(
                    path, f"file is {stat.st_size / 1048576:.1f} MB, over the {settings.max_file_mb:g} MB limit"
                )
                result.failures.append(ScanFailure(folder.source_id, path, relative, error.kind, error.reason, f"{stat.st_size}"))
                continue
            try:
                checksum = sha256_file(path)
            except OSError as error:
                result.failures.append(
                    ScanFailure(folder.source_id, path, relative, "unreadable", f"cannot read the file: {error.strerror or error}", "")
                )
                continue
            result.bytes_hashed += stat.st_size
            result.files.append(
                SourceFile(
                    source_id=folder.source_id,
                    path=path,
                    relative_path=relative,
                    size_bytes=stat.st_size,
                    modified_at=datetime.fromtimestamp(stat.st_mtime, timezone.utc).replace(tzinfo=None),
                    checksum=checksum,
                )
            )
        result.excluded[folder.source_id] = len(ignored) + len(links)
        result.excluded_items[folder.source_id] = (
            links + [(relative, f"matches {IGNORE_FILE}") for relative in ignored]
        )[:EXCLUDED_PREVIEW]
    return result


def _delete_pending_version(conn: duckdb.DuckDBPyConnection, doc_id: str, version: int) -> None:
    delete_mentions_of_chunks(conn, "doc_id = ? AND version = ?", [doc_id, version])
    for table in ("pages", "blocks", "chunks", "document_links"):
        conn.execute(f"DELETE FROM {table} WHERE doc_id = ? AND version = ?", [doc_id, version])
    conn.execute("DELETE FROM documents WHERE doc_id = ? AND version = ?", [doc_id, version])


def _missing_reason(folder: SourceFolder, reason: str | None) -> tuple[str, str]:
    if folder.kind == "web":
        return "source_unreachable", f"the site could not be crawled ({reason or 'unreachable'}); its pages are kept as they are"
    if reason:  # the folder leads outside every source root (run.record_sources)
        return "outside_source_roots", f"{reason}; not read, its documents are kept as they are"
    return "missing_source", "source folder does not exist; its documents are kept as they are"


@dataclass
class _KnownVersions:
    """What the store already holds for the sources in a scan: the facts every re-sync rule reads."""

    latest: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # doc_id -> (version, status, checksum)
    active_version: dict[str, int] = field(default_factory=dict)
    doc_source: dict[str, str] = field(default_factory=dict)
    stopped: dict[str, bool] = field(default_factory=dict)  # latest version recorded by a run that stopped before it finished
    # latest version superseded by a newer revision in another file (ingest/relations.py): not in the index,
    # but its file is live - unchanged while its bytes are, deleted when its file goes
    family_superseded: set[str] = field(default_factory=set)
    unpublished: dict[str, tuple[int, int | None]] = field(default_factory=dict)


class _PerSourceCounts:
    """Counts per source (added, updated, removed, unchanged, excluded, failed, seen) for the run's details."""

    def __init__(self, scan: ScanResult) -> None:
        self.counts: dict[str, dict[str, int]] = {
            f.source_id: {"added": 0, "updated": 0, "removed": 0, "unchanged": 0,
                          "excluded": scan.excluded.get(f.source_id, 0), "failed": 0, "seen": 0}
            for f in scan.folders
        }

    def bump(self, source_id: str, key: str) -> None:
        self.counts.setdefault(source_id, {"added": 0, "updated": 0, "removed": 0, "unchanged": 0, "excluded": 0,
                                           "failed": 0, "seen": 0})[key] += 1


def _record_source_availability(
    conn: duckdb.DuckDBPyConnection, scan: ScanResult, sync_run_id: str, unreachable_reasons: dict[str, str]
) -> None:
    """A missing folder or unreachable site is a failure row (its documents are kept); one that is back resolves it."""
    for folder in scan.folders:
        kind, reason = _missing_reason(folder, unreachable_reasons.get(folder.source_id))
        if not folder.exists:
            record_failure(
                conn, path=str(folder.location), stage="scan", kind=kind, reason=reason,
                sync_run_id=sync_run_id, source_id=folder.source_id, identity="",
            )
        else:
            resolve_failures(conn, str(folder.location), stages=("scan",))


def _known_versions(conn: duckdb.DuckDBPyConnection, scan: ScanResult, sync_run_id: str) -> _KnownVersions:
    """The latest version of every document of the sources in this scan - also of a site whose crawl
    was incomplete: the pages it did fetch are versioned as usual, only deletions need a full view."""
    known = _KnownVersions()
    observed_sources = sorted({f.source_id for f in scan.folders} | {f.source_id for f in scan.files})
    if not observed_sources:
        return known
    rows = conn.execute(
        "SELECT d.doc_id, d.version, d.status, d.checksum, d.source_id, "
        "coalesce(list_contains(?, r.status), FALSE) AND d.sync_run_id <> ?, d.superseded_by IS NOT NULL "
        "FROM documents d LEFT JOIN sync_runs r USING (sync_run_id) WHERE list_contains(?, d.source_id)",
        [list(STOPPED_RUN_STATUSES), sync_run_id, observed_sources],
    ).fetchall()
    by_other_file: set[tuple[str, int]] = set()
    for doc_id, version, status, checksum, source_id, by_stopped_run, superseded_by_file in rows:
        known.doc_source[doc_id] = source_id
        if status == "active":
            known.active_version[doc_id] = version
        if status == "superseded" and superseded_by_file:
            by_other_file.add((doc_id, version))
        if doc_id not in known.latest or version > known.latest[doc_id][0]:
            known.latest[doc_id] = (version, status, checksum)
            known.stopped[doc_id] = bool(by_stopped_run)
    known.family_superseded = {doc_id for doc_id, (version, status, _) in known.latest.items()
                               if status == "superseded" and (doc_id, version) in by_other_file}
    known.unpublished = unpublished_active_versions(conn, observed_sources)
    return known


def _record_scan_failures(
    conn: duckdb.DuckDBPyConnection, scan: ScanResult, sync_run_id: str, scanned_sources: list[str],
    result: RawDocumentsResult, counts: _PerSourceCounts, now: datetime,
) -> None:
    """Record this scan's file/page failures; resolve the earlier ones not seen again (file removed,
    fixed, now ignored; page fetched) - unless this is a partial retry, which saw only some items."""
    seen_failures: set[str] = set()
    for failure in scan.failures:
        seen_failures.add(failure_id(str(failure.path), failure.stage, failure.kind, failure.identity))
        counts.bump(failure.source_id, "failed")
        if record_failure(
            conn, path=str(failure.path), stage=failure.stage, kind=failure.kind, reason=failure.reason,
            sync_run_id=sync_run_id, source_id=failure.source_id, identity=failure.identity,
            doc_id=doc_id_for(failure.source_id, failure.relative_path),
            attempts=failure.attempts, failure_class=failure.failure_class,
        ):
            result.failed += 1
    if scanned_sources and not scan.partial:
        stale = [
            fid for fid, in conn.execute(
                "SELECT failure_id FROM ingestion_failures WHERE stage IN ('scan', 'fetch') "
                "AND kind NOT IN ('missing_source', 'source_unreachable') "
                "AND resolved_at IS NULL AND list_contains(?, source_id)", [scanned_sources]
            ).fetchall() if fid not in seen_failures
        ]
        if stale:
            conn.execute("UPDATE ingestion_failures SET resolved_at = ? WHERE list_contains(?, failure_id)", [now, stale])


def _version_file(
    conn: duckdb.DuckDBPyConnection, scan: ScanResult, file: SourceFile, known: _KnownVersions,
    result: RawDocumentsResult, counts: _PerSourceCounts,
) -> dict[str, object] | None:
    """Apply the re-sync rules to one scanned file: the new pending version row to insert, or None
    when its bytes are already recorded (unchanged, or left pending or unpublished by a stopped run)."""
    doc_id = file.doc_id
    counts.bump(file.source_id, "seen")
    if scan.partial:
        resolve_failures(conn, str(file.url or file.path), stages=("scan", "fetch"))
    previous = known.latest.get(doc_id)
    base = {
        "doc_id": doc_id, "source_id": file.source_id, "relative_path": file.relative_path,
        "path": str(file.path), "url": file.url or file.path.resolve().as_uri(), "checksum": file.checksum,
        "size_bytes": file.size_bytes, "modified_at": file.modified_at,
    }
    if previous is None:
        result.changes.append({"doc_id": doc_id, "path": file.relative_path, "change": "added"})
        counts.bump(file.source_id, "added")
        return {**base, "version": 1, "supersedes": None}
    version, status, checksum = previous
    if checksum == file.checksum and status == "active" and known.unpublished.get(doc_id, (None,))[0] == version:
        # activated by a run killed before it published the index: this run publishes it
        change = "added" if known.unpublished[doc_id][1] is None else "updated"
        result.resumed += 1
        counts.bump(file.source_id, change)
        result.changes.append({"doc_id": doc_id, "path": file.relative_path, "change": change, "resumed": True})
        return None
    if checksum == file.checksum and (status in ("active", "failed") or doc_id in known.family_superseded):
        result.unchanged += 1
        counts.bump(file.source_id, "unchanged")
        return None
    if checksum == file.checksum and status == "pending":
        result.pending += 1  # a killed run left it half-done: the later stages resume it
        if known.stopped.get(doc_id):  # ... and it is this run that brings it into the index
            change = "updated" if doc_id in known.active_version else "added"
            result.resumed += 1
            counts.bump(file.source_id, change)
            result.changes.append({"doc_id": doc_id, "path": file.relative_path, "change": change,
                                   "resumed": True})
        return None
    if status == "pending":
        # changed again before it was processed: restart that version with the new bytes
        _delete_pending_version(conn, doc_id, version)
        row = {**base, "version": version, "supersedes": known.active_version.get(doc_id)}
    else:
        replaces = version if doc_id in known.family_superseded else known.active_version.get(doc_id)
        row = {**base, "version": version + 1, "supersedes": replaces}
    # a changed revision that another file had superseded is an update of that document
    is_known = doc_id in known.active_version or doc_id in known.family_superseded
    change = "updated" if is_known else ("restored" if status == "deleted" else "added")
    if change == "restored":
        result.restored += 1
    counts.bump(file.source_id, "updated" if change == "updated" else "added")
    result.changes.append({"doc_id": doc_id, "path": file.relative_path, "change": change})
    return row


def _insert_pending_versions(
    conn: duckdb.DuckDBPyConnection, rows: list[dict[str, object]], sync_run_id: str, now: datetime
) -> None:
    """New versions start ``pending``: they supersede the active one only once parsed, chunked and embedded."""
    for row in rows:
        conn.execute(
            "INSERT INTO documents (doc_id, version, source_id, relative_path, path, url, checksum, size_bytes, "
            "modified_at, status, supersedes, created_at, sync_run_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
            [row["doc_id"], row["version"], row["source_id"], row["relative_path"], row["path"], row["url"],
             row["checksum"], row["size_bytes"], row["modified_at"], row["supersedes"], now, sync_run_id],
        )


def _delete_gone_documents(
    conn: duckdb.DuckDBPyConnection, scan: ScanResult, known: _KnownVersions, scanned_sources: list[str],
    result: RawDocumentsResult, counts: _PerSourceCounts, now: datetime,
) -> None:
    """Soft-delete documents whose file (or page) is gone from a completely scanned source.

    Absence proves nothing for a missing folder, an incomplete crawl, a partial retry or a crawl
    stopped by its page cap (unless the page is known gone); an item that exists but could not be
    read this time is not gone either."""
    present = {f.doc_id for f in scan.files} | {
        doc_id_for(f.source_id, f.relative_path) for f in scan.failures if f.keeps_document
    }
    known_gone = {doc_id_for(f.source_id, f.relative_path) for f in scan.failures if not f.keeps_document}
    complete_sources = set(scanned_sources)
    for doc_id, (version, status, _checksum) in known.latest.items():
        if scan.partial or doc_id in present or status == "deleted":
            continue
        if status == "superseded" and doc_id not in known.family_superseded:
            continue
        if known.doc_source[doc_id] not in complete_sources:
            continue  # missing folder or incomplete crawl: absence proves nothing
        if known.doc_source[doc_id] in scan.keep_unseen and doc_id not in known_gone:
            continue
        path_row = conn.execute(
            "SELECT path, relative_path, url FROM documents WHERE doc_id = ? AND version = ?", [doc_id, version]
        ).fetchone()
        if status == "pending":
            _delete_pending_version(conn, doc_id, version)
        conn.execute(
            "UPDATE documents SET status = 'deleted', valid_to = ? WHERE doc_id = ? AND status IN ('active', 'failed')",
            [now, doc_id],
        )
        if doc_id in known.family_superseded:  # out of the index since it was superseded: keep when that was
            conn.execute(
                "UPDATE documents SET status = 'deleted', valid_to = coalesce(valid_to, ?) "
                "WHERE doc_id = ? AND version = ?", [now, doc_id, version])
        if doc_id in known.active_version:
            result.removed += 1
            counts.bump(known.doc_source[doc_id], "removed")
            result.changes.append({"doc_id": doc_id, "path": path_row[1], "change": "removed"})
        resolve_failures(conn, path_row[0], stages=("scan", "parse", "chunk", "embed"))
        if path_row[2] and path_row[2].startswith("http"):
            resolve_failures(conn, path_row[2], stages=("parse", "chunk", "embed"))


def _record_run_summary(
    conn: duckdb.DuckDBPyConnection, scan: ScanResult, sync_run_id: str, scanned_sources: list[str],
    result: RawDocumentsResult, counts: _PerSourceCounts, now: datetime,
) -> None:
    """The counts and details of this stage on the sync run row (what ``groundwork status`` and the
    console show), and when each fully scanned source was last synced."""
    result.excluded = sum(scan.excluded.values())
    result.excluded_items = {
        source_id: [{"path": path, "reason": reason} for path, reason in items]
        for source_id, items in scan.excluded_items.items() if items
    }
    if not scan.partial:
        conn.execute(
            "UPDATE sources SET last_synced_at = ? WHERE list_contains(?, source_id)", [now, scanned_sources]
        )
    add_counts(conn, sync_run_id, removed=result.removed, unchanged=result.unchanged, failed=result.failed,
               excluded=result.excluded)
    conn.execute(
        "UPDATE sync_runs SET details = ? WHERE sync_run_id = ?",
        [json.dumps({"changes": result.changes[:500], "missing_sources": result.missing_sources,
                     "per_source": counts.counts, "excluded_items": result.excluded_items}), sync_run_id],
    )


def record_raw_documents(
    conn: duckdb.DuckDBPyConnection,
    scan: ScanResult,
    sync_run_id: str,
    unreachable_reasons: dict[str, str] | None = None,
) -> RawDocumentsResult:
    """Turn a scan into document versions (one transaction): see the module docstring.

    Web pages arrive as ``SourceFile`` rows too (their body cached on disk, their
    canonical URL as relative path), so folders and sites share one set of rules.
    """
    result = RawDocumentsResult(sync_run_id=sync_run_id, files_seen=len(scan.files), bytes_hashed=scan.bytes_hashed)
    now = utcnow()
    counts = _PerSourceCounts(scan)
    with transaction(conn):
        scanned_sources = [f.source_id for f in scan.folders if f.exists]
        result.missing_sources = [str(f.location) for f in scan.folders if not f.exists]
        _record_source_availability(conn, scan, sync_run_id, unreachable_reasons or {})
        known = _known_versions(conn, scan, sync_run_id)
        _record_scan_failures(conn, scan, sync_run_id, scanned_sources, result, counts, now)
        new_rows = [row for file in scan.files if (row := _version_file(conn, scan, file, known, result, counts))]
        _insert_pending_versions(conn, new_rows, sync_run_id, now)
        result.pending += len(new_rows)
        _delete_gone_documents(conn, scan, known, scanned_sources, result, counts, now)
        _record_run_summary(conn, scan, sync_run_id, scanned_sources, result, counts, now)
    result.added = sum(1 for c in result.changes if c["change"] == "added")
    result.updated = sum(1 for c in result.changes if c["change"] == "updated")
    result.per_source = counts.counts
    return result
