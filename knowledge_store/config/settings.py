"""The one configuration object, in sections.  Every knob lives here, every knob can be set
from the environment with the ``GROUNDWORK_`` prefix (``GROUNDWORK_DATA_DIR``,
``GROUNDWORK_SOURCES=/docs/a:/docs/b``, ``GROUNDWORK_CHUNK_SIZE_TOKENS=180`` …)
or from a ``.env`` file in the working directory.

Each section (``StorageSettings``, ``RankingSettings``, ...) is a class of its own; ``Settings`` is all of them
at once, so the variable names stay flat while code that needs one section takes that section's type."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from knowledge_store.config.embedding_models import (
    EMBEDDING_BACKENDS,
    EMBEDDING_MODELS,
    QUANTIZATION_RECIPES,
    SENTENCE_ENCODINGS,
    resolve_model,
)
from knowledge_store.core.entities import EntityVocabulary, vocabulary_from_json
from knowledge_store.core.errors import ConfigError
from knowledge_store.core.revisions import DEFAULT_FAMILY_ID_PATTERN
from knowledge_store.core.vocabulary import Vocabulary

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SectionT = TypeVar("SectionT", bound=BaseModel)


def default_models_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/groundwork/models``, else ``~/.cache/groundwork/models``: one per user, every data dir's
    (``models.artifacts`` says what it holds)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "groundwork" / "models"

# a model reads at most its window of word-pieces *including* [CLS] and [SEP] (256 for all-MiniLM-L6-v2):
# anything a chunk carries past window - 2 content tokens is invisible to its vector
SPECIAL_TOKENS = 2


# setting -> the vocabulary its values must belong to, registered by the layer that implements the names
# (retrieval: fusion modes, rerankers): configuration does not import the code its values choose
REGISTERED_VOCABULARIES: dict[str, Vocabulary] = {}


def register_vocabulary(setting: str, vocabulary: Vocabulary) -> None:
    """Check ``setting``'s values against ``vocabulary`` from now on (a live view: names added later count)."""
    REGISTERED_VOCABULARIES[setting] = vocabulary


class StorageSettings(BaseModel):
    """Where the store, the index snapshots and the logs live, and how the store is written."""

    data_dir: Path = Field(Path("./data"), description="Where the store, index snapshots and logs live.")
    models_cache_dir: Path = Field(default_factory=default_models_cache_dir, description="The per-user cache of model graphs (ONNX exports and quantised graphs, with their fidelity checks per CPU), shared by every data dir and built once per machine (`make install` builds the default model's). Default: $XDG_CACHE_HOME/groundwork/models, else ~/.cache/groundwork/models.")
    lock_timeout_s: float = Field(30.0, ge=0, description="How long to wait for the store's write lock.")
    write_batch_chunks: int = Field(512, ge=1, description="Embeddings written per store transaction.")
    snapshots_to_keep: int = Field(3, ge=1, description="Published index snapshots kept on disk (newest first).")
    deleted_retention_days: float = Field(30.0, ge=0, description="Soft-deleted documents are purged after this.")

    @property
    def store_path(self) -> Path:
        return self.data_dir / "store.duckdb"

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "index"

    @property
    def logs_path(self) -> Path:
        return self.data_dir / "logs.duckdb"

    @property
    def finetuned_models_dir(self) -> Path:
        """Models fine-tuned for this corpus (one folder each): they belong to the data dir, unlike the
        exported graphs of the base models in ``models_cache_dir``."""
        return self.data_dir / "models" / "finetuned"

    @property
    def uploads_dir(self) -> Path:
        """Where files uploaded through the API land; always ingested."""
        return self.data_dir / "uploads"

    @property
    def sample_corpus_dir(self) -> Path:
        return self.data_dir / "sample_corpus"


class SourceSettings(BaseModel):
    """What is ingested and which files count as one document."""

    sources: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Folders to ingest, separated by ':'. Empty = the default corpus: the generated sample "
        "documents (data/sample_corpus) and the uploads folder. This project's own docs/ are not part of it; "
        "add them with GROUNDWORK_SOURCES=data/sample_corpus:docs or as a folder source.",
    )
    max_file_mb: float = Field(50.0, gt=0, description="Files larger than this are refused with a failure row.")
    follow_external_symlinks: bool = Field(False, description="Index symbolic links (to files or folders) in a folder source whose target lies outside that folder; off = such links are skipped and counted as excluded.")
    revision_families: bool = Field(True, description="Supersedence across files: of live documents of one source that are revisions of one document (same asset id, or same title once the revision label is removed; knowledge_store/core/revisions.py), only the newest stays active; the others are superseded, with a supersedes relation. Off: every file is its own document (superseded ones become active again on the next sync).")
    family_id_pattern: str = Field(DEFAULT_FAMILY_ID_PATTERN, description="Regular expression (matched case-insensitively) for a document id in a title or file name that makes files revisions of one document: SOP-42-RevB.pdf and SOP-42 Rev C.docx share SOP-42.")
    entity_patterns: dict[str, str | dict[str, str | None] | None] = Field(
        default_factory=dict,
        description="Entity types recognised in chunk text, queries and filters.entities (knowledge_store/core/entities.py), "
        "as JSON adjusting the defaults (asset ASSET-104, equipment EQP-P101, procedure SOP-42, standard API 510 / "
        "ISO 9001 / IEC 61511): {type: regex | {pattern, canonical?, case?} | null}; a named type replaces its default, "
        "null removes it, a new type is added. A change re-extracts every document on the next sync.",
    )
    sensor_interval_s: int = Field(60, ge=10, description="How often the Dagster sensor looks for changed files.")
    ingest_retry_delays_s: list[float] = Field(
        default_factory=lambda: [10.0, 60.0, 300.0],
        description="Waits before each retry of a document whose parse failed transiently (an I/O error, an OCR time-out "
        "on a busy machine) and of an API ingestion job stopped by a busy store: one retry per entry, so [10, 60, 300] "
        "makes at most 4 attempts. Permanent failures (a corrupt or unsupported file) are never "
        "retried; [] switches retries off. JSON list, e.g. GROUNDWORK_INGEST_RETRY_DELAYS_S=[10,60,300].",
    )
    min_markdown_words: int = Field(50, ge=0, description="Markdown files with fewer words than this (front matter, link targets and markup not counted) are not indexed: a stub or placeholder page only adds noise to search results. Each one gets a too_short warning row naming its word count; 0 indexes every Markdown file.")

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * 1024 * 1024)

    @property
    def uses_default_corpus(self) -> bool:
        return not self.sources

    @property
    def in_context_sentences(self) -> bool:
        """Sentence vectors are made and pooled from their chunks' own forward pass (sentence_encoding)."""
        return self.sentence_vectors and self.sentence_encoding == "in_context"

    @property
    def entity_vocabulary(self) -> EntityVocabulary:
        """The entity patterns in force: the defaults adjusted by ``entity_patterns`` (cached per value)."""
        return vocabulary_from_json(json.dumps(self.entity_patterns, sort_keys=True))


class ChunkingSettings(BaseModel):
    """How documents are cut into chunks (in word-pieces of the embedding model)."""

    chunk_size_tokens: int = Field(200, ge=32, description="Target word-pieces per chunk (incl. title/section header).")
    chunk_max_tokens: int | None = Field(None, description="Hard cap; never above the model window minus [CLS]/[SEP] "
                                         "(default: exactly that: 254 minilm, 382 mpnet).")
    chunk_overlap_tokens: int = Field(32, ge=0, description="Word-pieces of trailing sentences repeated in the next chunk.")
    chunk_min_tokens: int = Field(24, ge=0, description="Fragments smaller than this are merged into a neighbour.")
    header_max_tokens: int = Field(40, ge=0, description="Budget for the 'title › section' header embedded with each chunk.")


class ModelSettings(BaseModel):
    """The embedding model and how documents and queries are embedded."""

    embedding_model: str = Field("mpnet", description="The embedding model: " + EMBEDDING_MODELS.described()
                                 + "; or the path of a local sentence-transformers folder. A change re-embeds every "
                                 "chunk into a new snapshot on the next sync (vectors of two models are never mixed).")
    model_path: Path | None = Field(None, description="A local sentence-transformers folder; wins over embedding_model "
                                    "Resolved: the folder of the model in use.")
    embedding_query_prefix: str | None = Field(None, description="Text put before every query before it is embedded "
                                               "(e5: 'query: ', bge: its query instruction); default: the model's "
                                               "registry entry (none for minilm and mpnet).")
    embedding_passage_prefix: str | None = Field(None, description="Text put before every chunk and sentence before "
                                                 "it is embedded (e5: 'passage: '); default: the registry entry's.")
    embedding_dim: int | None = Field(None, ge=1, description="Width of the model's vectors (checked at load); "
                                      "default: what the model folder's pooling config says (384 minilm, 768 mpnet).")
    embed_batch_size: int = Field(32, ge=1, description="Texts per batch when documents are embedded with torch (document_encoder=torch).")
    torch_threads: int = Field(min(2, os.cpu_count() or 1), ge=1, description="Cores document embedding may use: torch threads, or ONNX batches run at once (one thread each).")
    document_encoder: str = Field("onnx", description="Document (chunk) embedding backend in ingestion: onnx (ONNX Runtime, exported once from the local weights; fp32 vectors equal torch's to |1-cos| < 1e-6 and share its model id, faster, docs/BENCHMARKS.md) or torch (sentence-transformers).")
    document_quantization: str | None = Field(None, description="Document vectors in fp32 (none) or from a dynamically int8-quantised ONNX graph (int8: faster, cosine ~0.998 to fp32, its own model id so the two are never mixed; quality in docs/EVALUATION.md). Queries follow query_quantization. int8 needs document_encoder=onnx. Default: the model's registry entry (minilm none, mpnet int8).")
    sentence_vectors: bool = Field(True, description="Ingestion also makes a vector for every sentence of every chunk (as sentence_encoding says), for sentence evidence (sentence_weight). Sentences embedded on their own about double the embedding stage's time, pooled in context they add nothing measurable (docs/BENCHMARKS.md); false = no sentence vectors, and sentence evidence is off.")
    sentence_encoding: str | None = Field(None, description="How ingestion makes sentence vectors: separate (each sentence embedded on its own: a second forward pass, about as long as the chunks') or in_context (each sentence's token states pooled from its chunk's own forward pass: no second pass, the sentence read in its chunk's context; its own model id, so the next sync re-embeds). Needs document_encoder=onnx. Default: the model's registry entry (minilm separate, mpnet in_context). Ranking effect and ingest time in docs/EVALUATION.md.")
    bare_vector_weight: float = Field(0.0, ge=0, le=1, description="Share of each chunk's vector that is its text embedded without the 'title > section' header (0 = header + text only). Helped on documentation sets but not on scientific claims (docs/EVALUATION.md): try it on documentation corpora. Costs a second embedding of every chunk with a header; a change gets its own model id, so the next sync re-embeds every chunk before the index switches.")
    onnx_batch_size: int = Field(8, ge=1, description="Texts per ONNX Runtime call when embedding documents; texts are length-sorted first, so a batch carries almost no padding. 8 measured fastest on two cores (docs/BENCHMARKS.md).")
    embed_workers: int = Field(1, ge=1, le=64, description="Shards the Dagster embeddings asset fans out to, one step "
                               "each: run them at once with the multiprocess, Kubernetes or Celery executor (each shard gets "
                               "torch_threads / embed_workers threads); the store keeps one writer.")
    embed_handoff_dir: Path | None = Field(None, description="Set when shards run on other machines (K8s, Celery): a "
                                           "folder every worker mounts; shards write Parquet parts there and the "
                                           "combining step alone writes them into the store. Unset: shards write the "
                                           "store directly (one machine).")
    query_torch_threads: int = Field(default_factory=lambda: min(2, os.cpu_count() or 1), ge=1, description="Threads for query embedding in the serving process (default: 2, or 1 on a one-core machine; ONNX Runtime's query threads wait without spinning, so the second one does not take the ranking's time).")
    query_encoder: str = Field("onnx", description="Query embedding backend: onnx (ONNX Runtime, exported once from the local weights, faster, same vectors) or torch.")
    query_quantization: str | None = Field(None, description="Query vectors from the fp32 graph (none) or an int8 one (int8: the document recipe, every MatMul in 8-bit blocks; int8-mixed: the attention projections as dynamic int8 with 7-bit weights and the feed-forward layers in 8-bit blocks, faster for one question at a time; int8-smooth: the feed-forward input projections dynamic too, their inputs smoothed first, faster again) - for a large model whose query embedding dominates a query's latency, e.g. mpnet; ranking effect and latency in docs/EVALUATION.md and docs/BENCHMARKS.md. Each runs only where it passed its fidelity check on this CPU, else fp32. Needs query_encoder=onnx. Query vectors are never stored, so switching needs no re-embedding. Default: the model's registry entry (minilm none, mpnet int8-smooth).")


class RankingSettings(BaseModel):
    """How a query's candidates are found, fused and re-ordered (the ranking pipeline's steps)."""

    default_k: int = Field(5, ge=1, le=100, description="Passages returned when a query does not say.")
    default_alpha: float = Field(0.7, ge=0, le=1, description="Fusion weight: 0 = pure BM25, 1 = pure vector. The default is close to the best alpha on every dev set with the default section and lead weights (docs/EVALUATION.md); `groundwork tune` picks per corpus.")
    question_alpha: float | None = Field(0.8, ge=0, le=1, description="Fusion weight of questions (a query ending in '?' or opening with how/what/why/which/...) that do not set alpha: a question paraphrases its answer, so the vector side weighs more. Chosen on the train splits of the documentation dev sets (docs/EVALUATION.md). Unset (GROUNDWORK_QUESTION_ALPHA=null): questions use default_alpha. When default_alpha is pinned (environment or console) and this is not, questions follow it.")
    default_fusion: str = Field("weighted", description="Fusion mode of queries that do not name one (the fusion "
                                "modes: `groundwork query --help`, GET /api/knowledge/config fusion_modes).")
    section_weight: float = Field(1.0, ge=0, le=1, description="Share of a chunk's BM25 evidence that is its whole section's BM25 (0 = the chunk alone). See docs/EVALUATION.md.")
    lead_weight: float = Field(0.6, ge=0, le=1, description="Share of a chunk's vector evidence that is its section's first chunk's cosine (0 = the chunk alone).")
    entity_boost: float = Field(0.75, ge=0, le=10, description="A query naming an entity (SOP-42, ASSET-104, API 510): "
                                "candidates mentioning it gain this share of the fused-score spread (times the share of "
                                "the query's entities they mention), and one naming all of them is never below "
                                "min_relevance. 0 = off; queries naming no entity are unaffected.")
    identifier_boost: float = Field(0.75, ge=0, le=10, description="A query naming an identifier the corpus holds "
                                    "(a known term of letters and digits: E47, ext4, sha256): candidates holding it "
                                    "gain this share of the fused-score spread (times the share of the query's "
                                    "identifiers they hold), as entity_boost does for entities. 0 = off.")
    feedback_docs: int = Field(3, ge=0, le=20, description="Pseudo-relevance feedback: the query vector is moved towards the best chunk of each of the first this many documents of the fused ranking and the candidate pool is fused again (0 = off). See docs/EVALUATION.md.")
    feedback_beta: float = Field(0.3, ge=0.0, le=2.0, description="Pseudo-relevance feedback: how far the query vector moves towards those documents (query + beta * their centroid, renormalised; 0 = off).")
    sentence_weight: float = Field(0.15, ge=0.0, le=1.0, description="Sentence evidence: each candidate's vector evidence becomes (1 - w) * its chunk's cosine + w * its best sentence's cosine (and the same for its section's lead), over the fused pool only; 0 = off. Chosen on the dev sets' train splits (docs/EVALUATION.md). Needs sentence vectors in the snapshot (sentence_vectors).")
    phrase_boost: bool = Field(True, description="Queries of 8+ words: candidates containing most of the query's word pairs in order (a pasted passage) rank first.")
    use_tuned_ranking: bool = Field(True, description="Use the corpus's self-tuned ranking (index/tuned.json, `groundwork tune`) for values not set explicitly.")
    rrf_k: int = Field(60, ge=1, description="Reciprocal-rank-fusion constant.")
    calibrated_vector_sds: float = Field(1.0, ge=0, description="Calibrated fusion: a cosine range narrower than this "
                                         "many standard deviations of the query's cosine over a reference sample of "
                                         "the corpus's chunks counts as noise and is not stretched to 0-1 (see "
                                         "docs/EVALUATION.md, Calibrated fusion).")
    calibrated_vector_floor: float = Field(0.1, ge=0, le=2, description="Calibrated fusion: the smallest cosine "
                                           "noise scale, whatever the reference sample says (a store of a few chunks "
                                           "has no spread to measure).")
    calibrated_bm25_idf_share: float = Field(0.5, ge=0, description="Calibrated fusion: a BM25 range narrower than "
                                             "this share of the mean idf of the query's known terms (about what one "
                                             "occurrence of a typical query term adds) counts as noise.")
    calibrated_reference_rows: int = Field(256, ge=2, le=100_000, description="Calibrated fusion: chunks (evenly "
                                           "spaced over the snapshot) whose cosine with the query gives the vector "
                                           "noise scale.")
    candidate_pool: int = Field(100, ge=10, le=2000, description="Top hits taken from each of BM25 and vector before fusion.")
    min_relevance: float = Field(0.35, ge=0, le=1, description="Best relevance under this = 'no relevant content found'.")
    search_threads: int = Field(1, ge=1, description="BLAS threads for vector search (1 is fastest under load).")
    ann_min_chunks: int = Field(100_000, ge=1, description="Snapshots with at least this many chunks get an approximate (HNSW) vector index, built in the background from the stored vectors; smaller ones, and filters allowing fewer rows, are searched exactly. Below that size exact search is fast enough; see docs/BENCHMARKS.md (query latency).")
    ann_ef_search: int = Field(512, ge=10, le=4096, description="HNSW beam width per query (more = higher recall, slower); at least candidate_pool is searched (recall and latency per value: docs/BENCHMARKS.md).")
    ann_connectivity: int = Field(32, ge=4, le=64, description="HNSW links per node (recall, graph size and build time grow with it; docs/BENCHMARKS.md).")
    ann_expansion_add: int = Field(256, ge=16, le=1024, description="HNSW beam width while building.")
    ann_build_threads: int = Field(1, ge=1, description="Threads building an HNSW index while the server answers queries (the build is minutes at 1M chunks).")
    ann_cache: bool = Field(True, description="Keep a built HNSW index beside its snapshot (written atomically, checked against the snapshot on load) so a restart does not rebuild it.")
    query_cache_size: int = Field(2048, ge=0, description="Recent query embeddings kept in memory (0 = off).")


class RerankerSettings(BaseModel):
    """The rerankers a query may name."""

    default_reranker: str = Field("none", description="Reranker of queries that do not name one (the rerankers: "
                                  "`groundwork query --help`, GET /api/knowledge/config rerankers)"
                                  + ". A value set in the console applies when this is not set explicitly.")
    reranker_timeout_s: float = Field(3.0, gt=0, description="A reranker slower than this falls back to the fused order.")
    mmr_lambda: float = Field(0.7, ge=0, le=1, description="MMR trade-off: 1 = relevance only, 0 = diversity only.")
    feedback_similarity: float = Field(0.8, ge=0, le=1, description="Past queries at least this similar (cosine) lend their feedback.")
    feedback_weight: float = Field(0.3, ge=0, description="How far one unit of net feedback moves a passage's score.")
    cross_encoder_path: Path | None = Field(None, description="Local sentence-transformers CrossEncoder folder for the cross-encoder reranker.")
    node_postprocessors: str = Field(
        "", description="LlamaIndex node postprocessors offered as rerankers, comma-separated: 'module:Class' (named "
                        "by the class, lower-cased) or 'name=module:Class'; each is built with no arguments.")


class AnswerSettings(BaseModel):
    """Answers and snippets: extractive, generated by an OpenAI-compatible endpoint, and the support tool's."""

    snippet_chars: int = Field(150, ge=40, le=1000)
    llm_base_url: str | None = Field(None, description="OpenAI-compatible endpoint for generated answers; unset = extractive answers only.")
    llm_model: str | None = Field(None)
    llm_api_key: SecretStr | None = Field(None)
    support_floor: float = Field(0.7, ge=0, le=1, description="retrieve_knowledge: minimum relevance_score of a source.")
    support_budget_ms: int = Field(100, ge=1, description="retrieve_knowledge: hard time budget of every call, the "
                                   "first ones of a cold process included (they answer empty while the model loads).")

    @property
    def llm_configured(self) -> bool:
        """An OpenAI-compatible endpoint and model are set: generated (``llm``) answers can run."""
        return bool(self.llm_base_url and self.llm_model)


class LearningSettings(BaseModel):
    """What the corpus learns by itself: the query adapter from thumbs-up, the fine-tuned embedding model."""

    use_query_adapter: bool = Field(True, description="Apply the corpus's query adapter learned from thumbs-up feedback (index/query_adapter.npz, `groundwork adapt`) to every query vector. See docs/EVALUATION.md (Feedback that learns).")
    adapter_min_queries: int = Field(20, ge=2, description="`groundwork adapt` refuses to train a query adapter from fewer rated queries than this.")
    adapter_retrain_votes: int = Field(50, ge=1, description="The Dagster sensor `feedback_grew` retrains the query adapter once this many new thumbs-up have been given since the last decision (never fewer than adapter_min_queries): often enough that ratings change rankings, seldom enough that each decision rests on new evidence.")
    learn_from_feedback: bool = Field(True, description="Learn from ratings without a command: the Dagster sensor `feedback_grew` retrains the query adapter after adapter_retrain_votes new thumbs-up, and it is adopted only when its cross-validated gain on the rated queries is clear (the decision, adopted or declined, is shown on the console's Settings page). false: ratings are only stored (and used by the feedback reranker); `groundwork adapt` still trains by hand.")
    feedback_check_interval_s: int = Field(300, ge=30, description="How often the sensor `feedback_grew` counts new thumbs-up (seconds): counting is one query of the query log, the retraining it may start takes seconds to minutes.")
    finetune_embedder: bool = Field(True, description="Fine-tune the embedding model on each corpus without labels "
                                    "(pairs from its headings, titles, first sentences, link texts and thumbs-up) and "
                                    "serve the result only when held-out pseudo-queries rank clearly better (paired "
                                    "gain over 0.005 nDCG@10 and 2 standard errors). Runs in the background after "
                                    "syncs that change finetune_change_share of the corpus (Dagster sensor), on "
                                    "`groundwork adapt --embedder` and in `groundwork eval`. false: the base model "
                                    "serves (the next publish switches back).")
    finetune_budget_s: float = Field(900.0, gt=0, description="Seconds of training one fine-tuning run may spend; it "
                                     "stops at the step that reaches it (re-embedding and the decision come on top).")
    finetune_min_pairs: int = Field(200, ge=1, description="Corpora yielding fewer training pairs are not fine-tuned "
                                    "(declined, with the count).")
    finetune_max_pairs: int = Field(6000, ge=32, description="Training pairs used at most per run (a seeded sample, "
                                    "each document capped so a long manual does not dominate).")
    finetune_target_gain: float = Field(0.03, gt=0, description="The held-out nDCG@10 gain fine-tuning is for: when "
                                        "the held-out pseudo-queries are too few to show a gain this large (two "
                                        "expected standard errors), fine-tuning declines before training.")
    finetune_memory_gb: float = Field(4.0, gt=0, description="The peak resident memory a fine-tuning run's process may "
                                      "reach (GiB): what the process already holds (its corpus's snapshot and "
                                      "engine) plus what training adds, which must also fit what the machine has "
                                      "free. The mini-batch and gradient checkpointing are chosen to fit it, and a "
                                      "run that cannot fit is declined before training.")
    finetune_change_share: float = Field(0.2, gt=0, le=1, description="The Dagster sensor fine-tunes again when this "
                                         "share of the served chunks is new since the last fine-tuning decision (or "
                                         "none was made yet).")


class EvaluationSettings(BaseModel):
    """What the Dagster evaluation assets measure."""

    eval_datasets: Annotated[list[Path], NoDecode] = Field(
        default_factory=lambda: [PROJECT_ROOT.parent / "shared" / "datasets" / "scifact",
                                 PROJECT_ROOT / "data" / "datasets" / "debian-docs",
                                 PROJECT_ROOT / "data" / "datasets" / "perl-docs"],
        description="BEIR folders (corpus.jsonl, queries.jsonl, qrels) the Dagster evaluation assets measure, "
        "separated by ':'; those that do not exist are skipped. Default: the shared SciFact set beside the checkout "
        "and the two documentation dev sets once `make devset` has built them (quality is measured on more than "
        "one kind of corpus: docs/EVALUATION.md).",
    )
    eval_llm_answers: bool = Field(True, description="With an OpenAI-compatible endpoint configured "
                                   "(GROUNDWORK_LLM_BASE_URL and GROUNDWORK_LLM_MODEL), evaluations answer each query "
                                   "through it, as answer=llm does, so grounding and the RAGAS faithfulness and answer "
                                   "relevancy judge the answers such users read; false: extractive answers, whose "
                                   "grounding is not applicable (they are verbatim), and no endpoint calls.")
    eval_judge_url: str | None = Field(None, description="OpenAI-compatible endpoint (Ollama, a llama.cpp server, "
                                       "vLLM: its /v1 base URL) that judges RAGAS faithfulness and answer relevancy; "
                                       "needs GROUNDWORK_EVAL_JUDGE_MODEL. Unset = the answering endpoint "
                                       "(GROUNDWORK_LLM_BASE_URL) when one is configured, else no judge: the query-log "
                                       "evaluation then records only the metrics that need none.")
    eval_judge_model: str | None = Field(None, description="Model that judges RAGAS faithfulness and answer relevancy "
                                         "through GROUNDWORK_EVAL_JUDGE_URL or GROUNDWORK_LLM_BASE_URL; unset = the "
                                         "answering model (GROUNDWORK_LLM_MODEL). Another model avoids a model grading "
                                         "its own answers.")
    eval_judge_timeout_s: float = Field(60.0, gt=0, description="Seconds one request to the judge endpoint may take "
                                        "before it is retried (twice) and then recorded as the judge's failure; a "
                                        "small local model on a CPU needs minutes.")
    eval_judge_embedding_model: str | None = Field(None, description="Model the endpoint's /embeddings is asked with "
                                                   "for RAGAS answer relevancy (it compares the question with "
                                                   "questions generated from the answer); unset = the judge model.")


class QueryLogSettings(BaseModel):
    """The query log: its retention and the JSON lines written per query."""

    query_log_retention_days: float = Field(90.0, ge=0, description="Logged queries and their feedback older than this "
                                            "many days are deleted by the daily Dagster schedule query_log_retention_daily "
                                            "(and by groundwork logs purge); 0 = keep everything.")
    query_log_stdout: bool = Field(True, description="The server prints one JSON line per query (redacted) on stdout, "
                                   "for container logs. Only the server: the CLI's stdout is its output "
                                   "and MCP over stdio's is the protocol.")
    query_log_file: bool = Field(True, description="Every process that logs a query (server, CLI, MCP over stdio, "
                                 "support tool) appends its line to <data_dir>/logs/query.log, rotated daily and "
                                 "at query_log_max_mb, query_log_keep_days kept.")
    query_log_max_mb: float = Field(100.0, gt=0, description="Size at which query.log is rotated (besides midnight UTC).")
    query_log_keep_days: int = Field(7, ge=1, description="Rotated query.log files kept.")
    log_answers: bool = Field(False, description="Write each answer's text into the query line (stdout and "
                              "query.log). Off: the line has answer null and its retrieval_request_id, and the text "
                              "stays in the query log (logs.duckdb) - an admin's answer may quote internal documents, "
                              "and container logs travel further than the data folder.")


class ServerSettings(BaseModel):
    """The HTTP API, console and MCP server: address, access, limits."""

    server_host: str = Field("127.0.0.1", description="Bind address; anything but loopback needs allow_remote=true.")
    server_port: int = Field(8080, ge=1, le=65535)
    allow_remote: bool = Field(False, description="Remote mode: serve beyond this machine (needed to bind anything but "
                               "loopback). The admin surface then requires the admin token, and public callers see "
                               "only public sources and are rate-limited (README, 'Running it for others').")
    admin_token: SecretStr | None = Field(None, description="Bearer token of the admin surface (everything but ask, "
                                          "query, feedback, the widget, /health and public documents' files). Set: "
                                          "required on every admin request. Unset: open on loopback; in remote mode one "
                                          "is generated into <data_dir>/admin_token (mode 0600).")
    source_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="Folders (':'-separated) inside which the API may register folder sources, "
        "symbolic links resolved; others are refused with 422, token or not. Default: the data folder and the "
        "folders configured at start (GROUNDWORK_SOURCES or the default corpus) whenever the admin surface needs a "
        "token (remote mode, or GROUNDWORK_ADMIN_TOKEN set); otherwise, on loopback, any folder.")
    public_rate: float = Field(5.0, ge=0, description="Requests per second one client may make to the public API "
                               "routes (token bucket; 0 = no limit); over it: 429 with Retry-After. Admin requests are "
                               "never limited; loopback clients only in remote mode.")
    public_burst: int = Field(20, ge=1, description="Requests one client may make at once before public_rate applies.")
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Addresses or networks (comma-separated, e.g. 127.0.0.1,10.0.0.0/8) of reverse "
        "proxies whose X-Forwarded-For names the client; from anyone else the header is ignored.")
    public_metrics: bool = Field(False, description="Serve /metrics on the public surface (default: admin only).")
    ssl_certfile: Path | None = Field(None, description="TLS certificate (PEM) for `groundwork serve`; with ssl_keyfile.")
    ssl_keyfile: Path | None = Field(None, description="TLS private key (PEM) for `groundwork serve`; with ssl_certfile.")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host header values accepted besides localhost/127.0.0.1/[::1] (any port), comma-separated; "
        "'name:*' allows any port. Every route answers 421 to other hosts (DNS-rebinding protection).",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Browser origins (scheme://host[:port], comma-separated; 'http://name:*' = any port) allowed to "
        "call the API cross-site, with CORS headers. Every other origin but the server's own - other ports of this "
        "machine included - gets 403 (/mcp also takes local origins, as the MCP SDK does).",
    )
    search_workers: int = Field(8, ge=1, description="Queries the API runs at once; more wait (and share embedding batches).")
    max_query_chars: int = Field(2000, ge=10, description="Longer queries are rejected with 422.")
    max_note_chars: int = Field(1000, ge=1, description="Feedback notes longer than this are rejected.")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Largest request body the API reads (every route "
                                "but uploads, which take max_file_mb): a larger one is answered 413 before it is "
                                "read, at once when its Content-Length says so.")


class WebSettings(BaseModel):
    """Crawling web sources (per-source options - depth, include/exclude, page cap, rate - live on the source row)."""

    web_timeout_s: float = Field(20.0, gt=0, description="Per-request timeout when crawling a web source.")
    web_max_retries: int = Field(3, ge=0, le=10, description="Retries of a transient fetch failure (timeout, 429, 5xx).")
    web_backoff_base_s: float = Field(0.5, ge=0, description="First retry wait; doubles per retry (Retry-After wins when larger).")
    web_max_backoff_s: float = Field(60.0, ge=0, description="Longest wait between retries; a Retry-After asking for more ends the retries (transient failure, kept for the next sync).")
    web_revalidate_days: float = Field(7.0, ge=0, description="A page skipped by sitemap <lastmod> this long is requested again (conditionally: 304 is cheap), so a lagging sitemap cannot hide a change longer.")
    web_progress_interval_s: float = Field(2.0, ge=0, description="How often crawl progress is reported to logs and job status.")
    chromium_path: Path = Field(Path("/usr/bin/chromium"), description="The Chromium executable that renders the pages of web sources with render_js on (Debian's chromium package, driven by Playwright; no browser is ever downloaded). Missing: those sources fail with an error naming this setting.")
    web_render_timeout_s: float = Field(30.0, gt=0, description="Time one page may take to render in Chromium (navigation plus the wait condition); past it the scripts are stopped, the DOM as it stands is kept and the page counts as a render timeout, so one hanging page cannot stall a crawl.")
    web_render_wait: Literal["load", "domcontentloaded", "networkidle"] = Field("networkidle", description="When a rendered page is read: networkidle (no request for 0.5 s) also catches content fetched by scripts after load; load or domcontentloaded are faster for pages that build their content from bundled scripts alone.")
    web_js_min_words: int = Field(20, ge=0, description="A fetched HTML page with fewer words of content than this that loads scripts, from a web source with render_js off, is not indexed as a near-empty document but reported as needs_js_rendering: its content is built by JavaScript. 0 turns the check off.")


class OcrSettings(BaseModel):
    """OCR of PDF pages without a text layer (Tesseract through PyMuPDF; digital pages never)."""

    ocr_enabled: bool = Field(True, description="OCR PDF pages that have no text layer (scans). Pages with text are never OCR'd.")
    ocr_language: str = Field("eng", pattern=r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$", description="Tesseract language(s), e.g. eng or eng+deu; each needs <lang>.traineddata in the tessdata folder.")
    ocr_dpi: int = Field(300, ge=72, le=600, description="Resolution scanned pages are rendered at for OCR (300 is Tesseract's sweet spot).")
    ocr_timeout_s: float = Field(300.0, gt=0, description="OCR time allowed per document; past it that version fails (the previous one stays indexed).")
    ocr_confidence_pass: bool = Field(True, description="Also run the tesseract command on each OCR'd page for word confidences (beside the OCR, on another core); off = confidence unknown.")
    tessdata_dir: Path | None = Field(None, description="Tesseract language data folder; unset = TESSDATA_PREFIX, else the system's (Debian: /usr/share/tesseract-ocr/5/tessdata).")
    ocr_low_confidence: float = Field(0.5, ge=0, le=1, description="A text line OCR read with a mean word confidence under this (0-1) is a low-confidence region: recorded per page, its document marked needs_review and its passages' citations flagged low_confidence_ocr, so a person checks the scan.")


# (fields are listed base by base from the last: storage first, as in the sections above)
class Settings(BaseSettings, OcrSettings, WebSettings, ServerSettings, QueryLogSettings, EvaluationSettings,
               LearningSettings, AnswerSettings, RerankerSettings, RankingSettings, ModelSettings, ChunkingSettings,
               SourceSettings, StorageSettings):
    """Every setting, one field per ``GROUNDWORK_*`` variable, composed of the sections above.

    Code that needs one section takes that section's type (``ranking: RankingSettings``): a ``Settings`` is one,
    and ``section`` copies one out on its own."""

    model_config = SettingsConfigDict(
        env_prefix="GROUNDWORK_", env_file=".env", extra="ignore", validate_default=True
    )


    @field_validator("sources", "eval_datasets", "source_roots", mode="before")
    @classmethod
    def _split_sources(cls, value: object) -> object:
        if isinstance(value, str):
            return [Path(part) for part in value.split(":") if part.strip()]
        return value

    @field_validator("question_alpha", mode="before")
    @classmethod
    def _question_alpha_off(cls, value: object) -> object:
        """``GROUNDWORK_QUESTION_ALPHA=null`` (or none/off/empty): questions use default_alpha."""
        return None if isinstance(value, str) and value.strip().lower() in ("", "null", "none", "off") else value

    @field_validator("allowed_hosts", "cors_origins", "trusted_proxies", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("cors_origins")
    @classmethod
    def _origin_shape(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin == "*" or not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"{origin!r} is not an origin: use scheme://host[:port] (no path, no '*' alone)")
        return [origin.rstrip("/") for origin in value]

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network (e.g. 127.0.0.1 or 10.0.0.0/8)") from None
        return value

    @field_validator("default_fusion", "default_reranker")
    @classmethod
    def _in_vocabulary(cls, value: str, info: ValidationInfo) -> str:
        # the registries live with their implementations (retrieval/fusion.py, retrieval/reranker_registry.py),
        # which register them here when they are imported; the engine checks again when it is built
        vocabulary = REGISTERED_VOCABULARIES.get(info.field_name)
        return vocabulary.check(value) if vocabulary is not None else value

    @field_validator("document_encoder", "query_encoder", "document_quantization", "query_quantization",
                     "sentence_encoding")
    @classmethod
    def _known_embedding_option(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None  # the model's registry entry decides (_check)
        known = QUANTIZATION_RECIPES if info.field_name.endswith("_quantization") else \
            SENTENCE_ENCODINGS if info.field_name == "sentence_encoding" else EMBEDDING_BACKENDS
        if value not in known:
            raise ValueError(f"must be one of {', '.join(known)} (got {value!r})")
        return value

    @field_validator("ingest_retry_delays_s")
    @classmethod
    def _retry_delays(cls, value: list[float]) -> list[float]:
        if len(value) > 10 or any(not (0 <= delay <= 3600) for delay in value):
            raise ValueError(f"{value!r}: at most 10 waits, each between 0 and 3600 seconds")
        return value

    @field_validator("family_id_pattern")
    @classmethod
    def _compilable_family_pattern(cls, value: str) -> str:
        try:
            re.compile(value, re.IGNORECASE)
        except re.error as error:
            raise ConfigError("family_id_pattern", value, f"is not a regular expression: {error}") from None
        if re.compile(value, re.IGNORECASE).search(""):
            raise ConfigError("family_id_pattern", value, "matches the empty string, so every file would be one document")
        return value

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        model = resolve_model(str(self.model_path) if self.model_path is not None else self.embedding_model,
                              self.embedding_query_prefix, self.embedding_passage_prefix)
        self.model_path = model.path
        self.embedding_query_prefix, self.embedding_passage_prefix = model.query_prefix, model.passage_prefix
        # unset: how the registry entry runs the model, as far as the encoders allow (torch runs fp32 only)
        if self.document_quantization is None:
            self.document_quantization = model.document_quantization if self.document_encoder == "onnx" else "none"
        if self.query_quantization is None:
            self.query_quantization = model.query_quantization if self.query_encoder == "onnx" else "none"
        if self.sentence_encoding is None:
            self.sentence_encoding = model.sentence_encoding if self.document_encoder == "onnx" else "separate"
        if self.embedding_dim is None:
            if model.dim is None:
                raise ConfigError("embedding_dim", None, f"{model.path} does not say its vector width (no pooling "
                                  "config): set GROUNDWORK_EMBEDDING_DIM")
            self.embedding_dim = model.dim
        window = model.max_tokens - SPECIAL_TOKENS
        if self.chunk_max_tokens is None:
            self.chunk_max_tokens = window
        if self.chunk_max_tokens > window:
            raise ConfigError("chunk_max_tokens", self.chunk_max_tokens, f"must be <= {window} (model window)")
        if self.chunk_size_tokens > self.chunk_max_tokens:
            raise ConfigError("chunk_size_tokens", self.chunk_size_tokens, f"must be <= chunk_max_tokens ({self.chunk_max_tokens})")
        if self.chunk_overlap_tokens >= self.chunk_size_tokens // 2:
            raise ConfigError("chunk_overlap_tokens", self.chunk_overlap_tokens, "must be under half of chunk_size_tokens")
        if self.header_max_tokens >= self.chunk_size_tokens // 2:
            raise ConfigError("header_max_tokens", self.header_max_tokens, "must be under half of chunk_size_tokens")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            given = "ssl_certfile" if self.ssl_certfile is not None else "ssl_keyfile"
            raise ConfigError(given, str(self.ssl_certfile or self.ssl_keyfile),
                              "TLS needs both ssl_certfile and ssl_keyfile")
        if self.document_quantization != "none" and self.document_encoder != "onnx":
            raise ConfigError("document_quantization", self.document_quantization, "needs document_encoder=onnx")
        if self.query_quantization != "none" and self.query_encoder != "onnx":
            raise ConfigError("query_quantization", self.query_quantization, "needs query_encoder=onnx")
        if self.sentence_encoding == "in_context" and self.document_encoder != "onnx":
            raise ConfigError("sentence_encoding", self.sentence_encoding,
                              "needs document_encoder=onnx (sentences are pooled from the ONNX graph's token states)")
        self.entity_vocabulary  # compiles every entity pattern: a bad one is refused here (EntityPatternError)
        return self











    @property
    def source_dirs(self) -> list[Path]:
        """The folders to ingest, resolved; the default corpus (the generated sample documents only) when none
        are set, plus the uploads folder once it exists (computed each time: cheap, and never stale)."""
        if self.sources:
            dirs = [p.expanduser().resolve() for p in self.sources]
        else:
            dirs = [self.sample_corpus_dir.resolve()]
        uploads = self.uploads_dir.resolve()
        if uploads.is_dir() and uploads not in dirs:
            dirs.append(uploads)
        return dirs

    @property
    def source_roots_in_force(self) -> tuple[Path, ...] | None:
        """The folders inside which every folder source must lie, resolved now (symbolic links followed), or None
        where folders may be anywhere: ``source_roots`` when set, else - whenever the admin surface needs a token
        (remote mode, or an admin token set) - the data folder and the configured folders; on loopback without a
        token, None (a local user already owns every file)."""
        if self.source_roots:
            roots = list(self.source_roots)
        elif self.allow_remote or self.admin_token is not None:
            roots = [self.data_dir, *self.source_dirs]
        else:
            return None
        return tuple(dict.fromkeys(Path(root).expanduser().resolve() for root in roots))

    def section(self, kind: type[SectionT]) -> SectionT:
        """The values of one section (``RankingSettings``, ...) as an object of that section alone."""
        return kind.model_construct(**{name: getattr(self, name) for name in kind.model_fields})
