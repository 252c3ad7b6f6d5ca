"""Query filters, applied as a boolean mask over the snapshot's rows.

Filters are evaluated once per *document* (there are few) and broadcast to its
chunks, so a filter costs microseconds and - unlike a post-filter on an
approximate index - never returns fewer than k results when k exist.  The
``entities`` filter is the one chunk-level field: it reads the snapshot's
per-entity row lists (loaded once), so it is just as cheap.
"""

from __future__ import annotations

import fnmatch
from collections import OrderedDict
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot

# a single value is taken as a one-item list (``_listify``); the schema says so
OneOrMany = Annotated[list[str], WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})]


class SearchFilters(BaseModel):
    """Restrict a query. Every given field must match (AND); list values are OR within the field.

    - ``sources``: source names or ids (``groundwork status`` lists them).
    - ``doc_ids``: document ids.
    - ``paths``: file paths: absolute, relative to their source, or a glob
      (``manuals/*.pdf``) - "answer only from this document/chapter".  With ``visibility``
      set (every search of the public surface) only paths relative to their source.
    - ``metadata``: document metadata (Markdown front matter, PDF/DOCX properties),
      e.g. ``{"product": "aurora-hub"}``; a list-valued field (``tags``) matches
      when it contains the value; comparison is case-insensitive.
    - ``entities``: entity values such as ``SOP-42``, ``ASSET-104``, ``API 510``
      (``knowledge_store.core.entities``); matches the *chunks* that mention any of them.
      Chunk-level on purpose: "passages about ASSET-104" is what an identifier
      filter means, and it is what a result's entity chip offers; to keep a whole
      document use ``doc_ids`` or ``paths``.  Values are read with the same patterns
      as chunk text, so ``api-510``, ``API510`` and ``API 510`` are one value; a value
      no pattern recognises is compared with the canonical values case-insensitively
      (a configured type's values), and one naming no known entity matches nothing.
    - ``include_superseded``: also search versions replaced by a newer one
      (kept until the retention purge); default latest only.
    - ``visibility``: only documents of sources with this visibility (``public``,
      ``internal``).  The server sets it to ``public`` for every caller of its public
      surface (no admin token), whatever the request said: that is what keeps internal
      documents out of the widget's answers.
    """

    model_config = ConfigDict(extra="forbid")

    sources: OneOrMany = Field(default_factory=list)
    doc_ids: OneOrMany = Field(default_factory=list)
    paths: OneOrMany = Field(default_factory=list)
    metadata: dict[str, str | list[str]] = Field(default_factory=dict)
    entities: OneOrMany = Field(default_factory=list, description="Entity values (SOP-42, ASSET-104, API 510; any "
                                "spelling): only passages mentioning one of them.")
    include_superseded: bool = Field(False, strict=True)
    visibility: list[Literal["public", "internal"]] = Field(
        default_factory=list, description="Only documents of sources with this visibility (public, internal); "
        "callers without the admin token always get public.")

    @field_validator("sources", "doc_ids", "paths", "entities", "visibility", mode="before")
    @classmethod
    def _listify(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @property
    def selects_documents(self) -> bool:
        """A document-level field is set: the mask is computed per document (``document_matches``)."""
        return bool(self.sources or self.doc_ids or self.paths or self.metadata or self.visibility)

    def public_only(self) -> SearchFilters:
        """These filters on the public surface: the same restrictions, over public sources only."""
        return self.model_copy(update={"visibility": ["public"]})

    def key(self) -> str:
        return self.model_dump_json()


def _matches_metadata(doc_meta: dict, wanted: dict[str, str | list[str]]) -> bool:
    lowered = {str(k).lower(): v for k, v in doc_meta.items()}
    for key, expected in wanted.items():
        actual = lowered.get(key.lower())
        if actual is None:
            return False
        options = [expected] if isinstance(expected, str) else list(expected)
        options = [str(o).lower() for o in options]
        values = actual if isinstance(actual, list) else [actual]
        if not any(str(v).lower() in options for v in values):
            return False
    return True


def _matches_path(doc: dict, patterns: list[str], relative_only: bool = False) -> bool:
    path, relative = doc["path"], doc["relative_path"]
    if relative_only:
        path = relative
    for pattern in patterns:
        if pattern in (path, relative) or path.endswith("/" + pattern.lstrip("/")):
            return True
        if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(path, pattern):
            return True
    return False


def document_matches(doc: dict, filters: SearchFilters) -> bool:
    if filters.visibility and doc.get("visibility", "internal") not in filters.visibility:
        return False
    if filters.sources and doc["source_name"] not in filters.sources and doc["source_id"] not in filters.sources:
        return False
    if filters.doc_ids and doc["doc_id"] not in filters.doc_ids:
        return False
    # scoped to visibilities (every public search), a document is named as the public surface names it: by its
    # path relative to its source; its place on the server's disk is no criterion there (nor an oracle for it)
    if filters.paths and not _matches_path(doc, filters.paths, relative_only=bool(filters.visibility)):
        return False
    if filters.metadata and not _matches_metadata(doc["metadata"], filters.metadata):
        return False
    return True


class MaskCache:
    """Masks per (snapshot version, visibility view, filter) - the same filter on the same snapshot is free."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._cache: OrderedDict[tuple[int, tuple[str, ...] | None, str], np.ndarray] = OrderedDict()

    def mask(self, snapshot: LoadedSnapshot, filters: SearchFilters | None) -> np.ndarray:
        filters = filters or SearchFilters()
        key = (snapshot.info.snapshot_version, snapshot.view_of, filters.key())
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        base = np.ones(snapshot.size, dtype=bool) if filters.include_superseded else snapshot.active.copy()
        if not filters.selects_documents:
            mask = base
        else:
            allowed = np.array([document_matches(doc, filters) for doc in snapshot.documents], dtype=bool)
            mask = base & (allowed[snapshot.doc_index] if len(allowed) else np.zeros(snapshot.size, dtype=bool))
        if filters.entities:
            mask = mask & snapshot.entity_mask(filters.entities)
        mask.setflags(write=False)
        self._cache[key] = mask
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return mask
