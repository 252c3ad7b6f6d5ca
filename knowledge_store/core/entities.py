"""Entities: identifiers and standards named in chunk text.

A plant manual says "inspect ASSET-104 under SOP-42 as API 510 requires"; people
search for exactly those names, in any spelling ("sop 42", "API-510").  An
``EntityPattern`` is one entity type: a regular expression and how a match is
written canonically; an ``EntityVocabulary`` is the list in force.  The same
vocabulary reads chunk text at ingestion (``chunk_entities`` rows), queries
(ranking boost) and filter values (``filters.entities``), so every spelling it
recognises meets the same canonical value.

Defaults (``DEFAULT_ENTITY_PATTERNS``), all matched case-insensitively:

- ``asset``     ``ASSET-104`` (also ``ASSET104``, ``asset_104``)      -> ``ASSET-104``
- ``equipment`` ``EQP-P101`` (also ``eqp_p101``)                       -> ``EQP-P101``
- ``procedure`` ``SOP-42`` (also ``SOP 42``, ``sop42``)                -> ``SOP-42``
- ``standard``  ``API 510``, ``API-510``, ``ISO 9001:2015``, ``IEC 61511`` -> ``API 510``, ``ISO 9001``, ``IEC 61511``

Why these standards: API (inspection codes such as API 510/570/653), ISO
(management systems, ISO 9001/14001/45001) and IEC (functional safety, IEC
61508/61511) are what maintenance procedures cite; their numbers have 3-5
digits, which keeps "API 2" or "ISO 9" in prose out.  The edition year
(``:2015``) is dropped from the canonical value so a query for ISO 9001 finds
every edition; the spelling as written stays in ``entities.alt_labels``.
ASME and EN numbering ("ASME B31.3", "EN 13445-3") is too irregular for one
safe pattern: add it through ``GROUNDWORK_ENTITY_PATTERNS`` when a corpus needs it.

``GROUNDWORK_ENTITY_PATTERNS`` (JSON) *adjusts* the defaults by type: a type
it names replaces that default (``null`` removes it), a new type is added::

    {"asset": "TAG-\\\\d+",
     "term": {"pattern": "pressure relief valves?", "canonical": "pressure relief valve", "case": "lower"},
     "standard": null}

A value is a regex (canonical value = the match, whitespace collapsed, upper
case) or ``{"pattern", "canonical"?, "case"?}``: ``canonical`` is a
``re.Match.expand`` template (``\\1``, ``\\g<name>``), ``case`` is ``upper``
(default), ``lower`` or ``keep``.  Matching ignores case; write ``(?-i:...)``
for a part that must not.  A pattern that does not compile, matches the empty
string or has a template referring to a missing group is refused at start-up
with ``EntityPatternError`` naming the type and the pattern.

Ids: ``entity_id = sha256(type | canonical_value)[:32]``, a content hash like
chunk ids.  ``signature`` hashes the vocabulary: ``documents.entity_signature``
records which vocabulary extracted a version's mentions, so changing the
patterns re-extracts every document on the next sync (regex over stored chunk
text: no re-parse, no re-chunk, no re-embedding).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from knowledge_store.core.errors import EntityPatternError

# bump when extraction changes in a way the patterns do not show (re-extracts everything on the next sync)
EXTRACTOR_VERSION = 1
# a regex match is certain to be a mention of what it matched; the confidence column is kept for other extractors
REGEX_CONFIDENCE = 1.0
ENTITY_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
CASES = ("upper", "lower", "keep")


class EntityRef(BaseModel):
    """An entity a passage mentions, as results and citations carry it."""

    model_config = ConfigDict(frozen=True)

    type: str = Field(description="Entity type: asset, equipment, procedure, standard, or a configured one.")
    value: str = Field(description="Canonical value, e.g. ASSET-104, SOP-42, API 510 (usable in filters.entities).")


@dataclass(frozen=True)
class EntityPattern:
    """One entity type: what to match and how a match is written canonically."""

    type: str
    pattern: str
    canonical: str | None = None  # re.Match.expand template; None = the whole match
    case: str = "upper"
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not ENTITY_TYPE_NAME.match(self.type):
            raise EntityPatternError(str(self.type), self.pattern, "type names are 1-32 lower-case letters, digits or _, "
                                     "starting with a letter")
        if self.case not in CASES:
            raise EntityPatternError(self.type, self.pattern, f"case must be one of {', '.join(CASES)} (got {self.case!r})")
        try:
            compiled = re.compile(self.pattern, re.IGNORECASE)
        except (re.error, TypeError) as error:
            raise EntityPatternError(self.type, self.pattern, f"not a valid regular expression: {error}") from error
        if compiled.fullmatch(""):
            raise EntityPatternError(self.type, self.pattern, "matches the empty string")
        if self.canonical is not None:
            try:
                compiled.sub(self.canonical, "")  # compiles the template: bad group references fail here
            except (re.error, IndexError) as error:
                raise EntityPatternError(self.type, self.pattern,
                                         f"canonical template {self.canonical!r} does not fit the pattern: {error}") from error
        object.__setattr__(self, "regex", compiled)

    def canonicalise(self, match: re.Match[str]) -> str:
        text = match.expand(self.canonical) if self.canonical is not None else match.group(0)
        text = " ".join(text.split())
        if self.case == "upper":
            return text.upper()
        if self.case == "lower":
            return text.lower()
        return text

    def spec(self) -> dict[str, Any]:
        return {"type": self.type, "pattern": self.pattern, "canonical": self.canonical, "case": self.case}


DEFAULT_ENTITY_PATTERNS: tuple[EntityPattern, ...] = (
    EntityPattern("asset", r"\bASSET[-_]?(\d+)(?![\w-])", r"ASSET-\1"),
    EntityPattern("equipment", r"\bEQP[-_]([A-Z0-9]+)\b", r"EQP-\1"),
    # "SOP 42" is how procedures are cited in prose; "asset 12" is as often a count as an id, so only SOP takes a space
    EntityPattern("procedure", r"\bSOP[-_ ]?(\d+)(?![\w-])", r"SOP-\1"),
    EntityPattern("standard", r"\b(API|ISO|IEC)[ -]?(\d{3,5})(?::\d{4})?(?![\w-])", r"\1 \2"),
)


@dataclass(frozen=True)
class EntityMention:
    """One match in a text: the entity and where (``span_start``/``span_end`` index the text)."""

    entity_id: str
    type: str
    canonical_value: str
    surface: str  # the text as written
    span_start: int
    span_end: int
    confidence: float = REGEX_CONFIDENCE

    @property
    def ref(self) -> EntityRef:
        return EntityRef(type=self.type, value=self.canonical_value)


def entity_id_for(entity_type: str, canonical_value: str) -> str:
    """Stable id from content: the same entity gets the same id in every store and snapshot."""
    return hashlib.sha256(f"{entity_type}|{canonical_value}".encode()).hexdigest()[:32]


def entity_key(value: str) -> str:
    """How canonical values are compared in filters and the boost: case-folded, whitespace collapsed."""
    return " ".join(value.split()).casefold()


@dataclass(frozen=True)
class EntityVocabulary:
    """The entity patterns in force; one per settings object, stored in each snapshot's meta."""

    patterns: tuple[EntityPattern, ...]

    @property
    def signature(self) -> str:
        payload = json.dumps([EXTRACTOR_VERSION, [p.spec() for p in self.patterns]], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def types(self) -> list[str]:
        return [p.type for p in self.patterns]

    def extract(self, text: str) -> list[EntityMention]:
        """Every mention in ``text``, in order of position (a span matched by two types counts for both)."""
        mentions: list[EntityMention] = []
        seen: set[tuple[str, int, int]] = set()
        for pattern in self.patterns:
            for match in pattern.regex.finditer(text):
                value = pattern.canonicalise(match)
                if not value:
                    continue
                entity_id = entity_id_for(pattern.type, value)
                key = (entity_id, match.start(), match.end())
                if key in seen:
                    continue
                seen.add(key)
                mentions.append(EntityMention(entity_id, pattern.type, value, match.group(0), match.start(), match.end()))
        mentions.sort(key=lambda m: (m.span_start, m.span_end, m.type))
        return mentions

    def filter_keys(self, value: str) -> list[str]:
        """The keys a ``filters.entities`` value stands for: the canonical values it spells
        ("api-510" -> "api 510"), or, when it spells none, the value itself compared
        case-insensitively (a custom type's canonical value, or nothing)."""
        found = list(dict.fromkeys(entity_key(m.canonical_value) for m in self.extract(value)))
        return found or [entity_key(value)]

    def to_json(self) -> str:
        return json.dumps([p.spec() for p in self.patterns], sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "EntityVocabulary":
        return cls(tuple(EntityPattern(**spec) for spec in json.loads(text)))


DEFAULT_VOCABULARY = EntityVocabulary(DEFAULT_ENTITY_PATTERNS)


def build_vocabulary(overrides: dict[str, str | dict | None] | None) -> EntityVocabulary:
    """The defaults adjusted by ``GROUNDWORK_ENTITY_PATTERNS``: a named type replaces (``None``:
    removes) its default, a new type is added after the defaults.  Raises ``EntityPatternError``."""
    overrides = dict(overrides or {})
    patterns: list[EntityPattern] = []
    for default in DEFAULT_ENTITY_PATTERNS:
        if default.type not in overrides:
            patterns.append(default)
            continue
        replacement = _pattern(default.type, overrides.pop(default.type))
        if replacement is not None:
            patterns.append(replacement)
    for entity_type, value in overrides.items():
        added = _pattern(entity_type, value)
        if added is not None:
            patterns.append(added)
    return EntityVocabulary(tuple(patterns))


@lru_cache(maxsize=32)
def vocabulary_from_json(overrides_json: str) -> EntityVocabulary:
    """``build_vocabulary`` cached by the overrides' JSON (settings ask for it per sync and per query)."""
    return build_vocabulary(json.loads(overrides_json))


def _pattern(entity_type: str, value: object) -> EntityPattern | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return EntityPattern(entity_type, value)
    if isinstance(value, dict):
        unknown = set(value) - {"pattern", "canonical", "case"}
        if unknown or "pattern" not in value:
            raise EntityPatternError(entity_type, value, "an entry is a regex or {\"pattern\", \"canonical\"?, \"case\"?}"
                                     + (f"; unknown keys: {', '.join(sorted(unknown))}" if unknown else ""))
        return EntityPattern(entity_type, value["pattern"], value.get("canonical"), value.get("case", "upper"))
    raise EntityPatternError(entity_type, value, "an entry is a regex string, an object or null")
