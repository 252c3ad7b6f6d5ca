"""The embedding-model registry and what settings derive from it, without loading a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knowledge_store.config.embedding_models import EMBEDDER_REGISTRY, EMBEDDING_MODELS, model_facts, resolve_model
from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError
from knowledge_store.models.embeddings import document_model_id, model_id_for, with_prefix


def st_folder(path: Path, dim: int = 16, window: int = 128) -> Path:
    (path / "1_Pooling").mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": dim}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": window}))
    return path


def test_the_vocabulary_lists_the_registry():
    assert list(EMBEDDING_MODELS) == ["minilm", "mpnet"]
    assert EMBEDDER_REGISTRY["mpnet"].dim == 768 and EMBEDDER_REGISTRY["mpnet"].max_tokens == 384
    assert "all-mpnet-base-v2" in EMBEDDING_MODELS["mpnet"]


def test_mpnet_is_the_default_and_the_suite_runs_minilm_whose_window_sets_the_chunk_cap(tmp_path):
    assert Settings.model_fields["embedding_model"].default == "mpnet"
    settings = Settings(data_dir=tmp_path)  # tests/conftest.py: GROUNDWORK_EMBEDDING_MODEL=minilm
    assert settings.embedding_model == "minilm" and settings.embedding_dim == 384 and settings.chunk_max_tokens == 254
    assert settings.embedding_query_prefix == "" and settings.embedding_passage_prefix == ""
    assert model_facts(settings.model_path).max_tokens == 256


def test_a_folder_given_as_the_model_brings_its_own_width_window_and_prefixes(tmp_path):
    folder = st_folder(tmp_path / "e5-like", dim=16, window=128)
    settings = Settings(data_dir=tmp_path / "d", embedding_model=str(folder), embedding_query_prefix="query: ",
                        embedding_passage_prefix="passage: ", chunk_size_tokens=100, chunk_overlap_tokens=16,
                        header_max_tokens=20)
    assert settings.model_path == folder.resolve() and settings.embedding_dim == 16 and settings.chunk_max_tokens == 126
    assert (settings.embedding_query_prefix, settings.embedding_passage_prefix) == ("query: ", "passage: ")
    # vectors of texts embedded behind a prefix have their own id: never taken for plain ones
    plain = document_model_id(folder)
    prefixed = document_model_id(folder, "none", 0.0, "passage: ")
    assert prefixed != plain and prefixed == with_prefix(model_id_for(folder), "passage: ")
    assert document_model_id(folder, "none", 0.5, "passage: ").endswith("+bare0.5")


def test_an_unknown_model_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(ConfigError, match="embedding_model='no-such-model'.*minilm, mpnet"):
        Settings(data_dir=tmp_path, embedding_model="no-such-model")
    with pytest.raises(ConfigError, match="chunk_max_tokens"):
        Settings(data_dir=tmp_path, chunk_max_tokens=300)  # beyond minilm's 254


def test_a_folder_without_a_pooling_config_needs_its_width(tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="GROUNDWORK_EMBEDDING_DIM"):
        Settings(data_dir=tmp_path / "d", embedding_model=str(folder))
    assert Settings(data_dir=tmp_path / "d", embedding_model=str(folder), embedding_dim=32).embedding_dim == 32
    assert resolve_model(str(folder)).dim is None


def test_a_models_entry_says_how_it_runs_unless_the_settings_do(tmp_path, monkeypatch):
    from dataclasses import replace

    folder = st_folder(tmp_path / "mpnet-like", dim=768, window=384)
    monkeypatch.setitem(EMBEDDER_REGISTRY, "mpnet", replace(EMBEDDER_REGISTRY["mpnet"], locate=lambda: folder))
    mpnet = Settings(data_dir=tmp_path, embedding_model="mpnet")
    assert (mpnet.document_quantization, mpnet.query_quantization, mpnet.sentence_encoding) == ("int8", "int8-smooth", "in_context")
    assert mpnet.in_context_sentences
    assert not Settings(data_dir=tmp_path, embedding_model="mpnet", sentence_vectors=False).in_context_sentences
    minilm = Settings(data_dir=tmp_path)
    assert (minilm.document_quantization, minilm.query_quantization, minilm.sentence_encoding) == ("none", "none", "separate")
    # what the settings say wins; the torch encoders run fp32 with separate sentences
    mine = Settings(data_dir=tmp_path, embedding_model="mpnet", document_quantization="none", sentence_encoding="separate")
    assert (mine.document_quantization, mine.query_quantization, mine.sentence_encoding) == ("none", "int8-smooth", "separate")
    torch = Settings(data_dir=tmp_path, embedding_model="mpnet", document_encoder="torch", query_encoder="torch")
    assert (torch.document_quantization, torch.query_quantization, torch.sentence_encoding) == ("none", "none", "separate")
    with pytest.raises(ConfigError, match="sentence_encoding='in_context'"):
        Settings(data_dir=tmp_path, embedding_model="mpnet", document_encoder="torch", sentence_encoding="in_context")
    folder_settings = Settings(data_dir=tmp_path / "d", embedding_model=str(folder))
    assert (folder_settings.document_quantization, folder_settings.sentence_encoding) == ("none", "separate")
