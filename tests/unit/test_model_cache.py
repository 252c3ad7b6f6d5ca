"""``models.artifacts``: a model that will never serve leaves the per-user model cache."""

from __future__ import annotations

import json

from knowledge_store.models.artifacts import forget_model, model_cache_folder


def fake_model(folder, weights: bytes):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_forgetting_a_model_removes_its_graphs_and_fingerprint_and_nothing_else(tmp_path):
    cache = tmp_path / "cache"
    kept = fake_model(tmp_path / "base", b"base weights")
    declined = fake_model(tmp_path / "candidate", b"candidate weights")
    for model in (kept, declined):
        graphs = model_cache_folder(model, cache) / "onnxruntime-1.0"
        graphs.mkdir(parents=True)
        (graphs / "fp32.onnx").write_bytes(b"x" * 1000)
    kept_graphs, declined_graphs = model_cache_folder(kept, cache), model_cache_folder(declined, cache)
    assert kept_graphs != declined_graphs  # keyed by the weights' hash
    assert forget_model(declined, cache) == 1000
    assert not declined_graphs.exists()
    assert (kept_graphs / "onnxruntime-1.0" / "fp32.onnx").is_file()
    book = json.loads((cache / "fingerprints.json").read_text())
    assert str(kept.resolve()) in book and str(declined.resolve()) not in book
    assert declined.is_dir()  # the weights are the caller's: only the cache's copy goes


def test_forgetting_a_model_that_is_gone_or_never_cached_frees_nothing(tmp_path):
    cache = tmp_path / "cache"
    assert forget_model(tmp_path / "missing", cache) == 0
    assert forget_model(fake_model(tmp_path / "never", b"w"), cache) == 0


def test_graphs_of_fine_tuned_models_that_are_gone_are_pruned_once_old(tmp_path):
    import os
    import shutil

    from knowledge_store.models.artifacts import forget_orphans

    cache = tmp_path / "cache"
    base = fake_model(tmp_path / "base", b"base weights")
    alive = fake_model(tmp_path / "data" / "base-ft-alive", b"adopted weights")
    gone = fake_model(tmp_path / "deleted" / "base-ft-gone", b"weights of a deleted data dir")
    folders = {}
    for model in (base, alive, gone):
        folders[model.name] = model_cache_folder(model, cache)
        (folders[model.name] / "onnxruntime-1.0").mkdir(parents=True)
        (folders[model.name] / "onnxruntime-1.0" / "fp32.onnx").write_bytes(b"x" * 10)
    shutil.rmtree(tmp_path / "deleted")
    assert forget_orphans(cache) == 0  # too young: it may be a graph being built
    for folder in folders.values():
        os.utime(folder, (0, 0))
    assert forget_orphans(cache) == 10
    assert not folders["base-ft-gone"].exists()
    assert folders["base-ft-alive"].is_dir() and folders["base"].is_dir()
