"""A small OpenAI-compatible server for tests: a threaded ``http.server`` on 127.0.0.1 that answers
``/v1/chat/completions`` and ``/v1/embeddings`` deterministically, as RAGAS and ``LLMAnswerer`` call them.

- An answering request (``LLMAnswerer``: no JSON schema in the system message) gets the first sentence of
  passage [1] followed by `` [1]``.
- A judge request (RAGAS through instructor's JSON-schema mode: the output's JSON schema in ``response_format``;
  in JSON mode it is in the system message) gets the JSON that schema asks for: two statements for ``StatementGeneratorOutput``, the
  verdicts 1 then 0 for ``NLIStatementOutput`` (faithfulness 0.5), the question ``QUESTION`` and
  noncommittal 0 for ``AnswerRelevanceOutput``.
- Embeddings are letter counts (a-z) of each text, so equal texts embed equally and others differ.
- Model ``broken-judge`` gets HTTP 500; model ``garbage-judge`` gets a completion whose content is not JSON.

Every request body is kept in ``requests`` as ``(path, body)``.
"""

from __future__ import annotations

import json
import re
import string
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

QUESTION = "how do I reset the thermostat"
STATEMENTS = ["The dial resets the thermostat.", "The reset takes an hour."]


def letter_counts(text: str) -> list[float]:
    lower = text.lower()
    return [float(lower.count(letter)) for letter in string.ascii_lowercase]


def _first_passage_sentence(prompt: str) -> str:
    match = re.search(r"\[1\][^\n]*\n(.+?)(?:\n\n|\n\[2\]|$)", prompt, re.S)
    body = " ".join((match.group(1) if match else prompt).split())
    sentence = re.split(r"(?<=[.!?])\s", body, maxsplit=1)[0]
    return sentence


class StandIn:
    """``with StandIn() as server: server.base_url`` - ``http://127.0.0.1:<port>/v1``."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                return None

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                stand_in.requests.append((self.path, body))
                status, reply = stand_in.reply(self.path, body)
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def chat_models(self) -> list[str]:
        return [body.get("model") for path, body in self.requests if path.endswith("/chat/completions")]

    def embedding_models(self) -> list[str]:
        return [body.get("model") for path, body in self.requests if path.endswith("/embeddings")]

    def reply(self, path: str, body: dict) -> tuple[int, dict | bytes]:
        model = body.get("model", "")
        if path.endswith("/embeddings"):
            texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
            return 200, {"object": "list", "model": model, "usage": {"prompt_tokens": 1, "total_tokens": 1},
                         "data": [{"object": "embedding", "index": i, "embedding": letter_counts(t)}
                                  for i, t in enumerate(texts)]}
        if not path.endswith("/chat/completions"):
            return 404, {"error": {"message": f"no route {path}"}}
        if model == "broken-judge":
            return 500, {"error": {"message": "the judge is down"}}
        messages = body.get("messages", [])
        system = " ".join(m.get("content", "") for m in messages if m.get("role") == "system")
        user = " ".join(m.get("content", "") for m in messages if m.get("role") == "user")
        system += " " + json.dumps(body.get("response_format") or {})  # the schema, in JSON-schema mode
        if model == "garbage-judge":
            content = "certainly! here is no json at all"
        elif "json_schema" not in system:  # an answer, as LLMAnswerer asks for one
            content = f"{_first_passage_sentence(user)} [1]"
        elif "AnswerRelevanceOutput" in system:
            content = json.dumps({"question": QUESTION, "noncommittal": 0})
        elif "NLIStatementOutput" in system:
            content = json.dumps({"statements": [
                {"statement": STATEMENTS[0], "reason": "the passage says so", "verdict": 1},
                {"statement": STATEMENTS[1], "reason": "the passage does not say so", "verdict": 0}]})
        elif "StatementGeneratorOutput" in system:
            content = json.dumps({"statements": STATEMENTS})
        else:
            return 400, {"error": {"message": "unknown structured output"}}
        return 200, {"id": "stand-in", "object": "chat.completion", "created": 0, "model": model,
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": content}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
