"""An index snapshot loaded for serving: BM25 postings and the vector matrix in memory.

Why not ``fts_main_chunks.match_bm25`` per query: the fts macro is evaluated once
per row (it is correlated on the document name), and at 100k chunks a single
15-word query exhausted 24 GB of RAM on this machine.  The fts extension still
does the work that defines BM25 here - tokenising, stemming, stopwords, the
term dictionary, document frequencies and lengths - and the snapshot stores its
term index aggregated (``bm25_postings``).  The reader scores with exactly the
fts formula (k1 = 1.2, b = 0.75, idf = log10((N - df + 0.5) / (df + 0.5) + 1)) in
NumPy; ``tests/integration/test_retrieval.py`` checks the scores equal ``match_bm25``'s.

Vectors: exact cosine by one matrix-vector product over L2-normalised float32
rows (see docs/ARCHITECTURE.md for the measurements behind this choice).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from knowledge_store.core.entities import DEFAULT_VOCABULARY, EntityRef, EntityVocabulary, entity_key
from knowledge_store.retrieval import ann
from knowledge_store.retrieval.sentences import SentenceIndex, sentence_index_from
from knowledge_store.retrieval.types import SearchHit
from knowledge_store.storage.index import FTS_IGNORE, SnapshotInfo, open_snapshot, read_pointer

_FTS_SPLIT = re.compile(FTS_IGNORE)
BM25_K1 = 1.2
BM25_B = 0.75


def bm25_idf(n: float, df: np.ndarray) -> np.ndarray:
    """The fts idf: log10((N - df + 0.5) / (df + 0.5) + 1) (DuckDB's log() is base 10)."""
    return np.log10((n - df + 0.5) / (df + 0.5) + 1.0)


def bm25_norm(length: np.ndarray | float, avgdl: float) -> np.ndarray | float:
    """The length normalisation k1 * (1 - b + b * len / avgdl)."""
    return BM25_K1 * (1.0 - BM25_B + BM25_B * length / avgdl)


def bm25_term(idf, tf: np.ndarray, norm) -> np.ndarray:
    """One term's BM25 contribution: idf * tf * (k1 + 1) / (tf + norm)."""
    return idf * tf * (BM25_K1 + 1.0) / (tf + norm)


QUERY_ENTITY_CACHE = 256  # queries whose entity rows a snapshot remembers


@dataclass
class QueryTerms:
    """The fts view of a query: stemmed terms found in the dictionary, and the rest."""

    termids: np.ndarray
    idf: np.ndarray
    known: list[str]
    unknown: list[str]
    # the query's words (its tokens, as written but lower-cased) whose stem is unknown: what a response can name as
    # "no document mentions"
    unknown_words: list[str] = field(default_factory=list)

    @property
    def total_weight(self) -> float:
        """idf mass of the whole query; unknown terms weigh as much as the rarest term."""
        return float(self.idf.sum()) + len(self.unknown) * (float(self.idf.max()) if len(self.idf) else 1.0)


@dataclass
class LoadedSnapshot:
    info: SnapshotInfo
    path: Path
    conn: object  # duckdb connection, read-only; only used through cursors
    chunk_ids: list[str]
    row_of: dict[str, int]
    doc_ids: np.ndarray  # object array, per row
    doc_index: np.ndarray  # int32 per row: index into ``documents``
    active: np.ndarray  # bool per row
    embeddings: np.ndarray  # (n, dim) float32, L2-normalised
    doc_len: np.ndarray  # float32 per row (fts token count)
    avgdl: float
    num_docs: int
    term_ptr: np.ndarray  # int64 (n_terms + 1): postings of termid t are [ptr[t], ptr[t+1])
    post_rows: np.ndarray  # int32 row per posting
    post_tf: np.ndarray  # float32 term frequency per posting
    df: np.ndarray  # int64 per termid
    term_ids: dict[str, int]
    records: object  # pyarrow Table of every chunk's citation fields and text, row-aligned
    documents: list[dict]  # per doc index: doc_id, version, source_id, source_name, visibility, path, relative_path, title, metadata
    stopwords: frozenset[str] = frozenset()
    sections: "SectionIndex | None" = None
    # each row's sentences embedded alone (retrieval/sentences.py); None when the snapshot was built without them
    sentence_index: SentenceIndex | None = None
    post_norm: np.ndarray | None = None  # float32 per chunk posting: bm25_norm of its row, derived below
    phrase_text_cache: dict = field(default_factory=dict)  # row -> normalised (own, pair) texts, see evidence.py
    normalised_text_cache: dict = field(default_factory=dict)  # row -> normalised text
    # query text -> query_entity_rows: a query's entities are asked for by query_form and the entity boost alike
    query_entity_cache: dict = field(default_factory=dict)
    _stems: dict[str, str] = field(default_factory=dict)
    load_seconds: float = 0.0
    # approximate vector index (ann.py): None = exact search; set by SnapshotManager once built or loaded
    ann: object | None = None
    ann_ready: threading.Event = field(default_factory=threading.Event)  # set when the ANN is attached or given up
    ann_cancel: threading.Event = field(default_factory=threading.Event)  # set when this snapshot is retired
    ann_error: str | None = None
    # the document model's relations between documents (index.py copies the store's ``relations`` table): every row, and
    # per doc_id the ids it supersedes / is superseded by / links to (seeAlso) / is linked from
    relations: list[dict] = field(default_factory=list)
    doc_relations: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # entities (knowledge_store/core/entities.py): sparse, most chunks mention none
    entity_vocabulary: EntityVocabulary = DEFAULT_VOCABULARY  # the patterns that extracted this snapshot's mentions
    row_entities: dict[int, list[EntityRef]] = field(default_factory=dict)  # row -> entities, first mention first
    entity_rows: dict[str, np.ndarray] = field(default_factory=dict)  # entity_key(canonical value) -> sorted rows
    # the visibilities this snapshot is the view of (``visibility_view``); None: the whole published snapshot
    view_of: tuple[str, ...] | None = None
    views: dict = field(default_factory=dict)  # visibilities -> its view, built once (``view``)
    ann_config: object | None = None  # how SnapshotManager builds its ANN graphs (views of enough rows get one too)
    _view_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.post_norm is None:  # derived once, so scoring a term gathers no lengths
            self.post_norm = bm25_norm(self.doc_len[self.post_rows], self.avgdl).astype(np.float32) \
                if len(self.post_rows) else np.zeros(0, dtype=np.float32)

    @property
    def size(self) -> int:
        return len(self.chunk_ids)

    def view(self, visibility: list[str] | tuple[str, ...]) -> LoadedSnapshot:
        """This snapshot as if it held only the documents of sources with one of ``visibility`` (built on first
        use, then kept): what a search filtered by visibility - every search of the public surface - runs on.
        Itself when every document qualifies."""
        key = tuple(sorted(set(visibility)))
        found = self.views.get(key)
        if found is None:
            with self._view_lock:
                found = self.views.get(key)
                if found is None:
                    found = self.views[key] = visibility_view(self, key)
        return found

    # ------------------------------------------------------------------ BM25
    def query_terms(self, query: str) -> QueryTerms:
        """Tokenise and stem exactly as the fts index did.

        ASCII queries are split in Python with the fts ``tokenize`` rule (lower case,
        ``(\\.|[^a-z0-9_])+`` -> space) and stemmed through a cache filled by DuckDB's own
        ``stem(_, 'porter')``, so a repeated word costs a dict lookup instead of a
        DuckDB round trip; anything else goes through the fts macro itself.
        """
        if query.isascii():
            tokens = list(dict.fromkeys(_FTS_SPLIT.sub(" ", query.lower()).split()))
            stemmed = list(zip(tokens, self.stem_tokens(tokens)))
        else:
            cursor = self.conn.cursor()
            try:
                stemmed = cursor.execute(
                    "SELECT t, stem(t, 'porter') FROM (SELECT unnest(fts_main_chunks.tokenize(?)) AS t)", [query]
                ).fetchall()
            finally:
                cursor.close()
        stems = list(dict.fromkeys(stem for _, stem in stemmed if stem))
        known = [s for s in stems if s in self.term_ids]
        unknown = [s for s in stems if s not in self.term_ids and s not in self.stopwords]
        missing = set(unknown)
        unknown_words = list(dict.fromkeys(token for token, stem in stemmed if stem in missing))
        termids = np.array([self.term_ids[s] for s in known], dtype=np.int64)
        df = self.df[termids].astype(np.float64) if len(termids) else np.zeros(0)
        return QueryTerms(termids=termids, idf=bm25_idf(self.num_docs, df), known=known, unknown=unknown,
                          unknown_words=unknown_words)

    def stem_tokens(self, tokens: list[str]) -> list[str]:
        """Porter stems of fts tokens (lower-cased, split by the fts rule), one per token ("" when empty),
        through a cache filled by DuckDB's own ``stem``: a repeated word costs a dict lookup."""
        missing = [t for t in dict.fromkeys(tokens) if t not in self._stems]
        if missing:
            cursor = self.conn.cursor()
            try:
                for token, stemmed in cursor.execute(
                    "SELECT t, stem(t, 'porter') FROM (SELECT unnest(?::VARCHAR[]) AS t)", [missing]
                ).fetchall():
                    self._stems[token] = stemmed or ""
            finally:
                cursor.close()
        return [self._stems[t] for t in tokens]

    def bm25_scores(self, terms: QueryTerms) -> tuple[np.ndarray, np.ndarray]:
        """(scores, idf coverage) for every row; coverage = idf mass of query terms present."""
        scores = np.zeros(self.size, dtype=np.float32)
        coverage = np.zeros(self.size, dtype=np.float32)
        for termid, idf in zip(terms.termids, terms.idf):
            start, end = self.term_ptr[termid], self.term_ptr[termid + 1]
            if start == end:
                continue
            rows = self.post_rows[start:end]
            tf = self.post_tf[start:end]
            scores[rows] += bm25_term(np.float32(idf), tf, self.post_norm[start:end])
            coverage[rows] += idf
        return scores, coverage

    def section_bm25_scores(self, terms: QueryTerms) -> np.ndarray:
        """BM25 of each row's *section* (its run of chunks under one heading), broadcast to the rows.

        A short answer section and a long reference page should compete as
        wholes: chunk-level BM25 hands a long page one lottery ticket per chunk
        and splits a section's evidence across chunk borders.
        """
        sections = self.sections
        if sections is None or not len(terms.termids):
            return np.zeros(self.size, dtype=np.float32)
        return sections.scores(terms.termids)[sections.group]

    # --------------------------------------------------------------- entities
    def entity_mask(self, values: list[str]) -> np.ndarray:
        """Rows whose chunk mentions any of ``values``, each read with the snapshot's vocabulary
        ("api-510" = "API 510"); a value naming no known entity matches nothing."""
        mask = np.zeros(self.size, dtype=bool)
        for value in values:
            for key in self.entity_vocabulary.filter_keys(value):
                rows = self.entity_rows.get(key)
                if rows is not None:
                    mask[rows] = True
        return mask

    def query_entity_rows(self, query: str) -> list[np.ndarray]:
        """For each distinct entity the query names that some chunk mentions: the rows mentioning it.

        Remembered for the last ``QUERY_ENTITY_CACHE`` queries: one search asks twice (its alpha by
        ``query_form``, then the entity boost), and the patterns are the costly part."""
        cache = self.query_entity_cache
        found = cache.get(query)
        if found is None:
            keys = dict.fromkeys(entity_key(m.canonical_value) for m in self.entity_vocabulary.extract(query))
            found = [self.entity_rows[k] for k in keys if k in self.entity_rows]
            if len(cache) >= QUERY_ENTITY_CACHE:
                try:  # the oldest query first (dicts keep insertion order); another request may evict it first
                    cache.pop(next(iter(cache)), None)
                except (RuntimeError, StopIteration):
                    pass
            cache[query] = found
        return found

    def term_rows(self, termid: int) -> np.ndarray:
        """The rows whose chunk holds the term ``termid``, sorted (its BM25 postings)."""
        return np.sort(self.post_rows[self.term_ptr[termid]:self.term_ptr[termid + 1]].astype(np.int64))

    # ---------------------------------------------------------------- vectors
    def vector_scores(self, query_vector: np.ndarray) -> np.ndarray:
        return self.embeddings @ query_vector.astype(np.float32)

    # ------------------------------------------------------------------ rows
    def hits_for_rows(self, rows: list[int]) -> list[SearchHit]:
        """Full chunk records for the given rows, in the given order (from memory, no I/O)."""
        if not len(rows):
            return []
        records = self.records.take(np.asarray(rows, dtype=np.int64)).to_pylist()
        hits: list[SearchHit] = []
        for row, r in zip(rows, records):
            metadata = r["metadata"]
            metadata = json.loads(metadata) if isinstance(metadata, str) and metadata else (metadata or {})
            updated = r["last_updated"]
            hits.append(
                SearchHit(
                    chunk_id=r["chunk_id"], doc_id=r["doc_id"], version=r["version"], title=r["title"] or "",
                    section=r["section"] or "", section_path=tuple(r["section_path"] or ()), page_start=r["page_start"],
                    page_end=r["page_end"], url=r["url"], source_path=r["source_path"], source_id=r["source_id"],
                    text=r["text"], doc_type=r["doc_type"] or "", metadata=metadata,
                    last_updated=(updated.isoformat() + "Z") if updated is not None else None, status=r["status"],
                    content_hash=r["content_hash"], ocr=bool(r["ocr"]), ocr_confidence=r["ocr_confidence"],
                    low_confidence_ocr=bool(r["low_confidence_ocr"]), needs_review=bool(r["needs_review"]),
                    **self._revision_fields(r),
                    entities=list(self.row_entities.get(int(row), ())), row=int(row),
                )
            )
        return hits

    def _revision_fields(self, record: dict) -> dict:
        """A hit's document-model fields: revision label, validity (ISO-8601 UTC) and related documents."""
        related = self.doc_relations.get(record["doc_id"], {})
        valid_from, valid_to = record.get("valid_from"), record.get("valid_to")
        superseded_by = record.get("superseded_by") or next(iter(related.get("superseded_by", ())), None)
        return {
            "rev_label": record.get("rev_label"),
            "valid_from": valid_from.isoformat() + "Z" if valid_from is not None else None,
            "valid_to": valid_to.isoformat() + "Z" if valid_to is not None else None,
            "superseded_by": superseded_by if record["status"] != "active" else None,
            "supersedes": list(related.get("supersedes", ())),
            "see_also": list(related.get("see_also", ())),
        }

    def neighbours(self, chunk_id: str, before: int = 1, after: int = 1) -> list[dict]:
        """The chunk and its neighbours in the same document version, in order."""
        cursor = self.conn.cursor()
        try:
            cur = cursor.execute(
                """
                WITH me AS (SELECT doc_id, version, chunk_index FROM chunks WHERE chunk_id = ?)
                SELECT c.chunk_id, c.chunk_index, c.text, c.section, c.page_start, c.page_end, c.url
                FROM chunks c, me
                WHERE c.doc_id = me.doc_id AND c.version = me.version
                  AND c.chunk_index BETWEEN me.chunk_index - ? AND me.chunk_index + ?
                ORDER BY c.chunk_index
                """,
                [chunk_id, before, after],
            )
            columns = [d[0] for d in cur.description]
            return [dict(zip(columns, row)) for row in cur.fetchall()]
        finally:
            cursor.close()

    def close(self) -> None:
        self.ann_cancel.set()
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - closing a read-only handle cannot lose data
            pass


# a section longer than this many chunks is split into runs (a 300-page PDF with no headings is not one "section")
SECTION_MAX_CHUNKS = 16


@dataclass
class SectionIndex:
    """Rows grouped into sections (consecutive chunks of one document version under one heading path),
    with BM25 postings aggregated per section and each section's lead (first) row.

    Built in memory from the chunk postings at snapshot load (no file format
    change): the section's term frequency is the sum over its chunks, its
    length the sum of their lengths, idf counts sections.
    """

    group: np.ndarray  # int32 per row: section number
    lead_row: np.ndarray  # int64 per section: its first row
    term_ptr: np.ndarray  # int64 (n_terms + 1)
    post_groups: np.ndarray  # int32 per posting
    post_tf: np.ndarray  # float32 per posting
    df: np.ndarray  # float64 per termid: sections containing the term
    length: np.ndarray  # float32 per section
    avgdl: float
    post_norm: np.ndarray | None = None  # float32 per posting: bm25_norm of its section, derived below

    def __post_init__(self) -> None:
        if self.post_norm is None:
            self.post_norm = bm25_norm(self.length[self.post_groups], self.avgdl).astype(np.float32)

    def idf(self, termids: np.ndarray) -> np.ndarray:
        """idf of each term over sections (a section counts once however many of its chunks hold it)."""
        return bm25_idf(float(self.count), self.df[termids])

    @property
    def count(self) -> int:
        return len(self.lead_row)

    def rows(self, section: int) -> np.ndarray:
        """The rows of ``section`` (a run of consecutive rows, from its lead to the next section's)."""
        end = int(self.lead_row[section + 1]) if section + 1 < self.count else len(self.group)
        return np.arange(int(self.lead_row[section]), end, dtype=np.int64)

    def scores(self, termids: np.ndarray) -> np.ndarray:
        out = np.zeros(self.count, dtype=np.float32)
        for termid, idf in zip(termids, self.idf(termids)):
            start, end = self.term_ptr[termid], self.term_ptr[termid + 1]
            if start == end:
                continue
            tf = self.post_tf[start:end]
            out[self.post_groups[start:end]] += bm25_term(np.float32(idf), tf, self.post_norm[start:end])
        return out


def section_groups(doc_index: np.ndarray, section_paths: list, max_chunks: int = SECTION_MAX_CHUNKS) -> np.ndarray:
    """Section number per row; rows are in (document version, chunk order) order in a snapshot."""
    group = np.zeros(len(doc_index), dtype=np.int32)
    current = -1
    previous: tuple | None = None
    run = 0
    for row, (doc, path) in enumerate(zip(doc_index.tolist(), section_paths)):
        key = (doc, tuple(path or ()))
        if key != previous or run >= max_chunks:
            current += 1
            previous, run = key, 0
        run += 1
        group[row] = current
    return group


def build_section_index(group: np.ndarray, doc_len: np.ndarray, term_ptr: np.ndarray, post_rows: np.ndarray,
                        post_tf: np.ndarray) -> SectionIndex:
    n_groups = int(group.max()) + 1 if len(group) else 0
    n_terms = len(term_ptr) - 1
    rows = np.arange(len(group), dtype=np.int64)
    # rows of a section are consecutive, so its lead is where the section number changes
    first = np.ones(len(group), dtype=bool)
    first[1:] = group[1:] != group[:-1]
    lead_row = rows[first]
    length = np.bincount(group, weights=doc_len, minlength=n_groups).astype(np.float32)
    if len(post_rows):
        post_terms = np.repeat(np.arange(n_terms, dtype=np.int64), np.diff(term_ptr))
        valid = post_rows >= 0
        keys = post_terms[valid] * max(n_groups, 1) + group[post_rows[valid]].astype(np.int64)
        unique, inverse = np.unique(keys, return_inverse=True)
        tf = np.bincount(inverse, weights=post_tf[valid]).astype(np.float32)
        terms_of = unique // max(n_groups, 1)
        groups_of = (unique % max(n_groups, 1)).astype(np.int32)
        counts = np.bincount(terms_of, minlength=n_terms)
        ptr = np.zeros(n_terms + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(counts)
        df = counts.astype(np.float64)
    else:
        ptr, groups_of, tf, df = np.zeros(n_terms + 1, dtype=np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(n_terms)
    avgdl = float(length.mean()) if n_groups else 1.0
    return SectionIndex(group=group, lead_row=lead_row, term_ptr=ptr, post_groups=groups_of, post_tf=tf, df=df,
                        length=length, avgdl=avgdl or 1.0)


def _ocr_columns(conn) -> str:
    """The OCR marks to load; snapshots published before OCR existed have none (not OCR'd)."""
    columns = {row[0] for row in conn.execute("SELECT column_name FROM (DESCRIBE chunks)").fetchall()}
    if {"ocr", "ocr_confidence"} <= columns:
        return "ocr, ocr_confidence"
    return "FALSE AS ocr, NULL::DOUBLE AS ocr_confidence"


def _review_columns(conn) -> str:
    """The low-confidence OCR marks; snapshots published before regions were kept have none (nothing flagged)."""
    columns = {row[0] for row in conn.execute("SELECT column_name FROM (DESCRIBE chunks)").fetchall()}
    if {"low_confidence_ocr", "needs_review"} <= columns:
        return "low_confidence_ocr, needs_review"
    return "FALSE AS low_confidence_ocr, FALSE AS needs_review"


REVISION_COLUMNS = ("rev_label", "valid_from", "valid_to", "superseded_by")


def _visibility_column(conn) -> str:
    """Each source's visibility; snapshots published before it existed (store migration 8) say internal, so
    the public surface serves nothing from them until the next publish (which their fingerprint triggers)."""
    columns = {row[0] for row in conn.execute("SELECT column_name FROM (DESCRIBE sources)").fetchall()}
    return "coalesce(s.visibility, 'internal')" if "visibility" in columns else "'internal'"


def _revision_columns(conn, prefix: str = "") -> str:
    """The document model's fields; snapshots published before them (store migration 6) have none."""
    columns = {row[0] for row in conn.execute("SELECT column_name FROM (DESCRIBE chunks)").fetchall()}
    if set(REVISION_COLUMNS) <= columns:
        return ", ".join(prefix + name for name in REVISION_COLUMNS)
    return ("NULL::VARCHAR AS rev_label, NULL::TIMESTAMP AS valid_from, NULL::TIMESTAMP AS valid_to, "
            "NULL::VARCHAR AS superseded_by")


def load_relations(conn) -> tuple[list[dict], dict[str, dict[str, list[str]]]]:
    """The snapshot's relations (none in snapshots published before them), and per document the ids
    each kind of relation names: supersedes / superseded_by / see_also / linked_from."""
    tables = {row[0] for row in conn.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
    if "relations" not in tables:
        return [], {}
    cursor = conn.execute("SELECT relation_id, src_type, src_id, rel_type, dst_type, dst_id, confidence, evidence, "
                          "created_at FROM relations ORDER BY src_id, rel_type, dst_id")
    names = [d[0] for d in cursor.description]
    rows: list[dict] = []
    for values in cursor.fetchall():
        row = dict(zip(names, values))
        row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
        row["created_at"] = row["created_at"].isoformat() + "Z" if row["created_at"] is not None else None
        rows.append(row)
    return rows, relations_by_document(rows)


def relations_by_document(rows: list[dict]) -> dict[str, dict[str, list[str]]]:
    """Per document, the ids each kind of relation of ``rows`` names: supersedes / superseded_by / see_also /
    linked_from."""
    per_doc: dict[str, dict[str, list[str]]] = {}
    outgoing = {"supersedes": "supersedes", "seeAlso": "see_also"}
    incoming = {"supersedes": "superseded_by", "seeAlso": "linked_from"}
    for row in rows:
        if row["rel_type"] in outgoing:
            per_doc.setdefault(row["src_id"], {}).setdefault(outgoing[row["rel_type"]], []).append(row["dst_id"])
            per_doc.setdefault(row["dst_id"], {}).setdefault(incoming[row["rel_type"]], []).append(row["src_id"])
    return per_doc


def document_relations(snapshot: LoadedSnapshot, doc_id: str) -> dict | None:
    """One document with every relation naming it (``GET /api/knowledge/documents/{doc_id}/relations``),
    or None when the snapshot knows neither the document nor a relation of it.  The document is its
    active version when it has one, else its latest version in the snapshot."""
    versions: dict[str, dict] = {}
    for doc in snapshot.documents:  # per doc_id: the active version, else the latest
        held = versions.get(doc["doc_id"])
        if held is None or (held["status"] != "active" and (doc["status"] == "active" or doc["version"] > held["version"])):
            versions[doc["doc_id"]] = doc
    rows = [row for row in snapshot.relations if doc_id in (row["src_id"], row["dst_id"])]
    doc = versions.get(doc_id)
    if doc is None and not rows:
        return None

    def brief(other_id: str) -> dict | None:
        other = versions.get(other_id)
        if other is None:
            return None
        return {"doc_id": other_id, "title": other["title"], "path": other["relative_path"], "status": other["status"],
                "rev_label": other.get("rev_label")}

    relations = [{**row, "direction": "outgoing" if row["src_id"] == doc_id else "incoming",
                  "other": brief(row["dst_id"] if row["src_id"] == doc_id else row["src_id"])} for row in rows]
    doc = doc or {}
    return {
        "doc_id": doc_id, "title": doc.get("title", ""), "path": doc.get("relative_path", ""),
        "status": doc.get("status", "gone"), "rev_label": doc.get("rev_label"), "valid_from": doc.get("valid_from"),
        "valid_to": doc.get("valid_to"), "superseded_by": doc.get("superseded_by"), "relations": relations,
        "snapshot_version": snapshot.info.snapshot_version,
    }


def load_entities(conn, row_of: dict[str, int]) -> tuple[EntityVocabulary, dict[int, list[EntityRef]], dict[str, np.ndarray]]:
    """(vocabulary, entities per row, rows per entity key) of a snapshot; a snapshot published before
    entities existed has no mentions (and the built-in vocabulary)."""
    tables = {row[0] for row in conn.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
    if not {"chunk_entities", "entities"} <= tables:
        return DEFAULT_VOCABULARY, {}, {}
    stored = conn.execute("SELECT value FROM meta WHERE key = 'entity_vocabulary'").fetchone()
    vocabulary = EntityVocabulary.from_json(stored[0]) if stored else DEFAULT_VOCABULARY
    row_entities: dict[int, list[EntityRef]] = {}
    by_key: dict[str, list[int]] = {}
    for chunk_id, entity_type, value in conn.execute(
        "SELECT ce.chunk_id, e.type, e.canonical_value FROM chunk_entities ce JOIN entities e USING (entity_id) "
        "GROUP BY ALL ORDER BY ce.chunk_id, min(ce.span_start), e.type"
    ).fetchall():
        row = row_of.get(chunk_id)
        if row is None:
            continue
        row_entities.setdefault(row, []).append(EntityRef(type=entity_type, value=value))
        rows = by_key.setdefault(entity_key(value), [])
        if not rows or rows[-1] != row:
            rows.append(row)
    entity_rows = {key: np.unique(np.asarray(rows, dtype=np.int64)) for key, rows in by_key.items()}
    return vocabulary, row_entities, entity_rows


def load_sentence_index(conn, content_hashes: list[str], dim: int) -> SentenceIndex | None:
    """The snapshot's sentence vectors (float16 in memory), or None: built without them, or some row has none."""
    if not conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'sentence_embeddings'"
                        ).fetchone()[0]:
        return None
    count = conn.execute("SELECT count(*) FROM sentence_embeddings").fetchone()[0]
    if not count:
        return None
    # filled batch by batch: the float32 lists never exist whole beside the float16 copy (peak memory, load time);
    # the table was written ordered by content hash and ordinal (index.build_snapshot), its row order keeps that
    vectors = np.empty((count, dim), dtype=np.float16)
    hashes: list[str] = []
    reader = conn.execute("SELECT content_hash, embedding FROM sentence_embeddings ORDER BY rowid").fetch_record_batch(65_536)
    filled = 0
    for batch in reader:
        rows = batch.num_rows
        vectors[filled:filled + rows] = batch.column(1).flatten().to_numpy(zero_copy_only=False).reshape(rows, dim)
        hashes += batch.column(0).to_pylist()
        filled += rows
    return sentence_index_from(content_hashes, hashes, vectors)


# DuckDB's memory limit for a serving snapshot's connection once it is loaded: what it answers then are word stems
# and a few rows at a time (a document's chunks, its neighbours, the source and document lists)
SERVING_MEMORY_LIMIT = "512MB"


def load_snapshot(index_dir: Path, info: SnapshotInfo | None = None) -> LoadedSnapshot:
    """Read a published snapshot into memory (vectors, postings, row metadata)."""
    started = time.perf_counter()
    conn, info = open_snapshot(index_dir, info)
    table = conn.execute("SELECT embedding FROM chunks ORDER BY rowid").arrow()
    records = conn.execute(
        "SELECT chunk_id, doc_id, version, title, section, section_path, page_start, page_end, url, source_path, "
        f"source_id, text, doc_type, metadata::VARCHAR AS metadata, last_updated, status, content_hash, {_ocr_columns(conn)}, {_review_columns(conn)}, "
        f"{_revision_columns(conn)} FROM chunks ORDER BY rowid"
    ).arrow()
    chunk_ids = records.column("chunk_id").to_pylist()
    doc_ids = np.array(records.column("doc_id").to_pylist(), dtype=object)
    versions = np.array(records.column("version").to_pylist(), dtype=np.int64)
    active = np.array([s == "active" for s in records.column("status").to_pylist()], dtype=bool)
    emb_col = table.column("embedding").combine_chunks()
    # the snapshot's own width: FLOAT[n] (a fixed-size list) with n the store's embedding_dim
    dim = emb_col.type.list_size if hasattr(emb_col.type, "list_size") else (len(emb_col[0]) if len(emb_col) else 0)
    embeddings = np.ascontiguousarray(
        emb_col.values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
    ) if len(chunk_ids) else np.zeros((0, dim), dtype=np.float32)
    row_of = {cid: i for i, cid in enumerate(chunk_ids)}

    # documents (active and superseded versions present in the snapshot) with their source names
    doc_rows = conn.execute(
        f"""
        SELECT DISTINCT c.doc_id, c.version, c.source_id, coalesce(s.name, c.source_id) AS source_name,
               {_visibility_column(conn)} AS visibility,
               c.source_path, c.title, c.metadata, c.status, {_revision_columns(conn, "c.")}
        FROM chunks c LEFT JOIN sources s USING (source_id)
        """
    ).fetchall()
    documents: list[dict] = []
    key_index: dict[tuple[str, int], int] = {}
    relative = dict(conn.execute("SELECT path, relative_path FROM documents").fetchall())
    for doc_id, version, source_id, source_name, visibility, path, title, metadata, status, *revision in doc_rows:
        key_index[(doc_id, version)] = len(documents)
        rev_label, valid_from, valid_to, superseded_by = revision
        documents.append({
            "doc_id": doc_id, "version": version, "source_id": source_id, "source_name": source_name,
            "visibility": visibility,
            "path": path, "relative_path": relative.get(path, Path(path).name), "title": title or "",
            "metadata": json.loads(metadata) if isinstance(metadata, str) and metadata else (metadata or {}),
            "status": status, "rev_label": rev_label,
            "valid_from": valid_from.isoformat() + "Z" if valid_from is not None else None,
            "valid_to": valid_to.isoformat() + "Z" if valid_to is not None else None,
            "superseded_by": superseded_by,
        })
    doc_index = np.array([key_index[(d, int(v))] for d, v in zip(doc_ids, versions)], dtype=np.int32)

    # BM25: docid -> row, lengths, postings
    docid_rows = conn.execute(
        "SELECT d.docid, d.len FROM fts_main_chunks.docs d ORDER BY d.docid"
    ).fetchall()
    names = dict(conn.execute("SELECT docid, name FROM fts_main_chunks.docs").fetchall())
    max_docid = max((d for d, _ in docid_rows), default=-1)
    docid_to_row = np.full(max_docid + 2, -1, dtype=np.int64)
    doc_len = np.zeros(len(chunk_ids), dtype=np.float32)
    for docid, length in docid_rows:
        row = row_of[names[docid]]
        docid_to_row[docid] = row
        doc_len[row] = length
    num_docs, avgdl = conn.execute("SELECT num_docs, avgdl FROM fts_main_chunks.stats").fetchone()
    dict_rows = conn.execute("SELECT termid, term, df FROM fts_main_chunks.dict ORDER BY termid").fetchall()
    n_terms = (dict_rows[-1][0] + 1) if dict_rows else 0
    df = np.zeros(n_terms, dtype=np.int64)
    term_ids: dict[str, int] = {}
    for termid, term, freq in dict_rows:
        df[termid] = freq
        term_ids[term] = termid
    stopwords = frozenset(r[0] for r in conn.execute(
        "SELECT DISTINCT stem(sw, 'porter') FROM fts_main_chunks.stopwords UNION SELECT sw FROM fts_main_chunks.stopwords"
    ).fetchall())
    postings = conn.execute("SELECT termid, docid, tf FROM bm25_postings ORDER BY termid, docid").arrow()
    post_terms = postings.column("termid").to_numpy()
    post_rows = docid_to_row[postings.column("docid").to_numpy()].astype(np.int32)
    post_tf = postings.column("tf").to_numpy().astype(np.float32)
    term_ptr = np.zeros(n_terms + 1, dtype=np.int64)
    if len(post_terms):
        counts = np.bincount(post_terms, minlength=n_terms)
        term_ptr[1:] = np.cumsum(counts)
    group = section_groups(doc_index, records.column("section_path").to_pylist())
    sections = build_section_index(group, doc_len, term_ptr, post_rows, post_tf)
    vocabulary, row_entities, entity_rows = load_entities(conn, row_of)
    relations, doc_relations = load_relations(conn)
    sentence_index = load_sentence_index(conn, records.column("content_hash").to_pylist(), dim)
    # Everything a search reads is in memory now (SERVING_MEMORY_LIMIT: what the connection answers later).
    # DuckDB keeps the pages it read cached up to its memory limit (by default most of the machine's memory):
    # several GB for a large snapshot, held for as long as the snapshot serves.  Lowering the limit evicts them.
    conn.execute(f"SET memory_limit = '{SERVING_MEMORY_LIMIT}'")
    return LoadedSnapshot(
        sentence_index=sentence_index,
        relations=relations, doc_relations=doc_relations,
        info=info, path=info.path(index_dir), conn=conn, chunk_ids=chunk_ids, row_of=row_of, doc_ids=doc_ids,
        doc_index=doc_index, active=active, embeddings=embeddings, records=records,
        doc_len=doc_len, avgdl=float(avgdl or 1.0), num_docs=int(num_docs or 0), term_ptr=term_ptr,
        post_rows=post_rows, post_tf=post_tf, df=df, term_ids=term_ids, documents=documents,
        stopwords=stopwords, sections=sections, entity_vocabulary=vocabulary, row_entities=row_entities,
        entity_rows=entity_rows, load_seconds=time.perf_counter() - started,
    )


def visibility_view(snapshot: LoadedSnapshot, visibility: tuple[str, ...]) -> LoadedSnapshot:
    """``snapshot`` restricted to the documents of sources whose visibility is in ``visibility``: their rows
    (in order), and every statistic a search reads computed again over those rows alone - BM25's document count,
    average length, document frequencies and term dictionary (a term only other documents hold is unknown here),
    the sections and their statistics, the entity tables (an entity only other documents mention is unknown),
    the relations between its own documents.  So what a search on the view answers - results, scores, relevance,
    coverage, the query's form and alpha - is the same whatever the other documents hold.  Costs a copy of its
    rows' vectors; ``snapshot`` itself when every document qualifies."""
    started = time.perf_counter()
    keep_docs = np.array([d.get("visibility", "internal") in visibility for d in snapshot.documents], dtype=bool)
    if keep_docs.all():
        return snapshot
    doc_map = np.full(len(keep_docs), -1, dtype=np.int32)
    doc_map[keep_docs] = np.arange(int(keep_docs.sum()), dtype=np.int32)
    rows = np.flatnonzero(keep_docs[snapshot.doc_index]) if snapshot.size else np.zeros(0, dtype=np.int64)
    row_map = np.full(snapshot.size + 1, -1, dtype=np.int64)  # the extra slot maps an unmapped (-1) posting to -1
    row_map[rows] = np.arange(len(rows), dtype=np.int64)

    n_terms = len(snapshot.term_ptr) - 1
    post_terms = np.repeat(np.arange(n_terms, dtype=np.int64), np.diff(snapshot.term_ptr))
    mapped = row_map[snapshot.post_rows]
    kept = mapped >= 0
    counts = np.bincount(post_terms[kept], minlength=n_terms)
    term_ptr = np.zeros(n_terms + 1, dtype=np.int64)
    term_ptr[1:] = np.cumsum(counts)
    post_rows = mapped[kept].astype(np.int32)
    post_tf = snapshot.post_tf[kept]
    doc_len = snapshot.doc_len[rows]

    records = snapshot.records.take(rows)
    chunk_ids = records.column("chunk_id").to_pylist()
    doc_index = doc_map[snapshot.doc_index[rows]]
    documents = [doc for doc, keep in zip(snapshot.documents, keep_docs) if keep]
    group = section_groups(doc_index, records.column("section_path").to_pylist())
    visible = {doc["doc_id"] for doc in documents}
    relations = [r for r in snapshot.relations if r["src_id"] in visible and r["dst_id"] in visible]
    entity_rows = {}
    for key, mentioning in snapshot.entity_rows.items():
        own = row_map[mentioning]
        if (own >= 0).any():
            entity_rows[key] = own[own >= 0]
    sentences = snapshot.sentence_index
    view = LoadedSnapshot(
        info=snapshot.info, path=snapshot.path, conn=snapshot.conn, chunk_ids=chunk_ids,
        row_of={cid: i for i, cid in enumerate(chunk_ids)}, doc_ids=snapshot.doc_ids[rows], doc_index=doc_index,
        active=snapshot.active[rows], embeddings=np.ascontiguousarray(snapshot.embeddings[rows]), doc_len=doc_len,
        avgdl=float(doc_len.mean()) if len(rows) else 1.0, num_docs=len(rows), term_ptr=term_ptr,
        post_rows=post_rows, post_tf=post_tf, df=counts.astype(np.int64),
        term_ids={term: termid for term, termid in snapshot.term_ids.items() if counts[termid] > 0},
        records=records, documents=documents, stopwords=snapshot.stopwords,
        sections=build_section_index(group, doc_len, term_ptr, post_rows, post_tf),
        sentence_index=None if sentences is None else SentenceIndex(sentences.vectors, sentences.start[rows],
                                                                    sentences.end[rows]),
        relations=relations, doc_relations=relations_by_document(relations),
        entity_vocabulary=snapshot.entity_vocabulary,
        row_entities={int(row_map[row]): refs for row, refs in snapshot.row_entities.items() if row_map[row] >= 0},
        entity_rows=entity_rows, view_of=visibility, ann_config=snapshot.ann_config,
        ann_cancel=snapshot.ann_cancel,  # retired with the snapshot it is a view of
        _stems=snapshot._stems,  # stems depend on the word, not the corpus
    )
    view.load_seconds = time.perf_counter() - started
    config = snapshot.ann_config
    if config is not None and config.wanted(view.size):
        variant = replace(config, variant="-".join(visibility))
        threading.Thread(target=SnapshotManager._attach_ann, args=(view, variant),
                         name=f"ann-{snapshot.info.snapshot_version}-{variant.variant}", daemon=True).start()
    else:
        view.ann_ready.set()
    return view


class SnapshotManager:
    """Serves the published snapshot and switches to a newer one without a restart.

    ``current()`` stats ``CURRENT.json`` (cheap) at most every ``check_interval_s``;
    when a new version is published it loads it fully and then swaps the
    reference, so in-flight queries finish on the old one and nobody waits on a
    half-loaded index.

    With ``ann`` (an ``AnnConfig``), a snapshot of at least ``ann.min_chunks`` rows gets
    an approximate vector index on a background thread (from its side file, else built:
    minutes at 1M rows); until it is attached the snapshot is served with exact search.
    Such a large snapshot is also *loaded* on a background thread (~a minute at 1M rows)
    while the previous one keeps answering; ``refresh()`` waits for it (a source delete
    must not be served from the old snapshot after the call returns).
    """

    def __init__(self, index_dir: Path, check_interval_s: float = 1.0, ann=None) -> None:
        self.index_dir = Path(index_dir)
        self.check_interval_s = check_interval_s
        self.ann_config = ann
        self._snapshot: LoadedSnapshot | None = None
        self._lock = threading.Lock()
        self._last_check = 0.0
        self._pointer_mtime: float | None = None
        self._loader: threading.Thread | None = None
        self._loading_version: int | None = None
        self.load_error: str | None = None
        self.reloads = 0

    def refresh(self) -> LoadedSnapshot:
        """Look at the pointer now (after this process published, e.g. a source delete); waits for a
        background load, so the snapshot returned is the published one."""
        self._last_check = float("-inf")
        snapshot = self.current()
        loader = self._loader
        if loader is not None:
            loader.join()
            self._last_check = float("-inf")
            snapshot = self.current()
        return snapshot

    def current(self) -> LoadedSnapshot:
        now = time.monotonic()
        snapshot = self._snapshot
        if snapshot is not None and now - self._last_check < self.check_interval_s:
            return snapshot
        with self._lock:
            self._last_check = now
            pointer = self.index_dir / "CURRENT.json"
            try:
                mtime = pointer.stat().st_mtime
            except FileNotFoundError:
                mtime = None
            if self._snapshot is not None and mtime == self._pointer_mtime:
                return self._snapshot
            info = read_pointer(self.index_dir)  # raises IndexNotBuiltError when nothing is published
            if self._snapshot is not None and self._snapshot.info.snapshot_version == info.snapshot_version:
                self._pointer_mtime = mtime
                return self._snapshot
            if self._snapshot is not None and self.ann_config is not None and self.ann_config.wanted(info.chunk_count):
                # large: keep serving the old snapshot while the new one loads
                if self._loading_version != info.snapshot_version:
                    self._loading_version = info.snapshot_version
                    self._loader = threading.Thread(target=self._load_in_background, args=(info, mtime),
                                                    name=f"snapshot-{info.snapshot_version}", daemon=True)
                    self._loader.start()
                return self._snapshot
            return self._install(load_snapshot(self.index_dir, info), mtime)

    def _install(self, fresh: LoadedSnapshot, mtime: float | None) -> LoadedSnapshot:
        """Serve ``fresh`` from now on (the caller holds the lock)."""
        self._start_ann(fresh)
        old, self._snapshot = self._snapshot, fresh
        self._pointer_mtime = mtime
        if old is not None:
            self.reloads += 1
            # old readers may still hold it; DuckDB handles close-after-use safely on a read-only file
            old.ann_cancel.set()  # an unfinished ANN build for it stops at its next batch
            threading.Timer(30.0, old.close).start()
        return fresh

    def _load_in_background(self, info: SnapshotInfo, mtime: float | None) -> None:
        try:
            fresh = load_snapshot(self.index_dir, info)
        except Exception as error:  # noqa: BLE001 - the old snapshot keeps serving; the next check retries
            self.load_error = f"{type(error).__name__}: {error}"
            logging.getLogger(__name__).warning("loading snapshot %s failed: %s", info.snapshot_version, self.load_error)
            with self._lock:
                self._loading_version, self._loader = None, None
            return
        with self._lock:
            current = self._snapshot
            if current is None or current.info.snapshot_version < fresh.info.snapshot_version:
                self._install(fresh, mtime)
            else:
                fresh.close()
            self._loading_version, self._loader = None, None
            self.load_error = None

    # ------------------------------------------------------------------ ANN
    def _start_ann(self, snapshot: LoadedSnapshot) -> None:
        config = self.ann_config
        snapshot.ann_config = config  # its views build theirs alike
        if config is None or not config.wanted(snapshot.size):
            snapshot.ann_ready.set()
            return
        threading.Thread(target=self._attach_ann, args=(snapshot, config), name=f"ann-{snapshot.info.snapshot_version}",
                         daemon=True).start()

    @staticmethod
    def _attach_ann(snapshot: LoadedSnapshot, config) -> None:
        logger = logging.getLogger(__name__)
        try:
            # looked up on the module at each build, so a replaced ``obtain`` (tests) is the one used
            index = ann.obtain(snapshot.path, snapshot.info, snapshot.embeddings, config, snapshot.ann_cancel)
            if not snapshot.ann_cancel.is_set():
                snapshot.ann = index
                logger.info("ANN index for snapshot %s ready: %s", snapshot.info.snapshot_version, index.describe())
        except ann.BuildCancelled:
            pass
        except Exception as error:  # noqa: BLE001 - without the ANN the snapshot is still served (exactly)
            snapshot.ann_error = f"{type(error).__name__}: {error}"
            logger.warning("ANN index for snapshot %s failed (%s); exact vector search", snapshot.info.snapshot_version,
                           snapshot.ann_error)
        finally:
            snapshot.ann_ready.set()

    @staticmethod
    def wait_for_ann(snapshot: LoadedSnapshot, timeout_s: float | None = None):
        """Block until the snapshot's ANN index is attached (or given up); returns it or None."""
        snapshot.ann_ready.wait(timeout_s)
        return snapshot.ann

