"""What is in the store: sources, document versions, counts, failures, the published snapshot."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import IndexNotBuiltError, StoreError
from knowledge_store.ingest.failures import open_failures
from knowledge_store.ingest.sync_runs import run_process_state
from knowledge_store.learning.adapter_training import retrain_threshold
from knowledge_store.models.embeddings import bare_weight_of, graph_status, in_context_sentences_of, model_id_for
from knowledge_store.models.serving import load_record
from knowledge_store.retrieval.query_adapter import QueryAdapterError, adapter_path, read_adapter
from knowledge_store.retrieval.ranking_defaults import effective_question_alpha, effective_ranking
from knowledge_store.storage.feedback_learning import load_feedback_learning
from knowledge_store.storage.index import read_pointer
from knowledge_store.storage.store import store_connection
from knowledge_store.storage.tuned import load_tuned


def _rows(cursor) -> list[dict[str, object]]:
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row)) for row in cursor.fetchall()]


def _iso(value: object) -> object:
    return value.isoformat() + "Z" if isinstance(value, datetime) else value


def store_status(settings: Settings, include_history: bool = True, needs_review: bool = False) -> dict[str, object]:
    """A JSON-ready description of the store; raises StoreError when there is no store yet.

    ``needs_review``: list only the documents with low-confidence OCR regions (``documents.needs_review``)."""
    if not settings.store_path.exists():
        raise StoreError(f"no store at {settings.store_path}; run `groundwork ingest` first")
    with store_connection(settings.store_path, read_only=True, timeout_s=settings.lock_timeout_s) as conn:
        sources = _rows(conn.execute(
            """
            SELECT s.name, s.kind, s.location, s.enabled, s.last_synced_at,
                   count(DISTINCT d.doc_id) FILTER (WHERE d.status = 'active') AS active_documents
            FROM sources s LEFT JOIN documents d USING (source_id)
            GROUP BY ALL ORDER BY s.name
            """
        ))
        document_columns = {d[0] for d in conn.execute("SELECT * FROM documents LIMIT 0").description}
        # the document model's fields (store migration 6): a store not yet migrated (opened read-only) has none of them
        revision_columns = "".join(f"d.{c}, " for c in ("rev_label", "superseded_by") if c in document_columns)
        # store migration 11: low-confidence OCR regions (absent: nothing was flagged)
        reviewable = "needs_review" in document_columns
        review_columns = ("coalesce(d.needs_review, FALSE) AS needs_review, "
                          "coalesce(d.low_confidence_regions, 0) AS low_confidence_regions, " if reviewable
                          else "FALSE AS needs_review, 0 AS low_confidence_regions, ")
        where = [] if include_history else ["d.status IN ('active', 'pending', 'failed')"]
        if needs_review:
            where.append("coalesce(d.needs_review, FALSE)" if reviewable else "FALSE")
        documents = _rows(conn.execute(
            f"""
            SELECT d.doc_id, d.version, d.status, d.title, d.relative_path, d.doc_type, d.page_count,
                   d.checksum, d.valid_from, d.valid_to, d.supersedes, {revision_columns}{review_columns}
                   (SELECT count(*) FROM chunks c WHERE c.doc_id = d.doc_id AND c.version = d.version) AS chunks
            FROM documents d
            {("WHERE " + " AND ".join(where)) if where else ""}
            ORDER BY d.relative_path, d.version DESC
            """
        ))
        counts = _rows(conn.execute(
            """
            SELECT
              (SELECT count(*) FROM documents WHERE status = 'active') AS active_documents,
              (SELECT count(*) FROM documents WHERE status = 'pending') AS pending_versions,
              (SELECT count(*) FROM documents WHERE status = 'superseded') AS superseded_versions,
              (SELECT count(*) FROM documents WHERE status = 'deleted') AS deleted_documents,
              (SELECT count(*) FROM documents WHERE status = 'failed') AS failed_versions,
              (SELECT count(*) FROM chunks c JOIN documents d USING (doc_id, version) WHERE d.status = 'active') AS active_chunks,
              (SELECT count(*) FROM chunks) AS all_chunks,
              (SELECT count(*) FROM embeddings) AS embeddings
            """
        ))[0]
        review = conn.execute(
            "SELECT count(*), coalesce(sum(low_confidence_regions), 0) FROM documents "
            "WHERE status = 'active' AND needs_review"
        ).fetchone() if reviewable else (0, 0)
        counts["needs_review_documents"], counts["low_confidence_regions"] = int(review[0]), int(review[1])
        run_columns = {d[0] for d in conn.execute("SELECT * FROM sync_runs LIMIT 0").description}
        process_columns = [c for c in ("pid", "hostname", "heartbeat_at") if c in run_columns]  # schema 3+
        last_run = _rows(conn.execute(
            "SELECT sync_run_id, trigger, status, started_at, finished_at, summary, snapshot_version, "
            "chunks_created, embeddings_computed, embeddings_reused"
            + "".join(f", {c}" for c in process_columns) + " FROM sync_runs ORDER BY started_at DESC LIMIT 1"
        ))
        for run in last_run:  # a 'running' run whose process is gone was interrupted
            run["status"], reason = run_process_state(run)
            if reason:
                run["interrupted_reason"] = reason
        failures = open_failures(conn)
    try:
        pointer = read_pointer(settings.index_dir)
        snapshot: dict[str, object] | None = {
            "snapshot_version": pointer.snapshot_version, "file": pointer.file, "created_at": pointer.created_at,
            "chunk_count": pointer.chunk_count, "document_count": pointer.document_count, "model_id": pointer.model_id,
        }
    except IndexNotBuiltError:
        snapshot = None

    def clean(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: _iso(v) for k, v in row.items()} for row in rows]

    run_failures = []
    failures_file = settings.data_dir / "run_failures.jsonl"
    if failures_file.is_file():
        for line in failures_file.read_text(encoding="utf-8").splitlines()[-5:]:
            try:
                run_failures.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return {
        "data_dir": str(settings.data_dir),
        "recent_run_failures": run_failures,
        "sources": clean(sources),
        "documents": clean(documents),
        "counts": counts,
        "index_snapshot": snapshot,
        "last_sync": clean(last_run)[0] if last_run else None,
        "ingestion_failures": clean(failures),
        "ranking": ranking_status(settings),
        "chunk_vectors": chunk_vector_status(settings, settings.index_dir),
        "embedding_model": embedding_model_status(settings),
        "feedback_learning": feedback_learning_status(settings, up_votes=None),
    }


def embedding_model_status(settings: Settings) -> dict[str, object]:
    """Which embedding model serves (the base model, or one fine-tuned for this corpus) and the last fine-tuning
    decision: what ``groundwork status``, ``/api/knowledge/config`` and the console's Settings page show."""
    try:
        served = read_pointer(settings.index_dir).model_id
    except IndexNotBuiltError:
        served = None
    try:
        record = load_record(settings.index_dir)
        error = None
    except StoreError as failure:
        record, error = None, str(failure)
    decision = (record.decision if record else None) or None
    keys = ("decision", "reason", "gain", "standard_error", "required", "pairs", "held_out", "seconds", "created_at",
            "finished_at", "before", "after", "candidate_model_id", "snapshot_version")
    return {
        "embedding_model": settings.embedding_model, "model_path": str(settings.model_path),
        "dimensions": settings.embedding_dim, "max_chunk_tokens": settings.chunk_max_tokens,
        "document_quantization": settings.document_quantization, "query_quantization": settings.query_quantization,
        "sentence_encoding": settings.sentence_encoding if settings.sentence_vectors else None,
        "served_model_id": served, "base_model_id": model_id_for(settings.model_path),
        "fine_tuned": bool(served and record and record.model_id and served.split("+", 1)[0] == record.model_id),
        "adopted_model_id": record.model_id if record else None, "adopted_at": record.adopted_at if record else None,
        "finetune_enabled": settings.finetune_embedder, "budget_s": settings.finetune_budget_s,
        "last_decision": {k: decision.get(k) for k in keys} if decision else None, "error": error,
        # which ONNX graph embeds documents and queries on this CPU, and why (the quantised graph's fidelity check)
        "graphs": graph_status(settings),
    }


def chunk_vector_status(settings: Settings, index_dir) -> dict[str, object]:
    """Which chunk vectors the served index holds (model id, bare-text share) against what the settings ask
    for: a changed ``bare_vector_weight`` is served only after the next sync has re-embedded every chunk."""
    try:
        pointer = read_pointer(index_dir)
    except IndexNotBuiltError:  # nothing published yet
        pointer = None
    served = pointer.model_id if pointer is not None else None
    configured = settings.bare_vector_weight
    # a snapshot built with every chunk's sentence vectors says so in its fingerprint (ingest/publish.py)
    sentences = None if pointer is None else pointer.fingerprint.endswith(":sentences")
    return {"model_id": served, "bare_vector_weight": None if served is None else bare_weight_of(served),
            "configured_bare_vector_weight": configured,
            "re_embed_pending": served is not None and bare_weight_of(served) != configured,
            "sentence_vectors": sentences, "configured_sentence_vectors": settings.sentence_vectors,
            "sentence_weight": settings.sentence_weight,
            "sentence_evidence": bool(sentences) and settings.sentence_weight > 0,
            "sentence_vectors_pending": pointer is not None and settings.sentence_vectors and not sentences,
            # how the served sentence vectors were made, and whether the next sync re-embeds for a changed setting
            "sentence_encoding": (("in_context" if in_context_sentences_of(served) else "separate")
                                  if sentences else None),
            "configured_sentence_encoding": settings.sentence_encoding,
            "sentence_re_embed_pending": bool(sentences) and settings.sentence_vectors
            and in_context_sentences_of(served) != settings.in_context_sentences}


def ranking_status(settings: Settings) -> dict[str, object]:
    """What ranks this corpus's queries beyond the built-in defaults: the self-tuned choice and the query
    adapter learned from feedback (each None when there is none; a damaged adapter file reports its error)."""
    tuned = load_tuned(settings.index_dir)
    adapter: dict[str, object] | None = None
    path = adapter_path(settings.index_dir)
    if path.exists():
        try:
            adapter = read_adapter(path).summary(settings.use_query_adapter)
        except QueryAdapterError as error:
            adapter = {"in_use": False, "error": str(error)}
    question_alpha = effective_question_alpha(settings, settings.index_dir)
    effective = effective_ranking(settings, settings.index_dir).label
    if question_alpha is not None:
        effective += f" (questions: alpha={question_alpha:g})"
    return {"effective": effective, "question_alpha": question_alpha,
            "tuned": None if tuned is None else {"created_at": tuned.created_at, "before": tuned.before,
                                                "after": tuned.after},
            "query_adapter": adapter}


def feedback_learning_status(settings: Settings, up_votes: int | None) -> dict[str, object]:
    """Whether ratings retrain the query adapter by themselves, what the last decision was and when the next
    can come: ``/api/knowledge/config``'s ``feedback_learning`` and the console's Settings page.  ``up_votes``:
    the thumbs-up in the query log now (None: not known)."""
    try:
        state = load_feedback_learning(settings.index_dir)
        error = None
    except StoreError as failure:
        state, error = None, str(failure)
    last = state.last_decision if state else None
    check = state.last_check if state else None
    threshold = retrain_threshold(settings)
    since = last.get("up_votes") if last else 0
    new = None if up_votes is None else max(0, up_votes - (since if isinstance(since, int) and since <= up_votes else 0))
    next_check = None
    if settings.learn_from_feedback and check and check.get("at"):
        try:
            next_check = (datetime.fromisoformat(check["at"])
                          + timedelta(seconds=settings.feedback_check_interval_s)).isoformat(timespec="seconds")
        except ValueError:
            next_check = None
    return {
        "enabled": settings.learn_from_feedback, "retrain_votes": threshold, "up_votes": up_votes,
        "new_up_votes": new, "until_next_retrain": None if new is None else max(0, threshold - new),
        "check_interval_s": settings.feedback_check_interval_s,
        "last_check": check, "next_check_at": next_check, "last_decision": last, "error": error,
    }
