"""Redaction of secrets in logged queries (the query log itself: tests/integration/test_query_log.py)."""

from __future__ import annotations

import pytest

from knowledge_store.storage.query_log import redact

# ---------------------------------------------------------------------------
# redaction
# ---------------------------------------------------------------------------

SECRETS = {
    "openai": "sk-abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKL",
    "openai_project": "sk-proj-abcDEF1234567890abcdefGHIJ_kl-MNOP",
    "anthropic": "sk-ant-api03-AbCdEf0123456789abcdefXYZ_-abcd",
    "aws_key_id": "AKIAIOSFODNN7EXAMPLE",
    "github_classic": "ghp_1234567890abcdefghijABCDEFGHIJ123456",
    "github_oauth": "gho_16C7e42F292c6912E7710c838347Ae178B4a",
    "github_server": "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
    "github_fine_grained": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "slack_bot": "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp",
    "slack_user": "xoxp-1234567890-abcdefghij",
    "google": "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "hex_64": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "base64_40": "j2vVHi1rVsi+/hJQoC4Uxysw0jjAm+pmvgfT0qX8",
    "base64url_43": "Q2x1c3Rlci1rZXktMTIzNDU2Nzg5MC1hYmNkZWZnaGk",
}


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_redact_replaces_each_secret_shape_with_a_placeholder(kind: str) -> None:
    secret = SECRETS[kind]
    out = redact(f"why does {secret} fail?")
    assert secret not in out
    assert out == "why does [SECRET] fail?"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail bob.smith+ops@example.co.uk today", "mail bob.smith+ops@[REDACTED] today"),
        ("user@example.com", "user@[REDACTED]"),  # the query-line contract's own example
        ("Authorization: Bearer abc123def456ghi789", "Authorization: Bearer [SECRET]"),
        ("password=hunter2 and more", "password=[SECRET] and more"),
        ("DB_PASSWORD=pa55word!", "DB_PASSWORD=[SECRET]"),
        ('{"api_key": "x y z"}', '{"api_key": "[SECRET]"}'),
        ("api_key: abc123", "api_key: [SECRET]"),
        ("https://x.test/cb?token=abc&page=2", "https://x.test/cb?token=[SECRET]&page=2"),
        ("secret=s3cr3t", "secret=[SECRET]"),
        ("client_secret='s3cr3t'", "client_secret='[SECRET]'"),
        (
            "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "aws_secret_access_key=[SECRET]",
        ),
        (
            "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\nq0Zx=\n-----END RSA PRIVATE KEY-----\nthanks",
            "key:\n[SECRET]\nthanks",
        ),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----",
            "[SECRET]",
        ),
    ],
)
def test_redact_keeps_key_names_and_surrounding_text(text: str, expected: str) -> None:
    assert redact(text) == expected


NOT_SECRETS = [
    "hvac.min_cycle_minutes",
    "error E42",
    "POST /api/v2/auth/token",
    "192.168.1.20",
    "a 40-character sentence without secrets in it",
    "how do I rotate the api key?",
    "what is a token budget",
    "Bearer authentication in the gateway",
    "token_count=5 max_tokens=512",
    "commit 3f2a9bc1d7e and 3f2a9bc1d7e4a0b1c2d3e4f5a6b7c8",  # 11 and 30 hex chars
    "version 1.2.3-rc4 of groundwork",
    "/Users/JohnSmith/Documents/Report2024/final_draft.pdf",
    "src/Components/Button2/IndexPageLayout.tsx",
    "knowledge_store/retrieval/hybrid_search_pipeline_v2.py",
    "HTTPServerErrorResponseHandlerV2Factory",
    "MyCompany-Quarterly-Report-Q3-2024-Final-Version2",
    "550e8400-e29b-41d4-a716-446655440000",
    "sk-learn vs scikit-learn",
    "",
]


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_redact_leaves_ordinary_text_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    "text",
    [*SECRETS.values(), *NOT_SECRETS, "token: Bearer abc123def456ghi789", "password=bob@example.com", "x [SECRET] user@[REDACTED]", "a@b.example.com and c@d.org"],
)
def test_redact_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


def test_one_client_rating_one_passage_of_one_request_again_replaces_its_rating(tmp_path) -> None:
    from knowledge_store.storage.query_log import QueryLog, QueryLogRecord

    log = QueryLog(tmp_path / "logs.duckdb")
    try:
        rid = log.append(QueryLogRecord(query="when is compost ready", results_post=[{"chunk_id": "c1"}]))
        log.flush()
        reader, other = log.client_pseudonym("203.0.113.7"), log.client_pseudonym("198.51.100.1")
        assert reader == log.client_pseudonym("203.0.113.7") and reader != other and "203" not in reader
        stored = [log.add_feedback(rid, rating, chunk_id="c1", client=reader) for rating in ["up"] * 4 + ["down"]]
        assert [s["replaced"] for s in stored] == [0, 1, 1, 1, 1]
        assert [(r["rating"], r["client"]) for r in log.list_feedback()] == [("down", reader)]
        log.add_feedback(rid, "up", chunk_id="c1", client=other)
        log.add_feedback(rid, "up", client=reader)  # the answer as a whole is another thing to rate
        assert log.feedback_counts() == {"up": 2, "down": 1}
        # a second request of the same question rated by the same client: still one thumbs-up for the learning loop
        again = log.append(QueryLogRecord(query="when is compost ready", results_post=[{"chunk_id": "c1"}]))
        log.flush()
        log.add_feedback(again, "up", chunk_id="c1", client=other)
        assert log.feedback_counts() == {"up": 2, "down": 1} and len(log.list_feedback()) == 4
    finally:
        log.close()
