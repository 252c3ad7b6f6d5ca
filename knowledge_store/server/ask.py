"""``POST /api/ask`` and ``POST /api/ask-local`` (the ask contract): a question in, an answer with its sources out.

The ask contract's retrieval pipeline on this engine: the query is ranked over the
whole index (hybrid BM25 + vector, the corpus's defaults), the ``top_k`` (10)
best passages are taken in descending score, and the answer is made from the
first ``max_sources`` (3) of them, which are the ``sources`` returned.  The
answer is the engine's extractive one (sentences of those passages, each with
its ``[n]`` marker); ``answer: "llm"`` asks the configured OpenAI-compatible
endpoint instead (only offered when one is configured).  Nothing relevant:
``answer`` says so and ``sources`` is empty.

``/api/ask-local`` is the "ask about the selected text" variant: retrieval is
restricted to ``source_file`` (the same matching as ``filters.paths``: a path
relative to its source, an absolute path, a file name or a glob; the page URL
for web sources, in any spelling the crawler would have stored under the same
canonical URL - see ``source_file_patterns``) and searches for the question
*and* the selected ``context``, so the passages around the selection come
first.  The extractive answer picks
sentences by the question's words (the selection says what it is about, the
question what to take from it), unless the question only asks about the
selection itself ("what does this mean?", "explain this"): then by the
selection's words too.  An LLM sees the selection as well.

Each call is one logged retrieval: ``retrieval_request_id`` is what
``POST /api/knowledge/feedback`` refers to, and the query log (and its JSON
line) keeps the answer returned here.  The answer is the retrieval layer's
(``retrieval.synthesis.write_answer``, from the request's ``question``,
``selection`` and ``answer_sources``); this module builds the request and
shapes the sources.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from knowledge_store.core.errors import QueryValidationError
from knowledge_store.ingest.web.errors import InvalidUrlError
from knowledge_store.ingest.web.urls import canonical_url
from knowledge_store.retrieval.filters import SearchFilters, document_matches
from knowledge_store.retrieval.request import retrieval_query


def source_file_patterns(source_file: str) -> list[str]:
    """The ``filters.paths`` patterns ``source_file`` stands for.

    A file path, name or glob stands for itself.  A page URL (what the docs-site widget sends: the page's
    ``<link rel=canonical>`` or its address) is also tried as the key web documents are stored under - its
    canonical form (fragment, tracking parameters and default port dropped, host lower-cased) - with and
    without a trailing slash, because a site answers ``/docs/intro`` and ``/docs/intro/`` alike while the
    crawler kept whichever spelling its links used.
    """
    source_file = source_file.strip()
    patterns = [source_file]
    if source_file.lower().startswith(("http://", "https://")):
        try:
            canonical = canonical_url(source_file)
        except (InvalidUrlError, ValueError):  # not a URL a crawl could have stored (urlsplit: bad IPv6 host)
            return patterns
        address, mark, query = canonical.partition("?")
        if urlsplit(address).path == "/":  # the site's root has one spelling
            toggled = None
        else:
            toggled = (address[:-1] if address.endswith("/") else address + "/") + mark + query
        patterns += [p for p in (canonical, toggled) if p and p not in patterns]
    return patterns


def _source_url(base: str, citation: Any) -> str:
    """The original: the page URL for web sources, this server's file link (with #page=N / #anchor) otherwise."""
    url = citation.url or ""
    if url.startswith(("http://", "https://")):
        return url
    fragment = url.split("#", 1)[1] if "#" in url else ""
    return f"{base}/api/knowledge/sources/{citation.doc_id}/file" + (f"#{fragment}" if fragment else "")


def ask(engine, base: str, question: str, *, top_k: int = 10, max_sources: int = 3, answer: str = "extractive",
        context: str | None = None, source_file: str | None = None, client: str = "api-ask",
        scope: SearchFilters | None = None) -> dict[str, Any]:
    """``scope``: the documents this caller may be answered from (public callers: public sources only);
    ``source_file`` narrows it further, and one outside it is refused as if it did not exist."""
    began = time.perf_counter()
    settings = engine.settings
    filters = scope
    served = engine.snapshots.current()  # read once: the search and the sources' names use it too
    if source_file is not None:
        filters = (scope or SearchFilters()).model_copy(update={"paths": source_file_patterns(source_file)})
        snapshot = engine.searched_snapshot(filters, served)  # the documents it may answer from
        if not any(document_matches(doc, filters) for doc in snapshot.documents if doc["status"] == "active"):
            raise QueryValidationError("source_file", source_file, "matches no indexed document (give its path relative "
                                       "to its source, e.g. from GET /api/kb/articles, a file name, a glob, or the "
                                       "URL of a crawled web page)")
    request = engine.request(retrieval_query(question, context, settings.max_query_chars), k=top_k, answer=answer,
                             filters=filters, client=client, question=question, selection=context,
                             answer_sources=max_sources)
    response = engine.search(request=request, snapshot=served)
    hits = list(response.hits)[:max_sources]
    citations = list(response.results)[:max_sources]
    reply = response.answer
    documents = served.documents
    relative = {(d["doc_id"], d["version"]): d["relative_path"] for d in documents}
    source_names = {d["doc_id"]: d["source_name"] for d in documents}
    sources = []
    for n, (hit, citation) in enumerate(zip(hits, citations), start=1):
        sources.append({
            "file": relative.get((hit.doc_id, hit.version), Path(hit.source_path).name),
            "source": source_names.get(hit.doc_id, ""),
            "section": citation.section, "url": _source_url(base, citation), "pages": citation.pages,
            "n": n, "title": citation.title, "doc_id": citation.doc_id, "chunk_id": citation.chunk_id,
            "snippet": citation.snippet, "relevance": citation.relevance,
            "rev_label": citation.rev_label, "valid_from": citation.valid_from, "valid_to": citation.valid_to,
            "source_path": citation.source_path, "superseded_by": citation.superseded_by,
            "supersedes": list(citation.supersedes), "see_also": list(citation.see_also),
            "entities": [entity.model_dump() for entity in citation.entities],
        })
    return {
        "answer": reply.text, "sources": sources, "answer_method": reply.method,
        "retrieval_request_id": response.retrieval_request_id, "coverage": response.coverage if sources else "none",
        "missing_terms": response.missing_terms,
        "candidates": len(response.results), "snapshot_version": response.snapshot_version,
        "latency_ms": round((time.perf_counter() - began) * 1000, 3),
    }
