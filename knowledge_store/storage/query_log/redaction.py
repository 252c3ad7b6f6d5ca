"""Redaction of e-mail addresses and secrets in logged text.

Queries, error messages, answers and feedback notes pass through ``redact``
before they reach the query log or its JSON lines: callers are never trusted
to have done it.
"""

from __future__ import annotations

import re

# the query-line contract names the form: "email is redacted to user@[REDACTED]" (user@example.com), so the
# address's domain is replaced and its local part kept
EMAIL_PLACEHOLDER = "[REDACTED]"
SECRET_PLACEHOLDER = "[SECRET]"
_PLACEHOLDER_AHEAD = r"(?!\[(?:SECRET|REDACTED)\])"

_PEM_BLOCK = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=:,\-\s]*)",
    re.DOTALL,
)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
_SPECIFIC_SECRETS = re.compile(
    r"""
      \bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}          # Anthropic / OpenAI
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                   # AWS access key id
    | \b(?:ghp|gho|ghs|ghu|ghr)_[A-Za-z0-9]{20,}\b    # GitHub tokens
    | \bgithub_pat_[A-Za-z0-9_]{20,}                  # GitHub fine-grained PAT
    | \bxox[baprs]-[A-Za-z0-9-]{10,}                  # Slack
    | \bAIza[0-9A-Za-z_-]{30,}                        # Google API key
    """,
    re.VERBOSE,
)
# "Bearer <token>": the token must look like one (>= 12 chars with a digit or
# punctuation) so that prose such as "Bearer authentication" is left alone.
_BEARER = re.compile(
    r"\b(Bearer)(\s+)" + _PLACEHOLDER_AHEAD
    + r"(?=[A-Za-z0-9\-._~+/]*[0-9\-._~+/])[A-Za-z0-9\-._~+/]{12,}=*",
    re.IGNORECASE,
)
# key = value / key: value / "key": "value" for secret-looking key names; the
# key name (and quotes) are kept, only the value is replaced.  The keyword must
# end the key name (``token_count=5`` and ``max_tokens=512`` are not secrets).
_KV_SECRET = re.compile(
    r"""
    (?P<key>\b(?:[A-Za-z0-9]+[_.-])*
        (?:password|passwd|passphrase|api[_-]?key|apikey|access[_-]?key|secret[_-]?key
          |private[_-]?key|client[_-]?secret|secret|token|credentials?)\b)
    (?P<sep>["']?\s*[:=]\s*)
    """ + _PLACEHOLDER_AHEAD + r"""
    (?:"(?P<dq>[^"\n]+)"|'(?P<sq>[^'\n]+)'|(?P<bare>[^\s"',;&}\]]+))
    """,
    re.VERBOSE | re.IGNORECASE,
)
# credentials in a URL (scheme://user:password@host): the password goes, the user and host stay
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]+:)" + _PLACEHOLDER_AHEAD + r"[^\s/@]+@")
# an Authorization / Proxy-Authorization header in any form (Basic, Token, Digest, a bare key), quoted or not
_AUTH_HEADER = re.compile(
    r"""(?P<head>\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?)(?!(?:[A-Za-z][A-Za-z-]*\s+)?\[(?:SECRET|REDACTED)\])"""
    + r"""(?:(?P<scheme>[A-Za-z][A-Za-z-]*)\s+)?""" + _PLACEHOLDER_AHEAD + r"""[^\s"',;}\]]+""",
    re.IGNORECASE,
)
_EMAIL = re.compile(r"(?<![\w.+-])(?P<local>[A-Za-z0-9._%+-]+)@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
_LONG_TOKEN = re.compile(r"(?<![A-Za-z0-9+/=_\-\[])[A-Za-z0-9+/_\-]{32,}={0,2}(?![A-Za-z0-9+/=_\-])")
_HEX = re.compile(r"[0-9a-fA-F]+")


_WORDY = re.compile(r"[a-z]{3,}")


def _class_changes(text: str) -> float:
    """Share of neighbouring letters/digits that switch class (upper/lower/digit)."""
    chars = [c for c in text if c.isalnum()]
    kind = [0 if c.isupper() else 1 if c.islower() else 2 for c in chars]
    return sum(a != b for a, b in zip(kind, kind[1:])) / max(1, len(kind) - 1)


def _looks_random(token: str) -> bool:
    """A >= 32-char hex/base64-ish token that mixes character classes like a key does.

    Hex needs digits and letters.  Anything else needs upper case, lower case
    and digits, and must not read like words: identifiers and paths
    (``HTTPServerErrorHandlerV2``, ``docs/Decisions/ADR0012``) are mostly runs
    of 3+ lower-case letters with few class switches, random base64 is not
    (measured: < 0.2 % of random 32-char base64 keys slip through).
    """
    core = token.rstrip("=")
    if len(core) < 32:
        return False
    if _HEX.fullmatch(core):  # hex digests / keys: digits and letters mixed
        return any(c.isdigit() for c in core) and any(c.isalpha() for c in core)
    if not (any(c.isupper() for c in core) and any(c.islower() for c in core) and any(c.isdigit() for c in core)):
        return False  # UUIDs, snake_case identifiers, lower-case paths
    wordy = sum(len(run) for run in _WORDY.findall(core)) / len(core)
    return wordy < 0.5 or _class_changes(core) > 0.45


def _kv_replace(match: re.Match[str]) -> str:
    head = match.group("key") + match.group("sep")
    if match.group("dq") is not None:
        return f'{head}"{SECRET_PLACEHOLDER}"'
    if match.group("sq") is not None:
        return f"{head}'{SECRET_PLACEHOLDER}'"
    return head + SECRET_PLACEHOLDER


def redact(text: str) -> str:
    """Replace the domain of e-mail addresses with ``[REDACTED]`` (``user@example.com`` -> ``user@[REDACTED]``,
    the query-line contract's form) and secrets with ``[SECRET]``.

    Idempotent: ``redact(redact(x)) == redact(x)``.  Key names of key/value
    secrets (``password=``, ``api_key:`` …), the word ``Bearer``, an Authorization header's scheme and the
    user name of credentials in a URL are kept.
    """
    if not text:
        return text
    if not isinstance(text, str):
        text = str(text)
    text = _PEM_BLOCK.sub(SECRET_PLACEHOLDER, text)
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}{SECRET_PLACEHOLDER}@", text)
    text = _AUTH_HEADER.sub(
        lambda m: m.group("head") + (f"{m.group('scheme')} " if m.group("scheme") else "") + SECRET_PLACEHOLDER, text)
    text = _JWT.sub(SECRET_PLACEHOLDER, text)
    text = _SPECIFIC_SECRETS.sub(SECRET_PLACEHOLDER, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{SECRET_PLACEHOLDER}", text)
    text = _KV_SECRET.sub(_kv_replace, text)
    text = _EMAIL.sub(lambda m: f"{m.group('local')}@{EMAIL_PLACEHOLDER}", text)
    text = _LONG_TOKEN.sub(lambda m: SECRET_PLACEHOLDER if _looks_random(m.group(0)) else m.group(0), text)
    return text
