"""Citations, snippets, extractive answers and the LLM client (against a local fake server).

The parts that need no model, store or server are in tests/unit/test_citations_answer.py.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from knowledge_store.core.errors import GroundworkError
from knowledge_store.retrieval.answer import NO_ANSWER, GenerationError, LLMAnswerer
from tests.helpers import hits_for_answer

# ---------------------------------------------------------------------------
# LLM client against a local fake OpenAI-compatible server


class FakeLLMServer:
    """Replies from a script of (status, headers, body, delay_s); then 200s."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, str], object, float]] = []
        self.requests: list[dict] = []
        self.reply = "To reset it, hold MODE for ten seconds [1]. It blinks twice [2]. See also [9]."
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                server.requests.append({"path": self.path, "headers": dict(self.headers), "json": body, "t": time.monotonic()})
                status, headers, payload, delay = (
                    server.script.pop(0) if server.script else (200, {}, None, 0.0)
                )
                if delay:
                    time.sleep(delay)
                if payload is None:
                    payload = {
                        "id": "x", "object": "chat.completion", "model": body.get("model"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": server.reply}}],
                    }
                if callable(payload):
                    payload = payload(self)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_llm(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    server = FakeLLMServer()
    yield server
    server.close()


KEY = "sk-test-SECRET-123"


def client(server: FakeLLMServer, **kw) -> LLMAnswerer:
    options = dict(api_key=KEY, timeout_s=2, max_retries=3, backoff_s=0.01)
    options.update(kw)
    return LLMAnswerer(server.base_url, "local-model", **options)


def test_llm_success_prompt_and_auth(fake_llm):
    hits = hits_for_answer()[:2]
    answer = client(fake_llm).answer("How do I reset the controller?", hits)
    assert answer.method == "llm" and answer.model == "local-model"
    assert answer.text == fake_llm.reply
    assert answer.citations == [1, 2]  # [9] is not a valid position
    assert [s["citation"] for s in answer.sentences] == [1, 2, None]
    assert answer.sentences[0]["chunk_id"] == "c1"
    assert len(fake_llm.requests) == 1
    request = fake_llm.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {KEY}"
    payload = request["json"]
    assert payload["model"] == "local-model" and payload["temperature"] == 0
    system, user = payload["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    assert "ONLY the numbered passages" in system["content"]
    assert NO_ANSWER in system["content"] and "[1]" in system["content"]
    assert "[1] Doc 1 — Reset (p. 1)\n" + hits[0].text.strip() in user["content"]
    assert "[2] Doc 2 — Errors (p. 2)\n" + hits[1].text.strip() in user["content"]
    assert "[3]" not in user["content"]
    assert "How do I reset the controller?" in user["content"]


def test_llm_retries_500_then_429_with_retry_after(fake_llm):
    fake_llm.script = [(500, {}, {"error": "boom"}, 0.0), (429, {"Retry-After": "0.3"}, {"error": "slow down"}, 0.0)]
    answer = client(fake_llm, backoff_s=0.05).answer("reset", hits_for_answer())
    assert answer.citations == [1, 2]
    assert len(fake_llm.requests) == 3
    times = [r["t"] for r in fake_llm.requests]
    assert times[1] - times[0] >= 0.04  # exponential backoff, first step
    assert times[2] - times[1] >= 0.28  # Retry-After honoured


def test_llm_backoff_schedule_and_retry_after_cap(fake_llm):
    delays: list[float] = []
    fake_llm.script = [(503, {}, "", 0.0), (502, {}, "", 0.0), (500, {}, "", 0.0)]
    client(fake_llm, backoff_s=0.05, sleep=delays.append).answer("reset", hits_for_answer())
    assert delays == pytest.approx([0.05, 0.1, 0.2])
    delays.clear()
    fake_llm.script = [(429, {"Retry-After": "120"}, "", 0.0), (429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, "", 0.0)]
    client(fake_llm, backoff_s=0.05, max_retry_after_s=0.2, sleep=delays.append).answer("reset", hits_for_answer())
    assert delays == pytest.approx([0.2, 0.1])  # capped; a date is not numeric: plain backoff


def test_llm_gives_up_after_max_retries_without_leaking_key(fake_llm, caplog):
    echo_key = lambda handler: {"error": f"server saw {handler.headers.get('Authorization')}"}  # noqa: E731
    fake_llm.script = [(503, {}, echo_key, 0.0)] * 10
    caplog.set_level(logging.DEBUG)
    with pytest.raises(GenerationError) as info:
        client(fake_llm, max_retries=2).answer("reset", hits_for_answer())
    assert len(fake_llm.requests) == 3
    message = str(info.value)
    assert fake_llm.base_url + "/chat/completions" in message
    assert "503" in message and "3 attempt" in message
    assert KEY not in message and KEY not in caplog.text
    assert "retry 1/2" in caplog.text
    assert isinstance(info.value, GroundworkError)
    assert info.value.status == 503 and info.value.attempts == 3


def test_llm_does_not_retry_other_4xx(fake_llm):
    fake_llm.script = [(400, {}, {"error": "bad model"}, 0.0)]
    with pytest.raises(GenerationError) as info:
        client(fake_llm).answer("reset", hits_for_answer())
    assert len(fake_llm.requests) == 1
    assert "400" in str(info.value) and "bad model" in str(info.value) and KEY not in str(info.value)


def test_llm_retries_timeouts(fake_llm):
    fake_llm.script = [(200, {}, None, 1.0)]
    answer = client(fake_llm, timeout_s=0.2).answer("reset", hits_for_answer())
    assert answer.citations == [1, 2] and len(fake_llm.requests) == 2


def test_llm_connection_refused_is_a_generation_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    answerer = LLMAnswerer(f"http://127.0.0.1:{port}/v1", "m", api_key=KEY, max_retries=1, backoff_s=0.01)
    with pytest.raises(GenerationError) as info:
        answerer.answer("reset", hits_for_answer())
    assert f"127.0.0.1:{port}" in str(info.value) and "2 attempt" in str(info.value)
    assert info.value.status is None and KEY not in str(info.value) and KEY not in repr(answerer)


def test_llm_no_answer_and_no_hits(fake_llm):
    fake_llm.reply = "No relevant content found."
    answer = client(fake_llm).answer("what is the airspeed of a swallow", hits_for_answer())
    assert answer.text == NO_ANSWER and answer.citations == [] and answer.method == "llm"
    fake_llm.requests.clear()
    empty = client(fake_llm).answer("reset", [])
    assert empty.text == NO_ANSWER and empty.citations == [] and fake_llm.requests == []


def test_llm_malformed_completion_is_an_error(fake_llm):
    fake_llm.script = [(200, {}, {"unexpected": True}, 0.0)]
    with pytest.raises(GenerationError, match="not a chat completion"):
        client(fake_llm).answer("reset", hits_for_answer())
    assert len(fake_llm.requests) == 1


# ---------------------------------------------------------------------------
# coverage says how well the quoted sentences answer


@pytest.fixture(scope="module")
def without_the_answers(tmp_path_factory, embedder):
    """The sample corpus with the API guide's Rate limits section and the SOP's pre-charge step deleted."""
    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest.run import run_sync
    from knowledge_store.ingest.sample_corpus import API_GUIDE, MAINTENANCE_SOP, write_sample_corpus

    root = tmp_path_factory.mktemp("without-answers")
    write_sample_corpus(root / "docs")
    for name, first, stop in ((API_GUIDE, "### Rate limits", "## Authentication"),
                              (MAINTENANCE_SOP, "2. Read the pre-charge", "3. Look for corrosion")):
        path = root / "docs" / name
        text = path.read_text(encoding="utf-8")
        path.write_text(text[:text.index(first)] + text[text.index(stop):], encoding="utf-8")
    settings = Settings(data_dir=root / "data", sources=[root / "docs"])
    run_sync(settings, embedder)
    return settings


def test_coverage_is_not_high_when_the_answering_section_is_missing(without_the_answers, shared_sample_index, embedder):
    from knowledge_store.core.text import contains_words
    from knowledge_store.ingest.sample_corpus import EXAMPLE_QUESTIONS
    from knowledge_store.retrieval.engine import RetrievalEngine

    intact = RetrievalEngine(shared_sample_index, embedder=embedder)
    missing = RetrievalEngine(without_the_answers, embedder=embedder)
    try:
        for example in EXAMPLE_QUESTIONS:
            if not (example.section[-1] == "Rate limits" or "pre-charge" in example.question):
                continue
            there = intact.search(example.question, log=False)
            assert all(contains_words(there.answer.text, fact) for fact in example.key_facts), there.answer.text
            assert there.coverage in ("high", "medium")
            gone = missing.search(example.question, log=False)
            assert not all(contains_words(gone.answer.text, fact) for fact in example.key_facts)
            assert gone.coverage != "high", (example.question, gone.answer.text, gone.answer.confidence)
            assert gone.answer.confidence < there.answer.confidence
    finally:
        intact.query_log.close()
        missing.query_log.close()
