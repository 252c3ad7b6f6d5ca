"""What each layer loads: a lower layer never pulls a higher one in (the import contracts, .importlinter, check
the code; these check the running import of the modules people start from)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HIGHER_THAN_STORAGE = ("knowledge_store.retrieval", "knowledge_store.learning", "knowledge_store.evaluation",
                       "knowledge_store.ingest", "knowledge_store.server", "knowledge_store.app")


def loaded_after(module: str) -> set[str]:
    """The knowledge_store and pipelines modules a fresh interpreter has loaded after ``import module``."""
    code = (f"import json, sys; import {module}; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('knowledge_store', 'pipelines')))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(run.stdout.strip().splitlines()[-1]))


def test_the_store_loads_no_retrieval_learning_or_evaluation():
    loaded = loaded_after("knowledge_store.storage.store")
    assert not {m for m in loaded if m.startswith(HIGHER_THAN_STORAGE)}, sorted(loaded)


def test_the_engine_loads_neither_learning_nor_evaluation_nor_the_dagster_project():
    loaded = loaded_after("knowledge_store.retrieval.engine")
    assert not {m for m in loaded if m.startswith(("knowledge_store.learning", "knowledge_store.evaluation",
                                                    "knowledge_store.server", "pipelines"))}, sorted(loaded)


@pytest.mark.parametrize("module", ["knowledge_store.cli", "knowledge_store.server.app"])
def test_front_ends_never_import_the_dagster_project(module):
    assert not {m for m in loaded_after(module) if m.startswith("pipelines")}
