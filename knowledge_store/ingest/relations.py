"""The document model in the store: revision labels, supersedence across files, relations.

Runs inside the publish stage's activation transaction (``publish.py``), after
the ready versions are activated and before the snapshot is built, over the
whole store - so it is a function of the store's state, not of what one run
saw, and a re-run changes nothing (idempotent):

1. **Labels**: live documents parsed before migration 6 (``rev_label_source``
   NULL) get their label from their stored title, metadata and path.
2. **Families**: live documents (active, or superseded by another file) of one
   source that share a family key (``knowledge_store.core.revisions``) are ordered
   oldest to newest; only the newest stays ``active``; each older one is
   ``superseded`` (``valid_to`` set, ``superseded_by`` = the next newer one),
   and ``relations`` holds ``next newer -[supersedes]-> older`` with evidence.
   A superseded document whose family no longer has a newer member (the newer
   file was deleted, renamed out of the family, or lost its key) is active
   again, from now.
3. **seeAlso**: links of active documents (``document_links``) that point at
   another live document of the store - a file of the same folder source
   (relative path) or a web page (canonical URL) - become one ``seeAlso`` row per
   (source document, target document) with the first link's phrase, page and
   span as evidence.

``relations`` then holds exactly the rows these rules derive now: a row whose
reason is gone (a deleted file, a removed link) is deleted, an unchanged row
keeps its ``created_at``.  Ids are hashes of the row's identity, never
positions, so re-syncs cannot duplicate rows.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import unquote, urlsplit

import duckdb
import pyarrow as pa

from knowledge_store.config.settings import Settings
from knowledge_store.core.revisions import (
    FamilyMember,
    compile_family_pattern,
    family_key,
    order_family,
    revision_label,
)
from knowledge_store.ingest.documents import DocumentLink
from knowledge_store.ingest.web.errors import InvalidUrlError
from knowledge_store.ingest.web.urls import canonical_url

SUPERSEDES = "supersedes"
SEE_ALSO = "seeAlso"
DERIVED_REL_TYPES = (SUPERSEDES, SEE_ALSO)  # the rows this module owns in ``relations``
CHANGES_KEPT = 50  # supersedence changes listed per run (the counts are complete)

_REASONS = {"asset_id": "same asset id", "title": "same title"}


@dataclass
class RelationsResult:
    """What one pass changed, for the sync's details, the Dagster metadata and the API."""

    labels_derived: int = 0  # live documents whose rev_label was derived now (parsed before migration 6)
    superseded: int = 0  # documents that left the index because a newer revision (another file) is active
    reactivated: int = 0  # superseded documents active again (their newer revision is gone)
    supersedes: int = 0  # supersedes rows now in ``relations``
    see_also: int = 0  # seeAlso rows now in ``relations``
    relations_added: int = 0
    relations_removed: int = 0
    changes: list[dict[str, object]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "labels_derived": self.labels_derived, "superseded": self.superseded, "reactivated": self.reactivated,
            "supersedes": self.supersedes, "see_also": self.see_also, "relations_added": self.relations_added,
            "relations_removed": self.relations_removed, "changes": self.changes[:CHANGES_KEPT],
        }


def relation_id(src_type: str, src_id: str, rel_type: str, dst_type: str, dst_id: str) -> str:
    """The row's identity as a hash: one row per (source, type, target), whatever the run."""
    return hashlib.sha256(f"{src_type}|{src_id}|{rel_type}|{dst_type}|{dst_id}".encode()).hexdigest()[:32]


# ---------------------------------------------------------------------------- links (parse stage)

def link_targets(href: str, relative_path: str, document_url: str) -> tuple[str | None, str | None]:
    """(target_path, target_url) a link can name: a file of the same folder source, relative to the
    source root, or a web page's canonical URL.  Both None for anything else (mail, ftp, a path that
    climbs out of the source, a malformed URL)."""
    href = href.strip()
    scheme = urlsplit(href).scheme.lower()
    if scheme in ("http", "https"):
        try:
            return None, canonical_url(href)
        except (InvalidUrlError, ValueError):
            return None, None
    if scheme and len(scheme) > 1:  # file:, ftp:, ... (a one-letter scheme is a Windows drive: not resolvable)
        return None, None
    if document_url.startswith(("http://", "https://")):  # a relative link on a web page
        try:
            return None, canonical_url(href, document_url)
        except (InvalidUrlError, ValueError):
            return None, None
    path = unquote(href.split("#", 1)[0].split("?", 1)[0]).replace("\\", "/")
    if not path or scheme:
        return None, None
    joined = posixpath.normpath(path.lstrip("/") if path.startswith("/") else
                                posixpath.join(posixpath.dirname(relative_path), path))
    if joined in (".", "") or joined == ".." or joined.startswith("../"):
        return None, None
    return joined, None


def write_links(conn: duckdb.DuckDBPyConnection, doc_id: str, version: int, links: list[DocumentLink]) -> int:
    """Replace the links recorded for one version (idempotent); returns how many were stored."""
    conn.execute("DELETE FROM document_links WHERE doc_id = ? AND version = ?", [doc_id, version])
    if not links:
        return 0
    row = conn.execute("SELECT relative_path, url FROM documents WHERE doc_id = ? AND version = ?",
                       [doc_id, version]).fetchone()
    relative_path, url = (row[0], row[1]) if row else ("", "")
    rows = []
    for index, link in enumerate(links):
        target_path, target_url = link_targets(link.href, relative_path, url)
        rows.append([doc_id, version, index, link.href, link.text, link.page_number, link.char_start, link.char_end,
                     target_path, target_url])
    conn.executemany("INSERT INTO document_links VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return len(rows)


# ---------------------------------------------------------------------------- publish stage

# a live document: its active version, or the latest version of a document superseded by another file
# (a newer version that is pending or failed does not count: the superseded one is still what there is)
_LIVE = """(d.status = 'active'
    OR (d.status = 'superseded' AND d.superseded_by IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM documents n WHERE n.doc_id = d.doc_id AND n.version > d.version
          AND n.status IN ('active', 'superseded', 'deleted'))))"""

_LIVE_DOCUMENTS = f"""
    SELECT d.doc_id, d.version, d.source_id, d.relative_path, coalesce(d.title, ''), d.rev_label, d.modified_at,
           d.status, d.superseded_by,
           CASE WHEN json_type(d.metadata, '$.asset_id') IN ('VARCHAR', 'BIGINT', 'UBIGINT', 'DOUBLE')
                THEN d.metadata ->> '$.asset_id' END AS asset_id,
           CASE WHEN json_type(d.metadata, '$.asset') IN ('VARCHAR', 'BIGINT', 'UBIGINT', 'DOUBLE')
                THEN d.metadata ->> '$.asset' END AS asset
    FROM documents d WHERE {_LIVE}
"""


def derive_missing_labels(conn: duckdb.DuckDBPyConnection) -> int:
    """Labels of versions parsed before migration 6 (``rev_label_source`` NULL), from what the store kept."""
    rows = conn.execute(
        "SELECT doc_id, version, title, metadata, relative_path FROM documents "
        "WHERE rev_label_source IS NULL AND parsed_at IS NOT NULL AND status IN ('active', 'superseded', 'pending')"
    ).fetchall()
    if not rows:
        return 0
    derived: dict[str, list] = {"doc_id": [], "version": [], "rev_label": [], "rev_label_source": []}
    for doc_id, version, title, metadata, relative_path in rows:
        meta = json.loads(metadata) if isinstance(metadata, str) and metadata else (metadata or {})
        label = revision_label(title, meta if isinstance(meta, dict) else {}, relative_path)
        for key, value in (("doc_id", doc_id), ("version", version), ("rev_label", label.label if label else None),
                           ("rev_label_source", label.source if label else "none")):
            derived[key].append(value)
    # one statement, not one per row: an upgraded store of 100k documents pays this once
    conn.register("derived_labels", pa.table(derived, schema=pa.schema([
        ("doc_id", pa.string()), ("version", pa.int32()), ("rev_label", pa.string()), ("rev_label_source", pa.string())])))
    try:
        conn.execute(
            "UPDATE documents SET rev_label = l.rev_label, rev_label_source = l.rev_label_source FROM derived_labels l "
            "WHERE documents.doc_id = l.doc_id AND documents.version = l.version")
    finally:
        conn.unregister("derived_labels")
    return len(rows)


def _live_members(conn: duckdb.DuckDBPyConnection, settings: Settings) -> tuple[list[FamilyMember], list[tuple]]:
    """Live documents with a family key, and (doc_id, version, status, superseded_by) of those without one."""
    pattern = compile_family_pattern(settings.family_id_pattern)
    members: list[FamilyMember] = []
    keyless: list[tuple] = []
    for (doc_id, version, source_id, relative_path, title, rev_label, modified_at, status, superseded_by,
         asset_id, asset) in conn.execute(_LIVE_DOCUMENTS).fetchall():
        metadata = {k: v for k, v in (("asset_id", asset_id), ("asset", asset)) if v is not None}
        key = family_key(title, metadata, relative_path, rev_label, pattern) if settings.revision_families else None
        if key is None:
            keyless.append((doc_id, version, status, superseded_by, relative_path))
            continue
        members.append(FamilyMember(doc_id, version, source_id, relative_path, title, rev_label, modified_at, status,
                                    superseded_by, key))
    return members, keyless


def _member_view(member: FamilyMember) -> dict[str, object]:
    return {"doc_id": member.doc_id, "path": member.relative_path, "title": member.title,
            "rev_label": member.rev_label,
            "modified_at": member.modified_at.isoformat() + "Z" if isinstance(member.modified_at, datetime) else None}


def _reactivate(conn, doc_id: str, version: int, now: datetime, path: str, result: RelationsResult) -> None:
    conn.execute(
        "UPDATE documents SET status = 'active', valid_from = ?, valid_to = NULL, superseded_by = NULL "
        "WHERE doc_id = ? AND version = ?", [now, doc_id, version])
    result.reactivated += 1
    result.changes.append({"doc_id": doc_id, "path": path, "change": "reactivated"})


def resolve_families(
    conn: duckdb.DuckDBPyConnection, settings: Settings, now: datetime, result: RelationsResult
) -> dict[str, dict[str, object]]:
    """Apply supersedence across files (module docstring, rule 2); returns the supersedes rows it derives."""
    members, keyless = _live_members(conn, settings)
    groups: dict[tuple[str, str, str], list[FamilyMember]] = {}
    for member in members:
        groups.setdefault((member.source_id, member.key.kind, member.key.value), []).append(member)
    desired: dict[str, dict[str, object]] = {}
    for doc_id, version, status, _by, path in keyless:
        if status == "superseded":
            _reactivate(conn, doc_id, version, now, path, result)
    for family in groups.values():
        ordered, ordered_by = order_family(family)
        newest = ordered[-1]
        if newest.status == "superseded":
            _reactivate(conn, newest.doc_id, newest.version, now, newest.relative_path, result)
        for older, newer in zip(ordered, ordered[1:]):
            if older.status == "active":
                conn.execute(
                    "UPDATE documents SET status = 'superseded', valid_to = ?, superseded_by = ? "
                    "WHERE doc_id = ? AND version = ?", [now, newer.doc_id, older.doc_id, older.version])
                result.superseded += 1
                result.changes.append({"doc_id": older.doc_id, "path": older.relative_path, "change": "superseded",
                                       "by": newer.doc_id, "by_path": newer.relative_path})
            elif older.superseded_by != newer.doc_id:
                conn.execute("UPDATE documents SET superseded_by = ? WHERE doc_id = ? AND version = ?",
                             [newer.doc_id, older.doc_id, older.version])
            pair_by = ordered_by if ordered_by == "modified_at" or older.rev_label != newer.rev_label else "modified_at"
            key = newer.key
            evidence = {
                "reason": _REASONS[key.kind], "key": key.value, "phrase": key.phrase, "found_in": key.found_in,
                "ordered_by": pair_by, "new": _member_view(newer), "old": _member_view(older),
            }
            confidence = round(key.confidence * (1.0 if pair_by == "rev_label" else 0.8), 3)
            rid = relation_id("document", newer.doc_id, SUPERSEDES, "document", older.doc_id)
            desired[rid] = {"src_type": "document", "src_id": newer.doc_id, "rel_type": SUPERSEDES,
                            "dst_type": "document", "dst_id": older.doc_id, "confidence": confidence,
                            "evidence": evidence}
    return desired


_SEE_ALSO_LINKS = f"""
    WITH live AS (SELECT d.doc_id, d.source_id, d.relative_path FROM documents d WHERE {_LIVE}),
    links AS (
        SELECT l.doc_id AS src, s.source_id, l.link_index, l.href, l.text, l.page_number, l.char_start, l.char_end,
               l.target_path, l.target_url
        FROM document_links l JOIN documents s ON s.doc_id = l.doc_id AND s.version = l.version
        WHERE s.status = 'active'
    ),
    matched AS (
        SELECT links.*, t.doc_id AS dst FROM links JOIN live t
          ON t.source_id = links.source_id AND t.relative_path = links.target_path
        UNION ALL
        SELECT links.*, t.doc_id AS dst FROM links JOIN live t ON t.relative_path = links.target_url
    )
    SELECT src, dst, arg_min(struct_pack(href := href, text := text, page := page_number, span_start := char_start,
                                         span_end := char_end), link_index) AS first_link, count(*) AS links
    FROM matched WHERE src <> dst GROUP BY src, dst ORDER BY src, dst
"""


def see_also_relations(conn: duckdb.DuckDBPyConnection) -> dict[str, dict[str, object]]:
    """seeAlso rows from the links of active documents to other live documents (rule 3)."""
    desired: dict[str, dict[str, object]] = {}
    for src, dst, first, count in conn.execute(_SEE_ALSO_LINKS).fetchall():
        start, end = first["span_start"], first["span_end"]
        evidence: dict[str, object] = {"phrase": first["text"], "page": first["page"],
                                       "span": [start, end] if start is not None else None, "href": first["href"]}
        if count > 1:
            evidence["links"] = int(count)
        rid = relation_id("document", src, SEE_ALSO, "document", dst)
        desired[rid] = {"src_type": "document", "src_id": src, "rel_type": SEE_ALSO, "dst_type": "document",
                        "dst_id": dst, "confidence": 1.0, "evidence": evidence}
    return desired


def store_relations(conn: duckdb.DuckDBPyConnection, desired: dict[str, dict[str, object]], now: datetime,
                    result: RelationsResult) -> None:
    """Make the derived rows of ``relations`` exactly ``desired``: insert new, update changed, delete gone."""
    existing = {
        rid: (confidence, evidence)
        for rid, confidence, evidence in conn.execute(
            "SELECT relation_id, confidence, evidence::VARCHAR FROM relations WHERE list_contains(?, rel_type)",
            [list(DERIVED_REL_TYPES)]).fetchall()
    }
    gone = [rid for rid in existing if rid not in desired]
    if gone:
        conn.execute("DELETE FROM relations WHERE list_contains(?, relation_id)", [gone])
    inserts = []
    for rid, row in desired.items():
        evidence = json.dumps(row["evidence"], sort_keys=True)
        if rid not in existing:
            inserts.append([rid, row["src_type"], row["src_id"], row["rel_type"], row["dst_type"], row["dst_id"],
                            row["confidence"], evidence, now, now])
            continue
        confidence, stored = existing[rid]
        same_evidence = stored is not None and json.loads(stored) == json.loads(evidence)
        if confidence != row["confidence"] or not same_evidence:
            conn.execute("UPDATE relations SET confidence = ?, evidence = ?, updated_at = ? WHERE relation_id = ?",
                         [row["confidence"], evidence, now, rid])
    if inserts:
        conn.executemany("INSERT INTO relations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", inserts)
    result.relations_added, result.relations_removed = len(inserts), len(gone)
    result.supersedes = sum(1 for row in desired.values() if row["rel_type"] == SUPERSEDES)
    result.see_also = sum(1 for row in desired.values() if row["rel_type"] == SEE_ALSO)


def apply_document_model(conn: duckdb.DuckDBPyConnection, settings: Settings, now: datetime) -> RelationsResult:
    """Labels, families and relations for the whole store (call inside the activation transaction)."""
    result = RelationsResult()
    result.labels_derived = derive_missing_labels(conn)
    desired = resolve_families(conn, settings, now, result)
    desired.update(see_also_relations(conn))
    store_relations(conn, desired, now, result)
    return result


def document_model_digest(conn: duckdb.DuckDBPyConnection) -> str:
    """A hash of what the snapshot carries of the document model - labels, validity, supersedence,
    relations and each source's visibility - so a change to any of them (a new link, a relabelled file,
    a source made public) republishes the snapshot even when no chunk changed."""
    row = conn.execute(
        """
        SELECT coalesce(sha256((SELECT string_agg(doc_id || ':' || version || ':' || coalesce(rev_label, '') || ':'
                                                  || coalesce(superseded_by, ''), ',' ORDER BY doc_id, version)
                                FROM documents WHERE status IN ('active', 'superseded'))
                               || '|' || coalesce((SELECT string_agg(relation_id || ':' || confidence || ':'
                                                                     || coalesce(evidence::VARCHAR, ''), ','
                                                                     ORDER BY relation_id) FROM relations), '')
                               || '|' || coalesce((SELECT string_agg(source_id || ':' || coalesce(visibility, 'internal'),
                                                                     ',' ORDER BY source_id) FROM sources), '')), '')
        """
    ).fetchone()
    return row[0][:16]
