"""A live, read-only view of one registry's names: what every surface that lists them reads.

A vocabulary (the fusion modes, the rerankers, the answer modes) is defined once, as a registry
``dict[str, Entry]`` beside the code that implements it (``retrieval/fusion.py``,
``retrieval/reranker_registry.py``, ``retrieval/answer.py``).  Settings validation, CLI choices, the
HTTP API's request models, the MCP tool schema, the console (through ``GET /api/knowledge/config``),
the tuning grid and the evaluation configurations read the names through a ``Vocabulary`` *when they
need them*, never a copy taken at import, so an entry added to the registry is accepted and offered
everywhere without another edit (tests/unit/test_vocabularies.py and tests/integration/test_vocabularies.py register one at test time to prove it).

Deliberately tiny (pydantic is its only import): ``settings.py`` imports vocabularies, and must stay cheap to import.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator


class Described(Protocol):
    """What a registry entry must have for a ``Vocabulary``: a one-line description of what it does."""

    description: str


class Vocabulary(Mapping[str, str]):
    """Name -> description of every entry of ``registry``, in registration order, read at each use.

    A ``Mapping``, so ``name in vocabulary``, ``list(vocabulary)``, ``dict(vocabulary)`` and
    ``vocabulary.items()`` work as they did on the plain dicts and tuples this replaces."""

    def __init__(self, field: str, registry: Mapping[str, Described]) -> None:
        self.field = field  # the parameter the names are values of ("fusion", "reranker"), for messages
        self._registry = registry

    def __getitem__(self, name: str) -> str:
        return self._registry[name].description

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry)

    def __len__(self) -> int:
        return len(self._registry)

    def __repr__(self) -> str:
        return f"Vocabulary({self.field!r}: {', '.join(self)})"

    def names(self) -> tuple[str, ...]:
        """The names now, in registration order."""
        return tuple(self._registry)

    def literal(self) -> Any:
        """``Literal[<every name now>]``: a pydantic/FastAPI/MCP type whose JSON schema is the enum of names.
        Build it where the schema is built (per app, per MCP server), not at import."""
        return Literal[self.names()]  # type: ignore[valid-type]

    def member(self) -> Any:
        """``str`` checked against the names *at validation time*: a field type for models built at import
        (``EvalConfig``, settings) that must still accept a name registered later.  ``literal()`` is for
        schemas, which list the names; this is for values, which must be one of them."""
        return Annotated[str, AfterValidator(self.check)]

    def check(self, value: str) -> str:
        """``value`` if it is a name now, else ``ValueError`` naming the vocabulary and the value."""
        if value not in self._registry:
            raise ValueError(f"{self.one_of()} (got {value!r})")
        return value

    def one_of(self) -> str:
        """The reason a value outside the vocabulary is refused: ``must be one of a, b, c``."""
        return f"must be one of {', '.join(self)}"

    def described(self, separator: str = "; ") -> str:
        """``name: what it does`` for every name, for help texts and schema descriptions."""
        return separator.join(f"{name}: {description}" for name, description in self.items())
