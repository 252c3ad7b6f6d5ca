"""A polite documentation-site crawler, as a pure library (no store, no DuckDB).

``crawl(config, prior)`` decides what to fetch on one site (scope, robots.txt,
llms.txt, sitemaps, links up to a depth, a page cap), fetches it politely
(rate limit, retries, size limits) and returns bodies plus the metadata a
re-sync needs; the ingestion stage turns that into versioned documents.
"""

from knowledge_store.ingest.web.config import USER_AGENT, CrawlConfig
from knowledge_store.ingest.web.crawl import ProgressCallback, crawl
from knowledge_store.ingest.web.errors import BadSitemapError, InvalidCrawlConfig, InvalidUrlError, WebError
from knowledge_store.ingest.web.results import CrawlFailure, CrawlProgress, CrawlResult, FetchedPage, PriorPage
from knowledge_store.ingest.web.urls import Scope, canonical_url

__all__ = [
    "USER_AGENT",
    "BadSitemapError",
    "CrawlConfig",
    "CrawlFailure",
    "CrawlProgress",
    "CrawlResult",
    "FetchedPage",
    "InvalidCrawlConfig",
    "InvalidUrlError",
    "PriorPage",
    "ProgressCallback",
    "Scope",
    "WebError",
    "crawl",
    "canonical_url",
]
