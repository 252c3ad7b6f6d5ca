"""The Knowledge Grounding Console (``/``, files under ``/static``) and the docs-site chat widget
(``/widget.js``, docs/WIDGET.md).  Not part of the API schema; without the static folder (a stripped
install) ``/`` leads to the API docs instead."""

# no ``from __future__ import annotations``: FastAPI reads the parameter annotations as objects
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.staticfiles import NotModifiedResponse

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
# /widget.js: cached briefly and revalidated by ETag (a new release reaches pages within minutes); embeddable
# by pages that set Cross-Origin-Embedder-Policy; never sniffed as anything but JavaScript
WIDGET_HEADERS = {"Cache-Control": "public, max-age=600, must-revalidate", "Cross-Origin-Resource-Policy": "cross-origin",
                  "X-Content-Type-Options": "nosniff"}

router = APIRouter(include_in_schema=False)


@router.get("/")
def console() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@router.get("/widget.js")
def chat_widget(request: Request) -> Response:
    """The embeddable docs-site chat widget (docs/WIDGET.md): one ``<script src=".../widget.js">`` on any
    page.  Loaded cross-origin by a classic script tag (no ``Origin`` header, so the origin policy serves
    it to any page; its API calls are what ``GROUNDWORK_CORS_ORIGINS`` governs).  Revalidation by ETag
    answers 304, so every page view of a docs site costs a header exchange, not the script."""
    path = STATIC_DIR / "widget.js"
    response = FileResponse(path, media_type="text/javascript; charset=utf-8", headers=WIDGET_HEADERS,
                            stat_result=path.stat())
    wanted = {tag.strip().removeprefix("W/") for tag in request.headers.get("if-none-match", "").split(",")}
    if response.headers["etag"] in wanted or "*" in wanted:
        return NotModifiedResponse(response.headers)
    return response


def root() -> RedirectResponse:
    return RedirectResponse("/docs")


def install_console(app: FastAPI) -> None:
    """Serve the console and the widget from ``static/``, or redirect ``/`` to ``/docs`` when it is absent."""
    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
        app.include_router(router)
    else:
        app.add_api_route("/", root, methods=["GET"], include_in_schema=False)
