"""``GET /api/kb/articles`` (the knowledge-base articles contract): every active document as a knowledge-base article.

What each field is made of:

* ``id`` - the document id (stable across versions); ``title`` - its title (the file
  name when it has none).
* ``url`` - the original, absolute: the page URL for web sources, this server's
  ``/api/knowledge/sources/{id}/file`` link for files.
* ``content`` - the full document text, once.  It comes from the store's
  ``pages`` table (the parser's output, which chunks are exact slices of).  When
  the store cannot be read (another process is writing it) or no longer holds
  that version, it is rebuilt from the snapshot's chunks by their offsets:
  consecutive chunks of a section share trailing sentences, so each chunk adds
  only what lies past the end of the one before.  Concatenating chunks would
  repeat those sentences.
* ``metadata`` - ``intent`` (the document's ``intent``/``intents``, then
  ``tags``/``category`` metadata), ``device`` (``device``/``product`` and their
  plurals), ``last_updated`` (file modification time, else when the version was
  indexed; always present), ``author`` when known, then the document's other
  metadata fields.

Filters: ``intent`` matches an article whose intents contain it or whose title
contains all its words; ``device`` one whose devices contain it (both ignore
case and ``_``/``-``/space differences, so ``not_hashing`` = ``Not hashing``);
``updated_since`` keeps articles updated at or after that moment.  Articles are
ordered newest first, then by title; ``limit`` (default 100) and ``offset``
page through them, ``next_offset`` is where the next page starts.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

import duckdb

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import StoreError
from knowledge_store.storage.store import store_connection

INTENT_KEYS = ("intent", "intents", "tags", "tag", "category", "categories")
DEVICE_KEYS = ("device", "devices", "product", "products")
KB_UNAVAILABLE = {"error": "Internal server error", "message": "Knowledge base unavailable"}

_DOCUMENTS_SQL = """
    SELECT d.doc_id, d.version, d.title, d.doc_type, d.relative_path, d.url, d.metadata::VARCHAR,
           coalesce(d.modified_at, d.valid_from) AS last_updated, s.kind
    FROM documents d LEFT JOIN sources s ON s.source_id = d.source_id
    WHERE EXISTS (SELECT 1 FROM chunks c WHERE c.doc_id = d.doc_id AND c.version = d.version AND c.status = 'active')
    ORDER BY last_updated DESC NULLS LAST, d.title, d.doc_id
"""


def _words(text: str) -> str:
    return " ".join(re.split(r"[\s_\-]+", str(text).lower())).strip()


def _values(meta: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    lowered = {str(k).lower(): v for k, v in meta.items()}
    found: list[str] = []
    for key in keys:
        value = lowered.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, (str, int, float)) and not isinstance(item, bool) and str(item).strip():
                if str(item).strip() not in found:
                    found.append(str(item).strip())
    return found


def iso_utc(moment: datetime | str | None) -> str | None:
    """``2024-12-15T10:00:00Z`` (stored times are naive UTC)."""
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return moment.isoformat(timespec="seconds") + "Z"


def text_from_chunks(chunks: list[tuple[int | None, int | None, int, int, str]]) -> str:
    """A document's text from its chunks ``(page_start, page_end, char_start, char_end, text)`` in order.

    A chunk's text is the exact slice of its pages between its offsets (pieces of
    several pages joined by a blank line), so the part a chunk shares with the one
    before is its first ``end_before - char_start`` characters; a chunk that starts
    past that end (a new section or page) follows after a blank line."""
    parts: list[str] = []
    end: tuple[int, int] | None = None  # (page, char) covered so far
    for page_start, page_end, char_start, char_end, text in chunks:
        first = page_start if page_start is not None else 1
        last = page_end if page_end is not None else first
        if end is not None and (last, char_end) <= end:
            continue  # wholly inside what is already there
        if end is not None and first == end[0] and char_start < end[1]:
            parts.append(text[end[1] - char_start:])
        else:
            if parts:
                parts.append("\n\n")
            parts.append(text)
        end = max(end, (last, char_end)) if end is not None else (last, char_end)
    return "".join(parts).strip()


def _from_store(settings: Settings, keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """Page texts of these document versions from the store (empty when it cannot be read now)."""
    if not keys or not settings.store_path.exists():
        return {}
    wanted = set(keys)
    doc_ids = sorted({doc_id for doc_id, _ in keys})
    pages: dict[tuple[str, int], list[str]] = {}
    try:
        with store_connection(settings.store_path, read_only=True, timeout_s=1.0) as conn:
            rows = conn.execute(
                f"SELECT doc_id, version, text FROM pages WHERE doc_id IN ({', '.join(['?'] * len(doc_ids))}) "
                "ORDER BY doc_id, version, page_number", doc_ids).fetchall()
    except (StoreError, duckdb.Error):  # busy (another process syncs) or unreadable: the snapshot has the text too
        return {}
    for doc_id, version, text in rows:
        if (doc_id, version) in wanted:
            pages.setdefault((doc_id, version), []).append(text.strip())
    return {key: "\n\n".join(t for t in texts if t) for key, texts in pages.items()}


def _from_snapshot(snapshot, keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    if not keys:
        return {}
    wanted = set(keys)
    doc_ids = sorted({doc_id for doc_id, _ in keys})
    cursor = snapshot.conn.cursor()
    try:
        rows = cursor.execute(
            "SELECT doc_id, version, page_start, page_end, char_start, char_end, text FROM chunks "
            f"WHERE status = 'active' AND doc_id IN ({', '.join(['?'] * len(doc_ids))}) "
            "ORDER BY doc_id, version, chunk_index", doc_ids).fetchall()
    finally:
        cursor.close()
    chunks: dict[tuple[str, int], list] = {}
    for doc_id, version, *rest in rows:
        if (doc_id, version) in wanted:
            chunks.setdefault((doc_id, version), []).append(tuple(rest))
    return {key: text_from_chunks(items) for key, items in chunks.items()}


def contents(settings: Settings, snapshot, keys: list[tuple[str, int]]) -> tuple[dict[tuple[str, int], str], str]:
    """Full texts of these document versions and where they came from (``pages``, ``chunks`` or both)."""
    texts = _from_store(settings, keys)
    missing = [key for key in keys if key not in texts]
    if missing:
        texts.update(_from_snapshot(snapshot, missing))
    source = "chunks" if len(missing) == len(keys) and keys else "pages+chunks" if missing else "pages"
    return texts, source


def list_articles(settings: Settings, snapshot, base_url: str, *, intent: str | None = None, device: str | None = None,
                  updated_since: datetime | None = None, limit: int = 100, offset: int = 0) -> dict[str, Any]:
    if updated_since is not None and updated_since.tzinfo is not None:
        updated_since = updated_since.astimezone(timezone.utc).replace(tzinfo=None)
    cursor = snapshot.conn.cursor()
    try:
        rows = cursor.execute(_DOCUMENTS_SQL).fetchall()
    finally:
        cursor.close()
    published = iso_utc(snapshot.info.created_at)
    wanted_intent = _words(intent) if intent and intent.strip() else None
    wanted_device = _words(device) if device and device.strip() else None
    matches: list[dict[str, Any]] = []
    for doc_id, version, title, doc_type, relative, url, metadata, updated, kind in rows:
        meta = json.loads(metadata) if metadata else {}
        meta = meta if isinstance(meta, dict) else {}
        intents, devices = _values(meta, INTENT_KEYS), _values(meta, DEVICE_KEYS)
        title = title or relative.rsplit("/", 1)[-1]
        if wanted_intent and wanted_intent not in {_words(i) for i in intents} \
                and not set(wanted_intent.split()) <= set(_words(re.sub(r"[^\w\s-]", " ", title)).split()):
            continue
        if wanted_device and wanted_device not in {_words(d) for d in devices}:
            continue
        if updated_since is not None and updated is not None and updated < updated_since:
            continue
        last_updated = iso_utc(updated) or published
        link = url if (kind == "web" or re.match(r"^https?://", url or "")) else f"{base_url}/api/knowledge/sources/{doc_id}/file"
        extra = {k: v for k, v in meta.items() if k not in ("intent", "device", "last_updated", "author", "title")}
        article_meta = {**extra, "intent": intents, "device": devices, "last_updated": last_updated}
        if isinstance(meta.get("author"), str) and meta["author"].strip():
            article_meta["author"] = meta["author"].strip()
        matches.append({"id": doc_id, "title": title, "url": link, "metadata": article_meta,
                        # additions to the contract (clients of the first version read these)
                        "article_id": doc_id, "version": version, "type": doc_type, "path": relative,
                        "last_updated": last_updated})
    page = matches[offset: offset + limit]
    texts, source = contents(settings, snapshot, [(a["id"], a["version"]) for a in page])
    articles = [{**a, "content": texts.get((a["id"], a["version"]), "")} for a in page]
    return {"articles": articles, "total": len(matches), "updated_at": published, "limit": limit, "offset": offset,
            "next_offset": offset + limit if offset + limit < len(matches) else None, "content_source": source}
