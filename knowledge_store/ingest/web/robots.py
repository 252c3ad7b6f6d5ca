"""robots.txt rules as RFC 9309 defines them.

``urllib.robotparser`` is not used for matching on purpose: it applies the
first rule that matches in file order and knows no ``*``/``$`` wildcards,
while RFC 9309 (and every major crawler) uses the *longest* matching rule,
with ``Allow`` winning a tie.  ``Disallow: /docs/`` followed by
``Allow: /docs/public/`` means opposite things under the two readings, so a
polite crawler has to implement the RFC.  The fetch-status rules (4xx = allow
all, 5xx/unreachable = disallow all) live in the crawler, which owns fetching.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_SAFE = "/%:@!$&'()*+,;=-._~?"
MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309 2.5: parse at least the first 500 KiB


def _normalize(text: str) -> str:
    """Percent-encode what needs it and upper-case escapes, so rule and URL compare as octets."""
    text = _ESCAPE.sub(lambda m: "%" + m.group(1).upper(), text)
    return quote(text, safe=_SAFE + "*$")


@dataclass(frozen=True)
class Rule:
    allow: bool
    pattern: str
    regex: re.Pattern[str]

    @classmethod
    def build(cls, allow: bool, pattern: str) -> Rule:
        normalized = _normalize(pattern)
        anchored = normalized.endswith("$")
        body = normalized[:-1] if anchored else normalized
        regex = ".*".join(re.escape(piece) for piece in body.split("*")) + (r"\Z" if anchored else "")
        return cls(allow=allow, pattern=normalized, regex=re.compile(regex))


@dataclass
class RobotsRules:
    """The rules that apply to our product token, plus the file's ``Sitemap:`` lines."""

    rules: list[Rule] = field(default_factory=list)
    crawl_delay: float | None = None
    sitemaps: list[str] = field(default_factory=list)
    disallow_all: bool = False

    @classmethod
    def allow_everything(cls) -> RobotsRules:
        return cls()

    def allows(self, url: str) -> bool:
        parts = urlsplit(url)
        path = parts.path or "/"
        if path == "/robots.txt":
            return True
        if self.disallow_all:
            return False
        target = _normalize(path + ("?" + parts.query if parts.query else ""))
        best: Rule | None = None
        for rule in self.rules:
            if not rule.regex.match(target):
                continue
            if best is None or len(rule.pattern) > len(best.pattern) or (
                len(rule.pattern) == len(best.pattern) and rule.allow and not best.allow
            ):
                best = rule
        return best is None or best.allow


@dataclass
class _Group:
    agents: list[str] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    crawl_delay: float | None = None


def _agent_token(value: str) -> str:
    return value.strip().split("/", 1)[0].split(" ", 1)[0].lower() if value.strip() else ""


def parse_robots(text: str, token: str) -> RobotsRules:
    """Rules for ``token`` (e.g. ``GroundworkBot``): the groups naming it, merged;
    else the ``*`` groups, merged; else no rules (everything allowed)."""
    groups: list[_Group] = []
    sitemaps: list[str] = []
    current: _Group | None = None
    collecting_agents = False
    for raw in text.lstrip("\ufeff").splitlines():
        line = raw.split("#", 1)[0].strip()
        if ":" not in line:
            continue
        key, value = (part.strip() for part in line.split(":", 1))
        key = key.lower()
        if key == "sitemap":
            if value:
                sitemaps.append(value)
            continue
        if key in ("user-agent", "useragent"):
            if current is None or not collecting_agents:
                current = _Group()
                groups.append(current)
            current.agents.append(_agent_token(value))
            collecting_agents = True
            continue
        if current is None:
            continue  # rules before any user-agent line belong to no group
        collecting_agents = False
        if key in ("allow", "disallow"):
            if value:  # an empty Disallow allows everything: no rule
                current.rules.append(Rule.build(key == "allow", value))
        elif key == "crawl-delay":
            try:
                delay = float(value)
            except ValueError:
                continue
            if delay >= 0 and delay == delay:
                current.crawl_delay = delay if current.crawl_delay is None else max(current.crawl_delay, delay)
    wanted = token.lower()
    chosen = [group for group in groups if wanted in group.agents]
    if not chosen:
        chosen = [group for group in groups if "*" in group.agents]
    delays = [group.crawl_delay for group in chosen if group.crawl_delay is not None]
    return RobotsRules(
        rules=[rule for group in chosen for rule in group.rules],
        crawl_delay=max(delays) if delays else None,
        sitemaps=sitemaps,
    )
