"""Calibrated fusion: a method's score range is floored by its noise scale, so a difference below noise is not
stretched to 0 vs 1 (``fusion.noise_floored``, ``ranking.NoiseCalibration``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.evidence import QueryEvidence
from knowledge_store.retrieval.fusion import FUSION_REGISTRY, NoiseScales, fuse_scores, minmax, noise_floored
from knowledge_store.retrieval.ranking import NoiseCalibration, RankingPipeline, reference_rows
from knowledge_store.storage.tuned import RankingParams

# two candidates: row 0 is a hair closer in cosine, row 1 alone holds the query's rare word
BM25 = np.array([0.0, 0.9])
VECTOR = np.array([0.612, 0.604])


def test_min_max_turns_a_cosine_difference_below_noise_into_a_win_that_calibration_does_not():
    weighted = fuse_scores(BM25, VECTOR, None, alpha=0.8, pool=10, method="weighted")
    assert weighted.rows.tolist() == [0, 1]  # 0.8 * 1 against 0.2 * 1: the rare word loses
    calibrated = fuse_scores(BM25, VECTOR, None, alpha=0.8, pool=10, method="calibrated",
                             noise=NoiseScales(vector=0.05, bm25=0.1))
    assert calibrated.rows.tolist() == [1, 0]
    assert calibrated.fused.tolist() == pytest.approx([0.2, 0.8 * 0.008 / 0.05])


def test_noise_floored_is_min_max_when_the_range_exceeds_the_noise_and_without_noise():
    values = np.array([0.2, 0.5, 0.8])
    assert noise_floored(values, 0.1).tolist() == pytest.approx(minmax(values).tolist())
    assert noise_floored(values, 0.0).tolist() == pytest.approx(minmax(values).tolist())
    assert noise_floored(values, 1.2).tolist() == pytest.approx([0.0, 0.25, 0.5])
    assert noise_floored(np.zeros(0), 1.0).tolist() == []


def test_on_a_wide_pool_calibrated_ranks_as_weighted_does():
    rng = np.random.default_rng(7)
    bm25, vector = rng.gamma(2.0, 2.0, 200), rng.uniform(0.1, 0.8, 200)
    noise = NoiseScales(vector=0.05, bm25=0.5)
    weighted = fuse_scores(bm25, vector, None, 0.7, 50, "weighted")
    calibrated = fuse_scores(bm25, vector, None, 0.7, 50, "calibrated", noise=noise)
    assert calibrated.rows.tolist() == weighted.rows.tolist()
    assert calibrated.fused == pytest.approx(weighted.fused)


def test_the_calibration_reads_its_settings_and_measures_the_querys_spread_over_a_reference_sample():
    calibration = NoiseCalibration.from_settings(Settings(calibrated_vector_sds=2.0, calibrated_vector_floor=0.01,
                                                          calibrated_bm25_idf_share=0.5, calibrated_reference_rows=4))
    assert RankingPipeline.served(Settings(calibrated_vector_sds=2.0, calibrated_vector_floor=0.01,
                                           calibrated_bm25_idf_share=0.5, calibrated_reference_rows=4)
                                  ).calibration == calibration
    assert reference_rows(3, 4).tolist() == [0, 1, 2] and reference_rows(10, 4).tolist() == [0, 3, 6, 9]
    cosines = np.array([0.1, 0.9, 0.9, 0.3, 0.9, 0.9, 0.5, 0.9, 0.9, 0.7], dtype=np.float32)
    terms = SimpleNamespace(idf=np.array([0.2, 0.6]))
    evidence = QueryEvidence(terms, np.zeros(10), np.zeros(10), np.zeros(10), cosines, cosines)
    scales = calibration.scales(evidence, None, None)
    assert scales.vector == pytest.approx(2.0 * float(np.std([0.1, 0.3, 0.5, 0.7])))
    assert scales.bm25 == pytest.approx(0.5 * 0.4)
    # one chunk has no spread: the floor is the noise scale
    lone = QueryEvidence(SimpleNamespace(idf=np.zeros(0)), np.zeros(1), np.zeros(1), np.zeros(1), cosines[:1], cosines[:1])
    assert calibration.scales(lone, None, None) == NoiseScales(vector=0.01, bm25=0.0)


def test_the_pipeline_measures_noise_only_for_a_mode_that_reads_it():
    assert FUSION_REGISTRY["calibrated"].uses_noise and not FUSION_REGISTRY["weighted"].uses_noise
    terms = SimpleNamespace(idf=np.array([0.3]))
    evidence = QueryEvidence(terms, BM25, BM25, BM25, VECTOR.astype(np.float32), VECTOR.astype(np.float32))
    pipeline = RankingPipeline(pool=10)
    weighted = pipeline.context("q", evidence, RankingParams(0.8, "weighted"))
    assert pipeline.rank(weighted).rows.tolist() == [0, 1] and weighted.noise_scales is None
    calibrated = pipeline.context("q", evidence, RankingParams(0.8, "calibrated"))
    assert pipeline.rank(calibrated).rows.tolist() == [1, 0]
    assert calibrated.noise_scales.vector == pytest.approx(pipeline.calibration.vector_floor)
