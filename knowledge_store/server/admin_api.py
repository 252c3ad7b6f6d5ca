"""The console's administration routes: the corpus's ranking defaults and the evaluation summary.

- ``GET/PUT/DELETE /api/knowledge/ranking``: the corpus default alpha, fusion and reranker, stored in
  ``<index_dir>/tuned.json`` beside what ``groundwork tune`` chose (``knowledge_store.learning.tuning``), so the
  engine, the CLI and MCP read the same values on their next query, no restart.  Settings set explicitly
  (environment, ``.env``) still win; the answer says which values they pin.
- ``GET /api/evaluation/summary``: what the evaluation assets wrote (``knowledge_store.evaluation.results_store``), read-only.

The console's admin router (``router(models)``; its ``PUT`` body is the app's served ``RankingUpdate``,
which states the rerankers this server runs).  A refused ranking value (``InvalidRankingError``) is a 422
naming the field (``server/errors.py``).
"""

# no ``from __future__ import annotations``: FastAPI reads the parameter annotations as objects
from typing import Any

from fastapi import APIRouter

from knowledge_store.config.settings import Settings
from knowledge_store.evaluation.results_store import evaluation_summary as read_summary
from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.ranking_defaults import (
    RANKING_SETTINGS,
    builtin_ranking,
    effective_ranking,
    effective_reranker,
    ranking_sources,
    reranker_source,
)
from knowledge_store.retrieval.reranker_registry import RERANKER_REGISTRY, reranker_labels
from knowledge_store.server import api_models as out
from knowledge_store.server.request_models import RankingUpdate, RequestModels
from knowledge_store.server.state import State, with_body_model
from knowledge_store.storage.tuned import (
    InvalidRankingError,
    load_manual,
    load_tuned,
    reset_ranking,
    save_manual,
    tuned_path,
)


def ranking_settings(settings: Settings, index_dir, available: tuple[str, ...]) -> dict[str, Any]:
    """The three console-editable defaults as the server applies them, with their stored/tuned/built-in values."""
    builtin = builtin_ranking(settings)
    effective = effective_ranking(settings, index_dir)
    sources = {**ranking_sources(settings, index_dir), "reranker": reranker_source(settings, index_dir)}
    manual = load_manual(index_dir)
    tuned = load_tuned(index_dir)
    values = {
        "alpha": (effective.alpha, builtin.alpha, tuned.params.alpha if tuned else None),
        "fusion": (effective.fusion, builtin.fusion, tuned.params.fusion if tuned else None),
        "reranker": (effective_reranker(settings, index_dir), settings.default_reranker, None),
    }
    body: dict[str, Any] = {}
    notes: list[str] = []
    for name, (value, builtin_value, tuned_value) in values.items():
        stored = manual.values.get(name) if manual else None
        pinned = f"GROUNDWORK_{RANKING_SETTINGS[name].upper()}" if sources[name] == "setting" else None
        body[name] = {"effective": value, "source": sources[name], "stored": stored, "tuned": tuned_value,
                      "builtin": builtin_value, "pinned_by": pinned}
        if pinned and stored is not None and stored != value:
            notes.append(f"{name}: {pinned} is set ({value}); it wins over the value set here ({stored}), "
                         "which applies once the setting is removed")
        elif pinned:
            notes.append(f"{name}: pinned by {pinned} ({value}); a value set here applies once the setting is removed")
    if not settings.use_tuned_ranking:
        notes.append("GROUNDWORK_USE_TUNED_RANKING is false: the stored values (tuned and set here) are not used")
    if sources["reranker"] in ("console", "default") and values["reranker"][0] not in available:
        notes.append(f"reranker {values['reranker'][0]!r} cannot run on this server; queries that do not name a "
                     "reranker will report it as unavailable")
    return {**body, "fusion_modes": dict(FUSION_MODES), "rerankers": list(available),
            "reranker_labels": reranker_labels(available),
            "use_tuned_ranking": settings.use_tuned_ranking, "stored_in": str(tuned_path(index_dir)),
            "updated_at": manual.updated_at if manual else None, "notes": notes}


def ranking_get(state: State) -> dict[str, Any]:
    """The corpus default alpha, fusion and reranker: effective value, where it comes from (explicit setting >
    console > `groundwork tune` > built-in), the stored, tuned and built-in values, and what pins it."""
    return ranking_settings(state.engine.settings, state.engine.snapshots.index_dir, state.rerankers)


def ranking_put(body: RankingUpdate, state: State) -> dict[str, Any]:
    """Set (or, with null, forget) the corpus default alpha, fusion and reranker in ``tuned.json``; queries
    that do not set them use the new values from the next one on.  A reranker this server cannot run is 422."""
    changes = {name: getattr(body, name) for name in body.model_fields_set}
    reranker = changes.get("reranker")
    if reranker is not None and reranker not in state.rerankers:
        raise InvalidRankingError("reranker", reranker, f"this server cannot run it: "
                                  f"{RERANKER_REGISTRY[reranker].unavailable_reason()}; available: {', '.join(state.rerankers)}")
    index_dir = state.engine.snapshots.index_dir
    save_manual(index_dir, changes)
    return ranking_settings(state.engine.settings, index_dir, state.rerankers)


def ranking_reset(state: State) -> dict[str, Any]:
    """Back to the built-in defaults: forgets the console's values and the tuned choice (``groundwork tune
    --reset``); explicit settings still apply."""
    index_dir = state.engine.snapshots.index_dir
    reset_ranking(index_dir)
    return ranking_settings(state.engine.settings, index_dir, state.rerankers)


def evaluation_summary(state: State) -> dict[str, Any]:
    """The latest scorecard per dataset and configuration, the alpha sweeps, the helpful rate from thumbs and
    the drift of replayed queries, as the evaluation assets wrote them (``empty`` + ``hint`` before any run).
    503 while an evaluation run holds the results file for longer than 2 s."""
    return read_summary(state.settings.data_dir, state.engine.snapshots.index_dir)


def router(models: RequestModels) -> APIRouter:
    """The ranking-settings and evaluation-summary routes of one app (see the module docstring)."""
    routes = APIRouter()
    routes.add_api_route("/api/knowledge/ranking", ranking_get, methods=["GET"], tags=["knowledge"],
                         response_model=out.RankingSettings)
    routes.add_api_route("/api/knowledge/ranking", with_body_model(ranking_put, models.ranking_update),
                         methods=["PUT"], tags=["knowledge"], response_model=out.RankingSettings)
    routes.add_api_route("/api/knowledge/ranking", ranking_reset, methods=["DELETE"], tags=["knowledge"],
                         response_model=out.RankingSettings)
    routes.add_api_route("/api/evaluation/summary", evaluation_summary, methods=["GET"], tags=["evaluation"],
                         response_model=out.EvaluationSummary)
    return routes
