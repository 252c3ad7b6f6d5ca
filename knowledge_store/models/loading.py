"""Loading an embedding model in the background, watched: what the load is doing, for how long, until when.

A server binds its port before its query model is ready (``RetrievalEngine.warm_up_in_background``).  On a fresh
data folder the first load also exports the model to ONNX and quantises it (about 40 s for all-mpnet-base-v2 on
two cores, more on a busy machine).  ``ModelLoad`` runs that load and says, at any moment, its ``state``
(not_loaded, loading, ready, failed), the step it is in (``phase``: exporting, quantising, loading, as the
embedder reports them), the seconds so far and ``retry_after_s``, an estimate of the seconds left from the
embedder's own step estimates (``load_steps``).  It keeps the error of a failed load.  Queries read it instead of
waiting for the load (``not_ready``: ``ModelLoadingError`` or ``ModelLoadFailedError``), and so do ``/health``
and, through it, the console.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from knowledge_store.core.errors import GroundworkError, ModelLoadFailedError, ModelLoadingError

log = logging.getLogger(__name__)

# the wait a client is told when the load has no estimate (an embedder that does not say its steps), and when it
# has taken longer than estimated (it should end any moment; a busy machine is slower than the estimates)
UNKNOWN_RETRY_S = 5
OVERDUE_RETRY_S = 2
# what each step means, for reasons people read ("starting": a warm-up on its way to the load, reading the index
# that says which model it needs)
PHASE_TEXT = {"starting": "starting", "waiting": "waiting for another process that is building its graphs",
              "exporting": "exporting it to ONNX (once per model)",
              "quantising": "quantising it to int8 (once per model)", "loading": "loading it"}


class ModelLoad:
    """The load of one query embedding model, recorded (see the module docstring).

    ``model`` is the embedder that does the work (an ``OnnxEmbedder`` or ``Embedder`` reports its steps through
    ``on_phase`` and estimates them with ``load_steps``; any other embedder is loaded without either);
    ``target`` is what is loaded and asked whether it is (the engine's wrapped embedder, default ``model``)."""

    def __init__(self, model: Any, target: Any = None, name: str | None = None) -> None:
        self.model = model
        self.target = model if target is None else target
        self.name = name or str(getattr(model, "model_id", "the embedding model"))
        self._serial = threading.Lock()  # one load at a time
        self._lock = threading.Lock()  # the recorded state
        self._queued = False  # a background load was started and has not finished
        self._loading = False
        self._started: float | None = None
        self._seconds: float | None = None  # of the last finished attempt
        self._error: BaseException | None = None
        self._steps: list[tuple[str, float]] = []
        self._step = 0  # index into _steps of the step running now
        self._step_started: float | None = None
        if hasattr(model, "on_phase"):
            model.on_phase = self._on_phase

    @property
    def loaded(self) -> bool:
        return bool(getattr(self.target, "loaded", True))

    def load(self) -> None:
        """Load now, blocking, and record how it went; a second caller waits for the first and returns when the
        model is loaded (or tries again when that load failed).  Re-raises the load's error."""
        with self._serial:
            if self.loaded:
                return
            estimate = getattr(self.model, "load_steps", None)
            steps = list(estimate()) if callable(estimate) else []
            with self._lock:
                self._loading, self._error = True, None
                self._started = self._step_started = time.monotonic()
                self._steps, self._step = steps, 0
            expected = sum(seconds for _, seconds in steps)
            log.info("loading the embedding model %s: %s%s", self.name,
                     ", ".join(step for step, _ in steps) or "loading",
                     f" (about {expected:.0f} s)" if steps else "")
            try:
                loader = getattr(self.target, "load", None)
                if callable(loader):
                    loader()
            except BaseException as error:
                with self._lock:
                    self._loading, self._error = False, error
                    self._seconds = time.monotonic() - self._started
                log.warning("the embedding model %s could not be loaded (after %.1f s): %s: %s", self.name,
                            self._seconds, type(error).__name__, error)
                raise
            with self._lock:
                self._loading = False
                self._seconds = time.monotonic() - self._started
            log.info("the embedding model %s is ready (loaded in %.1f s)", self.name, self._seconds)

    def start_in_background(self) -> None:
        """``load`` in a daemon thread unless the model is loaded or a load is on its way (its error is recorded)."""
        with self._lock:
            if self._queued or self._loading or self.loaded:
                return
            self._queued, self._error, self._steps = True, None, []
            self._started = self._step_started = time.monotonic()
        threading.Thread(target=self._load_quietly, daemon=True, name="model-load").start()

    def _load_quietly(self) -> None:
        try:
            self.load()
        except BaseException:  # noqa: BLE001 - recorded by load: status() and not_ready() say it
            pass
        finally:
            with self._lock:
                self._queued = False

    def _on_phase(self, phase: str) -> None:
        with self._lock:
            later = [i for i in range(self._step, len(self._steps)) if self._steps[i][0] == phase]
            if phase == "waiting":  # before the planned step it holds up: that one has not started
                self._steps.insert(self._step, (phase, 0.0))
            elif later:
                self._step = later[0]
            else:  # a step the estimate did not plan (an embedder without estimates): no time of its own
                self._step = self._step + 1 if self._steps else 0
                self._steps.insert(self._step, (phase, 0.0))
            self._step_started = time.monotonic()
        log.info("the embedding model %s: %s", self.name, PHASE_TEXT.get(phase, phase))

    def status(self, pending: bool = False) -> dict[str, Any]:
        """``state`` (not_loaded | loading | ready | failed), ``phase`` (while loading: starting | waiting |
        exporting | quantising | checking | loading), ``seconds`` (so far while loading; of the last attempt otherwise), ``retry_after_s``
        (while loading: the estimated seconds left, at least 1) and ``error`` (of a failed load, ``Type: message``).
        ``pending``: a warm-up is on its way to this load (not started yet: loading, phase starting)."""
        loaded = self.loaded
        with self._lock:
            now = time.monotonic()
            if pending and not loaded and not (self._loading or self._queued):
                return {"state": "loading", "phase": "starting", "seconds": 0.0, "error": None,
                        "retry_after_s": self._expected()}
            loading = not loaded and (self._loading or self._queued)
            if loaded:
                state = "ready"
            elif loading:
                state = "loading"
            else:
                state = "failed" if self._error is not None else "not_loaded"
            seconds = now - self._started if loading and self._started is not None else self._seconds
            phase = retry = None
            if loading:
                phase = self._steps[self._step][0] if self._steps else "loading"
                retry = self._retry_after(now)
            error = self._error if state == "failed" else None
        return {"state": state, "phase": phase, "seconds": None if seconds is None else round(seconds, 1),
                "retry_after_s": retry, "error": None if error is None else f"{type(error).__name__}: {error}"}

    def _retry_after(self, now: float) -> int:
        """Seconds until the load should be done: what is left of this step's estimate plus the later steps'."""
        if not self._steps or self._step_started is None:
            return UNKNOWN_RETRY_S
        left = max(0.0, self._steps[self._step][1] - (now - self._step_started))
        left += sum(seconds for _, seconds in self._steps[self._step + 1:])
        return max(1, math.ceil(left)) if left > 0 else OVERDUE_RETRY_S

    def _expected(self) -> int:
        """The estimated seconds of a whole load not started yet."""
        estimate = getattr(self.model, "load_steps", None)
        steps = list(estimate()) if callable(estimate) else []
        return max(1, math.ceil(sum(seconds for _, seconds in steps))) if steps else UNKNOWN_RETRY_S

    def not_ready(self, pending: bool = False) -> GroundworkError | None:
        """The error a query that needs this model gets while it is not loaded (None once it is):
        ``ModelLoadFailedError`` when the last load failed, else ``ModelLoadingError``; a load is started in the
        background when none runs and no warm-up is on its way to it (``pending``)."""
        status = self.status(pending)
        if status["state"] == "not_loaded":
            self.start_in_background()
            status = self.status()
        if status["state"] == "ready":
            return None
        if status["state"] == "failed":
            return ModelLoadFailedError(self.name, status["error"])
        return ModelLoadingError(self.name, status["phase"] or "loading", status["seconds"] or 0.0,
                                 status["retry_after_s"] or UNKNOWN_RETRY_S)
