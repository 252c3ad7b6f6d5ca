"""What a finished sync must satisfy, checked against the store and the published snapshot.

Each check is a plain function of the settings returning an ``IndexCheck``; ``INDEX_CHECKS`` lists them with the
stage whose output they check.  The in-process sequence (``run.run_sync``: the API, uploads, retries) runs them
all after publishing and reports them; the Dagster asset checks are thin calls to the same functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from knowledge_store.config.settings import Settings
from knowledge_store.models.serving import serving_model_id
from knowledge_store.storage.index import open_snapshot
from knowledge_store.storage.store import store_connection


@dataclass(frozen=True)
class IndexCheck:
    name: str
    passed: bool
    offending_rows: int
    description: str  # what was checked, as a condition
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "offending_rows": self.offending_rows,
                "check": self.description, **self.metadata}


def no_empty_chunks(settings: Settings) -> IndexCheck:
    """No chunk is empty or whitespace."""
    with store_connection(settings.store_path, read_only=True) as conn:
        bad = conn.execute("SELECT count(*) FROM chunks WHERE length(trim(text)) = 0").fetchone()[0]
    return IndexCheck("no_empty_chunks", bad == 0, bad, "length(trim(text)) = 0")


def chunks_have_citation_fields(settings: Settings) -> IndexCheck:
    """Every chunk carries the fields a citation needs and fits the model window."""
    with store_connection(settings.store_path, read_only=True) as conn:
        bad = conn.execute(
            """
            SELECT count(*) FROM chunks c JOIN documents d USING (doc_id, version)
            WHERE c.chunk_id IS NULL OR c.doc_id IS NULL OR c.version IS NULL OR c.title IS NULL
               OR c.source_path IS NULL OR c.url IS NULL OR c.section_path IS NULL OR c.content_hash IS NULL
               OR c.char_start < 0
               OR (c.char_end <= c.char_start AND coalesce(c.page_start, 1) = coalesce(c.page_end, 1))
               OR c.token_count < 1 OR c.token_count > ?
               OR (d.paginated AND (c.page_start IS NULL OR c.page_end IS NULL OR c.page_end < c.page_start))
            """,
            [settings.chunk_max_tokens],
        ).fetchone()[0]
        total = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    return IndexCheck("chunks_have_citation_fields", bad == 0, bad,
                      "citation fields present, token_count within the window", {"chunks_checked": total})


def embeddings_are_unit_vectors(settings: Settings) -> IndexCheck:
    """Every vector of the serving model has its ``embedding_dim`` dimensions and unit L2 norm."""
    with store_connection(settings.store_path, read_only=True) as conn:
        bad, total, worst = conn.execute(
            """
            SELECT count(*) FILTER (WHERE len(embedding) <> ? OR abs(sqrt(list_dot_product(embedding::FLOAT[], embedding::FLOAT[])) - 1) > 1e-3),
                   count(*), coalesce(max(abs(sqrt(list_dot_product(embedding::FLOAT[], embedding::FLOAT[])) - 1)), 0)
            FROM embeddings WHERE model_id = ?
            """,
            [settings.embedding_dim, serving_model_id(settings)],
        ).fetchone()
    return IndexCheck("embeddings_are_unit_vectors", bad == 0, bad,
                      f"dimension {settings.embedding_dim} and |norm - 1| <= 1e-3",
                      {"vectors_checked": total, "worst_norm_error": float(worst)})


def index_matches_active_chunks(settings: Settings) -> IndexCheck:
    """The published snapshot holds exactly the active chunks (and the retained superseded ones), all in the
    BM25 index and all with a vector."""
    with store_connection(settings.store_path, read_only=True) as conn:
        active, retained = conn.execute(
            "SELECT count(*) FILTER (WHERE d.status = 'active'), count(*) FILTER (WHERE d.status = 'superseded') "
            "FROM chunks c JOIN documents d USING (doc_id, version)"
        ).fetchone()
    snap, info = open_snapshot(settings.index_dir)
    try:
        indexed_active, indexed_all = snap.execute(
            "SELECT count(*) FILTER (WHERE status = 'active'), count(*) FROM chunks"
        ).fetchone()
        in_fts = snap.execute("SELECT count(*) FROM fts_main_chunks.docs").fetchone()[0]
        with_vectors = snap.execute("SELECT count(*) FROM chunks WHERE embedding IS NOT NULL").fetchone()[0]
    finally:
        snap.close()
    passed = active == indexed_active and indexed_all == in_fts == with_vectors == active + retained
    return IndexCheck(
        "index_matches_active_chunks", passed, abs(active - indexed_active) + abs(active + retained - indexed_all),
        "snapshot active rows = active chunks in the store; every row (active + retained superseded) in fts and with a vector",
        {"active_chunks": active, "superseded_chunks_retained": retained, "snapshot_active_rows": indexed_active,
         "snapshot_rows": indexed_all, "fts_documents": in_fts, "vectors": with_vectors,
         "snapshot_version": info.snapshot_version})


@dataclass(frozen=True)
class IndexCheckSpec:
    stage: str  # the stage whose output it checks (a Dagster asset of the same name checks it there)
    run: Callable[[Settings], IndexCheck]

    @property
    def description(self) -> str:
        return (self.run.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")


INDEX_CHECKS: dict[str, IndexCheckSpec] = {
    "no_empty_chunks": IndexCheckSpec("chunks", no_empty_chunks),
    "chunks_have_citation_fields": IndexCheckSpec("chunks", chunks_have_citation_fields),
    "embeddings_are_unit_vectors": IndexCheckSpec("embeddings", embeddings_are_unit_vectors),
    "index_matches_active_chunks": IndexCheckSpec("search_index", index_matches_active_chunks),
}


def run_index_checks(settings: Settings) -> list[IndexCheck]:
    """Every check, in order."""
    return [spec.run(settings) for spec in INDEX_CHECKS.values()]
