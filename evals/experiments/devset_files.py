"""What the documentation dev-set builders share: Debian packages in, BEIR files and a README out.

``evals.experiments.debian_docs`` (the Debian FAQ among ten Debian manuals) and ``evals.experiments.perl_docs`` (the Perl
FAQ among Perl's reference and tutorial pages) both fetch Debian packages with ``apt-get
download``, unpack them with ``dpkg-deb -x``, turn sections into BEIR rows and write the same
files: ``corpus.jsonl``, ``queries{,_train,_all}.jsonl``, ``qrels{,_train,_all}.tsv``,
``manifest.json`` (builder version, packages, counts, sha256) and ``README.md``.  Nothing they
build is committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from knowledge_store.core.errors import GroundworkError

TEST_SHARE = 0.5
SPLIT_FILES = (("test", ""), ("train", "_train"), ("all", "_all"))
BEIR_FILES = ("corpus.jsonl", "queries.jsonl", "qrels.tsv", "queries_train.jsonl", "qrels_train.tsv",
              "queries_all.jsonl", "qrels_all.tsv")


class DatasetBuildError(GroundworkError):
    """A dev set cannot be built here (no apt, a package missing, an unexpected layout)."""


@dataclass
class DevSet:
    corpus: list[dict]
    queries: list[dict]
    qrels: list[tuple[str, str, int]]
    splits: dict[str, str]  # query id -> train | test
    stats: dict[str, object]


def split_of(query_id: str) -> str:
    """Stable train/test assignment from a hash of the id."""
    bucket = int(hashlib.sha256(query_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if bucket < TEST_SHARE else "train"


def median(values: Sequence[int]) -> float:
    values = sorted(values)
    if not values:
        return 0.0
    mid = len(values) // 2
    return float(values[mid]) if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def apt_available(package: str, what: str) -> tuple[bool, str]:
    """(True, "") when ``apt-get download`` and ``dpkg-deb`` can fetch ``package``, else (False, reason)."""
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed ({what} is built from Debian packages)"
    probe = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True)
    if probe.returncode != 0 or "Candidate: (none)" in probe.stdout or "Candidate" not in probe.stdout:
        return False, f"apt knows no candidate for {package} (run apt-get update, or the archive is unreachable)"
    return True, ""


def fetch_packages(work: Path, packages: Sequence[str], what: str) -> dict[str, str]:
    """Download and unpack ``packages`` into ``work/root``; returns {package: .deb file name}."""
    ok, reason = apt_available(packages[0], what)
    if not ok:
        raise DatasetBuildError(reason)
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(["apt-get", "download", *packages], cwd=debs, capture_output=True, text=True)
    if run.returncode != 0:
        raise DatasetBuildError(f"apt-get download {' '.join(packages)} failed: {run.stderr.strip()[-500:]}")
    found: dict[str, str] = {}
    for package in packages:
        files = sorted(debs.glob(f"{package}_*.deb"))
        if not files:
            raise DatasetBuildError(f"apt-get download left no {package}_*.deb in {debs}")
        found[package] = files[-1].name
        subprocess.run(["dpkg-deb", "-x", str(files[-1]), str(work / "root")], check=True)
    return found


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_devset(devset: DevSet, out: Path, packages: dict[str, str], builder_version: str,
                 readme: Callable[[DevSet, dict[str, str], dict[str, str]], str]) -> dict[str, str]:
    """Write the BEIR files, ``manifest.json`` and ``readme(devset, packages, checksums)``; returns {file: sha256}."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for row in devset.corpus:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    for split, suffix in SPLIT_FILES:
        ids = {q for q, s in devset.splits.items() if split in (s, "all")}
        with open(out / f"queries{suffix}.jsonl", "w", encoding="utf-8") as handle:
            for row in devset.queries:
                if row["_id"] in ids:
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        with open(out / f"qrels{suffix}.tsv", "w", encoding="utf-8") as handle:
            handle.write("query-id\tcorpus-id\tscore\n")
            for query_id, doc_id, score in devset.qrels:
                if query_id in ids:
                    handle.write(f"{query_id}\t{doc_id}\t{score}\n")
    checksums = {name: sha256_of(out / name) for name in BEIR_FILES}
    manifest = {"builder_version": builder_version, "packages": packages, "stats": devset.stats, "sha256": checksums}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "README.md").write_text(readme(devset, packages, checksums))
    return checksums


def readme_tail(devset: DevSet, packages: dict[str, str], checksums: dict[str, str]) -> list[str]:
    """The README lines every set has: counts, packages, licence note, checksums."""
    return [
        "| what | count |",
        "|---|---|",
        *(f"| {k.replace('_', ' ')} | {v} |" for k, v in devset.stats.items()),
        "",
        "Packages (apt-get download, dpkg-deb -x):",
        "",
        *(f"- `{deb}`" for deb in packages.values()),
        "",
        "Licenses: each package's copyright file; evaluation use only.",
        "For evaluation only; do not redistribute the built files.",
        "",
        "sha256:",
        "",
        "```",
        *(f"{digest}  {name}" for name, digest in checksums.items()),
        "```",
        "",
    ]


def is_current(out: Path, builder_version: str) -> bool:
    """True when ``out`` holds a build by this builder version."""
    manifest = Path(out) / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("builder_version") == builder_version
    except json.JSONDecodeError:
        return False


@dataclass(frozen=True)
class DevSetBuilder:
    """How one dev set is fetched, parsed and written; ``build``, ``ensure_built`` and ``main`` are the same for all."""

    what: str  # "the Debian docs dev set": what error messages call it
    packages: Callable[[], Sequence[str]]  # the Debian packages to fetch (a call: a name may depend on the release)
    parse: Callable[[Path], DevSet]  # unpacked packages' root -> the set
    readme: Callable[[DevSet, dict[str, str], dict[str, str]], str]
    version: str  # written to manifest.json; a build by another version is rebuilt by ensure_built
    default_out: Path

    def build(self, out: Path | None = None, keep_work: Path | None = None) -> dict[str, object]:
        """Fetch, parse and write the set into ``out``; returns the manifest."""
        out = Path(out or self.default_out)
        with tempfile.TemporaryDirectory(prefix="devset-") as tmp:
            work = keep_work or Path(tmp)
            packages = fetch_packages(work, self.packages(), self.what)
            write_devset(self.parse(work / "root"), out, packages, self.version, self.readme)
        return json.loads((out / "manifest.json").read_text())

    def ensure_built(self, out: Path | None = None) -> Path:
        """The dev set folder, built first when it is missing or was made by an older builder."""
        out = Path(out or self.default_out)
        if not is_current(out, self.version):
            self.build(out)
        return out

    def main(self, argv: list[str] | None, description: str) -> int:
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--out", type=Path, default=self.default_out)
        parser.add_argument("--force", action="store_true", help="rebuild even when an up-to-date build exists")
        args = parser.parse_args(argv)
        try:
            manifest = self.build(args.out) if args.force else \
                json.loads((self.ensure_built(args.out) / "manifest.json").read_text())
        except DatasetBuildError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(json.dumps(manifest["stats"], indent=2))
        print(f"written to {args.out}")
        return 0
