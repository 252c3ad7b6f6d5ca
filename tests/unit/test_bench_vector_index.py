"""bench/vector_index.py without the optional LlamaIndex DuckDB store: the comparison is skipped, with the reason."""

from __future__ import annotations

import importlib.util
import tomllib

from tests.helpers import REPO_ROOT as ROOT

STORE_MODULE = "llama_index.vector_stores.duckdb"


def _load_bench():
    spec = importlib.util.spec_from_file_location("vector_index_bench", ROOT / "bench" / "vector_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vector_bench_skips_the_llamaindex_comparison_with_the_reason_when_the_package_is_absent(monkeypatch, capsys):
    bench = _load_bench()
    real_find_spec = importlib.util.find_spec

    def find_spec_without_the_store(name, *args, **kwargs):
        if name == STORE_MODULE:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec_without_the_store)
    assert bench.runnable_methods({"numpy", "vss", "llamaindex"}) == {"numpy", "vss"}
    printed = capsys.readouterr().out
    assert "skip llamaindex" in printed and "llama-index-vector-stores-duckdb is not installed" in printed
    assert ".[bench]" in printed


def test_vector_bench_keeps_the_llamaindex_comparison_when_the_package_is_there(monkeypatch):
    bench = _load_bench()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: object())
    assert bench.runnable_methods({"numpy", "llamaindex"}) == {"numpy", "llamaindex"}


def test_the_llamaindex_duckdb_store_is_pinned_and_read_only_by_the_export_and_the_bench():
    """The export (groundwork export --llamaindex) needs LlamaIndex's DuckDB vector store, so it is a pinned
    dependency; serving keeps its own reader, so nothing else in the library imports it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("llama-index-vector-stores-duckdb==") for dep in project["dependencies"])
    importers = sorted(
        path.relative_to(ROOT).as_posix()
        for folder in ("knowledge_store", "pipelines", "evals", "tests", "bench")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "test_bench_vector_index.py" and "llama_index.vector_stores" in path.read_text(encoding="utf-8")
    )
    assert importers == ["bench/vector_index.py", "knowledge_store/retrieval/llama_export.py",
                         "tests/integration/test_llamaindex_export.py"]
