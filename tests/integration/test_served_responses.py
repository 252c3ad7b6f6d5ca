"""The served front ends answer the sample corpus as they did when tests/fixtures/served_responses.json was
recorded (``python -m tests.served_responses``): the same ranks, chunk ids, scores, citations and answers."""

from __future__ import annotations

import json

import pytest

from tests.served_responses import FIXTURE, REQUESTS, record

pytestmark = pytest.mark.slow


def test_served_responses_match_the_recording(tmp_path, embedder):
    from tests.helpers import build_sample_index

    expected = json.loads(FIXTURE.read_text())
    assert sorted(expected) == sorted(name for name, _, _ in REQUESTS)
    served = json.loads(json.dumps(record(build_sample_index(tmp_path, embedder), embedder)))
    for name, _, _ in REQUESTS:
        assert served[name] == expected[name], name
