"""Every served search is a LlamaIndex query: the engine the server holds is a ``RetrieverQueryEngine``, an
``/api/ask`` request reaches its instrumentation events, and a LlamaIndex node postprocessor named in
``GROUNDWORK_NODE_POSTPROCESSORS`` is a reranker of every front end."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from fastapi.testclient import TestClient
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.query import QueryEndEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle

from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.retrieval.llama import SearchQuery
from knowledge_store.retrieval.reranker_registry import RERANKER_REGISTRY
from knowledge_store.server.app import create_app
from knowledge_store.storage.query_log import QueryLog

pytestmark = pytest.mark.slow
RESET = "How do I reset the Aurora to factory settings?"


class ReversingPostprocessor(BaseNodePostprocessor):
    """A plain LlamaIndex postprocessor (no Groundwork base): reverses the nodes and remembers each query."""

    seen: ClassVar[list[str]] = []

    def _postprocess_nodes(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        ReversingPostprocessor.seen.append(query_bundle.query_str)
        return [NodeWithScore(node=n.node, score=float(i)) for i, n in enumerate(reversed(nodes))]


class QueryEnds(BaseEventHandler):
    """Every ``QueryEndEvent`` LlamaIndex dispatches, with the query it carried."""

    ends: list[Any] = []

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, QueryEndEvent):
            self.ends.append(event.query)


@pytest.fixture(scope="module")
def served(shared_sample_index, embedder):
    settings = shared_sample_index.model_copy(update={
        "node_postprocessors": f"reverse={__name__}:ReversingPostprocessor"})
    log = QueryLog(settings.logs_path)
    engine = RetrievalEngine(settings, embedder=embedder, query_log=log)
    spy = QueryEnds()
    get_dispatcher().add_event_handler(spy)
    try:
        with TestClient(create_app(settings, engine), base_url="http://127.0.0.1:8080") as client:
            yield {"client": client, "engine": engine, "spy": spy, "log": log}
    finally:
        get_dispatcher().event_handlers.remove(spy)
        RERANKER_REGISTRY.pop("reverse", None)


def test_the_server_answers_ask_through_its_llamaindex_query_engine(served):
    engine = served["engine"]
    assert isinstance(engine.query_engine, RetrieverQueryEngine)
    served["spy"].ends.clear()
    response = served["client"].post("/api/ask", json={"query": RESET})
    assert response.status_code == 200, response.text
    body = response.json()
    queries = [q for q in served["spy"].ends if isinstance(q, SearchQuery)]
    assert len(queries) == 1 and queries[0].request.question == RESET and queries[0].request.answer_sources == 3
    assert queries[0].request.client == "api-ask"
    # the instrumentation handler logged it, under the id the response carries
    served["log"].flush(timeout_s=5.0)
    assert served["log"].get(body["retrieval_request_id"]).query == RESET


def test_a_llamaindex_node_postprocessor_named_in_settings_is_a_reranker(served):
    client = served["client"]
    fused = client.post("/api/knowledge/query", json={"query": RESET, "k": 20, "min_relevance": 0.0}).json()
    ReversingPostprocessor.seen.clear()
    reversed_ = client.post("/api/knowledge/query", json={"query": RESET, "k": 20, "min_relevance": 0.0,
                                                          "reranker": "reverse"})
    assert reversed_.status_code == 200, reversed_.text
    data = reversed_.json()
    assert data["reranker_status"] == "ok" and ReversingPostprocessor.seen == [RESET]
    # the pool the reranker saw is max(4 k, 20) = 80 candidates, reversed: the last of them comes first
    assert [r["chunk_id"] for r in data["results"]] != [r["chunk_id"] for r in fused["results"]]
    assert data["results"][0]["rerank_score"] == 0.0
    assert "reverse" in client.get("/api/knowledge/config").json()["rerankers"]
