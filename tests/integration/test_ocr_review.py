"""Low-confidence OCR regions: text lines Tesseract reads under
``ocr_low_confidence`` are recorded per page, the document is marked needs_review with their count,
``groundwork status --needs-review`` and ``/api/knowledge/documents?needs_review=true`` list it, and
citations of its passages say ``low_confidence_ocr``.

The scan is made here: clear lines, then four bands of 8 pt text under a 1.8 px Gaussian blur at
150 dpi, which Tesseract 5 reads as garbled words at 0.29-0.41 mean confidence (measured; less blur
reads them well, more blur drops them).  Skipped without the ``tesseract`` command."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pymupdf
import pytest
from fastapi.testclient import TestClient
from PIL import Image, ImageFilter

from knowledge_store.cli import main
from knowledge_store.config.settings import Settings
from knowledge_store.ingest.run import run_sync
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.storage.store import store_connection

pytestmark = pytest.mark.skipif(
    shutil.which("tesseract") is None,
    reason="tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng; `make test` does it as root)",
)

CLEAR = ["The feed pump was inspected on Monday morning.", "Bearings were greased and the seal replaced.",
         "Vibration readings stayed within the normal band."]
BLURS = (1.8, 1.8, 1.8, 1.8)


def degraded_scan(path: Path) -> Path:
    """One image-only page: a title and three clear lines, then four bands of blurred 8 pt text."""
    source = pymupdf.open()
    page = source.new_page()
    page.insert_text((72, 90), "Pump Maintenance Record", fontsize=20)
    for i, line in enumerate(CLEAR):
        page.insert_text((72, 130 + 22 * i), line, fontsize=12)
    for i, _ in enumerate(BLURS):
        page.insert_text((72, 300 + 60 * i), "gasket torque values smudged by coffee stain", fontsize=8)
        page.insert_text((72, 309 + 60 * i), "reading illegible near the fold line", fontsize=8)
    image = Image.open(io.BytesIO(page.get_pixmap(dpi=150).tobytes("png")))
    scale = image.size[1] / page.rect.height
    for i, radius in enumerate(BLURS):
        box = (0, int((285 + 60 * i) * scale), image.size[0], int((330 + 60 * i) * scale))
        image.paste(image.crop(box).filter(ImageFilter.GaussianBlur(radius)), box)
    buffer = io.BytesIO()
    image.save(buffer, "png")
    out = pymupdf.open()
    out.new_page(width=page.rect.width, height=page.rect.height).insert_image(page.rect, stream=buffer.getvalue())
    out.save(path)
    return path


def test_low_confidence_regions_flag_the_document_status_and_citations(tmp_path, embedder, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    degraded_scan(docs / "scan.pdf")
    (docs / "clean.md").write_text("# Valves\n\n" + " ".join(
        f"Close valve {i} slowly before opening the drain on line {i}." for i in range(8)))
    settings = Settings(data_dir=tmp_path / "data", sources=[docs])
    report = run_sync(settings, embedder)
    assert report.parse.parsed == 2 and report.parse.pages_ocr == 1

    with store_connection(settings.store_path) as conn:
        regions = conn.execute("SELECT page_number, confidence, words, text, y0 FROM low_confidence_regions").fetchall()
        page = conn.execute("SELECT p.ocr, p.ocr_regions, p.low_confidence_regions FROM pages p JOIN documents d "
                            "USING (doc_id, version) WHERE d.relative_path = 'scan.pdf'").fetchone()
        documents = {path: (review, count) for path, review, count in conn.execute(
            "SELECT relative_path, needs_review, low_confidence_regions FROM documents WHERE status = 'active'").fetchall()}
        flagged = conn.execute("SELECT count(*) FILTER (WHERE low_confidence_ocr), count(*) FROM chunks c JOIN documents d "
                               "USING (doc_id, version) WHERE d.relative_path = 'scan.pdf'").fetchone()
        clean_flagged = conn.execute("SELECT count(*) FROM chunks c JOIN documents d USING (doc_id, version) "
                                     "WHERE d.relative_path = 'clean.md' AND low_confidence_ocr").fetchone()[0]
    assert regions, "no line of the blurred bands was read with low confidence"
    assert all(r[0] == 1 and 0 <= r[1] < 0.5 and r[2] >= 1 and r[4] >= 280 for r in regions)  # the bands, not the clear lines
    assert page[0] is True and page[2] == len(regions) and page[1] >= len(CLEAR) + 1 + len(regions)
    assert documents == {"scan.pdf": (True, len(regions)), "clean.md": (False, 0)}
    assert flagged[0] >= 1 and clean_flagged == 0

    assert main(["status", "--data-dir", str(settings.data_dir), "--needs-review", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [d["relative_path"] for d in status["documents"] if d["status"] == "active"] == ["scan.pdf"]
    assert status["counts"]["needs_review_documents"] == 1
    assert status["counts"]["low_confidence_regions"] == len(regions)
    assert main(["status", "--data-dir", str(settings.data_dir), "--needs-review"]) == 0
    assert "1 need review" in capsys.readouterr().out

    engine = RetrievalEngine(settings, embedder=embedder)
    citations = [c.model_dump() for c in engine.search("feed pump inspected bearings greased", k=5, log=False).results]
    scan = [c for c in citations if c["ocr"]]
    assert scan and all(c["needs_review"] for c in scan)
    assert any(c["low_confidence_ocr"] for c in scan)
    assert not any(c["low_confidence_ocr"] or c["needs_review"] for c in citations if not c["ocr"])
    with TestClient(create_app_for(settings, engine), base_url="http://127.0.0.1:8080") as client:
        listed = client.get("/api/knowledge/documents", params={"needs_review": "true", "include_history": "false"})
        assert listed.status_code == 200
        assert [(d["relative_path"], d["low_confidence_regions"]) for d in listed.json()["documents"]] == \
            [("scan.pdf", len(regions))]


def create_app_for(settings: Settings, engine: RetrievalEngine):
    from knowledge_store.server.app import create_app

    return create_app(settings, engine=engine, mount_mcp=False)
