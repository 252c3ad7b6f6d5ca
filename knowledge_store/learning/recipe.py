"""How fine-tuning turns training pairs into a loss, and how much memory that takes.

``ContrastiveRecipe`` is the loss and its optimiser settings as one object: in-batch negatives
(each query's own target against the other targets - and hard negatives - of its batch, scale 20),
computed with gradient caching (sentence-transformers' ``CachedMultipleNegativesRankingLoss``): the
batch is embedded once without gradients, the loss's gradient with respect to the embeddings is
cached, and the batch is embedded again in mini-batches with gradients.  The effective batch (the
negatives each query sees) no longer sets the memory: the mini-batch does, and with gradient
checkpointing a mini-batch keeps only each layer's input for the backward pass.  The result is the
same for any mini-batch size and with or without checkpointing (the dropout masks are replayed), so
neither is part of the recipe's identity (``identity``): a model trained with mini-batches of 8 is
the model trained with 32.

``training_memory_bytes`` estimates the peak resident memory of a process that trains with a recipe: what the
process already holds, measured, plus what training adds (``training_added_bytes``); ``fit_memory`` picks the
fastest mini-batch and checkpointing that fit a memory budget (None: nothing fits).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

# The estimate's constants, fitted to peak RSS measured with /usr/bin/time -v on runs of
# `groundwork adapt --embedder` (docs/EVALUATION.md, "Fine-tuning within a laptop's memory").
FLOATS_PER_TOKEN_AND_UNIT = 30  # activations a layer keeps per token and hidden unit for its backward pass
ATTENTION_MAPS = 3  # per head: scores, softmax and dropout mask, tokens x tokens each
STATE_BYTES_PER_WEIGHT_BYTE = 4  # fp32 weights, their gradients and AdamW's two moments
# what training adds besides its weights, their state and the activations: torch and sentence-transformers
# imported, the model's loading, the tokenizer and the allocator's slack (fitted to mpnet's whole runs with
# mini-batches of 2, 4 and 8: 665-710 MB, rounded up)
RUNTIME_BYTES = 768 * 2**20
# the resident memory assumed for the process that trains where the platform does not say: a conservative stand-in
# (a process training on ~800 chunks held 271 MB without the served query encoder, 1.2 GB with it)
DEFAULT_RESIDENT_BYTES = 1_250 * 2**20
# with checkpointing a sequence keeps each layer's input, and the backward pass holds about three layers' worth
# of activations at once (the recomputed layer, its gradients and the layer above's): fitted to mpnet's 5.35 GB
# peak with mini-batches of 32 (estimate before the fit, one layer: 3.6 GB)
CHECKPOINTED_LAYERS_HELD = 3

# (mini-batch, gradient checkpointing), fastest first: a larger mini-batch uses the cores better, and checkpointing
# runs each layer's forward pass a second time, which costs more than small mini-batches do (each mini-batch is
# padded only to its own longest text, so small ones also waste less on padding).  Checkpointed plans are the
# fallback for budgets below the smallest plain one.
MEMORY_PLANS = ((32, False), (16, False), (8, False), (4, False), (2, False), (8, True), (4, True), (2, True))


@dataclass(frozen=True)
class ContrastiveRecipe:
    """The loss fine-tuning trains with and its optimiser settings (see the module docstring)."""

    batch_size: int = 32  # the effective batch: each query is scored against this many targets (and negatives)
    scale: float = 20.0
    # training texts cut at this many word-pieces (the served model still reads its full window): a step at 128
    # costs about two thirds of one at 192, so a time budget trains more pairs, and a pair's first 128
    # word-pieces kept the gain per pair in the runs measured (docs/EVALUATION.md)
    max_tokens: int = 128
    learning_rate: float = 2e-5
    warmup: float = 0.1
    epochs: int = 1
    seed: int = 13
    hard_negatives: int = 0  # mined negatives per pair (learning.pairs.mine_hard_negatives); 0: in-batch only
    # memory only: the result does not depend on them (``identity``)
    mini_batch_size: int = 32
    gradient_checkpointing: bool = False

    @property
    def loss(self) -> str:
        return "CachedMultipleNegativesRankingLoss"

    def identity(self) -> dict[str, Any]:
        """What makes a model trained with this recipe what it is (the training hash): not the memory plan."""
        return {k: v for k, v in asdict(self).items() if k not in ("mini_batch_size", "gradient_checkpointing")} | {
            "loss": self.loss
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"loss": self.loss}

    def build_loss(self, model: Any) -> Any:
        """The loss module for ``model`` (a SentenceTransformer), its mini-batch and checkpointing applied
        (``release_checkpointing`` undoes the latter before the model is saved)."""
        from sentence_transformers.sentence_transformer.losses import (  # noqa: PLC0415 - only training needs it
            CachedMultipleNegativesRankingLoss,
        )

        if self.gradient_checkpointing:
            checkpoint_layers(model[0].auto_model)
        return CachedMultipleNegativesRankingLoss(model, scale=self.scale, mini_batch_size=self.mini_batch_size)


def checkpoint_layers(auto_model: Any) -> None:
    """Gradient checkpointing: each encoder layer keeps only its input for the backward pass and runs again
    there.  transformers' own switch where the model has one; MPNet has none, so its encoder layers are wrapped
    in ``torch.utils.checkpoint`` here (the dropout masks replayed: the same gradients)."""
    try:
        auto_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    except ValueError:  # "... does not support activation checkpointing"
        pass
    from torch.utils.checkpoint import checkpoint  # noqa: PLC0415 - only training needs torch

    for layer in auto_model.encoder.layer:
        layer.forward = partial(checkpoint, layer.forward, use_reentrant=False)


def release_checkpointing(auto_model: Any) -> None:
    """Undo ``checkpoint_layers``."""
    enabled = getattr(auto_model, "is_activation_checkpointing", None)  # transformers' newer name
    if enabled if enabled is not None else getattr(auto_model, "is_gradient_checkpointing", False):
        auto_model.gradient_checkpointing_disable()
    for layer in getattr(getattr(auto_model, "encoder", None), "layer", []):
        layer.__dict__.pop("forward", None)


def _model_shape(model_path: Path) -> tuple[int, int, int, int]:
    """(layers, hidden units, attention heads, bytes of fp32 weights) of a sentence-transformers folder."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    weights = sum(f.stat().st_size for f in Path(model_path).glob("*.safetensors")) or sum(
        f.stat().st_size for f in Path(model_path).glob("pytorch_model*.bin")
    )
    return (int(config["num_hidden_layers"]), int(config["hidden_size"]), int(config["num_attention_heads"]), weights)


def training_added_bytes(model_path: Path, recipe: ContrastiveRecipe) -> int:
    """About what training ``model_path`` with ``recipe`` adds to the resident memory of the process that runs it:
    the runtime (``RUNTIME_BYTES``), the weights with their gradients and AdamW's moments, and the activations one
    mini-batch keeps for its backward pass (per layer and sequence ~30 floats per token and hidden unit plus three
    attention maps per head; with checkpointing, each layer's input and ``CHECKPOINTED_LAYERS_HELD`` layers'
    activations).  The effective batch adds only its embeddings (a few MB)."""
    layers, hidden, heads, weights = _model_shape(model_path)
    tokens = recipe.max_tokens
    layer = (tokens * hidden * FLOATS_PER_TOKEN_AND_UNIT + heads * tokens * tokens * ATTENTION_MAPS) * 4
    per_sequence = (
        layers * tokens * hidden * 4 + CHECKPOINTED_LAYERS_HELD * layer
        if recipe.gradient_checkpointing
        else layers * layer
    )
    return RUNTIME_BYTES + STATE_BYTES_PER_WEIGHT_BYTE * weights + recipe.mini_batch_size * per_sequence


def training_memory_bytes(model_path: Path, recipe: ContrastiveRecipe, resident_bytes: int | None = None) -> int:
    """About the peak resident memory of a process holding ``resident_bytes`` (what it has loaded: the snapshot,
    the served query encoder, the pairs; ``DEFAULT_RESIDENT_BYTES`` when unknown) once it trains ``model_path``
    with ``recipe``.  The process's own part grows with the corpus, so it is measured, not assumed."""
    resident = DEFAULT_RESIDENT_BYTES if resident_bytes is None else resident_bytes
    return resident + training_added_bytes(model_path, recipe)


def memory_plans(recipe: ContrastiveRecipe) -> list[ContrastiveRecipe]:
    """``recipe`` with each memory plan of ``MEMORY_PLANS`` in its order, mini-batches no larger than the batch."""
    return [replace(recipe, mini_batch_size=mini_batch, gradient_checkpointing=checkpointing)
            for mini_batch, checkpointing in MEMORY_PLANS if mini_batch <= recipe.batch_size]


def fit_memory(model_path: Path, recipe: ContrastiveRecipe, budget_bytes: float, resident_bytes: int | None = None,
               free_bytes: int | None = None) -> ContrastiveRecipe | None:
    """``recipe`` with the fastest memory plan (``memory_plans``) whose estimated peak (``training_memory_bytes``)
    fits ``budget_bytes`` and whose addition fits ``free_bytes`` (what the machine can still allocate; None: not
    known); None when even the smallest does not."""
    return next((plan for plan in memory_plans(recipe)
                 if training_memory_bytes(model_path, plan, resident_bytes) <= budget_bytes
                 and (free_bytes is None or training_added_bytes(model_path, plan) <= free_bytes)), None)


def smallest_plan(model_path: Path, recipe: ContrastiveRecipe) -> ContrastiveRecipe:
    """``recipe`` with the memory plan whose estimate is the smallest (what a decline for memory quotes)."""
    return min(memory_plans(recipe), key=lambda plan: training_added_bytes(model_path, plan))
