"""``models.loading.ModelLoad``: a background load's state, step, estimate and error, without a model (the real
export and load run in tests/integration/test_serve_startup.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from knowledge_store.config.embedding_models import QUANTIZATION_RECIPES
from knowledge_store.core.errors import ModelLoadFailedError, ModelLoadingError
from knowledge_store.core.files import exclusive_lock
from knowledge_store.models.artifacts import fastest_alternating_ms
from knowledge_store.models.embeddings import OnnxEmbedder, report_step, step_seconds
from knowledge_store.models.loading import OVERDUE_RETRY_S, UNKNOWN_RETRY_S, ModelLoad
from tests.helpers import this_cpu_check

STEPS = [("exporting", 10.0), ("loading", 1.0)]


class SteppedModel:
    """An embedder whose load reports its steps and waits at each until the test lets it go on."""

    model_id, dim, torch_threads = "stepped", 4, 1

    def __init__(self, fail: Exception | None = None) -> None:
        self.on_phase = None
        self.loaded = False
        self.fail = fail
        self.gates = {step: threading.Event() for step, _ in STEPS}
        self.reached = {step: threading.Event() for step, _ in STEPS}
        self.loads = 0

    def load_steps(self):
        return [] if self.loaded else list(STEPS)

    def load(self):
        self.loads += 1
        for step, _ in STEPS:
            report_step(self, step)
            self.reached[step].set()
            assert self.gates[step].wait(10), f"the test never let {step} finish"
            if self.fail is not None and step == "exporting":
                raise self.fail
        self.loaded = True
        return self


def test_a_load_says_its_step_and_the_seconds_left_then_ready():
    model = SteppedModel()
    load = ModelLoad(model, name="stepped")
    assert load.status()["state"] == "not_loaded"
    assert load.status(pending=True) == {"state": "loading", "phase": "starting", "seconds": 0.0, "error": None,
                                         "retry_after_s": 11}  # a warm-up on its way: the whole estimate
    load.start_in_background()
    assert model.reached["exporting"].wait(10)
    exporting = load.status()
    assert (exporting["state"], exporting["phase"]) == ("loading", "exporting") and 10 <= exporting["retry_after_s"] <= 11
    error = load.not_ready()
    assert isinstance(error, ModelLoadingError) and error.phase == "exporting" and error.retry_after_s == exporting["retry_after_s"]
    assert "still loading (exporting" in str(error) and model.loads == 1  # no second load while one runs
    model.gates["exporting"].set()
    assert model.reached["loading"].wait(10)
    assert load.status()["phase"] == "loading" and load.status()["retry_after_s"] == 1
    model.gates["loading"].set()
    for _ in range(200):
        if load.status()["state"] == "ready":
            break
        threading.Event().wait(0.01)
    ready = load.status()
    assert ready["state"] == "ready" and ready["seconds"] is not None and ready["retry_after_s"] is None
    assert load.not_ready() is None


def test_waiting_for_another_builder_is_a_step_of_its_own_before_the_planned_ones():
    load = ModelLoad(SteppedModel(), name="stepped")
    load._steps, load._step = list(STEPS), 0  # as ``load`` plans them
    load._loading = True
    load._on_phase("waiting")  # another process holds the builder's lock
    assert load.status()["phase"] == "waiting" and load.status()["retry_after_s"] == 11  # the plan is all still left
    load._on_phase("exporting")
    assert load.status()["phase"] == "exporting"
    load._on_phase("loading")
    assert load.status()["phase"] == "loading" and [step for step, _ in load._steps] == ["waiting", *dict(STEPS)]


def test_an_exclusive_lock_held_elsewhere_says_so_before_it_waits(tmp_path):
    said = []
    path = tmp_path / ".lock"
    with exclusive_lock(path, threading.Lock(), on_wait=lambda: said.append("free")):
        pass
    assert said == []  # a free lock is taken without waiting
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with exclusive_lock(path, threading.Lock(), on_wait=lambda: said.append("waiting")):
            assert holder.wait(10) is not None  # taken only once the other process let go
    finally:
        holder.kill()
    assert said == ["waiting"]


HOLD_LOCK = """
import fcntl, sys, time
with open(sys.argv[1], "a") as handle:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(0.5)
"""


def test_a_failed_load_keeps_its_error_and_queries_are_told_it_without_a_new_load():
    model = SteppedModel(fail=OSError("weights unreadable"))
    model.gates["exporting"].set()
    load = ModelLoad(model, name="stepped")
    with pytest.raises(OSError):
        load.load()
    status = load.status()
    assert status["state"] == "failed" and status["error"] == "OSError: weights unreadable"
    error = load.not_ready()
    assert isinstance(error, ModelLoadFailedError) and error.reason == "OSError: weights unreadable"
    assert "could not be loaded: OSError: weights unreadable" in str(error) and model.loads == 1


def test_a_query_for_a_model_nobody_loads_starts_its_load_unless_a_warm_up_is_on_its_way():
    model = SteppedModel()
    load = ModelLoad(model, name="stepped")
    pending = load.not_ready(pending=True)
    assert isinstance(pending, ModelLoadingError) and pending.phase == "starting" and model.loads == 0
    started = load.not_ready()
    assert isinstance(started, ModelLoadingError) and model.reached["exporting"].wait(10) and model.loads == 1
    for gate in model.gates.values():
        gate.set()


def test_an_embedder_without_estimates_or_overdue_steps_gets_a_short_retry():
    class Plain:
        model_id, dim, torch_threads, loaded = "plain", 4, 1, False
        release = threading.Event()

        def load(self):
            assert self.release.wait(10)
            self.loaded = True

    plain = Plain()
    load = ModelLoad(plain)
    load.start_in_background()
    assert load.status()["retry_after_s"] == UNKNOWN_RETRY_S and load.status()["phase"] == "loading"
    plain.release.set()

    quick = SteppedModel()
    load = ModelLoad(quick)
    load._steps, load._step, load._step_started = [("loading", 0.0)], 0, 0.0  # an estimate long passed
    assert load._retry_after(now=100.0) == OVERDUE_RETRY_S


def test_step_estimates_follow_the_weights_and_the_files_left_to_make(tmp_path, model_path):
    folder = tmp_path / "model"
    folder.mkdir()
    with (folder / "model.safetensors").open("wb") as weights:
        weights.truncate(400_000_000)  # 400 MB, sparse
    assert step_seconds("exporting", folder) == pytest.approx(6.0 + 0.03 * 400, abs=0.1)
    assert step_seconds("quantising", folder) > step_seconds("loading", folder)

    int8 = OnnxEmbedder(model_path, tmp_path / "cache", quantization="int8")
    assert [step for step, _ in int8.load_steps()] == ["exporting", "quantising", "checking", "loading"]
    artifacts = int8.artifacts
    artifacts.folder.mkdir(parents=True)
    artifacts.fp32_path.write_bytes(b"")  # exported already: the int8 graph, its check and the session are left
    assert [step for step, _ in int8.load_steps()] == ["quantising", "checking", "loading"]
    artifacts.graph_path(QUANTIZATION_RECIPES["int8"]).write_bytes(b"")  # quantised, never checked on this CPU
    assert [step for step, _ in int8.load_steps()] == ["checking", "loading"]
    fp32 = OnnxEmbedder(model_path, tmp_path / "cache")
    assert [step for step, _ in fp32.load_steps()] == ["loading"]


def test_a_documents_check_recorded_without_batch_timings_is_run_again_a_queries_one_is_not(tmp_path, model_path):
    documents = OnnxEmbedder(model_path, tmp_path / "cache", quantization="int8")
    tag = QUANTIZATION_RECIPES["int8"]
    documents.artifacts.folder.mkdir(parents=True)
    documents.artifacts.fp32_path.write_bytes(b"")
    documents.artifacts.graph_path(tag).write_bytes(b"")
    record = this_cpu_check()
    documents.artifacts.record_fidelity(tag, record)  # as written before batches were timed
    assert [step for step, _ in documents.load_steps()] == ["checking", "loading"]
    assert documents.recorded_decision() is None  # status pages: not checked here yet, not the old verdict
    queries = OnnxEmbedder(model_path, tmp_path / "cache", quantization="int8", purpose="queries")
    assert [step for step, _ in queries.load_steps()] == ["loading"]
    record.batch_ms = {"fp32": 3.0, "quantised": 4.0}
    documents.artifacts.record_fidelity(tag, record)
    assert [step for step, _ in documents.load_steps()] == ["loading"]
    assert documents.recorded_decision().in_effect == "none"  # fp32 was faster in batches
    assert record.faster_for_documents() == "fp32" and record.faster_for_queries() == "quantised"


def test_the_faster_of_two_runs_is_timed_by_its_fastest_alternating_round():
    calls = []

    def run(name: str, seconds: float):
        return lambda: (calls.append(name), time.sleep(seconds))

    best = fastest_alternating_ms({"slow": run("slow", 0.02), "fast": run("fast", 0.005)}, 3)
    assert set(best) == {"slow", "fast"} and best["fast"] < best["slow"] and best["slow"] >= 20
    # one untimed call each, then rounds in alternating order
    assert calls == ["slow", "fast", "slow", "fast", "fast", "slow", "slow", "fast"]


def test_what_a_loading_embedder_runs_is_told_without_waiting_for_its_load(tmp_path, model_path):
    """A load holds the embedder's lock while it waits for another process's graph build; ``/health`` asks
    ``recorded_decision`` meanwhile and must answer at once."""
    embedder = OnnxEmbedder(model_path, tmp_path / "cache")
    held, release = threading.Event(), threading.Event()

    def loading():
        with embedder._lock:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=loading, daemon=True)
    thread.start()
    held.wait(10)
    answered: list = []
    asking = threading.Thread(target=lambda: answered.append(embedder.recorded_decision()), daemon=True)
    asking.start()
    asking.join(3)
    answered_while_loading = list(answered)
    release.set()
    thread.join(10)
    assert answered_while_loading, "recorded_decision waited for the load's lock"
    assert answered_while_loading[0].in_effect == "none" and answered_while_loading[0].reason == "fp32 asked for"
