"""What a plain install (``pip install groundwork``, no extras) must bring: every third-party package the library
or the Dagster project imports, deferred imports included, is a main dependency of pyproject.toml - an extra
(``test``, ``bench``) is for tests and benchmarks only."""

from __future__ import annotations

import ast
import re
import tomllib
from importlib.metadata import packages_distributions

from tests.helpers import REPO_ROOT


def _name(requirement: str) -> str:
    """``"playwright==1.65.2"`` -> ``"playwright"`` (PEP 503 normalised)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()


def _imported_modules(path) -> set[str]:
    """Top-level names of the absolute imports anywhere in a module (inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_library_or_pipeline_module_imports_a_package_only_an_extra_installs():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    main = {_name(req) for req in project["dependencies"]}
    extra_only = {_name(req) for group in project["optional-dependencies"].values() for req in group} - main
    distributions = packages_distributions()
    offenders = sorted(
        (path.relative_to(REPO_ROOT).as_posix(), module, dist)
        for folder in ("knowledge_store", "pipelines")
        for path in (REPO_ROOT / folder).rglob("*.py")
        for module in _imported_modules(path)
        for dist in distributions.get(module, [])
        if _name(dist) in extra_only
    )
    assert offenders == [], offenders


def test_playwright_for_render_js_is_a_pinned_main_dependency():
    """render_js web sources run the system Chromium through Playwright (no browser is ever downloaded)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = [req for req in project["dependencies"] if _name(req) == "playwright"]
    assert len(pins) == 1 and re.fullmatch(r"playwright==\d+(\.\d+)+", pins[0]), pins
    assert "playwright" in _imported_modules(REPO_ROOT / "knowledge_store" / "ingest" / "web" / "render.py")
