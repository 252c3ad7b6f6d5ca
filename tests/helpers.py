"""Helpers shared by test modules of both layers (tests/unit, tests/integration).

A test module imports what it shares with other modules from here (or from ``tests.doc_site``), never from
another test module: importing a test module runs its module-level code (skips, fixtures, marks) too.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO_ROOT.parent / "shared" / "datasets"

# The system Chromium the browser tests drive through Playwright (never a browser download by a test tool)
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 30_000
# appended to a tiny Markdown fixture so it passes GROUNDWORK_MIN_MARKDOWN_WORDS (50): the same words in every such
# file, so they rank nothing above anything else
MARKDOWN_FILLER = "\n\n" + "This page is kept in the plant handbook for the maintenance crew on every shift. " * 5
# How much of this project's docs a fine-tuning test corpus holds: the docs grow every release, and a test's
# time grows with what it embeds (each training test re-embeds its corpus), so the share is bounded
PROJECT_DOCS_PER_FILE = 24_000
PROJECT_DOCS_TOTAL = 144_000


def this_cpu_check(batch_ms: dict[str, float] | None = None, passed: bool = True):
    """A quantised graph's fidelity check as this CPU would record it (``artifacts.FidelityRecord``): passed or failed,
    the quantised graph the faster for queries, and ``batch_ms`` the document batches' timings (None: not timed)."""
    from knowledge_store.models.artifacts import FidelityRecord, cpu_identity

    cpu = cpu_identity()
    return FidelityRecord(cpu_key=cpu.key, cpu=cpu.describe(), flags=list(cpu.flags), onnxruntime=cpu.onnxruntime,
                          texts=12, mean=0.999 if passed else 0.5, min=0.998 if passed else 0.2, passed=passed,
                          checked_at="2026-01-01T00:00:00+00:00", seconds=1.0, query_ms={"fp32": 2.0, "quantised": 1.0},
                          batch_ms=dict(batch_ms or {}))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_browser(test: str):
    """Skip the calling module (the whole of ``test``) unless the system Chromium, playwright and uvicorn are
    there; returns playwright's ``expect``.  Call it at module level, before importing what needs them."""
    import pytest

    if not CHROMIUM.exists():
        pytest.skip(f"system Chromium not found at {CHROMIUM} (this test never downloads browsers)",
                    allow_module_level=True)
    try:
        from playwright.sync_api import expect
    except ImportError as error:  # pragma: no cover - depends on the environment
        pytest.skip(f"playwright cannot be imported ({error}); install the Python package to run {test}",
                    allow_module_level=True)
    pytest.importorskip("uvicorn", reason="uvicorn is needed to serve the app to the browser")
    return expect


@contextmanager
def served_app(settings, engine, port: int | None = None, name: str = "uvicorn",
               until_healthy: bool = True) -> Iterator[str]:
    """The real app (``create_app``) served by uvicorn on a loopback thread; yields its base URL once
    ``/health`` answers 200 (``until_healthy=False``: answers at all, 503 unhealthy too; fails the test after
    60 s), and stops it afterwards."""
    import pytest
    import uvicorn

    from knowledge_store.server.app import create_app

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True, name=name)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except urllib.error.HTTPError:  # it answers, unhealthy (no index, a model that failed to load)
            if not until_healthy:
                break
        except Exception:  # noqa: BLE001 - not up yet (connection refused)
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            pytest.fail("the app did not answer /health with 200 within 60 s")
        time.sleep(0.1)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def chromium(args: list[str] | None = None):
    """The system Chromium, headless, through Playwright (never a downloaded browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args or CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def console_page(browser, base: str, routes: dict | None = None):
    """A console page at ``base``; afterwards fails the test if it tried to load anything from outside the app
    (nothing may come from the internet) or raised a JavaScript error.  ``routes``: URL pattern -> Playwright route
    handler, in place before the page loads (to hold or change the requests it makes as it opens)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    outside: list[str] = []
    context.route(lambda url: not url.startswith(base) and not url.startswith("data:"),
                  lambda route: (outside.append(route.request.url), route.abort()))
    for pattern, handler in (routes or {}).items():
        context.route(pattern, handler)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(base + "/")
    yield page
    context.close()
    assert not outside, f"the console tried to load from outside the app: {outside}"
    assert not errors, f"JavaScript errors: {errors}"


def start_serve(env: dict[str, str], log_path: Path, cwd: Path | None = None) -> tuple[object, str]:
    """``groundwork serve`` in its own process with ``env`` on top of this one's (port: ``GROUNDWORK_SERVER_PORT``,
    else a free one); returns (process, base URL).  Its output goes to ``log_path``."""
    import os
    import subprocess
    import sys

    env = {"HF_HUB_OFFLINE": "1", "GROUNDWORK_TORCH_THREADS": "1", **env}
    env.setdefault("GROUNDWORK_SERVER_PORT", str(free_port()))
    scheme = "https" if env.get("GROUNDWORK_SSL_CERTFILE") else "http"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "knowledge_store.cli", "serve"], env={**os.environ, **env},
                                stdout=log, stderr=subprocess.STDOUT, cwd=cwd or log_path.parent)
    return proc, f"{scheme}://127.0.0.1:{env['GROUNDWORK_SERVER_PORT']}"


def wait_healthy(proc, base: str, log_path: Path, timeout_s: float = 120.0) -> None:
    """Until ``/health`` answers 200 with the embedding model loaded (the server answers from its start, and
    queries answer 503 model_loading until its model is loaded; TLS certificates are not checked); fails with the
    server's log when it exits or the time is up."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base}/health", timeout=2, verify=False)
            if response.status_code == 200 and response.json().get("services", {}).get("model", "up") == "up":
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"server at {base} did not start:\n{log_path.read_text()[-3000:]}")


def stop(proc) -> None:
    """Terminate a server process started by ``start_serve`` (kill it after 20 s)."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


class GatedModel:
    """The real model behind a load that waits until ``release`` is set (a cold process reading its weights)."""

    def __init__(self, inner) -> None:
        self.inner, self.model_id, self.dim, self.torch_threads = inner, inner.model_id, inner.dim, 1
        self.release = threading.Event()
        self.loaded = False

    def load(self):
        if not self.release.wait(timeout=60):
            raise TimeoutError("the test never released the model")
        self.loaded = True
        return self

    def embed(self, texts):
        return self.inner.embed(texts)


class CorruptModel(GatedModel):
    """The real model behind a load that fails (weights that cannot be read)."""

    def load(self):
        raise RuntimeError("model weights are corrupt")


class CountingEmbedder:
    """The real embedder, counting every text it is asked to embed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.torch_threads = inner.torch_threads
        self.texts: list[str] = []

    def embed(self, texts: list[str]):
        self.texts.extend(texts)
        return self.inner.embed(texts)

    def embed_in_context(self, texts: list[str], spans):
        self.texts.extend(texts)
        return self.inner.embed_in_context(texts, spans)


def copy_project_docs(dest: Path, per_file: int = PROJECT_DOCS_PER_FILE, total: int = PROJECT_DOCS_TOTAL,
                      names: tuple[str, ...] | None = None) -> list[Path]:
    """A bounded copy of this project's Markdown docs (``docs/*.md``, or ``names``) into ``dest``: each file's
    opening sections up to ``per_file`` characters, cut before a heading (else at a blank line), files in name
    order until ``total``.  Real prose with many headings (a few hundred training pairs), of a size that does not
    grow with the docs.  Returns the files written."""
    dest.mkdir(parents=True, exist_ok=True)
    written, left = [], total
    sources = [REPO_ROOT / "docs" / n for n in names] if names else sorted((REPO_ROOT / "docs").glob("*.md"))
    for source in sources:
        if left <= 0:
            break
        text, limit = source.read_text(encoding="utf-8"), min(per_file, left)
        if len(text) > limit:
            head = text[:limit]
            cut = head.rfind("\n#")
            text = head[:cut] if cut > 0 else head[:max(head.rfind("\n\n"), 1)]
        (dest / source.name).write_text(text.rstrip() + "\n", encoding="utf-8")
        written.append(dest / source.name)
        left -= len(text)
    return written


def build_sample_index(root: Path, embedder, **overrides):
    """Write the generated sample corpus under ``root/docs``, ingest it into ``root/data`` and
    return the Settings (~15 s).  Modules that only read the sample index use the session's
    ``shared_sample_index`` fixture (tests/integration/conftest.py) instead; this is for modules
    that change their index (sync, upload, delete, edit a document, write tuned.json)."""
    from knowledge_store.config.settings import Settings
    from knowledge_store.ingest.run import run_sync
    from knowledge_store.ingest.sample_corpus import write_sample_corpus

    write_sample_corpus(root / "docs")
    settings = Settings(data_dir=root / "data", sources=[root / "docs"], **overrides)
    run_sync(settings, embedder)
    return settings


def write_tiny_beir(folder: Path) -> None:
    """A four-document BEIR-format dataset with three judged queries."""
    folder.mkdir(parents=True)
    docs = [
        ("d1", "Thermostat reset", "Hold the dial for ten seconds to reset the thermostat to factory settings."),
        ("d2", "Hub pairing", "Press the blue button on the hub to pair a new sensor within two minutes."),
        ("d3", "Error E42", "Error E42 means the remote sensor circuit is open; check the wiring on S1 and S2."),
        ("d4", "Battery", "The sensor battery lasts two years; replace it with a CR2032 cell."),
    ]
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in docs))
    queries = [("q1", "how do I reset the thermostat"), ("q2", "pair a sensor with the hub"), ("q3", "what is error E42")]
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in queries))
    (folder / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td3\t1\n")


# ------------------------------------------------------------------ a tiny BEIR folder with a train split

BEIR_DOCS = [
    {"_id": "101", "title": "Aspirin and platelets", "text": "Aspirin irreversibly inhibits cyclooxygenase in platelets. The effect lasts for the platelet lifetime."},
    {"_id": "102", "title": "Yes: a title with a colon", "text": "Statins lower LDL cholesterol by inhibiting HMG-CoA reductase in the liver."},
    {"_id": "doc/3", "title": "Vitamin D", "text": "Vitamin D deficiency is associated with bone loss.\nSupplementation restores serum levels."},
    {"_id": "104", "title": "Sleep", "text": "Sleep deprivation impairs memory consolidation in young adults."},
    {"_id": "105", "title": "007", "text": "Exercise improves insulin sensitivity in skeletal muscle."},
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_qrels(path: Path) -> list[tuple[str, str, int]]:
    """A BEIR qrels file's rows (query id, corpus id, score), header skipped."""
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line.strip()]
    return [(q, d, int(s)) for q, d, s in rows]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_beir_splits(folder: Path) -> Path:
    """``BEIR_DOCS`` as a BEIR folder: a test split (one query without judgements, one judged 0) and a train split."""
    folder.mkdir()
    write_jsonl(folder / "corpus.jsonl", BEIR_DOCS)
    write_jsonl(
        folder / "queries.jsonl",
        [
            {"_id": "q1", "text": "does aspirin affect platelets"},
            {"_id": "q2", "text": "statins and cholesterol"},
            {"_id": "q3", "text": "vitamin d and bones"},
            {"_id": "q4", "text": "a query nobody judged"},
        ],
    )
    (folder / "qrels.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\t101\t1\nq2\t102\t2\nq2\t104\t0\nq3\tdoc/3\t1\nq3\t105\t1\n"
    )
    write_jsonl(folder / "queries_train.jsonl", [{"_id": "t1", "text": "sleep and memory"}, {"_id": "t2", "text": "exercise"}])
    (folder / "qrels_train.tsv").write_text("query-id\tcorpus-id\tscore\nt1\t104\t1\nt2\t105\t0\n")
    return folder


# ------------------------------------------------------------------ search hits for citations and answers

def make_hit(text: str, n: int = 1, **kw):
    """A SearchHit of ``text`` numbered ``n`` (its ids, title, section, page and URL say ``n``)."""
    from knowledge_store.retrieval.types import SearchHit

    fields = dict(
        chunk_id=f"c{n}",
        doc_id=f"d{n}",
        version=1,
        title=f"Doc {n}",
        section=f"Section {n}",
        section_path=(f"Doc {n}", f"Section {n}"),
        page_start=n,
        page_end=n,
        url=f"file:///docs/doc{n}.pdf#page={n}",
        source_path=f"/docs/doc{n}.pdf",
        source_id="src",
        text=text,
        doc_type="pdf",
        score=1.0 / n,
        bm25_score=3.0,
        vector_score=0.5,
        relevance=0.8,
    )
    fields.update(kw)
    return SearchHit(**fields)


HITS_TEXT = [
    "Reset\n\nThe controller keeps its schedule during a power cut. "
    "To reset the controller, hold the MODE button for ten seconds.   The display blinks twice\nwhen the reset is done.",
    "Error codes are shown on the display. Error E42 means the outdoor sensor is disconnected. "
    "To reset the controller, hold the MODE button for ten seconds.",
    "The warranty covers parts for five years and labour for one year.",
]


def hits_for_answer() -> list:
    return [
        make_hit(HITS_TEXT[0], 1, section="Reset", section_path=("Manual", "Reset")),
        make_hit(HITS_TEXT[1], 2, section="Errors", section_path=("Manual", "Errors")),
        make_hit(HITS_TEXT[2], 3, section="Warranty", section_path=("Manual", "Warranty")),
    ]


# ------------------------------------------------------------------ rerankers that are slow or a test's own

def slow_reranker(delay_s: float = 1.0):
    """A LlamaIndex postprocessor that takes ``delay_s`` and then reverses the order."""
    import time

    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class SlowReranker(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes, query_bundle=None):
            time.sleep(delay_s)
            return list(reversed(nodes))

    return SlowReranker()


def bm25_only(inputs):
    """A fusion mode the code base does not have: raw BM25, whatever alpha says."""
    import numpy as np

    return inputs.bm25.astype(np.float64)


def reverse_reranker(engine):
    """A reranker the code base does not have: the fused order reversed."""
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class ReverseReranker(BaseNodePostprocessor):
        @classmethod
        def class_name(cls) -> str:
            return "ReverseReranker"

        def _postprocess_nodes(self, nodes, query_bundle=None):
            return list(reversed(nodes))

    return ReverseReranker()


# ------------------------------------------------------------------ scanned PDFs (OCR)

SCANNED_LINES = (
    "Quarterly Maintenance Report",
    "The heat exchanger was inspected on Tuesday morning.",
    "Pressure readings stayed within the safe range.",
    "Replace the gasket before the winter season begins.",
)
DIGITAL_TEXT = "The digital page explains how the boiler thermostat schedule is programmed each week."


def _text_page(doc, lines: tuple[str, ...]):
    page = doc.new_page()
    page.insert_text((72, 100), lines[0], fontsize=20)
    for row, line in enumerate(lines[1:]):
        page.insert_text((72, 140 + 20 * row), line, fontsize=12)
    return page


def _add_scanned_page(doc, lines: tuple[str, ...], dpi: int = 200) -> None:
    """A page whose only content is a picture of a text page, like a scanner makes."""
    import pymupdf

    source = pymupdf.open()
    pixmap = _text_page(source, lines).get_pixmap(dpi=dpi)
    page = doc.new_page(width=source[0].rect.width, height=source[0].rect.height)
    page.insert_image(page.rect, pixmap=pixmap)


def make_pdf(path: Path, kinds: list[str], lines: tuple[str, ...] = SCANNED_LINES) -> Path:
    """A PDF with one page per kind: "digital" (text layer) or "scanned" (image only)."""
    import pymupdf

    doc = pymupdf.open()
    for kind in kinds:
        if kind == "digital":
            page = doc.new_page()
            page.insert_textbox(pymupdf.Rect(72, 72, 520, 300), DIGITAL_TEXT, fontsize=11)
        else:
            _add_scanned_page(doc, lines)
    doc.save(path)
    check = pymupdf.open(path)
    for kind, page in zip(kinds, check):
        assert (page.get_text().strip() == "") == (kind == "scanned")  # image-only pages have no text layer
    return path


# ------------------------------------------------------------------ folder sources with symbolic links

def symlink_layout(tmp_path: Path) -> tuple[Path, Path]:
    """A source folder with a real document, an outside folder with a secret, and links."""
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "guides" / "install.md").write_text("# Install\n\nMount the hub on the wall.\n" + MARKDOWN_FILLER)
    outside = tmp_path / "outside"
    (outside / "private").mkdir(parents=True)
    (outside / "secret.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (outside / "private" / "keys.md").write_text("# Keys\n\nnot for the index\n" + MARKDOWN_FILLER)
    (docs / "passwd.txt").symlink_to(outside / "secret.txt")          # file link leaving the folder
    (docs / "more").symlink_to(outside / "private", target_is_directory=True)  # folder link leaving it
    (docs / "setup.md").symlink_to(docs / "guides" / "install.md")    # file link inside: kept
    (docs / "latest").symlink_to(docs / "guides", target_is_directory=True)  # folder link inside
    return docs, outside


# ------------------------------------------------------------------ a clock for the crawler

class FakeTime:
    """clock()/sleep() pair: sleeping advances the clock instantly and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
