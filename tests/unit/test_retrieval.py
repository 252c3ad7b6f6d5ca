"""Retrieval pieces without an index: fusion maths, the MMR reranker and the reranker time-out fallback
(the engine over a real index: tests/integration/test_retrieval.py)."""

from __future__ import annotations

import numpy as np
import pytest
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from knowledge_store.retrieval.fusion import fuse_scores, minmax, relevance, top_rows
from knowledge_store.retrieval.rerankers import MMRReranker, run_reranker
from tests.helpers import slow_reranker

# ------------------------------------------------------------------ fusion maths

def test_minmax_scales_to_unit_interval_and_handles_constants():
    assert minmax(np.array([2.0, 4.0, 3.0])).tolist() == [0.0, 1.0, 0.5]
    assert minmax(np.array([3.0, 3.0])).tolist() == [1.0, 1.0]
    assert minmax(np.array([0.0, 0.0])).tolist() == [0.0, 0.0]


def test_weighted_fusion_follows_alpha():
    bm25 = np.array([10.0, 0.0, 5.0, 0.0])
    vector = np.array([0.1, 0.9, 0.5, 0.2])
    pure_bm25 = fuse_scores(bm25, vector, None, alpha=0.0, pool=10)
    assert pure_bm25.rows.tolist() == [0, 2]  # only rows BM25 matched
    pure_vec = fuse_scores(bm25, vector, None, alpha=1.0, pool=10)
    assert pure_vec.rows.tolist() == [1, 2, 3, 0]
    half = fuse_scores(bm25, vector, None, alpha=0.5, pool=10)
    # candidates 0..3; bm25 minmax over [10,0,5,0] -> [1,0,.5,0]; vector minmax over [.1,.9,.5,.2] -> [0,1,.5,.125]
    expected = {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.0625}
    for row, score in zip(half.rows, half.fused):
        assert score == pytest.approx(expected[int(row)])
    assert half.bm25_rank[half.rows.tolist().index(0)] == 1 and half.vector_rank[half.rows.tolist().index(1)] == 1


def test_rrf_fusion_sums_reciprocal_ranks():
    bm25 = np.array([3.0, 2.0, 1.0])
    vector = np.array([0.1, 0.3, 0.2])
    fused = fuse_scores(bm25, vector, None, alpha=0.5, pool=10, method="rrf", rrf_k=60)
    scores = dict(zip(fused.rows.tolist(), fused.fused.tolist()))
    assert scores[0] == pytest.approx(0.5 / 61 + 0.5 / 63)
    assert scores[1] == pytest.approx(0.5 / 62 + 0.5 / 61)
    assert fused.rows.tolist()[0] == 1


def test_fusion_respects_the_mask_and_rejects_bad_alpha():
    bm25 = np.array([5.0, 4.0, 3.0])
    vector = np.array([0.9, 0.8, 0.7])
    mask = np.array([False, True, True])
    assert 0 not in fuse_scores(bm25, vector, mask, 0.5, 10).rows.tolist()
    with pytest.raises(ValueError, match="alpha"):
        fuse_scores(bm25, vector, None, 1.5, 10)
    assert top_rows(np.array([0.0, 2.0, 1.0]), None, 1, positive_only=True).tolist() == [1]


def test_relevance_is_absolute_and_bounded():
    assert relevance(np.array([0.2]), np.array([0.0]))[0] == 0.0
    assert relevance(np.array([0.7]), np.array([1.0]))[0] == 1.0
    assert 0 < relevance(np.array([0.45]), np.array([0.5]))[0] < 1


# ------------------------------------------------------------------ rerankers

def _node(chunk_id: str, vector: list[float], score: float) -> NodeWithScore:
    v = np.array(vector, dtype=np.float32)
    return NodeWithScore(node=TextNode(id_=chunk_id, text=chunk_id, embedding=(v / np.linalg.norm(v)).tolist(),
                                       metadata={"chunk_id": chunk_id}), score=score)


def test_mmr_promotes_a_diverse_passage_over_a_near_duplicate():
    nodes = [_node("a", [1, 0, 0], 1.0), _node("a-copy", [0.99, 0.05, 0], 0.95), _node("b", [0, 1, 0], 0.8)]
    plain = [n.node.node_id for n in nodes]
    reranked = [n.node.node_id for n in MMRReranker(lambda_mult=0.5).postprocess_nodes(nodes, QueryBundle("q"))]
    assert plain == ["a", "a-copy", "b"] and reranked == ["a", "b", "a-copy"]
    assert [n.node.node_id for n in MMRReranker(lambda_mult=1.0).postprocess_nodes(nodes, QueryBundle("q"))] == plain


class BrokenReranker(BaseNodePostprocessor):
    def _postprocess_nodes(self, nodes, query_bundle=None):
        raise RuntimeError("model file missing")


def test_a_slow_or_failing_reranker_falls_back_to_the_fused_order():
    nodes = [_node("a", [1, 0], 1.0), _node("b", [0, 1], 0.5)]
    kept, status = run_reranker(slow_reranker(), nodes, QueryBundle("q"), timeout_s=0.1)
    assert [n.node.node_id for n in kept] == ["a", "b"] and status.startswith("fallback:") and "timed out" in status
    kept, status = run_reranker(BrokenReranker(), nodes, QueryBundle("q"), timeout_s=1.0)
    assert [n.node.node_id for n in kept] == ["a", "b"] and "model file missing" in status


# ------------------------------------------------------------------ loading LlamaIndex from several threads

RACE = """
import threading, time
from knowledge_store.retrieval import engine
errors = []
def load():
    try:
        engine._query_engine_module()
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
threads = []
for _ in range(12):  # staggered, as the server's warm-up thread and the first queries arrive
    threads.append(threading.Thread(target=load))
    threads[-1].start()
    time.sleep(0.08)
for thread in threads:
    thread.join()
print(errors)
"""


def test_the_first_searches_and_the_warm_up_load_llama_index_in_parallel_threads_without_error():
    """LlamaIndex imports itself in a circle: unserialised, threads importing it at once break it (an ImportError
    in one, a KeyError in the next), which was a 500 on a server's first query while it warmed up."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_the_feedback_reranker_counts_each_client_once_per_passage():
    import numpy as np

    from knowledge_store.retrieval.rerankers import FeedbackReranker

    vector = np.array([1.0, 0.0], dtype=np.float32)
    reranker = FeedbackReranker(feedback_source=list, embed=lambda texts: [vector for _ in texts])
    stuffed = [{"query": "compost", "chunk_id": "c1", "content_hash": "h1", "rating": "up", "client": "aa",
                "feedback_id": str(i)} for i in range(5)]
    by_chunk, by_hash = reranker.votes(vector, stuffed)
    assert by_chunk == {"c1": 1.0} and by_hash == {"h1": 1.0}  # five rows of one client: one vote
    other = {**stuffed[0], "client": "bb", "rating": "down", "feedback_id": "x"}
    assert reranker.votes(vector, [*stuffed, other])[0] == {"c1": 0.0}
    anonymous = [{**row, "client": None} for row in stuffed]  # ratings without a client (Python API): one voter each
    assert reranker.votes(vector, anonymous)[0] == {"c1": 5.0}
