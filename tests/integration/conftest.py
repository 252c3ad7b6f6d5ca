"""Integration fixtures: the real embedding model (loaded once), the sample index (built once), and the
browser and console page of the browser tests (each module serves its own `live` app)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import CountingEmbedder, build_sample_index


@pytest.fixture(scope="session")
def embedder(model_path: Path):
    from knowledge_store.models.embeddings import Embedder

    # loaded here: an app over an engine with this embedder answers queries from its start (a model still loading
    # would make them 503 model_loading until its warm-up is done)
    return Embedder(model_path, batch_size=32, torch_threads=2).load()


@pytest.fixture()
def counting_embedder(embedder) -> CountingEmbedder:
    return CountingEmbedder(embedder)


@pytest.fixture(scope="session")
def shared_sample_index(tmp_path_factory, embedder):
    """The sample corpus indexed once per session (Settings with default values), for the modules that only
    read it: they search it, list its documents and log their own queries.  A module that changes its index
    (a sync, an upload, a deleted or edited document, a source added, tuned.json written) builds its own with
    ``tests.helpers.build_sample_index``.  Teardown checks that nobody published a new snapshot of it."""
    from knowledge_store.storage.index import read_pointer
    from knowledge_store.storage.tuned import tuned_path

    settings = build_sample_index(tmp_path_factory.mktemp("shared-sample"), embedder)
    published = read_pointer(settings.index_dir)
    yield settings
    now = read_pointer(settings.index_dir)
    assert (now.snapshot_version, now.file) == (published.snapshot_version, published.file), (
        "a test published a new snapshot of the shared sample index: give its module its own "
        "(tests.helpers.build_sample_index)")
    assert not tuned_path(settings.index_dir).exists(), "a test wrote tuned.json into the shared sample index"


@pytest.fixture(scope="module")
def browser():
    """The system Chromium for one browser-test module (a module needing other flags defines its own)."""
    from tests.helpers import chromium

    with chromium() as browser:
        yield browser


@pytest.fixture()
def page(browser, live):
    """A console page of the requesting module's ``live`` app; fails the test if the page loaded anything
    from outside the app (nothing may come from the internet) or raised a JavaScript error."""
    from tests.helpers import console_page

    with console_page(browser, live["base"]) as page:
        yield page
