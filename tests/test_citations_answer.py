"""Citations, snippets, extractive answers and the LLM client (against a local fake server)."""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from knowledge_store.errors import GroundworkError
from knowledge_store.retrieval.answer import (
    NO_ANSWER,
    Answer,
    GenerationError,
    LLMAnswerer,
    extractive_answer,
)
from knowledge_store.retrieval.citations import Citation, build_citation, build_citations
from knowledge_store.retrieval.snippets import ELLIPSIS, best_snippet, collapse_ws, segments
from knowledge_store.retrieval.terms import query_terms, term_spans
from knowledge_store.retrieval.types import SearchHit


def make_hit(text: str, n: int = 1, **kw) -> SearchHit:
    fields = dict(
        chunk_id=f"c{n}",
        doc_id=f"d{n}",
        version=1,
        title=f"Doc {n}",
        section=f"Section {n}",
        section_path=(f"Doc {n}", f"Section {n}"),
        page_start=n,
        page_end=n,
        url=f"file:///docs/doc{n}.pdf#page={n}",
        source_path=f"/docs/doc{n}.pdf",
        source_id="src",
        text=text,
        doc_type="pdf",
        score=1.0 / n,
        bm25_score=3.0,
        vector_score=0.5,
        relevance=0.8,
    )
    fields.update(kw)
    return SearchHit(**fields)


def check_offsets(text: str, snippet: str, start: int, end: int) -> None:
    """The snippet minus its ellipses is exactly the collapsed text[start:end]."""
    assert 0 <= start < end <= len(text)
    body = collapse_ws(text[start:end])
    assert snippet in {body, ELLIPSIS + body, body + ELLIPSIS, ELLIPSIS + body + ELLIPSIS}, (snippet, body)


# ---------------------------------------------------------------------------
# query terms


def test_query_terms_stem_stopwords_and_identifiers():
    assert query_terms("How do I reset the thermostat?") == ["reset", "thermostat"]
    assert query_terms("resetting") == query_terms("reset") == query_terms("resets")
    assert query_terms("codes") == query_terms("code") == query_terms("coding")
    assert query_terms("configured") == query_terms("configuration") == query_terms("configure")
    assert query_terms("What is hvac.min_cycle_minutes?") == ["hvac", "min_cycle_minutes"]
    assert query_terms("Café RÉSUMÉ") == query_terms("cafe resume")
    assert query_terms("the of and is") == []
    assert query_terms("error E42 error") == ["error", "e42"]


# ---------------------------------------------------------------------------
# snippets

VOCAB = (
    "the thermostat controller reset button press hold seconds error code codes display battery sensor "
    "schedule heating cooling fan mode minutes cycle compressor filter warranty service manual install "
    "wiring voltage terminal café naïve résumé Straße 温度 計 données élève ünïcödé"
).split()
CODE_LINES = [
    "hvac.min_cycle_minutes = 5",
    "    if error_code == 42: reset()",
    "| code | meaning | action |",
    "def reset_controller(timeout=30):",
    "curl -X POST http://localhost:8080/api/v1/reset?force=true",
]
LONG_WORDS = [
    "https://example.com/manuals/thermostat/" + "x" * 120 + "/reset.pdf",
    "a" * 300,
    "sha256:" + "0123456789abcdef" * 8,
]


def random_text(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 8)):
        kind = rng.random()
        if kind < 0.6:
            n = rng.choice([3, 8, 15, 40, 90])  # some sentences far longer than a snippet
            words = [rng.choice(VOCAB) for _ in range(rng.randint(1, n))]
            if rng.random() < 0.1:
                words.insert(rng.randrange(len(words) + 1), rng.choice(LONG_WORDS))
            sentence = " ".join(words)
            parts.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", ";", ""]))
        elif kind < 0.85:
            parts.append("\n".join(rng.sample(CODE_LINES, rng.randint(1, len(CODE_LINES)))))
        else:
            parts.append(rng.choice(LONG_WORDS) + " 🙂 e.g. see fig. 3")
        parts.append(rng.choice([" ", "  ", "\n", "\n\n", " \t\n  "]))
    return "".join(parts)


def random_query(rng: random.Random) -> str:
    pool = VOCAB + ["hvac.min_cycle_minutes", "resetting", "E42", "absent", "what is the", "how do I"]
    return " ".join(rng.choice(pool) for _ in range(rng.randint(1, 4)))


def test_snippet_limits_offsets_and_terms_on_random_texts():
    rng = random.Random(20240611)
    for _ in range(600):
        text = random_text(rng)
        query = random_query(rng)
        max_chars = rng.choice([150, 150, 150, 60, 25, 200])
        snippet, start, end = best_snippet(text, query, max_chars)
        assert snippet, (text, query)
        assert len(snippet) <= max_chars, (snippet, max_chars)
        assert "\n" not in snippet and "  " not in snippet
        check_offsets(text, snippet, start, end)
        wanted = set(query_terms(query))
        present = wanted & {t for t, _, _ in term_spans(text)}
        if present and max_chars >= 60:
            assert wanted & set(query_terms(snippet)), (text, query, snippet)


def test_snippet_default_limit_is_150():
    text = " ".join(["word"] * 200) + " thermostat " + " ".join(["word"] * 200)
    snippet, start, end = best_snippet(text, "thermostat")
    assert len(snippet) <= 150 and "thermostat" in snippet
    assert snippet.startswith(ELLIPSIS) and snippet.endswith(ELLIPSIS)
    check_offsets(text, snippet, start, end)
    # centred: roughly as many words on each side of the match
    left, right = snippet.strip(ELLIPSIS).split("thermostat")
    assert abs(len(left) - len(right)) <= 12


def test_best_sentence_is_chosen():
    text = (
        "The unit ships with a wall plate. Batteries last about a year. "
        "To reset the controller, hold the MODE button for ten seconds. "
        "The warranty covers parts for five years."
    )
    snippet, start, end = best_snippet(text, "how do I reset the controller?", 150)
    assert "To reset the controller, hold the MODE button for ten seconds." in snippet
    check_offsets(text, snippet, start, end)
    exact = "To reset the controller, hold the MODE button for ten seconds."
    snippet, start, end = best_snippet(text, "resetting controller", len(exact))
    assert snippet == exact and text[start:end] == exact


def test_rare_terms_weigh_more_and_ties_go_earlier():
    text = "Thermostat battery notes. Thermostat wiring guide. Thermostat error codes list."
    snippet, _, _ = best_snippet(text, "thermostat error", 30)
    assert snippet == "Thermostat error codes list."
    snippet, _, _ = best_snippet(text, "thermostat", 30)
    assert snippet.startswith("Thermostat battery notes.")


def test_short_sentence_is_extended_with_neighbours():
    text = "Intro sentence here. Press reset. Then wait for the display to blink twice before releasing."
    snippet, start, end = best_snippet(text, "reset", 150)
    assert snippet == collapse_ws(text) and (start, end) == (0, len(text))
    snippet, start, end = best_snippet(text, "reset", 45)
    assert "Press reset." in snippet and len(snippet) <= 45
    check_offsets(text, snippet, start, end)


def test_long_sentence_window_has_ellipses_and_cuts_at_words():
    words = [f"filler{i}" for i in range(60)]
    words[45] = "compressor"
    text = "Short first. " + " ".join(words) + " end. Last one."
    snippet, start, end = best_snippet(text, "compressor", 80)
    assert len(snippet) <= 80 and "compressor" in snippet
    assert snippet.startswith(ELLIPSIS) and snippet.endswith(ELLIPSIS)
    check_offsets(text, snippet, start, end)
    assert text[start - 1] == " " and text[end] == " "  # whole words only


def test_code_lines_count_as_sentences():
    text = (
        "Configuration keys:\n"
        "hvac.fan_mode = auto\n"
        "hvac.min_cycle_minutes = 5\n"
        "hvac.max_temp = 30\n\n"
        "Restart the service after editing."
    )
    spans = [text[s:e] for s, e in segments(text)]
    assert "hvac.min_cycle_minutes = 5" in spans
    snippet, start, end = best_snippet(text, "hvac.min_cycle_minutes", 26)
    assert snippet == "hvac.min_cycle_minutes = 5"
    assert text[start:end] == snippet


def test_hard_wrapped_prose_stays_one_sentence():
    text = "The compressor restarts only after the minimum\ncycle time has elapsed, which protects\nthe motor."
    assert [text[s:e] for s, e in segments(text)] == [text]


def test_no_match_gives_first_sentence_and_empty_text_gives_empty():
    text = "First sentence is here. Second sentence follows."
    snippet, start, end = best_snippet(text, "zebra", 24)
    assert snippet == "First sentence is here." and start == 0
    assert best_snippet("", "zebra") == ("", 0, 0)
    assert best_snippet("   \n ", "zebra") == ("", 0, 0)
    with pytest.raises(ValueError):
        best_snippet(text, "x", 0)


def test_single_huge_word_is_cut_around_the_match():
    text = "See " + "q" * 200 + "/thermostat/" + "z" * 200 + " for details."
    snippet, start, end = best_snippet(text, "thermostat", 40)
    assert len(snippet) <= 40 and "thermostat" in snippet
    assert snippet.startswith(ELLIPSIS) and snippet.endswith(ELLIPSIS)
    assert snippet.strip(ELLIPSIS) == text[start:end]


# ---------------------------------------------------------------------------
# citations


def test_build_citation_fields_and_json():
    text = "Intro. To reset the controller, hold MODE for ten seconds. Outro."
    hit = make_hit(text, 2, section_path=("Manual", "Reset"), last_updated="2024-05-01", rerank_score=0.7)
    citation = build_citation(hit, "reset controller", 3)
    assert isinstance(citation, Citation)
    assert citation.n == 3 and citation.chunk_id == "c2" and citation.doc_id == "d2"
    assert citation.pages == [2] and citation.page_start == 2 and citation.page_end == 2
    assert citation.section_path == ["Manual", "Reset"]
    assert citation.url == "file:///docs/doc2.pdf#page=2"
    assert "reset the controller" in citation.snippet
    assert text[citation.snippet_start:citation.snippet_end] in text
    assert citation.rerank_score == 0.7 and citation.last_updated == "2024-05-01"
    data = json.loads(citation.model_dump_json())
    assert data["n"] == 3 and data["snippet"] == citation.snippet and data["bm25_score"] == 3.0


def test_citation_url_gets_page_fragment_only_when_missing():
    plain = make_hit("Some text.", 1, url="file:///docs/a.pdf", page_start=4, page_end=5)
    assert build_citation(plain, "text", 1).url == "file:///docs/a.pdf#page=4"
    assert build_citation(plain, "text", 1).pages == [4, 5]
    anchored = make_hit("Some text.", 1, url="file:///docs/a.md#install", page_start=1, page_end=1)
    assert build_citation(anchored, "text", 1).url == "file:///docs/a.md#install"
    no_page = make_hit("Some text.", 1, url="file:///docs/a.md", page_start=None, page_end=None)
    citation = build_citation(no_page, "text", 1)
    assert citation.url == "file:///docs/a.md" and citation.pages == []


def test_build_citations_numbers_in_rank_order_and_respects_limit():
    hits = [make_hit("Alpha reset step. " * 20, 1), make_hit("Beta reset step.", 2)]
    citations = build_citations(hits, "reset")
    assert [c.n for c in citations] == [1, 2] and [c.chunk_id for c in citations] == ["c1", "c2"]
    assert all(len(c.snippet) <= 150 for c in citations)
    assert all(len(c.snippet) <= 40 for c in build_citations(hits, "reset", max_snippet_chars=40))


# ---------------------------------------------------------------------------
# extractive answers

HITS_TEXT = [
    "Reset\n\nThe controller keeps its schedule during a power cut. "
    "To reset the controller, hold the MODE button for ten seconds.   The display blinks twice\nwhen the reset is done.",
    "Error codes are shown on the display. Error E42 means the outdoor sensor is disconnected. "
    "To reset the controller, hold the MODE button for ten seconds.",
    "The warranty covers parts for five years and labour for one year.",
]


def hits_for_answer() -> list[SearchHit]:
    return [
        make_hit(HITS_TEXT[0], 1, section="Reset", section_path=("Manual", "Reset")),
        make_hit(HITS_TEXT[1], 2, section="Errors", section_path=("Manual", "Errors")),
        make_hit(HITS_TEXT[2], 3, section="Warranty", section_path=("Manual", "Warranty")),
    ]


def test_extractive_sentences_are_verbatim_with_the_right_marker():
    hits = hits_for_answer()
    answer = extractive_answer("How do I reset the controller?", hits)
    assert answer.method == "extractive" and answer.model is None
    assert answer.sentences
    for item in answer.sentences:
        hit = hits[item["citation"] - 1]
        assert item["chunk_id"] == hit.chunk_id
        assert item["text"] in collapse_ws(hit.text)
        assert collapse_ws(hit.text[item["start"]:item["end"]]) == item["text"]
        assert f"{item['text']} [{item['citation']}]" in answer.text
    texts = [item["text"] for item in answer.sentences]
    best = "To reset the controller, hold the MODE button for ten seconds."
    assert best in texts and answer.sentences[texts.index(best)]["citation"] == 1  # the top hit's copy
    # the same sentence in hit 2 (chunk overlap) is not repeated
    assert texts.count("To reset the controller, hold the MODE button for ten seconds.") == 1
    assert "Reset" not in texts  # the heading is not an answer sentence
    assert set(answer.citations) == {item["citation"] for item in answer.sentences}


def test_extractive_cites_the_hit_that_holds_the_fact():
    hits = hits_for_answer()
    answer = extractive_answer("what does error E42 mean", hits, max_sentences=1)
    assert answer.text == "Error E42 means the outdoor sensor is disconnected. [2]"
    assert answer.citations == [2]
    answer = extractive_answer("warranty parts years", hits, max_sentences=1)
    assert answer.text.endswith("[3]") and answer.citations == [3]


def test_extractive_keeps_passage_order_and_limits():
    hits = hits_for_answer()
    answer = extractive_answer("controller reset display blinks", hits, max_sentences=3)
    first_hit = [item for item in answer.sentences if item["citation"] == 1]
    assert [item["start"] for item in first_hit] == sorted(item["start"] for item in first_hit)
    assert len(answer.sentences) <= 3
    short = extractive_answer("controller reset display blinks", hits, max_chars=80)
    assert len(short.text) <= 80 and short.sentences
    one = extractive_answer("controller reset display blinks", hits, max_sentences=1)
    assert len(one.sentences) == 1


def test_extractive_long_sentence_is_quoted_in_part():
    hit = make_hit("Intro. " + "The compressor " + " ".join(["waits"] * 200) + " before restarting.", 1)
    answer = extractive_answer("compressor", [hit], max_chars=100)
    assert len(answer.text) <= 100 and "compressor" in answer.text and answer.text.endswith("[1]")


def test_extractive_empty_and_unmatched():
    answer = extractive_answer("anything", [])
    assert answer == Answer(text=NO_ANSWER, citations=[], method="extractive")
    hits = hits_for_answer()
    fallback = extractive_answer("zebra giraffe", hits)
    assert fallback.citations == [1]
    assert fallback.text == "The controller keeps its schedule during a power cut. [1]"


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
