"""Which ranking a query gets when it does not say: explicit settings > the console > self-tuning > built-in.

Read per query (the file is re-read only when it changes, ``storage.tuned``): a value saved in the console or
chosen by ``groundwork tune`` applies from the next query on, in every process, without a restart.
"""

from __future__ import annotations

from pathlib import Path

from knowledge_store.storage.tuned import TUNED_FIELDS, ManualRanking, RankingParams, TunedConfig, load_both


def builtin_ranking(settings) -> RankingParams:
    return RankingParams(settings.default_alpha, settings.default_fusion, settings.section_weight, settings.lead_weight)


_RANKING_FIELDS = {"alpha": "default_alpha", "fusion": "default_fusion", "section_weight": "section_weight",
                   "lead_weight": "lead_weight"}
# the environment variable that pins each value (explicit settings win over the file)
RANKING_SETTINGS = {**_RANKING_FIELDS, "reranker": "default_reranker"}


def _source(settings, name: str, tuned: TunedConfig | None, manual: ManualRanking | None) -> str:
    """Where the effective value of ``name`` comes from: setting > console > tuned > default."""
    if RANKING_SETTINGS[name] in settings.model_fields_set:
        return "setting"
    if not settings.use_tuned_ranking:
        return "default"
    if manual is not None and name in manual.values:
        return "console"
    if tuned is not None and name in TUNED_FIELDS:
        return "tuned"
    return "default"


def effective_ranking(settings, index_dir: Path) -> RankingParams:
    """Explicit settings > values set in the console > the corpus's tuned choice > built-in defaults, field by field."""
    builtin = builtin_ranking(settings)
    tuned, manual = load_both(index_dir)
    values = {}
    for name in _RANKING_FIELDS:
        source = _source(settings, name, tuned, manual)
        values[name] = (manual.values[name] if source == "console" else
                        getattr(tuned.params, name) if source == "tuned" else getattr(builtin, name))
    return RankingParams(**values)


def ranking_sources(settings, index_dir: Path) -> dict[str, str]:
    """Where each effective ranking value came from: "setting", "console", "tuned" or "default"
    (``question_alpha`` included, see ``effective_question_alpha``)."""
    tuned, manual = load_both(index_dir)
    return {**{name: _source(settings, name, tuned, manual) for name in _RANKING_FIELDS},
            "question_alpha": _question_alpha(settings, tuned, manual)[1]}


def _question_alpha(settings, tuned: TunedConfig | None, manual: ManualRanking | None) -> tuple[float | None, str]:
    if "question_alpha" in settings.model_fields_set:
        return settings.question_alpha, "setting"
    alpha_source = _source(settings, "alpha", tuned, manual)
    if alpha_source in ("setting", "console"):  # a pinned alpha is meant for every query
        return None, alpha_source
    return settings.question_alpha, "default"


def effective_question_alpha(settings, index_dir: Path) -> float | None:
    """The alpha of question-form queries (``retrieval/query_form.py``) that do not set one; None = the
    effective alpha, as for every other query.  An explicit ``question_alpha`` setting wins; a pinned
    alpha (explicit setting or the console) applies to questions too; else the built-in ``question_alpha``,
    whatever alpha self-tuning chose (tuning's pseudo-queries are headings and titles, not questions)."""
    tuned, manual = load_both(index_dir)
    return _question_alpha(settings, tuned, manual)[0]



def effective_reranker(settings, index_dir: Path) -> str:
    """The reranker a query gets when it does not say: an explicit setting, else the one set in the console,
    else ``GROUNDWORK_DEFAULT_RERANKER``'s default (tuning does not choose a reranker)."""
    tuned, manual = load_both(index_dir)
    return manual.values["reranker"] if _source(settings, "reranker", tuned, manual) == "console" \
        else settings.default_reranker


def reranker_source(settings, index_dir: Path) -> str:
    """"setting", "console" or "default"."""
    tuned, manual = load_both(index_dir)
    return _source(settings, "reranker", tuned, manual)


