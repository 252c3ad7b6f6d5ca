"""Groundwork's library: ingestion into a versioned DuckDB store, hybrid retrieval with citations.

Import cost is kept low: heavy pieces (torch, DuckDB snapshots) load on first use.  The three names
below are lazy exports (PEP 562): this file runs before any ``knowledge_store.<module>`` import, so
importing them here would make ``import knowledge_store.storage.store`` load the retrieval engine and
the app layer above it (tests/unit/test_layers.py checks that it does not).
"""

from __future__ import annotations

from typing import Any

__all__ = ["retrieve_knowledge", "RetrievalEngine", "Settings"]


def retrieve_knowledge(intent: str, message: str, metadata: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """See ``knowledge_store.app.support_tool.retrieve_knowledge``."""
    from knowledge_store.app.support_tool import retrieve_knowledge as _retrieve  # noqa: PLC0415 - lazy export, ~0.7 s

    return _retrieve(intent, message, metadata, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "RetrievalEngine":
        from knowledge_store.retrieval.engine import RetrievalEngine  # noqa: PLC0415 - lazy export, ~0.7 s

        return RetrievalEngine
    if name == "Settings":
        from knowledge_store.config.settings import Settings  # noqa: PLC0415 - lazy export, ~0.2 s

        return Settings
    raise AttributeError(name)
