"""Calibrated fusion on a store of two documents that share a paragraph: min-max normalisation makes a cosine
difference below noise worth the whole vector weight, so the document holding the query's rare words can lose under
``weighted``; under ``calibrated`` it wins (``fusion.noise_floored``, ``ranking.NoiseCalibration``)."""

from __future__ import annotations

import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.retrieval.engine import RetrievalEngine

# the paragraph both documents hold (a site's commissioning boilerplate), then one line on the unit each is about
SHARED = ("Commissioning checklist. Before the first start, check that the unit is bolted down, the guard is fitted, "
          "the motor turns freely by hand and the rotation arrow matches the wiring. Fill the bearings with the "
          "grease named on the plate, open the isolating valves or dampers, and make sure the control room knows. "
          "Start the unit, run it for ten minutes, listen for noise and vibration, and record the current drawn. "
          "If everything is in order, sign the checklist and hand the unit over to operations.")
PUMPS = "# Unit P-7\n\n" + SHARED + "\n\nUnit: P-7 centrifugal pump. Asset tags ASSET-1024 and ASSET-1025.\n"
FANS = "# Unit F-2\n\n" + SHARED + "\n\nUnit: F-2 axial fan. Asset tag ASSET-1042.\n"


@pytest.fixture(scope="module")
def two_documents(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("two-docs")
    (root / "docs").mkdir()
    (root / "docs" / "pumps.md").write_text(PUMPS)
    (root / "docs" / "fans.md").write_text(FANS)
    settings = Settings(data_dir=root / "data", sources=[root / "docs"], use_tuned_ranking=False, min_relevance=0.0)
    run_sync(settings, embedder)
    return RetrievalEngine(settings, embedder=embedder)


def _top_document(engine: RetrievalEngine, query: str, fusion: str) -> str:
    return engine.search(query, k=2, fusion=fusion, log=False).hits[0].source_path.rsplit("/", 1)[-1]


def test_the_only_document_naming_an_asset_wins_although_the_other_is_a_hair_closer_in_cosine(two_documents):
    assert _top_document(two_documents, "ASSET-1042", "calibrated") == "fans.md"
    # what calibration prevents: min-max makes the pumps page's cosine lead of about 0.015 worth the whole
    # vector weight, more than BM25 and the entity boost give the page that names the asset
    assert _top_document(two_documents, "ASSET-1042", "weighted") == "pumps.md"


def test_a_question_naming_the_unit_finds_its_page(two_documents):
    assert _top_document(two_documents, "how do I get the pump ready to run", "calibrated") == "pumps.md"
