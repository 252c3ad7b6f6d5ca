"""Answers built from retrieved passages, every sentence carrying a citation marker.

Two ways:

- ``extractive_answer``: no model at all.  The answer is made only of sentences
  (or code/table lines) that exist verbatim in the retrieved passages, with
  whitespace normalised, each followed by ``[n]`` where ``n`` is the 1-based
  position of its hit.  It cannot say anything the sources do not say.
- ``LLMAnswerer``: an OpenAI-compatible ``/chat/completions`` endpoint the user
  configured (often a local server), asked with a strictly grounded prompt to
  answer only from the numbered passages and cite them.  This is the only code
  in the package that sends anything over the network, and only when called.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import BaseModel, Field

from knowledge_store.core.errors import GroundworkError
from knowledge_store.core.text import sentence_spans
from knowledge_store.core.vocabulary import Vocabulary
from knowledge_store.retrieval.snippets import collapse_ws, segments, snippet_around, term_weights, unit_term_sets
from knowledge_store.retrieval.terms import normalize, query_terms, term_spans
from knowledge_store.retrieval.types import SearchHit

if TYPE_CHECKING:
    from knowledge_store.config.settings import Settings

log = logging.getLogger(__name__)

NO_ANSWER = "No relevant content found."


@dataclass(frozen=True)
class AnswerMode:
    """One value of a query's ``answer`` parameter: what it gives and what it needs to run."""

    name: str  # what the engine, the HTTP API (query and ask bodies) and the console accept
    description: str  # what it gives, in one line (schema descriptions)
    writes_answer: bool = True  # False: passages only (POST /api/ask always writes an answer, so not offered there)
    needs: str | None = None  # what it cannot run without, said in the schema
    needs_llm: bool = False  # runs only with an OpenAI-compatible endpoint configured (Settings.llm_configured)

    def available(self, settings: Settings) -> bool:
        """Whether these settings let it run."""
        return not self.needs_llm or settings.llm_configured

    def schema_text(self) -> str:
        """``name: what it gives (needs ...)``, for schema descriptions."""
        return f"{self.name}: {self.description}" + (f" (needs {self.needs})" if self.needs else "")


# the one place an answer mode is named (in the order the API's schema lists them)
ANSWER_REGISTRY: dict[str, AnswerMode] = {mode.name: mode for mode in (
    AnswerMode("extractive", "sentences of the passages, each cited [n], no model needed"),
    AnswerMode("none", "passages only, no answer", writes_answer=False),
    AnswerMode("llm", "written from the passages, cited [n], by the configured OpenAI-compatible endpoint",
               needs="GROUNDWORK_LLM_BASE_URL and GROUNDWORK_LLM_MODEL", needs_llm=True),
)}
ANSWER_MODES = Vocabulary("answer", ANSWER_REGISTRY)


def available_answer_modes(settings: Settings, writing_only: bool = False) -> tuple[str, ...]:
    """The answer modes these settings can run, in registry order; ``writing_only``: those that write an
    answer (what ``POST /api/ask`` offers)."""
    return tuple(name for name, mode in ANSWER_REGISTRY.items()
                 if mode.available(settings) and (mode.writes_answer or not writing_only))


class GenerationError(GroundworkError):
    """The answer model could not produce an answer.  ``endpoint`` is the URL that
    was called (credentials stripped), ``status`` the last HTTP status if any,
    ``attempts`` how many requests were made."""

    def __init__(self, message: str, *, endpoint: str, status: int | None = None, attempts: int = 0) -> None:
        self.endpoint = endpoint
        self.status = status
        self.attempts = attempts
        super().__init__(message)


class Answer(BaseModel):
    """``citations`` lists the markers the text uses (positions in the hit list,
    1-based, in order of first use); ``sentences`` has one entry per answer
    sentence: ``text``, ``citation`` (its first marker, or None), ``citations``
    (all its markers) and ``chunk_id`` (of the first marker's hit, or None);
    extractive sentences also carry ``start``/``end`` offsets in the hit's text."""

    text: str
    citations: list[int] = Field(default_factory=list)
    method: Literal["extractive", "llm"]
    model: str | None = None
    sentences: list[dict[str, Any]] = Field(default_factory=list)


# ---------------------------------------------------------------------------
# extractive

_RANK_DECAY = 0.25  # a sentence in hit r (0-based) scores 1 / (1 + 0.25 r) of the same sentence in hit 0
_MIN_RELATIVE_SCORE = 0.3  # sentences scoring under 30% of the best are noise, not support
_NEAR_DUPLICATE = 0.8  # token-set overlap above which two sentences say the same thing


def _word_set(text: str) -> frozenset[str]:
    return frozenset(term for term, _, _ in term_spans(text))


def _near_duplicate(a: frozenset[str], b: frozenset[str]) -> bool:
    if not a or not b:
        return a == b
    common = len(a & b)
    return common / len(a | b) >= _NEAR_DUPLICATE or common / min(len(a), len(b)) >= 0.9


def _is_heading(text: str, hit: SearchHit) -> bool:
    """A unit that just repeats the hit's title or a heading of its section path."""
    if len(text) > 200:  # no heading is that long; skip the normalisation work
        return False
    norm = _heading_key(text)
    return any(norm == _heading_key(name) for name in {hit.title, hit.section, *hit.section_path} if name)


@lru_cache(maxsize=16384)
def _heading_key(text: str) -> str:
    # a Markdown heading unit ("## Resetting") repeats its section name as much as the bare text does
    return normalize(collapse_ws(re.sub(r"^\s*#{1,6}\s+", "", text))).rstrip(":.")


def extractive_answer(query: str, hits: Sequence[SearchHit], max_sentences: int = 3, max_chars: int = 600) -> Answer:
    """An answer made only of sentences found verbatim in ``hits`` (see the module docstring).

    Sentences are scored by the summed weight of the distinct query terms they
    contain (rarer terms among the retrieved sentences weigh more), discounted by
    the rank of their hit; the best ones are kept (no near-duplicates, at most
    ``max_sentences`` and ``max_chars`` characters including markers), grouped by
    passage in order of their best sentence and in original order within a
    passage.  If no sentence shares a term with the query, the first sentence of
    the top hit is the answer (retrieval already judged it relevant)."""
    if not hits:
        return Answer(text=NO_ANSWER, citations=[], method="extractive")
    terms = query_terms(query)

    candidates: list[tuple[int, int, int, int, frozenset[str]]] = []  # hit, unit index, start, end, terms
    for r, hit in enumerate(hits):
        spans = segments(hit.text)
        sets = unit_term_sets(spans, term_spans(hit.text)) if terms else [set() for _ in spans]
        for u, ((s, e), found) in enumerate(zip(spans, sets)):
            if not _is_heading(hit.text[s:e], hit):
                candidates.append((r, u, s, e, frozenset(found)))
    weights = term_weights(terms, [c[4] for c in candidates]) if terms else {}

    scored: list[tuple[float, int, int, int, int, int]] = []  # score, order, hit, unit, start, end
    for order, (r, u, s, e, found) in enumerate(candidates):
        score = sum(weights[t] for t in terms if t in found)
        if score <= 0:
            continue
        if len(hits[r].text[s:e].split()) <= 3:
            score *= 0.5  # a label or a fragment supports less than a sentence
        scored.append((score / (1 + _RANK_DECAY * r), order, r, u, s, e))
    scored.sort(key=lambda item: (-item[0], item[1]))

    chosen: list[tuple[int, int, int, int, str]] = []  # hit, unit, start, end, display text
    used = 0
    seen: list[frozenset[str]] = []
    top = scored[0][0] if scored else 0.0
    for score, _, r, u, s, e in scored:
        if len(chosen) >= max_sentences or score < _MIN_RELATIVE_SCORE * top:
            break
        text = collapse_ws(hits[r].text[s:e])
        words = _word_set(text)
        if any(_near_duplicate(words, other) for other in seen):
            continue
        cost = len(text) + len(f" [{r + 1}]") + (1 if chosen else 0)
        if used + cost > max_chars:
            continue
        chosen.append((r, u, s, e, text))
        seen.append(words)
        used += cost

    if not chosen:
        if scored:  # the best sentence alone is longer than max_chars: quote the best part of it
            _, _, r, u, _, _ = scored[0]
        else:  # nothing matches the query's words: the top hit's first sentence
            r, u = 0, next((c[1] for c in candidates if c[0] == 0), 0)
        spans = segments(hits[r].text)
        if not spans:
            return Answer(text=NO_ANSWER, citations=[], method="extractive")
        budget = max(1, max_chars - len(f" [{r + 1}]"))
        text, s, e = snippet_around(hits[r].text, spans, u, terms, budget)
        if (s, e) != spans[u]:  # the snippet may have pulled in neighbours: keep to the one unit
            s, e = max(s, spans[u][0]), min(e, spans[u][1])
            if e <= s or not text.strip("…"):
                s, e = spans[u]
            text = snippet_text(hits[r].text, s, e, spans[u])
        chosen = [(r, u, s, e, text)]

    # passages in order of their best sentence, original order inside a passage
    passage_order: dict[int, int] = {}
    for r, *_ in chosen:
        passage_order.setdefault(r, len(passage_order))
    chosen.sort(key=lambda c: (passage_order[c[0]], c[2]))

    sentences = [
        {"text": text, "citation": r + 1, "citations": [r + 1], "chunk_id": hits[r].chunk_id, "start": s, "end": e}
        for r, _, s, e, text in chosen
    ]
    answer_text = " ".join(f"{item['text']} [{item['citation']}]" for item in sentences)
    return Answer(
        text=answer_text,
        citations=list(dict.fromkeys(item["citation"] for item in sentences)),
        method="extractive",
        sentences=sentences,
    )


def snippet_text(text: str, start: int, end: int, unit: tuple[int, int]) -> str:
    """``text[start:end]`` whitespace-collapsed, with "…" where it cuts ``unit``."""
    body = collapse_ws(text[start:end])
    return f"{'…' if start > unit[0] else ''}{body}{'…' if end < unit[1] else ''}"


# ---------------------------------------------------------------------------
# LLM

SYSTEM_PROMPT = (
    "You answer questions using ONLY the numbered passages given by the user. "
    "Do not use any outside knowledge. "
    "Cite every claim with the number of the passage that supports it in square brackets, like [1] or [2][3]. "
    f'If the passages do not contain the answer, reply exactly "{NO_ANSWER}" and nothing else.'
)

_MARKER = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
_USERINFO = re.compile(r"//[^/@\s]*@")


def _pages_label(hit: SearchHit) -> str:
    pages = hit.pages
    if not pages:
        return ""
    if len(pages) == 1:
        return f" (p. {pages[0]})"
    return f" (pp. {pages[0]}–{pages[-1]})"


def format_passages(hits: Sequence[SearchHit]) -> str:
    """``[n] title — section (pages)`` then the passage text, for every hit."""
    blocks = []
    for n, hit in enumerate(hits, start=1):
        head = f"[{n}] {hit.title or hit.source_path or hit.doc_id}"
        if hit.section and hit.section != hit.title:
            head += f" — {hit.section}"
        head += _pages_label(hit)
        blocks.append(f"{head}\n{hit.text.strip()}")
    return "\n\n".join(blocks)


def build_messages(query: str, hits: Sequence[SearchHit]) -> list[dict[str, str]]:
    user = (
        f"Passages:\n\n{format_passages(hits)}\n\n"
        f"Question: {query.strip()}\n\n"
        f"Answer from the passages above only, citing them as [n]. "
        f'If they do not contain the answer, reply exactly "{NO_ANSWER}"'
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def cited_markers(text: str, n_hits: int) -> list[int]:
    """Markers ``[n]`` / ``[n, m]`` in ``text`` that point at a hit, in order of first use."""
    found: list[int] = []
    for match in _MARKER.finditer(text):
        for part in match.group(1).split(","):
            n = int(part)
            if 1 <= n <= n_hits and n not in found:
                found.append(n)
    return found


def _is_no_answer(text: str) -> bool:
    return normalize(text).strip().strip('"').rstrip(".").strip() == normalize(NO_ANSWER).rstrip(".")


class LLMAnswerer:
    """Grounded answers from an OpenAI-compatible chat-completions endpoint.

    ``max_retries`` counts retries after the first request, so at most
    ``max_retries + 1`` requests are made.  Timeouts, connection failures, 429
    and 5xx are retried after ``backoff_s * 2**k`` seconds (k = 0, 1, …; capped
    at ``max_backoff_s``) or after the server's numeric ``Retry-After`` (capped
    at ``max_retry_after_s``); any other 4xx fails at once.  The API key is sent
    as a Bearer token and never appears in an error message or a log line."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 20,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        *,
        max_backoff_s: float = 8.0,
        max_retry_after_s: float = 10.0,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key or None
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._transport = transport
        self._sleep = sleep

    def __repr__(self) -> str:  # no key
        return f"LLMAnswerer(endpoint={self.endpoint!r}, model={self.model!r})"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def endpoint(self) -> str:
        """The URL as shown in messages: any ``user:password@`` removed."""
        return _USERINFO.sub("//", self.url)

    def _redact(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text

    def _delay(self, retry: int, response: httpx.Response | None) -> float:
        if response is not None:
            header = response.headers.get("retry-after", "").strip()
            try:
                seconds = float(header)
            except ValueError:
                seconds = None
            if seconds is not None and seconds == seconds and seconds >= 0:  # not NaN
                return min(seconds, self.max_retry_after_s)
        return min(self.backoff_s * (2**retry), self.max_backoff_s)

    def complete(self, messages: list[dict[str, str]]) -> tuple[str, str]:
        """(reply text, model name) for ``messages``, with the retry policy above."""
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        attempts = self.max_retries + 1
        last_error = "no request made"
        last_status: int | None = None
        with httpx.Client(timeout=self.timeout_s, transport=self._transport) as client:
            for attempt in range(1, attempts + 1):
                response: httpx.Response | None = None
                try:
                    response = client.post(self.url, json=payload, headers=headers)
                except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                    last_error = f"{type(exc).__name__}: {exc}".rstrip(": ")
                    last_status = None
                except httpx.HTTPError as exc:  # bad URL, unsupported scheme, …: retrying cannot help
                    raise self._error(f"request failed: {type(exc).__name__}: {exc}", None, attempt) from None
                else:
                    if 200 <= response.status_code < 300:
                        return self._parse(response, attempt)
                    last_status = response.status_code
                    last_error = f"HTTP {response.status_code}{_body_excerpt(response)}"
                    if response.status_code != 429 and response.status_code < 500:
                        raise self._error(f"{last_error} (not retried)", last_status, attempt)
                if attempt < attempts:
                    delay = self._delay(attempt - 1, response)
                    log.warning(
                        "%s", self._redact(
                            f"LLM endpoint {self.endpoint}: {last_error}; retry {attempt}/{self.max_retries} in {delay:.2f}s"
                        )
                    )
                    self._sleep(delay)
        raise self._error(f"gave up after {attempts} attempt(s); last error: {last_error}", last_status, attempts)

    def _error(self, detail: str, status: int | None, attempts: int) -> GenerationError:
        message = self._redact(f"LLM endpoint {self.endpoint} (model {self.model!r}): {detail}")
        return GenerationError(message, endpoint=self.endpoint, status=status, attempts=attempts)

    def _parse(self, response: httpx.Response, attempt: int) -> tuple[str, str]:
        try:
            data = response.json()
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._error(
                f"HTTP {response.status_code} but the body is not a chat completion{_body_excerpt(response)}",
                response.status_code, attempt,
            ) from None
        if not isinstance(content, str):
            raise self._error("the completion has no text content", response.status_code, attempt)
        model = data.get("model") if isinstance(data.get("model"), str) and data.get("model") else self.model
        return content, model

    def answer(self, query: str, hits: Sequence[SearchHit]) -> Answer:
        """Ask the model; with no hits there is nothing to ground on and no request is made."""
        if not hits:
            return Answer(text=NO_ANSWER, citations=[], method="llm", model=self.model)
        content, model = self.complete(build_messages(query, hits))
        text = content.strip()
        if not text or _is_no_answer(text):
            return Answer(text=NO_ANSWER, citations=[], method="llm", model=model)
        sentences = []
        for s, e in sentence_spans(text):
            sentence = text[s:e]
            markers = cited_markers(sentence, len(hits))
            sentences.append({
                "text": sentence,
                "citation": markers[0] if markers else None,
                "citations": markers,
                "chunk_id": hits[markers[0] - 1].chunk_id if markers else None,
            })
        return Answer(text=text, citations=cited_markers(text, len(hits)), method="llm", model=model, sentences=sentences)

    __call__ = answer


def _body_excerpt(response: httpx.Response, limit: int = 200) -> str:
    try:
        body = collapse_ws(response.text)
    except Exception:  # undecodable body
        return ""
    if not body:
        return ""
    return f": {body[:limit]}{'…' if len(body) > limit else ''}"
