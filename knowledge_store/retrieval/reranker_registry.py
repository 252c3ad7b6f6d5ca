"""The rerankers by name: the one place a reranker is named, described and built.

``RERANKER_REGISTRY`` maps each name to a ``RerankerSpec``: a label and description for clients, the
factory the engine calls to build it (``RetrievalEngine.reranker`` dispatches here, no if/elif), and
what it needs to run (the cross-encoder needs a local model folder).  ``RERANKERS`` is the live
name -> description view that settings validation, CLI choices, the HTTP API's request models, the
MCP tool schema, the console (``GET /api/knowledge/config`` lists ``rerankers`` and
``reranker_labels``), the tuning store and the evaluations read, so a reranker added here is
accepted and offered everywhere without another edit.

Kept apart from ``rerankers.py`` (the implementations): this module is read for names by settings
validation, the CLI and the API's schema and must not import LlamaIndex (seconds at start-up); each
factory imports its implementation when the engine first builds it.  A factory receives a
``RerankerContext`` (the settings, the feedback rows, the query embedding), never the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from knowledge_store.config.settings import Settings, register_vocabulary
from knowledge_store.core.errors import ConfigError, QueryValidationError
from knowledge_store.core.vocabulary import Vocabulary


@dataclass(frozen=True)
class RerankerContext:
    """What a reranker may use: the settings, the rated past queries and the query embedding of the served
    model (both read at each call: the feedback grows and an adopted fine-tuned model changes the embedding)."""

    settings: Settings
    feedback_rows: Callable[[], list[dict[str, Any]]]
    embed: Callable[[list[str]], np.ndarray]


class RerankerUnavailable(QueryValidationError):
    """The reranker cannot run with the current configuration (e.g. no model path).

    A field error on ``reranker`` carrying the requested name, so the HTTP API answers 422
    naming the field and the CLI prints one ``error:`` line."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__("reranker", name, reason)


def _always(settings: Settings) -> bool:
    return True


@dataclass(frozen=True)
class RerankerSpec:
    """One reranker: how clients show it, how the engine builds it, and what it needs to run."""

    name: str  # what settings, CLI, API, MCP and the console accept
    description: str  # what it does, in one line (help texts, schema descriptions, the console's tooltip)
    # the engine's factory: a LlamaIndex BaseNodePostprocessor, or None for "keep the fused order"
    build: Callable[[RerankerContext], Any]
    hint: str = ""  # a few words after the name in choice lists ("mmr (diversity)"); "" = the name says it
    needs: str | None = None  # what it cannot run without, said when it is unavailable
    available: Callable[[Settings], bool] = _always  # whether these settings let it run
    # it reads the feedback: the engine builds one per visibility scope, each reading only the feedback given on
    # searches of that scope (a public search is never moved by what was rated on searches of internal sources)
    reads_feedback: bool = False

    @property
    def label(self) -> str:
        """The text of its choice in the console: ``mmr (diversity)``."""
        return f"{self.name} ({self.hint})" if self.hint else self.name

    def unavailable_reason(self) -> str:
        """Why it cannot run here: ``the cross-encoder reranker needs GROUNDWORK_CROSS_ENCODER_PATH, ...``."""
        return f"the {self.name} reranker needs {self.needs or 'a configuration this server does not have'}"


def _keep_fused_order(context: RerankerContext) -> None:
    return None


def _mmr(context: RerankerContext) -> Any:
    from knowledge_store.retrieval.rerankers import MMRReranker  # noqa: PLC0415 - LlamaIndex, ~1.5 s to import

    return MMRReranker(lambda_mult=context.settings.mmr_lambda)


def _feedback(context: RerankerContext) -> Any:
    from knowledge_store.retrieval.rerankers import FeedbackReranker  # noqa: PLC0415 - LlamaIndex, ~1.5 s to import

    return FeedbackReranker(feedback_source=context.feedback_rows, embed=context.embed,
                            similarity=context.settings.feedback_similarity, weight=context.settings.feedback_weight)


def _cross_encoder(context: RerankerContext) -> Any:
    from knowledge_store.retrieval.rerankers import CrossEncoderReranker  # noqa: PLC0415 - LlamaIndex, ~1.5 s

    return CrossEncoderReranker(model_path=str(context.settings.cross_encoder_path))


# the one place a reranker is named (in the order clients list them)
RERANKER_REGISTRY: dict[str, RerankerSpec] = {spec.name: spec for spec in (
    RerankerSpec("none", "keep the fused order", _keep_fused_order),
    RerankerSpec("mmr", "maximal marginal relevance: trade relevance against similarity to passages already chosen "
                        "(mmr_lambda)", _mmr, hint="diversity"),
    RerankerSpec("feedback", "move passages by the thumbs up/down people gave them for similar past queries",
                 _feedback, hint="thumbs from similar queries", reads_feedback=True),
    RerankerSpec("cross-encoder", "score each (query, passage) pair with a local sentence-transformers CrossEncoder",
                 _cross_encoder, needs="GROUNDWORK_CROSS_ENCODER_PATH (a local CrossEncoder folder)",
                 available=lambda settings: bool(settings.cross_encoder_path)),
)}
RERANKERS = Vocabulary("reranker", RERANKER_REGISTRY)
register_vocabulary("default_reranker", RERANKERS)


def _node_postprocessor(name: str, target: str) -> RerankerSpec:
    """The registry entry of a LlamaIndex node postprocessor named in ``node_postprocessors`` (``module:Class``)."""
    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise ConfigError("node_postprocessors", target, "each entry is 'module:Class' or 'name=module:Class'")

    def build(context: RerankerContext) -> Any:
        import importlib  # noqa: PLC0415 - only for configured postprocessors

        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as error:
            raise RerankerUnavailable(name, f"cannot import {target}: {error}") from error
        return cls()

    return RerankerSpec(name, f"the LlamaIndex node postprocessor {target}", build, hint=class_name)


def register_node_postprocessors(settings: Settings) -> tuple[str, ...]:
    """Add each LlamaIndex node postprocessor ``settings.node_postprocessors`` names to the registry (so every
    front end accepts and offers it as a reranker); the names added.  A name the registry already holds for
    something else is refused (``ConfigError``)."""
    added = []
    for entry in filter(None, (item.strip() for item in settings.node_postprocessors.split(","))):
        name, _, target = entry.rpartition("=")
        target = target.strip()
        name = name.strip() or target.rpartition(":")[2].lower()
        spec = _node_postprocessor(name, target)
        known = RERANKER_REGISTRY.get(name)
        if known is not None and known.description != spec.description:
            raise ConfigError("node_postprocessors", entry, f"{name!r} already names a reranker ({known.description})")
        RERANKER_REGISTRY[name] = spec
        added.append(name)
    return tuple(added)


def available_rerankers(settings: Settings) -> tuple[str, ...]:
    """The rerankers these settings can run, in registry order (what clients should offer)."""
    return tuple(name for name, spec in RERANKER_REGISTRY.items() if spec.available(settings))


def reranker_labels(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``name -> label`` for ``names`` (the console's option texts)."""
    return {name: RERANKER_REGISTRY[name].label for name in names}


def unavailable_requirements() -> str:
    """What the rerankers that may be unavailable need, for schema descriptions:
    ``cross-encoder needs GROUNDWORK_CROSS_ENCODER_PATH (a local CrossEncoder folder)``."""
    return "; ".join(f"{spec.name} needs {spec.needs}" for spec in RERANKER_REGISTRY.values() if spec.needs)
