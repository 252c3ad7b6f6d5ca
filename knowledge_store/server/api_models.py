"""Response models of the HTTP API: what every route promises, in the OpenAPI schema and at run time.

FastAPI validates each response against its route's model, so the schema at
``/openapi.json`` cannot drift from what the server sends (a bounded
schemathesis run in the test suite checks both ways).  Models list the fields
clients rely on; those that carry open-ended rows (documents, sources, jobs)
allow further fields, which are additions, never replacements.

``ERROR_RESPONSES`` documents the one error shape, ``{error, message}``, for
every status the server can answer with.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from knowledge_store.core.entities import EntityRef
from knowledge_store.retrieval.answer import Answer
from knowledge_store.retrieval.citations import Citation
from knowledge_store.server.ingest_jobs import Job  # the job record's model lives beside the jobs


class Open(BaseModel):
    """Documented fields plus any others the server adds."""

    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------ errors

class FieldError(BaseModel):
    field: str = Field(..., description="The offending input: a body field (dotted path), query parameter or 'body'.")
    message: str


class ErrorBody(Open):
    """Every error, whatever its status."""

    error: str = Field(..., description="Stable machine-readable code, e.g. validation_error, not_found, source_conflict.")
    message: str = Field(..., description="What was wrong, in plain words.")
    errors: list[FieldError] | None = Field(None, description="Per-field problems (422 only).")
    retry_after_s: int | None = Field(None, description="503 model_loading only: the Retry-After seconds (the "
                                                        "estimated time until the embedding model is ready).")


_ERROR_TEXT = {
    400: "Malformed request (e.g. a body that is not valid JSON or multipart).",
    403: "Cross-site request refused: the Origin is neither this server's own nor in GROUNDWORK_CORS_ORIGINS.",
    404: "No such resource (the message names the id).",
    405: "Method not allowed; the Allow header lists the methods of this path.",
    409: "Conflict (duplicate upload, source name or folder already registered).",
    410: "The resource existed but is gone (e.g. the original file left its source folder).",
    413: "Request body over the configured limit (GROUNDWORK_MAX_BODY_BYTES; uploads: GROUNDWORK_MAX_FILE_MB), "
         "refused before it is read.",
    421: "Host header not served here (DNS-rebinding protection); configure GROUNDWORK_ALLOWED_HOSTS.",
    422: "Invalid input; ``errors`` names each offending field.",
    500: "Unexpected server error (logged); the body never carries a traceback.",
    503: "Not available yet: no index snapshot published (index_not_built), the store is busy, or - on routes that "
         "embed a query - the embedding model is still loading (model_loading, with Retry-After: the estimated "
         "seconds until it is ready) or failed to load (model_load_failed, with the reason).",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these statuses, all with the ``ErrorBody`` shape."""
    return {str(status): {"model": ErrorBody, "description": _ERROR_TEXT[status]} for status in statuses}


# every route can answer these: the origin policy (403/421), bad input (400/422), a body over the limit (413),
# unexpected (500), unavailable (503)
COMMON_ERRORS = error_responses(400, 403, 405, 413, 421, 422, 500, 503)
# the 503 of a route that embeds its query (query, ask, ask-local): the server answers from the moment it starts,
# and its model may still be loading (exported and quantised on a fresh data folder) or have failed to load
MODEL_ERRORS: dict[int | str, dict[str, Any]] = {"503": {
    "model": ErrorBody,
    "description": "model_loading: the embedding model is still loading (the server answers while it loads; "
                   "/health says what it is doing); Retry-After (and retry_after_s) gives the estimated seconds until "
                   "it is ready. model_load_failed: the model could not be loaded (the message says why; /health "
                   "too); no Retry-After. index_not_built: no index snapshot published yet.",
    "headers": {"Retry-After": {"description": "model_loading: seconds until the model should be ready (an "
                                               "estimate from the load's steps)", "schema": {"type": "integer"}}},
}}


# ------------------------------------------------------------------ knowledge

class QueryResult(Citation):
    """One result.  For public callers ``url`` and ``source_path`` of a file are ``source_url`` (no path on the
    server's disk is ever shown to them); web pages keep their address."""

    source_url: str = Field(..., description="This server's link to the original file (with #page=N / #anchor).")
    source: str = Field("", description="The name of the document's source.")
    file: str = Field("", description="The document's path relative to its source (the page URL for web sources).")


class QueryResponse(BaseModel):
    retrieval_request_id: str = Field(..., description="What feedback refers to; also the query log's key.")
    query: str = Field(..., description="The query as received, with e-mail addresses and secrets redacted.")
    results: list[QueryResult]
    answer: Answer | None
    coverage: Literal["high", "medium", "low", "none"]
    missing_terms: list[str] = Field(default_factory=list, description="Words of the query that no document the "
                                     "caller may read contains (stopwords aside): the passages cannot say anything "
                                     "about them, whatever their scores.")
    message: str | None
    latency_ms: dict[str, float]
    reranker_status: str
    snapshot_version: int
    params: dict[str, Any] = Field(..., description="The parameters the query ran with (defaults filled in).")


class AskSource(Open):
    """One source of an /api/ask answer (the ask contract: file, section), plus url, pages and this server's own."""

    file: str = Field(..., description="The document's path relative to its source (the page URL for web sources): "
                                       "what /api/ask-local's source_file takes.")
    source: str = Field("", description="The name of the document's source.")
    section: str = Field(..., description="Heading path of the passage, 'Chapter > Section'.")
    url: str = Field(..., description="Absolute link to the original at the passage: the page URL for web sources, "
                                      "this server's /api/knowledge/sources/{doc_id}/file#page=N|#anchor otherwise.")
    pages: list[int] = Field(..., description="Pages the passage spans (empty for formats without pages).")
    n: int = Field(..., description="The answer's marker [n] for this source.")
    title: str
    doc_id: str
    chunk_id: str = Field(..., description="What feedback on this passage refers to.")
    snippet: str
    relevance: float
    rev_label: str | None = Field(None, description="The document's revision label, e.g. Rev C or v2.1.")
    valid_from: str | None = Field(None, description="ISO-8601 UTC: since when this version is the valid one.")
    valid_to: str | None = Field(None, description="ISO-8601 UTC: until when it was valid; null while it is.")
    # the rest of the document model's citation, as /api/knowledge/query results give it (same meaning, same descriptions)
    source_path: str = Field("", description=Citation.model_fields["source_path"].description + " Public callers: "
                             "the same link as url (no path on the server's disk).")
    superseded_by: str | None = Field(None, description=Citation.model_fields["superseded_by"].description)
    supersedes: list[str] = Field(default_factory=list, description=Citation.model_fields["supersedes"].description)
    see_also: list[str] = Field(default_factory=list, description=Citation.model_fields["see_also"].description)
    entities: list[EntityRef] = Field(default_factory=list, description=Citation.model_fields["entities"].description)


class AskResponse(Open):
    answer: str = Field(..., description="Grounded in the sources only, each sentence cited [n]; 'No relevant "
                                         "content found.' when nothing relevant was retrieved.")
    sources: list[AskSource]
    answer_method: Literal["extractive", "llm"]
    retrieval_request_id: str = Field(..., description="What POST /api/knowledge/feedback refers to.")
    coverage: Literal["high", "medium", "low", "none"]
    missing_terms: list[str] = Field(default_factory=list,
                                     description=QueryResponse.model_fields["missing_terms"].description)
    candidates: int = Field(..., description="Passages retrieved and ranked (at most top_k); sources are the first ones.")
    snapshot_version: int
    latency_ms: float


class FeedbackStored(BaseModel):
    feedback_id: str
    retrieval_request_id: str
    chunk_id: str | None
    rating: Literal["up", "down"]
    note: str | None
    created_at: str
    replaced: int = Field(0, description="This client's earlier ratings of the same passage (or answer) of the same "
                                         "request that this one replaced: one rating per client counts.")


class FeedbackList(BaseModel):
    feedback: list[dict[str, Any]]
    count: int


class JobAccepted(Job):
    status_url: str = Field(..., description="Poll this for the job's progress and outcome.")


class UploadAccepted(JobAccepted):
    sha256: str
    size_bytes: int
    stored_as: str = Field(..., description="File name in the uploads folder (a suffix is added when taken).")


class SourceList(BaseModel):
    sources: list[dict[str, Any]]


class SourceCreated(BaseModel):
    source: dict[str, Any]


class SourceUpdated(BaseModel):
    source: dict[str, Any]
    changed: Any
    resync_needed: bool
    snapshot_version: int | None = Field(None, description="The snapshot published for a change of visibility.")
    message: str


class SourceDeleted(Open):
    name: str
    documents_deleted: int
    snapshot_version: int | None


class FailureList(BaseModel):
    failures: list[dict[str, Any]]


class DocumentList(Open):
    source: Literal["store", "snapshot"] = Field(..., description="Where the list came from: the store, or the "
                                                 "published snapshot while a sync holds the store.")
    documents: list[dict[str, Any]] = Field(..., description="One row per document version: doc_id, version, status "
                                            "(active, superseded, pending, deleted, failed), title, relative_path, "
                                            "rev_label, valid_from, valid_to, superseded_by (the newer revision - another "
                                            "file - that replaced it), chunks, ...")
    index_snapshot: dict[str, Any]


class RelatedDocument(Open):
    """The other end of a relation, as the published snapshot knows it."""

    doc_id: str
    title: str
    path: str = Field(..., description="Path relative to its source (the page URL for web sources).")
    status: str = Field(..., description="active or superseded.")
    rev_label: str | None


class Relation(Open):
    """One row of the document model's ``relations`` table, seen from the document asked about."""

    relation_id: str = Field(..., description="Hash of (src_type, src_id, rel_type, dst_type, dst_id): stable across syncs.")
    src_type: str = Field(..., description="document")
    src_id: str
    rel_type: str = Field(..., description="supersedes (src is the newer revision of dst, another file) or seeAlso "
                                           "(src links to dst).")
    dst_type: str = Field(..., description="document")
    dst_id: str
    confidence: float = Field(..., description="0-1: 1.0 for a link or an asset id from metadata, 0.9 an id in the "
                                               "title or file name, 0.8 a title; times 0.8 when ordered by file date.")
    evidence: dict[str, Any] | None = Field(..., description="Why: seeAlso {phrase, page, span, href}; supersedes "
                                            "{reason, key, phrase, ordered_by, new, old}.")
    created_at: str | None
    direction: Literal["outgoing", "incoming"] = Field(..., description="outgoing: the document is src; incoming: dst.")
    other: RelatedDocument | None = Field(..., description="The document at the other end (null when it left the index).")


class DocumentRelations(Open):
    doc_id: str
    title: str
    path: str
    status: str = Field(..., description="active, or superseded (by a newer version or revision).")
    rev_label: str | None
    valid_from: str | None = Field(..., description="ISO-8601 UTC: when the served version became valid.")
    valid_to: str | None = Field(..., description="ISO-8601 UTC: when it stopped being valid; null while active.")
    superseded_by: str | None = Field(..., description="doc_id of the newer revision (another file) that replaced it.")
    relations: list[Relation]
    snapshot_version: int


class ArticleMetadata(Open):
    """Contract 001's article metadata; the document's other metadata fields follow as additions."""

    intent: list[str] = Field(..., description="The document's intent/intents, then tags/category metadata.")
    device: list[str] = Field(..., description="The document's device/product metadata.")
    last_updated: str = Field(..., description="ISO 8601 UTC: the file's modification time, else when this version "
                                               "was indexed. Always present.")
    author: str = Field(None, description="Present when the document names its author.")


class Article(Open):
    """One knowledge-base article (the knowledge-base articles contract), plus this server's additions."""

    id: str = Field(..., description="The document id (stable across versions).")
    title: str
    url: str = Field(..., description="Absolute link to the original: the page URL for web sources, this server's "
                                      "/api/knowledge/sources/{id}/file otherwise.")
    content: str = Field(..., description="The full document text, once (the stored page text, not overlapping chunks).")
    metadata: ArticleMetadata
    article_id: str = Field(..., description="Same as id (kept for clients of the first version).")
    version: int = Field(..., description="The document version served.")
    type: str | None = Field(..., description="Document type: pdf, docx, html, markdown, text.")
    path: str = Field(..., description="Path relative to its source (the page URL for web sources).")
    last_updated: str = Field(..., description="Same as metadata.last_updated.")


class ArticlePage(Open):
    articles: list[Article]
    total: int = Field(..., description="Articles matching the filters (all pages).")
    updated_at: str = Field(..., description="When the served index snapshot was published (ISO 8601 UTC).")
    limit: int
    offset: int
    next_offset: int | None = Field(..., description="offset of the next page; null on the last page.")
    content_source: str = Field(None, description="Where content came from: pages (the store's parsed page text) "
                                                  "or chunks (rebuilt from the index snapshot while the store is busy).")


class ConfigResponse(Open):
    default_k: int
    max_k: int
    default_alpha: float
    question_alpha: float | None = Field(None, description="Alpha of questions (ending in '?' or opening with "
                                         "how/what/why/...) that do not set alpha and name no entity of the corpus; "
                                         "null = they use default_alpha. ranking_sources.question_alpha says where "
                                         "it comes from; each response's params.query_form which one a query got.")
    default_fusion: str
    section_weight: float
    lead_weight: float
    feedback_docs: int = Field(..., description="Pseudo-relevance feedback: the query vector moves towards the best chunk "
                                                "of this many top documents and the candidate pool is fused again (0 = off).")
    feedback_beta: float = Field(..., description="How far it moves (query + beta * their centroid); 0 = off.")
    fusion_modes: dict[str, str]
    query_adapter: dict[str, Any] | None = Field(None, description="The corpus's query adapter learned from thumbs-up "
                                                 "feedback (`groundwork adapt`): rated and held-out queries, held-out "
                                                 "nDCG@10/Recall@5 without and with it, in_use; null when none is stored.")
    feedback_learning: dict[str, Any] | None = Field(None, description="Learning from ratings without a command: "
                                                     "enabled (GROUNDWORK_LEARN_FROM_FEEDBACK), retrain_votes, up_votes "
                                                     "(thumbs-up now), new_up_votes (since the last decision), "
                                                     "until_next_retrain, check_interval_s, last_check {at, up_votes, "
                                                     "message}, next_check_at and last_decision {decision (adopted or "
                                                     "declined), reason, gain, standard_error, required, rated_queries, "
                                                     "up_votes, trigger, decided_at, seconds}.")
    chunk_vectors: dict[str, Any] | None = Field(None, description="The served index's chunk vectors: model_id, "
                                                 "bare_vector_weight (share of each chunk's text embedded without its "
                                                 "header), configured_bare_vector_weight (the setting) and "
                                                 "re_embed_pending (true until a sync re-embeds for a changed setting); "
                                                 "sentence_vectors, sentence_encoding (in_context: pooled from each "
                                                 "chunk's forward pass; separate: each sentence embedded on its own), "
                                                 "configured_sentence_encoding and sentence_re_embed_pending.")
    embedding_model: dict[str, Any] | None = Field(None, description="Which embedding model serves: served_model_id, "
                                                   "base_model_id, fine_tuned (a model fine-tuned for this corpus was "
                                                   "adopted), document_quantization and query_quantization (none = "
                                                   "fp32, int8, int8-mixed, int8-smooth), sentence_encoding (null when sentence vectors are "
                                                   "off), finetune_enabled and the last fine-tuning decision "
                                                   "(decision, reason, gain, standard_error, pairs, seconds).")
    default_reranker: str
    rerankers: list[str] = Field(..., description="The rerankers this server can run now (the console offers only these).")
    reranker_labels: dict[str, str] = Field(..., description="The console's text for each of rerankers, e.g. "
                                                             "mmr (diversity).")
    max_query_chars: int
    max_note_chars: int
    max_upload_mb: float
    upload_types: list[str]


class Health(Open):
    """Health: ``{"status", "services", "version"}``; for admin callers also each non-up service's reason and
    the details (public callers get the three fields only: nothing about the corpus or the machine)."""

    status: Literal["healthy", "degraded", "unhealthy"] = Field(
        ..., description="healthy: every service up (200); degraded: the model is loading or an optional part "
                         "(store, query_log, dagster_home) is not up (200); unhealthy: no index, or the model cannot "
                         "load (503).")
    services: dict[str, str] = Field(
        ..., description="store, index, model, query_log, dagster_home: each 'up' or missing | loading | not_loaded "
                         "| error | down | not_configured.")
    version: str = Field(..., description="The groundwork package version.")
    reasons: dict[str, str] | None = Field(None, description="Admin: why each service that is not up is not "
                                                             "(service -> reason).")
    reason: str | None = Field(None, description="Admin: all reasons on one line; absent when healthy.")
    uptime_s: float | None = Field(None, description="Admin.")
    store: bool | None = Field(None, description="Admin: the store file exists.")
    model_loaded: bool | None = Field(None, description="Admin.")
    model_load: dict[str, Any] | None = Field(None, description="Admin: the served query model's load: state "
                                              "(not_loaded | loading | ready | failed), phase while loading (starting | "
                                              "waiting (for another process building the graphs) | exporting | quantising | checking | loading), seconds (so far, or of the "
                                              "last attempt), retry_after_s (the estimated seconds left while loading), "
                                              "error; null when its folder is missing.")
    model_graph: dict[str, Any] | None = Field(None, description="Admin: which ONNX graph embeds queries on this CPU "
                                              "and why: requested and in_effect quantisation (none = fp32), recipe, "
                                              "reason and the quantised graph's fidelity check (cosine to fp32 on the "
                                              "probe set; it runs only where it passed); null until known or for the "
                                              "torch encoder.")
    warm_up: dict[str, Any] | None = Field(None, description="Admin: the engine's warm-up: state (not_started | "
                                                             "warming | ready | failed), seconds, error.")
    remote: bool | None = Field(None, description="Admin: started in remote mode (GROUNDWORK_ALLOW_REMOTE).")
    tls: bool | None = Field(None, description="Admin: serving TLS itself (--ssl-certfile/--ssl-keyfile); false "
                                               "behind a TLS proxy.")
    admin_token_required: bool | None = Field(None, description="Admin: the admin surface needs the admin token.")
    index: dict[str, Any] | None = Field(None, description="Admin: the served snapshot: snapshot_version, chunks, "
                                                           "documents, published; null without one.")
    query_cache: dict[str, Any] | None = Field(None, description="Admin: the query-embedding cache: hits, misses, "
                                                                 "hit_rate.")


# ------------------------------------------------------------------ console: ranking settings, evaluation

class RankingValue(BaseModel):
    """One corpus ranking default as the server applies it, and where it comes from."""

    effective: float | str = Field(..., description="What a query that does not set this value gets now.")
    source: Literal["setting", "console", "tuned", "default"] = Field(
        ..., description="setting: set explicitly (environment or .env) and it wins; console: set with PUT "
                         "/api/knowledge/ranking; tuned: chosen by `groundwork tune`; default: built in.")
    stored: float | str | None = Field(..., description="The value set in the console (stored in tuned.json), or null.")
    tuned: float | str | None = Field(..., description="The value `groundwork tune` chose, or null (never for reranker).")
    builtin: float | str = Field(..., description="The settings' value (GROUNDWORK_* or the built-in default).")
    pinned_by: str | None = Field(..., description="The setting that pins this value (it was set explicitly), or null.")


class RankingSettings(BaseModel):
    alpha: RankingValue
    fusion: RankingValue
    reranker: RankingValue
    fusion_modes: dict[str, str] = Field(..., description="The fusion vocabulary, each with what it does.")
    rerankers: list[str] = Field(..., description="The rerankers this server can run (the only ones PUT accepts).")
    reranker_labels: dict[str, str] = Field(..., description="The console's text for each of rerankers.")
    use_tuned_ranking: bool = Field(..., description="False (GROUNDWORK_USE_TUNED_RANKING=false): tuned.json, "
                                                     "console values included, is ignored.")
    stored_in: str = Field(..., description="The file holding the tuned and the console-set ranking.")
    updated_at: str | None = Field(..., description="When a value was last set in the console (ISO 8601), or null.")
    notes: list[str] = Field(..., description="Why an effective value differs from the stored one, in plain words.")


class EvaluationSummary(Open):
    """What the evaluation runs wrote (nothing is computed here); ``empty`` with a ``hint`` when none ran."""

    results_path: str = Field(..., description="The evaluation results file (DuckDB) the Dagster assets write.")
    scorecard: list[dict[str, Any]] = Field(..., description="Latest result per dataset, split and configuration: "
                                                             "the run's fields (answer_method: extractive or llm; "
                                                             "judge_model and ragas_version when RAGAS judged the "
                                                             "answers), metrics ({canonical metric name: value}), "
                                                             "unavailable ({metric: {status: not_applicable or "
                                                             "failed, reason}}: the metrics without a value and why) "
                                                             "and previous (the run before it: run_id, created_at, "
                                                             "metrics, unavailable; null for a first run).")
    metrics: list[dict[str, Any]] = Field(..., description="The scorecard's metric columns in order: the registry "
                                          "(knowledge_store.evaluation.metrics.METRICS), then any other metric the runs stored; each "
                                          "with name, label, higher_is_better, digits, headline (shown with its "
                                          "change), gated (checked by the regression gate) and description.")
    alpha_sweeps: list[dict[str, Any]] = Field(..., description="Latest alpha sweep per dataset and split (an "
                                               "evaluation run's, e.g. `groundwork eval --sample`, and the "
                                               "alpha_sweep notebook's) and the self-tuning grid of this corpus: "
                                               "series of [alpha, score] points.")
    questions: list[dict[str, Any]] = Field([], description="Per dataset and split, the latest run's questions: "
                                            "query, expected (the answering document and section), found_rank (rank "
                                            "of the first relevant hit, null when not among the hits), scores and "
                                            "hits (rank, document, title, section, chunk_id, relevant, "
                                            "holds_answer); found and total count them.")
    helpful: dict[str, Any] | None = Field(..., description="The latest feedback_eval run: helpful rate from thumbs "
                                                            "overall and per configuration.")
    drift: dict[str, Any] | None = Field(..., description="The latest query_log_drift run: replayed queries, mean "
                                                          "top-5 overlap, the changed queries, and earlier runs.")
    feedback_ragas: dict[str, Any] | None = Field(None, description="The latest feedback_eval run's RAGAS figures on "
                                                  "the references the thumbs make: by_configuration ({configuration: "
                                                  "{ragas_recall@5, ragas_context_recall@5, ragas_context_precision@5, "
                                                  "downrated_in_top5}}), samples, run_id, created_at.")
    query_log_eval: dict[str, Any] | None = Field(None, description="The latest query_log_eval run: by_method ({answer "
                                                  "method: {metrics, unavailable}}: faithfulness, answer_relevancy, "
                                                  "answer_support, key_fact_recall), queries, judge_model, "
                                                  "ragas_version.")
    empty: bool = Field(..., description="True when no evaluation result exists yet.")
    hint: str | None = Field(..., description="How to produce results, when empty.")
