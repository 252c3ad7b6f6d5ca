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
