"""The console's administration pages in a real browser (system Chromium via Playwright) against the real app
(uvicorn, a real index of the sample corpus): navigation by keyboard; Upload (file chooser, progress to
indexed, a duplicate, a refused type; drag and drop onto the drop zone, to indexed, then the same file
again as a duplicate); Sources (add, edit, disable, enable, detail, delete a folder source);
Failures (Retry shows the job's result); Settings (saved in tuned.json, seen by /api/knowledge/config and the
Search page, reset); Evaluation (empty state, then results written by the evaluation code).  Screenshots go
to test-artifacts/console-*.png."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from tests.helpers import (
    MARKDOWN_FILLER,
    REPO_ROOT,
    build_sample_index,
    require_browser,
    served_app,
)

pytestmark = pytest.mark.slow

expect = require_browser("the console test")

from knowledge_store.ingest.run import run_sync  # noqa: E402  (after the skips: without a browser nothing loads)
from knowledge_store.retrieval.engine import RetrievalEngine  # noqa: E402
from knowledge_store.storage.query_log import QueryLog  # noqa: E402
from knowledge_store.storage.tuned import load_manual, tuned_path  # noqa: E402

ARTIFACTS = REPO_ROOT / "test-artifacts"
NAV = ["Search", "Sources", "Upload", "Failures", "Settings", "Evaluation"]


def api(base: str, path: str, method: str = "GET", body: object = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def live(tmp_path_factory, embedder):
    """The sample corpus plus one corrupt PDF (an open failure), served by the real app on a free port."""
    root = tmp_path_factory.mktemp("console_admin")
    settings = build_sample_index(root, embedder, query_torch_threads=2)
    (root / "docs" / "broken-manual.pdf").write_bytes(b"%PDF-1.7\nthis is not really a PDF\n")
    run_sync(settings, embedder)
    query_log = QueryLog(root / "logs.duckdb")
    engine = RetrievalEngine(settings, embedder=embedder, query_log=query_log)
    with served_app(settings, engine, name="console-admin-uvicorn") as base:
        yield {"base": base, "settings": settings, "root": root}
    query_log.close()


def go(page, route: str) -> None:
    page.get_by_role("navigation", name="Console pages").get_by_role("link", name=route, exact=True).click()
    expect(page.locator('.console-nav a[aria-current="page"]')).to_have_text(route)


def labelled(page, view: str) -> None:
    """Every visible form control of the view has exactly one label (or is inside one)."""
    controls = page.locator(f'.view[data-view="{view}"] input:visible, .view[data-view="{view}"] select:visible, '
                            f'.view[data-view="{view}"] textarea:visible')
    for i in range(controls.count()):
        control = controls.nth(i)
        control_id = control.get_attribute("id")
        wrapped = control.evaluate("c => !!c.closest('label')")
        assert wrapped or (control_id and page.locator(f'label[for="{control_id}"]').count() == 1), control_id


# ------------------------------------------------------------------ navigation

def test_navigation_by_keyboard_moves_focus_and_marks_the_current_page(page):
    links = page.locator(".console-nav a")
    assert links.all_inner_texts() == NAV
    expect(page.locator('.console-nav a[aria-current="page"]')).to_have_text("Search")
    page.focus('.console-nav a[data-route="search"]')
    visited = []
    for name, view, heading in (("Sources", "sources", "sources-heading"), ("Upload", "upload", "upload-heading"),
                                ("Failures", "failures", "failures-heading"), ("Settings", "settings", "settings-heading"),
                                ("Evaluation", "evaluation", "evaluation-heading")):
        page.focus(f'.console-nav a[data-route="{view}"]')
        assert page.evaluate("document.activeElement.textContent") == name
        page.keyboard.press("Enter")
        expect(page.locator(f"#view-{view}")).to_be_visible()
        expect(page.locator("#view-search")).to_be_hidden()
        expect(page.locator(f'.console-nav a[data-route="{view}"]')).to_have_attribute("aria-current", "page")
        page.wait_for_function(f"document.activeElement && document.activeElement.id === '{heading}'")
        assert name in page.title()
        labelled(page, view)
        visited.append(page.evaluate("location.hash"))
    assert visited == ["#/sources", "#/upload", "#/failures", "#/settings", "#/evaluation"]

    # Tab order inside the bar follows the pages; the browser's Back returns to the previous page
    page.focus('.console-nav a[data-route="search"]')
    order = []
    for _ in range(5):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.textContent"))
    assert order == NAV[1:]
    page.go_back()
    expect(page.locator("#view-settings")).to_be_visible()
    # a citation anchor (#result-n) is not a page: the view stays
    page.evaluate("location.hash = '#result-1'")
    expect(page.locator("#view-settings")).to_be_visible()
    page.goto(page.url.split("#")[0] + "#/search")
    expect(page.locator("#view-search")).to_be_visible()
    page.focus('.console-nav a[data-route="upload"]')
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none"), "the focused navigation link has no visible focus outline"


# ------------------------------------------------------------------ upload

def test_upload_by_file_chooser_shows_progress_to_indexed_and_reports_a_duplicate(page, live, tmp_path):
    new = tmp_path / "gadget-care.md"
    new.write_text("# Gadget care\n\n## Cleaning the lens\n\nWipe the zircon lens of the gadget with a dry cloth once "
                   "a week; never use alcohol, it clouds the coating.\n" + MARKDOWN_FILLER)
    duplicate = tmp_path / "copy-of-a-sample.md"
    sample = next(p for p in sorted((live["root"] / "docs").iterdir()) if p.suffix == ".md")
    shutil.copy(sample, duplicate)
    refused = tmp_path / "setup.exe"
    refused.write_bytes(b"MZ not a document")

    go(page, "Upload")
    expect(page.locator("#upload-hint")).to_contain_text(".pdf")
    page.set_input_files("#upload-input", [str(new), str(duplicate), str(refused)])
    items = page.locator("#upload-list > li")
    expect(items).to_have_count(3)
    first, second, third = items.nth(0), items.nth(1), items.nth(2)
    expect(third.locator(".upload-state")).to_contain_text("not a supported type")
    expect(first.locator(".upload-state")).to_contain_text("Indexed: 1 added", timeout=120_000)
    assert first.locator("progress").evaluate("p => p.value") == 100
    expect(first.locator(".upload-detail")).to_contain_text("passages in the index now")
    expect(second.locator(".upload-state")).to_contain_text("Duplicate: duplicate of", timeout=60_000)
    expect(second.get_by_role("button", name=f"Upload {duplicate.name} anyway")).to_be_visible()
    expect(page.locator("#upload-status")).to_have_attribute("aria-live", "polite")
    screenshot(page, "upload")

    titles = {d["title"] for d in api(live["base"], "/api/knowledge/documents")["documents"]}
    assert "Gadget care" in titles
    found = api(live["base"], "/api/knowledge/query", "POST", {"query": "how do I clean the zircon lens", "k": 3})
    assert found["results"] and found["results"][0]["title"] == "Gadget care"


def drop_file(page, name: str, text: str) -> None:
    """Drag a file onto the drop zone as a browser does: one DataTransfer holding a File, carried by
    dragenter, dragover and drop (Playwright hands the live object to each event)."""
    transfer = page.evaluate_handle("""([name, text]) => {
        const transfer = new DataTransfer();
        transfer.items.add(new File([text], name, { type: "text/markdown" }));
        return transfer;
    }""", [name, text])
    zone = page.locator("#drop-zone")
    zone.dispatch_event("dragenter", {"dataTransfer": transfer})
    zone.dispatch_event("dragover", {"dataTransfer": transfer})
    expect(zone).to_have_class(re.compile(r"\bdragging\b"))  # the zone shows it will take the file
    zone.dispatch_event("drop", {"dataTransfer": transfer})
    expect(zone).not_to_have_class(re.compile(r"\bdragging\b"))
    transfer.dispose()


def test_upload_by_drag_and_drop_shows_progress_to_indexed_then_a_second_drop_is_a_duplicate(page, live):
    name = "kiln-firing.md"
    text = ("# Kiln firing\n\n## Candling the bisque\n\nHold the kiln at 90 degrees for two hours with the lid "
            "propped open so the greenware dries before the bisque firing.\n" + MARKDOWN_FILLER)
    go(page, "Upload")
    drop_file(page, name, text)
    items = page.locator("#upload-list > li")
    expect(items).to_have_count(1)
    first = items.nth(0)
    expect(first).to_contain_text(name)
    expect(first.locator(".upload-state")).to_contain_text("Indexed: 1 added", timeout=120_000)
    assert first.locator("progress").evaluate("p => p.value") == 100
    expect(first.locator(".upload-detail")).to_contain_text("passages in the index now")

    drop_file(page, name, text)  # the same bytes again: the server's SHA-256 check answers 409
    expect(items).to_have_count(2)
    second = items.nth(1)
    expect(second.locator(".upload-state")).to_contain_text("Duplicate: duplicate of", timeout=60_000)
    expect(second.get_by_role("button", name=f"Upload {name} anyway")).to_be_visible()
    screenshot(page, "upload-drop")

    titles = [d["title"] for d in api(live["base"], "/api/knowledge/documents")["documents"]]
    assert titles.count("Kiln firing") == 1
    found = api(live["base"], "/api/knowledge/query", "POST", {"query": "how long to candle the bisque", "k": 3})
    assert found["results"] and found["results"][0]["title"] == "Kiln firing"


# ------------------------------------------------------------------ sources

def test_folder_source_can_be_added_edited_disabled_inspected_and_deleted(page, live, tmp_path):
    folder = tmp_path / "field-notes"
    folder.mkdir()
    (folder / "valve-notes.md").write_text("# Valve notes\n\n## Bleeding the radiator valve\n\nTurn the bleed key a "
                                           "quarter turn until water appears, then close it.\n" + MARKDOWN_FILLER)
    go(page, "Sources")
    expect(page.locator("#sources-body tr").first).to_be_visible()
    labelled(page, "sources")
    page.fill("#source-name", "field-notes")
    page.fill("#source-folder", str(folder))
    page.check("#source-sync")
    page.get_by_role("button", name="Add source").click()
    expect(page.locator("#sources-status")).to_contain_text("Synced field-notes: 1 added", timeout=120_000)
    row = page.locator('#sources-body tr[data-source="field-notes"]')
    expect(row.locator("td").nth(3)).to_have_text("1")

    # a bad folder: the server's 422 names the field
    page.fill("#source-name", "nowhere")
    page.fill("#source-folder", str(tmp_path / "does-not-exist"))
    page.get_by_role("button", name="Add source").click()
    expect(page.locator("#source-form-error")).to_contain_text("not an existing folder")
    expect(page.locator("#source-folder")).to_have_attribute("aria-invalid", "true")

    # edit: rename
    row.get_by_role("button", name="Edit field-notes").click()
    expect(page.locator("#source-form-heading")).to_have_text("Edit source field-notes")
    expect(page.locator("#source-folder")).to_be_disabled()
    page.fill("#source-name", "site-notes")
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator("#sources-status")).to_contain_text("Saved site-notes (changed name)")
    row = page.locator('#sources-body tr[data-source="site-notes"]')
    expect(row).to_have_count(1)

    # disable, then enable
    row.get_by_role("button", name="Disable site-notes").click()
    expect(page.locator("#sources-status")).to_contain_text("Disabled site-notes")
    expect(row.locator("td").first).to_have_text("folder (disabled)")
    expect(row.get_by_role("button", name="Sync site-notes now")).to_be_disabled()
    row.get_by_role("button", name="Enable site-notes").click()
    expect(row.locator("td").first).to_have_text("folder")

    # its detail page: documents, pages, passages, last sync
    row.get_by_role("link", name="Details of site-notes").click()
    expect(page.locator("#source-heading")).to_have_text("Source site-notes")
    expect(page.locator('.console-nav a[aria-current="page"]')).to_have_text("Sources")
    expect(page.locator("#source-docs tr")).to_have_count(1)
    expect(page.locator("#source-docs tr th")).to_have_text("Valve notes")
    stats = page.locator("#source-stats")
    expect(stats).to_contain_text("Documents")
    detail = api(live["base"], "/api/sources/site-notes")
    assert detail["statistics"]["chunks"] >= 1
    expect(page.locator("#source-docs tr td").nth(5)).to_have_text(str(detail["statistics"]["chunks"]))
    expect(page.locator("#source-last-sync")).to_contain_text("Added")
    screenshot(page, "source-detail")

    # delete, with a confirmation dialog
    page.get_by_role("link", name="All sources").click()
    row = page.locator('#sources-body tr[data-source="site-notes"]')
    row.get_by_role("button", name="Delete site-notes").click()
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Delete source site-notes?")
    expect(page.locator("#confirm-cancel")).to_be_focused()
    page.keyboard.press("Escape")  # cancel: nothing happens
    expect(dialog).to_be_hidden()
    expect(page.locator("#sources-status")).to_have_text("Nothing deleted.")
    row.get_by_role("button", name="Delete site-notes").click()
    page.get_by_role("button", name="Delete site-notes").last.click()
    expect(page.locator("#sources-status")).to_contain_text("Deleted site-notes: 1 documents left the index")
    expect(page.locator('#sources-body tr[data-source="site-notes"]')).to_have_count(0)
    assert "site-notes" not in {s["name"] for s in api(live["base"], "/api/sources")["sources"]}
    # a configured folder cannot be deleted here (it comes from the settings)
    expect(page.locator('#sources-body tr[data-source="docs"]').get_by_role("button", name="Delete docs")).to_have_count(0)
    screenshot(page, "sources")


def test_web_source_with_depth_rules_and_page_cap_shows_its_crawl_statistics(page, live):
    from tests.doc_site import DocSite

    with DocSite() as site:
        site.page("/guide/", "Kettle guide", [("start", "Start here", "Read the pages below in order.")],
                  links=["/guide/install", "/guide/faq", "/guide/private/keys"])
        site.page("/guide/install", "Installing the kettle", [("power", "Power", "Plug the kettle into a grounded socket.")])
        site.page("/guide/faq", "Kettle FAQ", [("why", "Why does it click?", "The thermostat opens at boiling point.")])
        site.page("/guide/private/keys", "Service keys", [("keys", "Keys", "Internal only.")])
        go(page, "Sources")
        page.get_by_label("Web site").check()
        expect(page.locator("#source-web-options")).to_be_visible()
        expect(page.locator("#source-folder")).to_be_hidden()
        labelled(page, "sources")
        page.fill("#source-name", "kettle-guide")
        page.fill("#source-url", site.url("/guide/"))
        page.fill("#source-depth", "7")
        page.get_by_role("button", name="Add source").click()
        expect(page.locator("#source-form-error")).to_contain_text("Depth must be a whole number from 0 to 5")
        expect(page.locator("#source-depth")).to_have_attribute("aria-invalid", "true")
        page.fill("#source-depth", "1")
        page.fill("#source-max-pages", "10")
        page.fill("#source-exclude", "/private/")
        page.check("#source-sync")
        page.get_by_role("button", name="Add source").click()
        expect(page.locator("#sources-status")).to_contain_text("Synced kettle-guide: 3 added", timeout=120_000)

        page.get_by_role("link", name="Details of kettle-guide").click()
        expect(page.locator("#source-heading")).to_have_text("Source kettle-guide")
        settings = page.locator("#source-settings")
        expect(settings).to_contain_text("/private/")
        expect(settings.locator("dd").nth(settings.locator("dt").all_inner_texts().index("Page cap"))).to_have_text("10")
        crawl = page.locator("#source-crawl")
        expect(page.locator("#source-crawl-heading")).to_be_visible()
        detail = api(live["base"], "/api/sources/kettle-guide")
        stats = detail["last_sync"]["crawl"]
        assert stats["fetched"] == 3 and stats["excluded"] == 1 and detail["config"]["depth"] == 1
        terms = crawl.locator("dt").all_inner_texts()
        expect(crawl.locator("dd").nth(terms.index("Fetched"))).to_have_text("3")
        expect(crawl.locator("dd").nth(terms.index("Excluded"))).to_have_text("1")
        titles = page.locator("#source-docs th").all_inner_texts()
        assert sorted(titles) == ["Installing the kettle", "Kettle FAQ", "Kettle guide"]
        screenshot(page, "source-web")
    api(live["base"], "/api/sources/kettle-guide", "DELETE")


# ------------------------------------------------------------------ failures

def test_failures_page_lists_reasons_and_retry_shows_the_job_result(page, live):
    go(page, "Failures")
    row = page.locator("#failures-body tr", has_text="broken-manual.pdf")
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(0)).to_have_text("docs")
    reason = row.locator("td").nth(2).inner_text()
    failure = next(f for f in api(live["base"], "/api/failures")["failures"] if f["path"].endswith("broken-manual.pdf"))
    assert failure["reason"] in reason and failure["kind"] in reason
    row.get_by_role("button", name="Retry", exact=False).click()
    expect(page.locator("#failures-status")).to_contain_text("Still failing: ", timeout=120_000)
    expect(page.locator("#failures-status")).to_contain_text("broken-manual.pdf")
    expect(page.locator("#failures-body tr", has_text="broken-manual.pdf")).to_have_count(1)  # still open
    screenshot(page, "failures")


# ------------------------------------------------------------------ settings

def test_settings_are_saved_in_tuned_json_and_used_by_the_server_and_the_search_page(page, live):
    base, index_dir = live["base"], live["settings"].index_dir
    go(page, "Settings")
    labelled(page, "settings")
    config = api(base, "/api/knowledge/config")
    offered = page.locator("#ranking-reranker option").evaluate_all("options => options.map(o => o.value)")
    assert offered == config["rerankers"] and "cross-encoder" not in offered
    expect(page.locator("#ranking-alpha-value")).to_have_text(f"{config['default_alpha']:.2f}")
    expect(page.locator("#ranking-fusion-source")).to_contain_text("built-in default")
    # which embedding model serves, and that no fine-tuning decision was taken yet on this index
    expect(page.locator("#model-facts")).to_contain_text(config["embedding_model"]["served_model_id"] + " \u2014 the base model")
    expect(page.locator("#model-facts")).to_contain_text("none yet")
    expect(page.locator("#model-facts")).to_contain_text("documents fp32, queries fp32, sentences embedded one by one")
    try:
        page.focus("#ranking-alpha")
        page.keyboard.press("ArrowLeft")
        page.keyboard.press("ArrowLeft")
        expected_alpha = round(config["default_alpha"] - 0.1, 2)
        expect(page.locator("#ranking-alpha-value")).to_have_text(f"{expected_alpha:.2f}")
        page.select_option("#ranking-fusion", "rrf")
        page.select_option("#ranking-reranker", "mmr")
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator("#ranking-status")).to_contain_text(f"Saved. Searches that do not choose their own now use "
                                                                f"alpha {expected_alpha:.2f}, rrf fusion, reranker mmr")
        expect(page.locator("#ranking-fusion-source")).to_contain_text("set here")

        config = api(base, "/api/knowledge/config")
        assert (config["default_alpha"], config["default_fusion"], config["default_reranker"]) == (expected_alpha, "rrf", "mmr")
        assert config["ranking_sources"]["alpha"] == config["ranking_sources"]["fusion"] == "console"
        assert load_manual(index_dir).values == {"alpha": expected_alpha, "fusion": "rrf", "reranker": "mmr"}
        assert json.loads(tuned_path(index_dir).read_text())["manual"]["reranker"] == "mmr"
        screenshot(page, "settings")

        # persisted: a fresh page shows the stored values; the Search page's defaults follow
        page.reload()
        expect(page.locator("#ranking-fusion")).to_have_value("rrf")
        expect(page.locator("#ranking-reranker")).to_have_value("mmr")
        go(page, "Search")
        expect(page.locator("#ranking-defaults")).to_contain_text("rrf fusion")
        expect(page.locator("#ranking-defaults")).to_contain_text("set in Settings")
        expect(page.locator("#reranker")).to_have_value("mmr")
        page.fill("#q", "how do I reset the Aurora to factory settings")
        page.press("#q", "Enter")
        expect(page.locator("#results > li").first).to_be_visible()
        logged = api(base, "/api/knowledge/query", "POST", {"query": "wiring terminals", "k": 2})["params"]
        assert (logged["alpha"], logged["fusion"], logged["reranker"]) == (expected_alpha, "rrf", "mmr")

        # reset (confirmed) goes back to the built-in defaults
        go(page, "Settings")
        page.get_by_role("button", name="Reset to built-in defaults").click()
        page.locator("#confirm-ok").click()
        expect(page.locator("#ranking-status")).to_contain_text("Back to the built-in defaults")
        config = api(base, "/api/knowledge/config")
        assert config["default_fusion"] == live["settings"].default_fusion and config["default_reranker"] == "none"
        assert not tuned_path(index_dir).exists()
    finally:
        api(base, "/api/knowledge/ranking", "DELETE")


# ------------------------------------------------------------------ evaluation

def seed_evaluation_results(data_dir: Path) -> None:
    """Write what the evaluation assets write, through the functions they write with (knowledge_store.evaluation.results_store), and an
    alpha sweep table and plot where the alpha_sweep notebook puts them (same file names and columns)."""
    from knowledge_store.evaluation.log_replay import ReplayReport, ReplayRow
    from knowledge_store.evaluation.results_store import (
        EvalRun,
        QuestionHits,
        record_drift,
        record_eval_results,
        record_feedback_eval,
        results_path,
    )
    from knowledge_store.storage.store import utcnow

    path = results_path(data_dir)
    earlier = utcnow() - timedelta(days=1)
    rows = []
    for run, when, recall in (("run-1", earlier, 0.80), ("run-2", utcnow(), 0.76)):
        for configuration, alpha, fusion, ndcg in (("bm25", 0.0, "weighted", 0.61), ("hybrid", 0.7, "weighted", 0.71)):
            rows.append(EvalRun(
                run_id=run, dataset="scifact", split="test", configuration=configuration, alpha=alpha, fusion=fusion,
                reranker="none", queries=300, created_at=when, metrics={
                    "recall@5": recall if configuration == "hybrid" else 0.7, "ndcg@10": ndcg, "mrr@10": 0.66,
                    "precision@5": 0.17, "ragas_recall@5": recall if configuration == "hybrid" else 0.7,
                    "grounding": 0.91, "latency_p50_ms": 9.0, "latency_p95_ms": 15.5}))
    record_eval_results(path, rows)
    # the example questions, as `groundwork eval --sample` records them: one found second, one not in the first 5
    def hit(rank, relevant):
        return {"rank": rank, "document": "aurora-faq.md", "judged_as": "answering section" if relevant else f"u{rank}",
                "relevant": relevant, "title": "Aurora FAQ", "section": f"Section {rank}", "chunk_id": f"c{rank}",
                "holds_answer": relevant}
    record_eval_results(path, [EvalRun(run_id="run-sample", dataset="sample corpus", split="example questions",
                                       configuration="served", queries=2, created_at=utcnow(),
                                       metrics={"recall@5": 0.5, "ndcg@10": 0.32})],
                        questions=[QuestionHits("q1", "Does the Aurora need a C-wire?", "aurora-faq.md \u203a C-wire", 2,
                                                {"recall@5": 1.0}, [hit(1, False), hit(2, True), hit(3, False)]),
                                   QuestionHits("q2", "What does error E47 mean?", "troubleshooting \u203a Error codes",
                                                None, {"recall@5": 0.0}, [hit(r, False) for r in range(1, 6)])])
    record_feedback_eval(path, "run-fb", utcnow(), {"samples": 4, "samples_with_references": 3, "recall@5": 0.67,
                                                    "unhelpful_passages_in_top5": 1},
                         [{"alpha": 0.7, "fusion": "weighted", "reranker": "none", "up": 3, "down": 1, "rated": 4,
                           "requests": 3, "helpful_rate": 0.75},
                          {"alpha": 0.3, "fusion": "rrf", "reranker": "mmr", "up": 1, "down": 1, "rated": 2,
                           "requests": 1, "helpful_rate": 0.5}])
    report = ReplayReport(queries=2, mean_overlap=0.9, changed_queries=1, per_query=[
        ReplayRow("r1", "what does error E42 mean", 0.8, added=["c9"], removed=["c2"], logged_snapshot=1, current_snapshot=2),
        ReplayRow("r2", "<b>pair</b> a sensor", 1.0, logged_snapshot=1, current_snapshot=2)])
    record_drift(path, "run-drift", utcnow(), report)
    sweep = data_dir / "notebooks" / "alpha_sweep-20260102T030405Z"
    sweep.mkdir(parents=True)
    lines = ["alpha,method,recall@5,ndcg@10,mrr@10,precision@5,p95_ms"]
    for alpha, recall, ndcg in ((0.0, 0.70, 0.61), (0.5, 0.78, 0.69), (0.7, 0.80, 0.71), (1.0, 0.74, 0.66)):
        lines.append(f"{alpha},hybrid alpha={alpha:g},{recall},{ndcg},0.6,0.16,14.0")
    (sweep / "alpha_sweep_scifact_test.csv").write_text("\n".join(lines) + "\n")


def test_evaluation_page_shows_an_empty_state_then_what_the_evaluation_wrote(page, live):
    go(page, "Evaluation")
    expect(page.locator("#evaluation-empty")).to_be_visible()
    expect(page.locator("#evaluation-empty-text")).to_contain_text("groundwork eval")
    expect(page.locator("#scorecard-panel")).to_be_hidden()
    screenshot(page, "evaluation-empty")

    seed_evaluation_results(live["settings"].data_dir)
    page.reload()
    expect(page.locator("#evaluation-empty")).to_be_hidden()
    expect(page.locator("#scorecards table")).to_have_count(2)  # scifact and the example questions
    table = page.locator("#scorecards table", has=page.locator("caption", has_text="scifact (test)"))
    expect(table.locator("caption")).to_have_text("scifact (test)")
    hybrid = table.locator("tbody tr", has=page.locator("th", has_text="hybrid"))
    expect(hybrid.locator("td").nth(4)).to_have_text("0.760 (\u22120.040)")  # Recall@5 and its drop since the last run
    expect(hybrid.locator("td .delta.worse")).to_have_count(1)
    expect(table.locator("tbody tr")).to_have_count(2)

    chart = page.locator("#sweeps svg")
    expect(chart).to_have_count(1)
    assert chart.get_attribute("role") == "img"
    expect(chart.locator("polyline")).to_have_count(2)
    expect(page.locator("#sweeps desc")).to_contain_text("nDCG@10 best 0.710 at alpha 0.70")
    expect(page.locator("#sweeps figcaption")).to_contain_text("scifact (test)")

    expect(page.locator("#helpful-summary")).to_have_text("67% helpful")
    expect(page.locator("#helpful-body tr")).to_have_count(2)
    expect(page.locator("#drift-summary")).to_have_text("Top-5 overlap 0.90")
    expect(page.locator("#drift-body tr")).to_have_count(1)
    expect(page.locator("#drift-body th")).to_have_text("what does error E42 mean")
    # the questions: the caption's count is the scorecard's Recall@5, a tick only where the table says it was found
    questions = page.locator("#questions table")
    expect(questions.locator("caption")).to_contain_text("1 of 2 found in the first 5 (Recall@5 0.500)")
    expect(questions.locator("li.relevant")).to_have_count(1)
    expect(questions.locator("li.relevant")).to_contain_text("Section 2 \u2713")
    expect(questions.locator("tbody tr").nth(1).locator("td").nth(1)).to_have_text("not in the first 5")
    assert page.locator("#view-evaluation b").count() == 0
    screenshot(page, "evaluation")
