"""Chunk vectors blended with their bare text (``bare_vector_weight``): the recipe, its model id, bad values."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from knowledge_store.config.settings import Settings
from knowledge_store.core.errors import ConfigError
from knowledge_store.ingest.embed import MissingText, chunk_vectors
from knowledge_store.models.embeddings import bare_weight_of, chunk_vector_id, embed_chunks


class LetterEmbedder:
    """A deterministic 4-d 'model': one axis per first letter a-d; records every text it embeds."""

    def __init__(self, model_id: str = "m:0") -> None:
        self.model_id = model_id
        self.seen: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.seen.extend(texts)
        out = np.zeros((len(texts), 4), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i, "abcd".index(text[0])] = 1.0
        return out


def test_without_a_bare_share_chunks_are_embedded_once_with_their_header():
    model = LetterEmbedder()
    vectors = embed_chunks(model.embed, ["a header\n\nbody"], ["body"], 0.0)
    assert model.seen == ["a header\n\nbody"]
    assert vectors.tolist() == [[1, 0, 0, 0]]


def test_a_bare_share_blends_the_two_vectors_and_renormalises():
    model = LetterEmbedder()
    vectors = embed_chunks(model.embed, ["a header\n\nb body"], ["b body"], 0.5)
    assert model.seen == ["a header\n\nb body", "b body"]
    np.testing.assert_allclose(vectors, [[np.sqrt(0.5), np.sqrt(0.5), 0, 0]], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    heavier = embed_chunks(model.embed, ["a header\n\nb body"], ["b body"], 0.8)
    assert heavier[0, 1] > heavier[0, 0]  # the bare text's axis wins as its share grows


def test_a_chunk_without_a_header_is_not_embedded_twice():
    model = LetterEmbedder()
    vectors = embed_chunks(model.embed, ["c alone", "a head\n\nd text"], ["c alone", "d text"], 0.5)
    assert model.seen == ["c alone", "a head\n\nd text", "d text"]
    assert vectors[0].tolist() == [0, 0, 1, 0]


def test_texts_and_embed_texts_must_pair_up():
    with pytest.raises(ValueError, match="2 embed texts for 1 chunk texts"):
        embed_chunks(LetterEmbedder().embed, ["a", "b"], ["a"], 0.5)


def test_the_recipe_is_part_of_the_model_id_and_read_back_from_it():
    assert chunk_vector_id("m:0", 0.0) == "m:0" and bare_weight_of("m:0") == 0.0
    assert chunk_vector_id("m:0", 0.5) == "m:0+bare0.5" and bare_weight_of("m:0+bare0.5") == 0.5
    assert bare_weight_of(chunk_vector_id("m:0+onnx-int8-dyn-pc2", 0.25)) == 0.25
    with pytest.raises(ConfigError, match="bare_vector_weight"):
        chunk_vector_id("m:0", 1.5)


def test_ingestion_blends_by_what_the_model_id_says():
    """A wrapper passing the id on (CountingEmbedder, the Dagster resource) cannot store plain vectors
    under a blend's id: the recipe is read off the id."""
    part = [MissingText("h1", "a header\n\nb body", "b body")]
    plain = chunk_vectors(LetterEmbedder("m:0"), part)
    blended = chunk_vectors(LetterEmbedder("m:0+bare0.5"), part)
    assert plain.tolist() == [[1, 0, 0, 0]]
    np.testing.assert_allclose(blended, [[np.sqrt(0.5), np.sqrt(0.5), 0, 0]], atol=1e-6)


@pytest.mark.parametrize("value", [-0.1, 1.01])
def test_settings_refuse_a_share_outside_zero_to_one(value, tmp_path):
    with pytest.raises(ValidationError, match="bare_vector_weight"):
        Settings(data_dir=tmp_path, bare_vector_weight=value)
