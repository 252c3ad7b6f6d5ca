"""Request models of the HTTP API: what every route accepts, in the OpenAPI schema and at run time.

The schema states what the server enforces: strict JSON types (``false`` is not a number, ``"3"`` is
not an integer), ISO-8601 date-times, and, in the *served* models that ``served_request_models`` derives
per app from the settings, the configured length limits and only the rerankers and answer modes this
server can run.  The base classes here are the vocabulary (every reranker, every answer mode); the
served ones are what the routes declare, so ``/openapi.json`` and the 422s agree with each other.
The vocabularies are the registries (``fusion.FUSION_REGISTRY``, ``reranker_registry.RERANKER_REGISTRY``,
``answer.ANSWER_REGISTRY``), read when an app's models are built: a name registered there is in the
served schema without an edit here.  (``api_models.py`` holds the response models.)
"""

# no ``from __future__ import annotations``: pydantic and FastAPI must see these annotations as objects
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from knowledge_store.config.settings import Settings
from knowledge_store.core.text import without_nul
from knowledge_store.ingest.sources import NAME_PATTERN
from knowledge_store.retrieval.answer import ANSWER_MODES, ANSWER_REGISTRY
from knowledge_store.retrieval.filters import SearchFilters
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.reranker_registry import RERANKERS, unavailable_requirements
from knowledge_store.storage.tuned import MANUAL_FIELDS

SOURCE_NAME_PATTERN = NAME_PATTERN.pattern


def _json_integer(value: object) -> object:
    """An integer as JSON Schema means it: 3 or 3.0, never true or "3" (pydantic's lax mode takes both)."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be an integer")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]

def _writing_answer_modes() -> Any:
    """``Literal`` of the answer modes that write an answer (what /api/ask takes), from the registry now."""
    return Literal[tuple(name for name, mode in ANSWER_REGISTRY.items() if mode.writes_answer)]  # type: ignore[valid-type]


def _fusion_text(prefix: str, suffix: str = "") -> str:
    return prefix + FUSION_MODES.described() + "." + suffix


def _answer_text(writing_only: bool) -> str:
    return "; ".join(mode.schema_text() for mode in ANSWER_REGISTRY.values() if mode.writes_answer or not writing_only) + "."


# the base classes' vocabularies as registered at import; the served models rebuild them per app
FusionName = FUSION_MODES.literal()
RerankerName = RERANKERS.literal()
AnswerName = ANSWER_MODES.literal()
WritingAnswerName = _writing_answer_modes()


def _iso_datetime(value: object) -> object:
    """Query-string datetimes must be ISO-8601 (the schema says date-time): ``0.5`` is not a moment."""
    if isinstance(value, str) and not re.match(r"^\d{4}-\d{2}-\d{2}", value):
        raise ValueError("must be an ISO-8601 date-time, e.g. 2026-01-31T12:00:00Z")
    return value


IsoDatetime = Annotated[datetime, BeforeValidator(_iso_datetime)]


def _text_field(description: str, **limits: Any) -> Any:
    # minLength/pattern stated for clients; enforced by _not_blank with a message people understand
    return Field(..., json_schema_extra={"minLength": 1, "pattern": r"\S"}, description=description, **limits)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


# ------------------------------------------------------------------ knowledge

class QueryBody(BaseModel):
    """The query request; ``served_request_models`` derives the served model, whose schema also states the configured
    length limit and only the rerankers / answer modes the server can run (others get a 422 naming the setting)."""

    model_config = ConfigDict(extra="forbid")

    # minLength/pattern stated for clients; enforced by _not_blank with a message people understand
    query: str = Field(..., json_schema_extra={"minLength": 1, "pattern": r"\S"},
                       description="Free text: a question, a prompt fragment, a parameter name (not only whitespace).")
    k: JsonInt = Field(5, ge=1, le=100)
    alpha: float | None = Field(None, ge=0.0, le=1.0, strict=True, description="0 = pure BM25, 1 = pure vector; default: the "
                                "corpus's effective default, or its question_alpha for a question (GET /api/knowledge/config; "
                                "the response's params say which: alpha, query_form).")
    fusion: FusionName | None = Field(None, description=_fusion_text("How BM25 and vector scores are combined: ",  # type: ignore[valid-type]
                                                                     " Default: the corpus's effective default."))
    section_weight: float | None = Field(None, ge=0.0, le=1.0, strict=True, description="Share of a passage's BM25 evidence taken "
                                         "from its whole section (0 = the passage alone); default: effective default.")
    lead_weight: float | None = Field(None, ge=0.0, le=1.0, strict=True, description="Share of a passage's vector evidence taken "
                                      "from its section's first passage (0 = the passage alone); default: effective default.")
    reranker: RerankerName | None = None  # type: ignore[valid-type]
    filters: SearchFilters | None = None
    answer: AnswerName = "extractive"  # type: ignore[valid-type]
    min_relevance: float | None = Field(None, ge=0.0, le=1.0, strict=True)

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, value: str) -> str:
        return _not_blank(value)


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retrieval_request_id: str = Field(..., min_length=1, max_length=64)
    chunk_id: str | None = Field(None, min_length=1, max_length=64)
    rating: Literal["up", "down"]
    note: str | None = None


class AskBody(BaseModel):
    """``POST /api/ask``; ``served_request_models`` derives the served model (length limit, answer modes)."""

    model_config = ConfigDict(extra="forbid")

    query: str = _text_field("The question.")
    top_k: JsonInt = Field(10, ge=1, le=100, description="Passages retrieved and ranked by descending score.")
    max_sources: JsonInt = Field(3, ge=1, le=10, description="How many of the best of them the answer is made from "
                                                              "and returns as sources.")
    answer: WritingAnswerName = "extractive"  # type: ignore[valid-type]

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, value: str) -> str:
        return _not_blank(value)


class AskLocalBody(AskBody):
    """``POST /api/ask-local`` (the ask contract): a question about text the reader selected in one document."""

    context: str = _text_field("The text the reader selected (searched together with the question).",
                               max_length=20000)
    source_file: str = _text_field("The document the selection is from: its path relative to its source (as in "
                                   "GET /api/kb/articles), an absolute path (admin callers only), a file name or a glob; the page URL "
                                   "for web sources. Retrieval is restricted to it.", max_length=2000)

    @field_validator("context", "source_file")
    @classmethod
    def _selection_not_blank(cls, value: str) -> str:
        return _not_blank(value)


class RankingUpdate(BaseModel):
    """``PUT /api/knowledge/ranking``: the values to set; ``null`` forgets the console's value (back to the tuned
    or built-in one); absent = unchanged.  The served model narrows ``reranker`` to those this server runs."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    alpha: float | None = Field(None, ge=0.0, le=1.0, strict=True,
                                description="Corpus default alpha: 0 = pure BM25, 1 = pure vector.")
    fusion: FusionName | None = Field(None, description=_fusion_text("Corpus default fusion: "))  # type: ignore[valid-type]
    reranker: RerankerName | None = None  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _something_to_change(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data:
            raise ValueError(f"nothing to change: send one or more of {', '.join(MANUAL_FIELDS)}")
        return data


# ------------------------------------------------------------------ sources

# a URL pattern of a web source: a non-empty regular expression (an empty one would match every URL)
UrlPattern = Annotated[str, Field(min_length=1, json_schema_extra={"format": "regex"})]


class WebOptions(BaseModel):
    """Crawl options of a web source (absent = the stored value, or the default for a new source; null is not a value)."""

    model_config = ConfigDict(extra="forbid")

    depth: JsonInt = Field(None, ge=0, le=5, description="Link hops followed from the base URL, 0-5 (default 2).")
    include: list[UrlPattern] = Field(None, description="Only URLs matching one of these regexes (re.search on the full URL).")
    exclude: list[UrlPattern] = Field(None, description="Skip URLs matching any of these regexes.")
    respect_robots: bool = Field(None, strict=True)
    requests_per_second: float = Field(None, ge=0.01, strict=True, description="Politeness limit per host (default 5).")
    max_pages: JsonInt = Field(None, ge=1, description="Page cap (default 500).")
    use_llms_txt: bool = Field(None, strict=True)
    use_sitemap: bool = Field(None, strict=True)
    llms_full_max_mb: float = Field(None, ge=0.01, strict=True)
    render_js: bool = Field(None, strict=True, description="Render HTML pages in headless Chromium before reading them "
                            "(sites whose content is built by JavaScript; default false). Needs GROUNDWORK_CHROMIUM_PATH.")


# a folder or URL holding NUL would name something else than it says (C strings end there): 422 naming the field
NO_NUL = r"^[^\x00]*$"


class SourceBody(WebOptions):
    name: str = Field(..., pattern=SOURCE_NAME_PATTERN,
                      description="Unique name: letters, digits, '.', '_', '-' (also the Dagster partition key).")
    kind: Literal["web", "folder"] = "web"
    url: str | None = Field(None, json_schema_extra={"pattern": NO_NUL}, description="Base URL of the site (kind web).")
    folder: str | None = Field(None, json_schema_extra={"pattern": NO_NUL},
                               description="Folder on this machine (kind folder).")
    enabled: bool = Field(True, strict=True)
    visibility: Literal["public", "internal"] = Field("internal", description="public: answers on the public surface "
                                                      "(the widget, callers without the admin token) may cite it; "
                                                      "internal: admin callers only.")
    sync: bool = Field(False, strict=True, description="Start a sync job right away (202 with its status URL).")

    @field_validator("url", "folder")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        return without_nul(value)


class SourceUpdateBody(WebOptions):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    name: str = Field(None, pattern=SOURCE_NAME_PATTERN)
    enabled: bool = Field(None, strict=True)
    visibility: Literal["public", "internal"] = Field(None, description="A change publishes a snapshot at once.")


WEB_OPTION_FIELDS = tuple(WebOptions.model_fields)


# ------------------------------------------------------------------ the served models of one app

@dataclass(frozen=True)
class RequestModels:
    """The request bodies one app serves, derived from its settings (limits) and what it can run."""

    query: type[QueryBody]
    ask: type[AskBody]
    ask_local: type[AskLocalBody]
    feedback: type[FeedbackBody]
    ranking_update: type[RankingUpdate]


def _enum(values: tuple[str, ...]) -> WithJsonSchema:
    """The schema of a vocabulary narrowed to ``values`` (validation still knows the whole vocabulary, so an
    unavailable value gets a 422 that names the missing setting rather than a bare 'not one of')."""
    return WithJsonSchema({"type": "string", "enum": list(values)})


def served_request_models(settings: Settings, rerankers: tuple[str, ...], answer_modes: tuple[str, ...],
                          ask_modes: tuple[str, ...]) -> RequestModels:
    """The served request models: the configured query and note length limits, and only the ``rerankers``,
    query ``answer_modes`` and ``ask_modes`` this server can run, stated in the schema.  The vocabularies
    (every registered fusion mode, reranker and answer mode) are read from their registries now."""
    fusion, reranker = FUSION_MODES.literal(), RERANKERS.literal()
    needs = unavailable_requirements()
    query = create_model(
        "QueryBody", __base__=QueryBody,
        query=(str, Field(..., max_length=settings.max_query_chars, json_schema_extra={"minLength": 1, "pattern": r"\S"},
                          description="Free text: a question, a prompt fragment, a parameter name (not only whitespace).")),
        fusion=(fusion | None, Field(None, description=_fusion_text("How BM25 and vector scores are combined: ",
                                                                    " Default: the corpus's effective default."))),
        reranker=(Annotated[reranker, _enum(rerankers)] | None,
                  Field(None, description="Reorders the fused candidates; the rerankers this server can run"
                                          + (f"; {needs}" if needs else "") + ". Default: default_reranker.")),
        answer=(Annotated[ANSWER_MODES.literal(), _enum(answer_modes)],
                Field("extractive", description=_answer_text(writing_only=False))),
    )
    ask_overrides: dict[str, Any] = dict(
        query=(str, Field(..., max_length=settings.max_query_chars, json_schema_extra={"minLength": 1, "pattern": r"\S"},
                          description="The question.")),
        answer=(Annotated[_writing_answer_modes(), _enum(ask_modes)],
                Field("extractive", description=_answer_text(writing_only=True))),
    )
    return RequestModels(
        query=query,
        ask=create_model("AskBody", __base__=AskBody, **ask_overrides),
        ask_local=create_model("AskLocalBody", __base__=AskLocalBody, **ask_overrides),
        feedback=create_model("FeedbackBody", __base__=FeedbackBody,
                              note=(str | None, Field(None, max_length=settings.max_note_chars))),
        ranking_update=create_model(
            "RankingUpdate", __base__=RankingUpdate,
            fusion=(fusion | None, Field(None, description=_fusion_text("Corpus default fusion: "))),
            reranker=(Annotated[reranker, _enum(rerankers)] | None,
                      Field(None, description="Corpus default reranker; only the rerankers this server can run "
                                              "(GET /api/knowledge/config lists them).")),
        ),
    )
