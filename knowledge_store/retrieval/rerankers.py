"""Rerankers as LlamaIndex ``BaseNodePostprocessor``s.

Each takes the fused candidates (``NodeWithScore`` whose node metadata carries
``chunk_id``, ``content_hash`` and the scores) and returns them reordered with
``score`` set to the reranker's score.  The engine runs every reranker under a
time limit and falls back to the fused order when it fails or is slow
(``run_reranker``), and says so in the response and the query log.  Which name builds which
reranker is ``reranker_registry.RERANKER_REGISTRY``.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

__all__ = ["MMRReranker", "FeedbackReranker", "CrossEncoderReranker", "run_reranker"]


def _node_vectors(nodes: list[NodeWithScore]) -> np.ndarray:
    return np.array([n.node.embedding for n in nodes], dtype=np.float32)


class MMRReranker(BaseNodePostprocessor):
    """Maximal marginal relevance: trade relevance against similarity to what is already chosen,
    so five results are not five near-copies of one page.

    ``lambda_mult`` = 1 keeps the fused order; lower values favour diversity.
    Relevance is the fused score rescaled to [0, 1]; similarity is cosine between
    chunk embeddings (the retriever attaches them).
    """

    lambda_mult: float = Field(default=0.7, ge=0.0, le=1.0)
    top_n: int | None = Field(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "GroundworkMMRReranker"

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if len(nodes) <= 1:
            return nodes
        vectors = _node_vectors(nodes)
        scores = np.array([n.score or 0.0 for n in nodes], dtype=np.float64)
        span = scores.max() - scores.min()
        relevance = (scores - scores.min()) / span if span > 1e-12 else np.ones_like(scores)
        similarity = vectors @ vectors.T
        chosen: list[int] = []
        mmr_scores: list[float] = []
        remaining = list(range(len(nodes)))
        limit = min(self.top_n or len(nodes), len(nodes))
        while remaining and len(chosen) < limit:
            if chosen:
                redundancy = similarity[np.ix_(remaining, chosen)].max(axis=1)
            else:
                redundancy = np.zeros(len(remaining))
            values = self.lambda_mult * relevance[remaining] - (1.0 - self.lambda_mult) * redundancy
            best = int(np.argmax(values))
            chosen.append(remaining.pop(best))
            mmr_scores.append(float(values[best]))
        return [NodeWithScore(node=nodes[i].node, score=s) for i, s in zip(chosen, mmr_scores)]


class FeedbackReranker(BaseNodePostprocessor):
    """Moves passages by what people said about them for similar past queries.

    For each past query with feedback whose embedding has cosine >= ``similarity``
    to this query, a thumbs-up on a passage adds ``+sim`` and a thumbs-down
    ``-sim`` to that passage's net vote (matched by chunk id, or by content hash
    so votes survive a re-sync that did not change the text).  The new score is
    ``score + weight * tanh(net)``: one strong vote moves a passage by up to
    ``weight``; many votes saturate instead of drowning relevance.
    """

    similarity: float = Field(default=0.8, ge=0.0, le=1.0)
    weight: float = Field(default=0.3, ge=0.0)
    _feedback_source: Callable[[], list[dict[str, Any]]] = PrivateAttr()
    _embed: Callable[[list[str]], np.ndarray] = PrivateAttr()
    _cache: dict[str, np.ndarray] = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, feedback_source: Callable[[], list[dict[str, Any]]], embed: Callable[[list[str]], np.ndarray], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._feedback_source = feedback_source
        self._embed = embed

    @classmethod
    def class_name(cls) -> str:
        return "GroundworkFeedbackReranker"

    def _query_vectors(self, texts: list[str]) -> dict[str, np.ndarray]:
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
            if missing:
                for text, vector in zip(missing, self._embed(missing)):
                    self._cache[text] = np.asarray(vector, dtype=np.float32)
            return {t: self._cache[t] for t in texts}

    def votes(self, query_vector: np.ndarray, feedback: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
        """Net votes per chunk id and per content hash from similar past queries.  Each client votes once per
        passage: its newest rating given for a similar query (``feedback`` is newest first; a row without a
        ``client`` is a voter of its own), so one reader rating a passage on many requests moves it once."""
        by_chunk: dict[str, float] = {}
        by_hash: dict[str, float] = {}
        if not feedback:
            return by_chunk, by_hash
        vectors = self._query_vectors([f["query"] for f in feedback])
        voted: set[tuple[str, str, str]] = set()
        for row in feedback:
            sim = float(vectors[row["query"]] @ query_vector)
            if sim < self.similarity or not row.get("chunk_id"):
                continue
            vote = sim if row["rating"] == "up" else -sim
            voter = row.get("client") or row.get("feedback_id") or str(id(row))
            if ("chunk", voter, row["chunk_id"]) not in voted:
                voted.add(("chunk", voter, row["chunk_id"]))
                by_chunk[row["chunk_id"]] = by_chunk.get(row["chunk_id"], 0.0) + vote
            if row.get("content_hash") and ("hash", voter, row["content_hash"]) not in voted:
                voted.add(("hash", voter, row["content_hash"]))
                by_hash[row["content_hash"]] = by_hash.get(row["content_hash"], 0.0) + vote
        return by_chunk, by_hash

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if not nodes or query_bundle is None or query_bundle.embedding is None:
            return nodes
        query_vector = np.asarray(query_bundle.embedding, dtype=np.float32)
        by_chunk, by_hash = self.votes(query_vector, self._feedback_source())
        rescored = []
        for item in nodes:
            meta = item.node.metadata
            net = by_chunk.get(meta.get("chunk_id"), by_hash.get(meta.get("content_hash"), 0.0))
            rescored.append(NodeWithScore(node=item.node, score=(item.score or 0.0) + self.weight * math.tanh(net)))
        return sorted(rescored, key=lambda n: -(n.score or 0.0))


class CrossEncoderReranker(BaseNodePostprocessor):
    """Scores (query, passage) pairs with a local sentence-transformers CrossEncoder.

    No weights can be downloaded here: ``model_path`` must be a local folder
    (any CrossEncoder saved with ``save_pretrained``/``save``).
    """

    model_path: str
    batch_size: int = Field(default=16)
    _model: Any = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "GroundworkCrossEncoderReranker"

    def model(self):
        with self._lock:
            if self._model is None:
                from sentence_transformers import CrossEncoder  # noqa: PLC0415 - sentence-transformers, ~6 s to import

                self._model = CrossEncoder(self.model_path, device="cpu", local_files_only=True)
            return self._model

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if not nodes or query_bundle is None:
            return nodes
        pairs = [(query_bundle.query_str, n.node.get_content()) for n in nodes]
        scores = np.asarray(self.model().predict(pairs, batch_size=self.batch_size, show_progress_bar=False), dtype=np.float64)
        if scores.ndim > 1:
            scores = scores[:, -1]
        order = np.argsort(-scores, kind="stable")
        return [NodeWithScore(node=nodes[i].node, score=float(scores[i])) for i in order]


_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="reranker")


def run_reranker(
    reranker: BaseNodePostprocessor | None,
    nodes: list[NodeWithScore],
    query_bundle: QueryBundle,
    timeout_s: float,
) -> tuple[list[NodeWithScore], str]:
    """Rerank under a time limit; on failure or timeout keep the fused order.

    Returns (nodes, status) where status is "none", "ok" or "fallback: <why>".
    A timed-out reranker thread cannot be killed; it finishes in the background
    and its result is discarded.
    """
    if reranker is None:
        return nodes, "none"
    future = _POOL.submit(reranker.postprocess_nodes, list(nodes), query_bundle)
    try:
        return future.result(timeout=timeout_s), "ok"
    except concurrent.futures.TimeoutError:
        return nodes, f"fallback: {reranker.class_name()} timed out after {timeout_s:g} s; fused order kept"
    except Exception as error:  # noqa: BLE001 - any reranker failure must not fail the query
        return nodes, f"fallback: {reranker.class_name()} failed ({type(error).__name__}: {error}); fused order kept"
