"""The console's administration routes: the corpus's ranking defaults and the evaluation summary.

- ``GET/PUT/DELETE /api/knowledge/ranking``: the corpus default alpha, fusion and reranker, stored in
  ``<index_dir>/tuned.json`` beside what ``groundwork tune`` chose (``knowledge_store.tuning``), so the
  engine, the CLI and MCP read the same values on their next query, no restart.  Settings set explicitly
  (environment, ``.env``) still win; the answer says which values they pin.
- ``GET /api/evaluation/summary``: what the evaluation assets wrote (``evals.results_store``), read-only.

Kept out of ``app.py`` so the routes, their request model and their error mapping read as one piece;
``create_app`` calls ``add_admin_routes`` once.
"""

# no ``from __future__ import annotations``: FastAPI must see the request model created in add_admin_routes
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, create_model, model_validator

from knowledge_store.retrieval.fusion import FUSION_MODES
from knowledge_store.retrieval.rerankers import RERANKERS
from knowledge_store.server import api_models as out
from knowledge_store.settings import Settings
from knowledge_store.tuning import (
    MANUAL_FIELDS,
    RANKING_SETTINGS,
    InvalidRankingError,
    builtin_ranking,
    load_manual,
    load_tuned,
    reset_ranking,
    save_manual,
    tuned_path,
)

FusionName = Literal[tuple(FUSION_MODES)]  # type: ignore[valid-type]


class RankingUpdate(BaseModel):
    """``PUT /api/knowledge/ranking``: the values to set; ``null`` forgets the console's value (back to the tuned
    or built-in one); absent = unchanged.  ``add_admin_routes`` narrows ``reranker`` to those this server runs."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    alpha: float | None = Field(None, ge=0.0, le=1.0, strict=True,
                                description="Corpus default alpha: 0 = pure BM25, 1 = pure vector.")
    fusion: FusionName | None = Field(None, description="Corpus default fusion: " + "; ".join(
        f"{k}: {v}" for k, v in FUSION_MODES.items()) + ".")
    reranker: Literal[RERANKERS] | None = None  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _something_to_change(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data:
            raise ValueError(f"nothing to change: send one or more of {', '.join(MANUAL_FIELDS)}")
        return data


def ranking_settings(settings: Settings, index_dir, available: tuple[str, ...]) -> dict[str, Any]:
    """The three console-editable defaults as the server applies them, with their stored/tuned/built-in values."""
    from knowledge_store.tuning import effective_ranking, effective_reranker, ranking_sources, reranker_source

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
            "use_tuned_ranking": settings.use_tuned_ranking, "stored_in": str(tuned_path(index_dir)),
            "updated_at": manual.updated_at if manual else None, "notes": notes}


def add_admin_routes(app: FastAPI, settings: Settings, engine, rerankers: tuple[str, ...]) -> None:
    """Register the ranking-settings and evaluation-summary routes on ``app`` (see the module docstring)."""
    served_update = create_model(
        "RankingUpdate", __base__=RankingUpdate,
        reranker=(Annotated[Literal[RERANKERS], WithJsonSchema({"type": "string", "enum": list(rerankers)})] | None,  # type: ignore[valid-type]
                  Field(None, description="Corpus default reranker; only the rerankers this server can run "
                                          "(GET /api/knowledge/config lists them).")),
    )

    def index_dir():
        return engine.snapshots.index_dir

    @app.exception_handler(InvalidRankingError)
    async def invalid_ranking(request: Request, exc: InvalidRankingError):
        return JSONResponse(status_code=422, content={"error": "validation_error", "message": str(exc),
                                                      "errors": [{"field": exc.field, "message": str(exc)}]})

    @app.get("/api/knowledge/ranking", tags=["knowledge"], response_model=out.RankingSettings)
    def ranking_get() -> dict[str, Any]:
        """The corpus default alpha, fusion and reranker: effective value, where it comes from (explicit setting >
        console > `groundwork tune` > built-in), the stored, tuned and built-in values, and what pins it."""
        return ranking_settings(engine.settings, index_dir(), rerankers)

    @app.put("/api/knowledge/ranking", tags=["knowledge"], response_model=out.RankingSettings)
    def ranking_put(body: served_update) -> dict[str, Any]:  # type: ignore[valid-type]
        """Set (or, with null, forget) the corpus default alpha, fusion and reranker in ``tuned.json``; queries
        that do not set them use the new values from the next one on.  A reranker this server cannot run is 422."""
        changes = {name: getattr(body, name) for name in body.model_fields_set}
        reranker = changes.get("reranker")
        if reranker is not None and reranker not in rerankers:
            raise InvalidRankingError("reranker", reranker, "this server cannot run it (cross-encoder needs "
                                                            "GROUNDWORK_CROSS_ENCODER_PATH); available: "
                                                            + ", ".join(rerankers))
        save_manual(index_dir(), changes)
        return ranking_settings(engine.settings, index_dir(), rerankers)

    @app.delete("/api/knowledge/ranking", tags=["knowledge"], response_model=out.RankingSettings)
    def ranking_reset() -> dict[str, Any]:
        """Back to the built-in defaults: forgets the console's values and the tuned choice (``groundwork tune
        --reset``); explicit settings still apply."""
        reset_ranking(index_dir())
        return ranking_settings(engine.settings, index_dir(), rerankers)

    @app.get("/api/evaluation/summary", tags=["evaluation"], response_model=out.EvaluationSummary)
    def evaluation_summary() -> dict[str, Any]:
        """The latest scorecard per dataset and configuration, the alpha sweeps, the helpful rate from thumbs and
        the drift of replayed queries, as the evaluation assets wrote them (``empty`` + ``hint`` before any run).
        503 while an evaluation run holds the results file for longer than 2 s."""
        from evals.results_store import evaluation_summary as read_summary

        return read_summary(settings.data_dir, index_dir())
