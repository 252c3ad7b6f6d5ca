"""The published index as a LlamaIndex vector store: ``groundwork export --llamaindex PATH``.

``export_llamaindex`` writes the served snapshot's chunks - text, the snapshot's own embeddings and the citation
fields (document, version, title, section, pages, url, content hash) - into a DuckDB file through
``llama-index-vector-stores-duckdb``'s ``DuckDBVectorStore`` (its ``documents`` table: ``node_id``, ``text``,
``embedding FLOAT[dim]``, ``metadata_ JSON``), so anyone with LlamaIndex opens it with
``DuckDBVectorStore.from_local(PATH)`` and ``VectorStoreIndex.from_vector_store(store, embed_model=...)``.  The
query side must embed with the model the snapshot was made with: ``QueryEmbedding`` wraps this project's query
embedder as a LlamaIndex ``BaseEmbedding``.

Serving keeps its own reader (``snapshot_reader``): that store answers cosine top-k over one table, while a served
search needs BM25 statistics, section and lead evidence, filter masks, the ANN index and public views of the same
snapshot (docs/ARCHITECTURE.md, "Serving and export").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import TextNode
from pydantic import PrivateAttr

from knowledge_store.core.errors import GroundworkError
from knowledge_store.retrieval.snapshot_reader import LoadedSnapshot
from knowledge_store.storage.store import load_extensions

EXPORT_BATCH = 1000  # chunks written to the store at a time


class ExportTargetExistsError(GroundworkError):
    """The export's target file exists and overwriting it was not asked for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(f"{path} exists (pass --overwrite to replace it)")


class OfflineConnection:
    """A DuckDB connection for ``DuckDBVectorStore(client=...)`` on a machine that cannot download extensions.

    The store runs ``install_extension("json")`` and ``("fts")`` on every connection it opens; DuckDB 1.3 tries
    to download ``json`` even where it is statically linked, which fails offline.  This connection skips the
    install of an extension already there (statically linked, or installed from the ``duckdb_extension_fts``
    package, ``storage.store.load_extensions``) and passes everything else to DuckDB."""

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        self._conn = conn

    def install_extension(self, name: str, *args: Any, **kwargs: Any) -> None:
        row = self._conn.execute("SELECT installed FROM duckdb_extensions() WHERE extension_name = ?", [name]).fetchone()
        if row is not None and row[0]:
            return
        if name in ("fts", "vss"):
            load_extensions(self._conn, name)
            return
        self._conn.install_extension(name, *args, **kwargs)

    def cursor(self) -> OfflineConnection:
        return OfflineConnection(self._conn.cursor())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def open_store(path: Path, table_name: str = "documents", embed_dim: int | None = None) -> Any:
    """A ``DuckDBVectorStore`` over the DuckDB file ``path`` whose connections are ``OfflineConnection``s (where
    DuckDB can download extensions, ``DuckDBVectorStore.from_local(path)`` opens the same file)."""
    from llama_index.vector_stores.duckdb import DuckDBVectorStore  # noqa: PLC0415 - only the export needs it

    class OfflineDuckDBVectorStore(DuckDBVectorStore):
        """``DuckDBVectorStore`` itself, but for the connection it opens (its ``client`` argument is dropped by
        its pydantic ``__init__`` in 0.7.0, so the connection is swapped where the store makes it)."""

        @classmethod
        def _connect(cls, database_name: str, persist_dir: str) -> Any:
            return OfflineConnection(super()._connect(database_name, persist_dir))

    path = Path(path)
    return OfflineDuckDBVectorStore.from_local(str(path), table_name=table_name, embed_dim=embed_dim)


class QueryEmbedding(BaseEmbedding):
    """This project's query embedder (``Embedder.embed``: normalised vectors of the snapshot's model) as a
    LlamaIndex embedding model, for querying an exported store."""

    _embedder: Any = PrivateAttr()

    def __init__(self, embedder: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        return "GroundworkQueryEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return np.asarray(self._embedder.embed([query])[0], dtype=np.float32).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_query_embedding(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


def export_nodes(snapshot: LoadedSnapshot, rows: list[int]) -> list[TextNode]:
    """The chunks at ``rows`` of ``snapshot`` as LlamaIndex nodes: id, text, embedding and citation fields."""
    nodes = []
    for hit in snapshot.hits_for_rows(rows):
        nodes.append(TextNode(
            id_=hit.chunk_id, text=hit.text, embedding=snapshot.embeddings[hit.row].astype(np.float32).tolist(),
            metadata={"doc_id": hit.doc_id, "version": hit.version, "title": hit.title, "section": hit.section,
                      "page_start": hit.page_start, "page_end": hit.page_end, "url": hit.url,
                      "source_path": hit.source_path, "content_hash": hit.content_hash, "status": hit.status},
            excluded_embed_metadata_keys=["doc_id", "version", "content_hash", "status", "source_path"],
            excluded_llm_metadata_keys=["doc_id", "version", "content_hash", "status", "source_path"],
        ))
    return nodes


def export_llamaindex(snapshot: LoadedSnapshot, path: Path, *, table_name: str = "documents",
                      overwrite: bool = False) -> int:
    """Write every chunk of ``snapshot`` into a new DuckDB file at ``path`` that ``DuckDBVectorStore`` reads;
    the number of chunks written.  ``ExportTargetExistsError`` when ``path`` exists and not ``overwrite``."""
    path = Path(path)
    if path.exists():
        if not overwrite:
            raise ExportTargetExistsError(path)
        path.unlink()
    dim = int(snapshot.embeddings.shape[1])
    path.parent.mkdir(parents=True, exist_ok=True)
    store = open_store(path, table_name, dim)
    try:
        for start in range(0, snapshot.size, EXPORT_BATCH):
            store.add(export_nodes(snapshot, list(range(start, min(start + EXPORT_BATCH, snapshot.size)))))
    finally:
        store.client.close()
        store._shared_conn.close()
    return snapshot.size
