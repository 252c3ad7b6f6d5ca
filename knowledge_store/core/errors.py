"""Typed errors.  Each carries the offending input so a failure row or an API
response can say exactly what was wrong, in plain words, without a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar


class GroundworkError(Exception):
    """Base class for every error this package raises on purpose."""


class IngestionError(GroundworkError):
    """A file could not be ingested.  ``kind`` is a stable machine-readable
    label stored in the ingestion-failures table; ``reason`` is the sentence a
    person reads."""

    kind = "ingestion_error"
    # transient: the same bytes may succeed on another attempt (an I/O error, a time-out on a busy machine), so
    # the parse stage retries them (GROUNDWORK_INGEST_RETRY_DELAYS_S); permanent ones fail on the first attempt
    transient: ClassVar[bool] = False

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class FileReadError(IngestionError):
    """Reading the file failed in a way another attempt can get past (an I/O error, a busy or stale network
    file, an interrupted read); carries the OS error number."""

    kind = "read_error"
    transient = True

    def __init__(self, path: str | Path, reason: str, errno: int | None = None) -> None:
        self.errno = errno
        super().__init__(path, reason)


class EmptyFileError(IngestionError):
    kind = "empty"


class OversizeFileError(IngestionError):
    kind = "oversize"


class UnsupportedTypeError(IngestionError):
    kind = "unsupported_type"


class WrongExtensionError(IngestionError):
    kind = "wrong_extension"


class PasswordProtectedError(IngestionError):
    kind = "password_protected"


class CorruptFileError(IngestionError):
    kind = "corrupt"


class NestingTooDeepError(IngestionError):
    """Markup nests elements deeper than the parser's limit (``MAX_HTML_NESTING_DEPTH``).

    Real pages nest a few dozen levels; thousands of levels are a generated or
    hostile file, and parsing it would take minutes.  Refused while the tree is
    being built, so the refusal is quick; ``depth`` is where counting stopped.
    """

    kind = "nested_too_deeply"

    def __init__(self, path: str | Path, depth: int, limit: int) -> None:
        self.depth = depth
        self.limit = limit
        super().__init__(
            path,
            f"elements are nested at least {depth} levels deep, over the limit of {limit} levels; "
            "real pages nest far less, so this file is generated or damaged",
        )


class NoTextError(IngestionError):
    """Parsing worked but there is no text to index (e.g. every page scanned)."""

    kind = "no_text"


class TooShortError(IngestionError):
    """A Markdown file has fewer words than ``GROUNDWORK_MIN_MARKDOWN_WORDS``: left out of the index on purpose
    (a stub adds noise to search), reported as a warning row carrying its word count and the threshold."""

    kind = "too_short"

    def __init__(self, path: str | Path, words: int, minimum: int) -> None:
        self.words = words
        self.minimum = minimum
        super().__init__(
            path,
            f"the Markdown file has {words} word(s), under the {minimum}-word minimum, so it is not indexed; "
            "add content, or lower GROUNDWORK_MIN_MARKDOWN_WORDS (0 indexes every Markdown file)",
        )


class NeedsJsRenderingError(IngestionError):
    """A fetched HTML page has (almost) no content but loads scripts: its text is built by JavaScript.
    Not indexed as an empty document; the reason says to turn on ``render_js`` for its source."""

    kind = "needs_js_rendering"

    def __init__(self, path: str | Path, words: int, source: str) -> None:
        self.words = words
        self.source = source
        super().__init__(
            path,
            f"the page has {words} word(s) of content but loads scripts: its content is rendered by JavaScript. "
            f"Enable render_js for source {source!r} (`groundwork sources update {source} --render-js`, the "
            f"Sources page, or PATCH /api/sources/{source} with render_js: true) and sync it again",
        )


class OcrTimeoutError(IngestionError):
    """OCR of one document used up its time budget (``GROUNDWORK_OCR_TIMEOUT_S``).

    That version fails with a failure row; the previous version stays indexed.
    Carries where it stopped so the reason can say how far it got.
    """

    kind = "ocr_timeout"
    transient = True  # the budget is wall time: a machine busy with other work can finish within it next time

    def __init__(
        self, path: str | Path, page_number: int, page_count: int, pages_done: int, seconds: float, limit_s: float
    ) -> None:
        self.page_number = page_number
        self.page_count = page_count
        self.pages_done = pages_done
        self.seconds = seconds
        self.limit_s = limit_s
        super().__init__(
            path,
            f"OCR stopped at page {page_number} of {page_count}: {pages_done} scanned page(s) took {seconds:.1f} s, "
            f"over the {limit_s:g} s per-document OCR limit; raise GROUNDWORK_OCR_TIMEOUT_S to index this document",
        )


class QueryValidationError(GroundworkError):
    """A query parameter is out of range or cannot be served; names the field and the value.

    The HTTP API answers it with 422 ``{field, message}``, MCP with Invalid params.
    (``knowledge_store.retrieval.engine`` imports it too: ``from knowledge_store.retrieval.engine import
    QueryValidationError`` works.)
    """

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        self.field = field_name
        self.value = value
        super().__init__(f"{field_name}: {reason} (got {value!r})")


class StoreError(GroundworkError):
    """The DuckDB store is missing, locked or inconsistent."""


class StoreLockedError(StoreError):
    def __init__(self, path: str | Path, detail: str) -> None:
        self.path = str(path)
        super().__init__(
            f"{self.path} is being written by another process (a sync is probably running); "
            f"retry when it finishes. DuckDB said: {detail}"
        )


class StoreBusyError(StoreLockedError):
    """This process's own connections to the store kept it in the other mode for longer than the timeout."""

    def __init__(self, path: str | Path, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        super().__init__(path, f"connections of this process held the store for more than {timeout_s:g} s")


class IndexNotBuiltError(StoreError):
    def __init__(self, index_dir: str | Path) -> None:
        self.index_dir = str(index_dir)
        super().__init__(
            f"no published index snapshot in {self.index_dir}; run `groundwork ingest` "
            "or materialise the assets in Dagster first"
        )


class ModelUnavailableError(GroundworkError):
    """The model that made the served snapshot's vectors is not on this machine (a fine-tuned folder deleted):
    queries cannot be embedded with it."""

    def __init__(self, model_id: str, path: object) -> None:
        self.model_id = model_id
        self.path = path
        super().__init__(f"the served index was embedded with {model_id}, whose folder {path or '(unknown)'} is "
                         "missing; run `groundwork adapt --embedder --rollback` to serve the base model again")


class ModelLoadingError(GroundworkError):
    """The embedding model a query needs is still being loaded in the background (a server that bound its port
    before the model was ready): the query is refused at once instead of waiting.  Carries the model, what the
    load is doing (``phase``: exporting, quantising or loading), how long it has run, and ``retry_after_s``, the
    estimated seconds until it is ready (the HTTP API's 503 ``Retry-After``)."""

    def __init__(self, model_id: str, phase: str, seconds: float, retry_after_s: int) -> None:
        self.model_id = model_id
        self.phase = phase
        self.seconds = seconds
        self.retry_after_s = retry_after_s
        super().__init__(f"the embedding model {model_id} is still loading ({phase}, {seconds:.0f} s so far); "
                         f"queries are answered once it is ready, in about {retry_after_s} s")


class ModelLoadFailedError(GroundworkError):
    """Loading the embedding model a query needs failed (in the background): carries the model and the load's
    own error (``reason``, ``Type: message``), so every refused query says why."""

    def __init__(self, model_id: str, reason: str) -> None:
        self.model_id = model_id
        self.reason = reason
        super().__init__(f"the embedding model {model_id} could not be loaded: {reason}")


class ConfigError(GroundworkError):
    """A setting has a value that cannot work; names the setting and the value."""

    def __init__(self, setting: str, value: object, reason: str) -> None:
        self.setting = setting
        self.value = value
        super().__init__(f"{setting}={value!r}: {reason}")


class ChromiumNotFoundError(ConfigError):
    """Rendering pages (a web source with ``render_js``) needs a Chromium executable that is not there."""

    def __init__(self, path: object) -> None:
        self.path = path
        super().__init__("GROUNDWORK_CHROMIUM_PATH", str(path), "no Chromium executable there; render_js needs one "
                         "(Debian: apt-get install chromium), or point GROUNDWORK_CHROMIUM_PATH at it")


class EntityPatternError(ConfigError):
    """An entity pattern (``GROUNDWORK_ENTITY_PATTERNS``) cannot work: names the entity type and the pattern."""

    def __init__(self, entity_type: str, pattern: object, reason: str) -> None:
        self.entity_type = entity_type
        self.pattern = pattern
        super().__init__(f"entity_patterns[{entity_type!r}]", pattern, reason)


class SourceError(GroundworkError):
    """A source registry request cannot be carried out; says which source and why."""


class SourceNotFoundError(SourceError):
    def __init__(self, name: str, known: list[str] | None = None) -> None:
        self.name = name
        hint = f"; known sources: {', '.join(known)}" if known else ""
        super().__init__(f"no source named {name!r}{hint}")


class SourceExistsError(SourceError):
    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        super().__init__(f"source {name!r}: {reason}")


class InvalidSourceError(SourceError):
    """A source field has a value that cannot work (bad URL, depth out of range, regex that does not compile…)."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}={value!r}: {reason}")
