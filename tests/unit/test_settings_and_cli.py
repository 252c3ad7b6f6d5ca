"""Settings from the environment and their validation (the store, the embedders and the groundwork command:
tests/integration/test_settings_and_cli.py)."""

from __future__ import annotations

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError


def test_sources_are_colon_separated_in_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GROUNDWORK_SOURCES", f"{tmp_path}/a:{tmp_path}/b")
    monkeypatch.setenv("GROUNDWORK_CHUNK_SIZE_TOKENS", "150")
    settings = Settings()
    assert settings.sources == [tmp_path / "a", tmp_path / "b"]
    assert settings.chunk_size_tokens == 150


def test_default_corpus_is_the_sample_documents_only(tmp_path):
    """The first answers come from the sample corpus: this repository's docs/ are an optional source."""
    from knowledge_store.config.settings import PROJECT_ROOT

    settings = Settings(data_dir=tmp_path)
    assert settings.uses_default_corpus
    assert settings.source_dirs == [(tmp_path / "sample_corpus").resolve()]
    assert (PROJECT_ROOT / "docs").resolve() not in settings.source_dirs
    (tmp_path / "uploads").mkdir()
    assert settings.source_dirs == [(tmp_path / "sample_corpus").resolve(), (tmp_path / "uploads").resolve()]


def test_naming_the_sample_corpus_among_the_sources_still_writes_it(tmp_path):
    """`GROUNDWORK_SOURCES=data/sample_corpus:docs` on a fresh checkout: the named sample folder is generated."""
    from knowledge_store.ingest.run import ensure_default_corpus

    other = tmp_path / "docs"
    other.mkdir()
    settings = Settings(data_dir=tmp_path / "data", sources=[tmp_path / "data" / "sample_corpus", other])
    assert not settings.uses_default_corpus
    ensure_default_corpus(settings)
    assert (tmp_path / "data" / "sample_corpus" / "aurora-faq.md").is_file()
    elsewhere = Settings(data_dir=tmp_path / "elsewhere", sources=[other])
    ensure_default_corpus(elsewhere)
    assert not (tmp_path / "elsewhere" / "sample_corpus").exists()


def test_the_project_docs_scan_without_failures_as_an_optional_source(tmp_path):
    """docs/ can be added as a source (README): a data file added there (benchmark JSON, plots) must be ignored,
    not a failure."""
    from knowledge_store.config.settings import PROJECT_ROOT
    from knowledge_store.ingest.raw_documents import scan_sources

    scan = scan_sources(Settings(data_dir=tmp_path, sources=[PROJECT_ROOT / "docs"]))
    assert [(f.relative_path, f.reason) for f in scan.failures] == []
    assert any(f.relative_path == "EVALUATION.md" for f in scan.files)


@pytest.mark.parametrize(
    "field,value",
    [("chunk_max_tokens", 300), ("chunk_size_tokens", 254 + 1), ("chunk_overlap_tokens", 150)],
)
def test_impossible_chunk_settings_are_refused_naming_the_setting(field, value):
    with pytest.raises(Exception) as info:
        Settings(**{field: value})
    assert field in str(info.value)


def test_config_error_carries_setting_and_value():
    error = ConfigError("chunk_max_tokens", 300, "too big")
    assert error.setting == "chunk_max_tokens" and error.value == 300


def test_an_embedding_dim_below_one_is_refused_naming_the_setting():
    with pytest.raises(Exception) as info:
        Settings(embedding_dim=0)
    assert "embedding_dim" in str(info.value)


def test_evaluation_datasets_come_from_settings_and_missing_folders_are_skipped(monkeypatch, tmp_path):
    from pipelines.evaluation import EvaluationResource

    present, missing = tmp_path / "mine", tmp_path / "gone"
    present.mkdir()
    monkeypatch.setenv("GROUNDWORK_EVAL_DATASETS", f"{present}:{missing}")
    assert Settings().eval_datasets == [present, missing]
    assert EvaluationResource().folders() == [present]
    assert EvaluationResource(datasets=[str(missing)]).folders() == [missing]  # named on the resource: as given
    monkeypatch.delenv("GROUNDWORK_EVAL_DATASETS")
    assert Settings(_env_file=None).eval_datasets[0].parts[-3:] == ("shared", "datasets", "scifact")
