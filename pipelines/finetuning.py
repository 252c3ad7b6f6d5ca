"""Per-corpus fine-tuning of the embedding model, in the background: the asset, its check and the sensor.

``finetuned_embedder`` runs ``knowledge_store.learning.finetune.finetune_corpus`` on the published index:
label-free training pairs, contrastive training within ``GROUNDWORK_FINETUNE_BUDGET_S``, the corpus
re-embedded with the candidate, and the paired decision on held-out pseudo-queries.  An adopted model is
published as a new snapshot (the current one serves until then); a declined one leaves nothing but the
recorded decision.  Its metadata tells the story: pairs per kind, steps, loss, pairs/s, the held-out
figures before and after, gain and standard error, seconds per stage.

``corpus_changed_for_finetuning`` (on by default; off with ``GROUNDWORK_FINETUNE_EMBEDDER=false``) requests a
run when ``GROUNDWORK_FINETUNE_CHANGE_SHARE`` of the served chunk texts are new since the last decision, or
when none was made yet.  The run shares the ingestion runs' concurrency tag: the store has one writer, and
a sync queued behind it publishes with whatever model serves when it starts.
"""

import dagster as dg

from knowledge_store.core.errors import GroundworkError
from knowledge_store.learning.finetune import corpus_change, finetune_corpus
from knowledge_store.models.serving import serving_model_id
from knowledge_store.storage.index import read_pointer
from pipelines.ingestion import search_index
from pipelines.metadata import markdown_table
from pipelines.resources import RetrievalResource

GROUP = "finetuning"
FINETUNE_JOB_NAME = "finetune"


class FinetuneConfig(dg.Config):
    budget_s: float | None = None  # training seconds; default GROUNDWORK_FINETUNE_BUDGET_S
    force: bool = False  # train and decide again even when these pairs were decided before


@dg.asset(
    group_name=GROUP, deps=[search_index], kinds={"torch"},
    description="The embedding model fine-tuned on this corpus's own headings, titles, first sentences, link texts "
                "and thumbs-up, served (a new snapshot) only when held-out pseudo-queries rank clearly better; "
                "decision in index/embedder.json.",
)
def finetuned_embedder(context: dg.AssetExecutionContext, config: FinetuneConfig,
                       retrieval: RetrievalResource) -> dg.MaterializeResult:
    settings = retrieval.settings()
    try:
        decision = finetune_corpus(settings, budget_s=config.budget_s, force=config.force, log=context.log.info)
    except GroundworkError as error:  # no index yet, a store that cannot be read: the run fails with the reason
        raise dg.Failure(description=f"cannot fine-tune for {settings.data_dir}: {error}", allow_retries=False) from error
    (context.log.info if decision.decision == "adopted" else context.log.warning)(decision.reason)
    training = decision.training or {}
    rows = [{"model": decision.served_model_id, **decision.before}] if decision.before else []
    if decision.after:
        rows.append({"model": str(decision.candidate_model_id), **decision.after})
    return dg.MaterializeResult(metadata={
        "decision": decision.decision,
        "reason": decision.reason,
        "progress": (f"{training.get('steps', 0)}/{training.get('planned_steps', 0)} training steps, "
                     f"{training.get('trained_pairs', 0)} of {decision.pairs} pairs "
                     f"({training.get('stopped_by') or 'not trained'})"),
        "peak_rss_mb": float(decision.peak_rss_mb or 0.0),
        "memory_plan": dg.MetadataValue.json({k: (training.get("recipe") or {}).get(k) for k in (
            "batch_size", "mini_batch_size", "gradient_checkpointing", "hard_negatives")}),
        # the plan's estimate against the process: resident when planned, estimated peak, peak after training (MB)
        "memory_mb": dg.MetadataValue.json(decision.memory),
        "detectable_gain": float(decision.detectable_gain or 0.0),
        "gain": float(decision.gain or 0.0),
        "standard_error": float(decision.standard_error or 0.0),
        "gain_required": float(decision.required or 0.0),
        "pairs": decision.pairs,
        "pairs_by_kind": markdown_table([{"kind": k, "pairs": v} for k, v in decision.pair_kinds.items()]),
        "held_out_queries": decision.held_out,
        "held_out_from_thumbs_up": decision.held_out_feedback,
        "held_out_figures": markdown_table(rows),
        "training_steps": int(training.get("steps", 0)),
        "training_stopped_by": str(training.get("stopped_by", "")),
        "loss_first": float(training.get("loss_first") or 0.0),
        "loss_last": float(training.get("loss_last") or 0.0),
        "pairs_per_s": float(training.get("pairs_per_s") or 0.0),
        "served_model_id": decision.served_model_id,
        "candidate_model_id": str(decision.candidate_model_id or ""),
        "snapshot_version": int(decision.snapshot_version or 0),
        "seconds_by_stage": dg.MetadataValue.json(decision.seconds_by_stage),
        "duration_s": float(decision.seconds),
    })


@dg.asset_check(asset=finetuned_embedder, description="The served snapshot's vectors come from the model embedder.json "
                                                      "says serves (an adopted one, or the base model).")
def served_snapshot_uses_the_serving_model(retrieval: RetrievalResource) -> dg.AssetCheckResult:
    settings = retrieval.settings()
    try:
        served = read_pointer(settings.index_dir).model_id
    except GroundworkError as error:
        return dg.AssetCheckResult(passed=False, metadata={"reason": str(error)})
    expected = serving_model_id(settings)
    return dg.AssetCheckResult(passed=served == expected, severity=dg.AssetCheckSeverity.WARN,
                               metadata={"served": served, "serving_model": expected})


def build_finetune_sensor(job) -> dg.SensorDefinition:
    @dg.sensor(
        name="corpus_changed_for_finetuning",
        job=job,
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests a fine-tuning run when GROUNDWORK_FINETUNE_CHANGE_SHARE of the served chunk texts are new "
                    "since the last decision (or none was made yet); GROUNDWORK_FINETUNE_EMBEDDER=false stops it.",
    )
    def corpus_changed_for_finetuning(context: dg.SensorEvaluationContext, retrieval: RetrievalResource):
        settings = retrieval.settings()
        if not settings.finetune_embedder:
            return dg.SkipReason("GROUNDWORK_FINETUNE_EMBEDDER is false: the base model serves")
        try:
            version = read_pointer(settings.index_dir).snapshot_version
            share, total, why = corpus_change(settings)
        except Exception as error:  # noqa: BLE001 - no index yet, the store busy: look again next tick, say why
            return dg.SkipReason(f"cannot read {settings.data_dir} now: {error}")
        if share < settings.finetune_change_share:
            return dg.SkipReason(f"{why}: {share:.0%} < {settings.finetune_change_share:.0%}")
        return dg.RunRequest(run_key=f"finetune-{version}", tags={"groundwork/trigger": "corpus-changed",
                                                                 "groundwork/change": f"{share:.3f}"})

    return corpus_changed_for_finetuning


FINETUNING_ASSETS = [finetuned_embedder]
FINETUNING_CHECKS = [served_snapshot_uses_the_serving_model]
