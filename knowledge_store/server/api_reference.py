"""docs/API.md, written from the served OpenAPI schema so the reference cannot drift.

Why generated: the routes, their parameters and every field of every request and
response model already carry types and descriptions (they are what `/docs` shows
and what the schemathesis run checks).  A hand-written reference went stale with
each added field; this one is rebuilt from the same schema and
``tests/integration/test_api_reference.py`` fails when docs/API.md differs from it.

    python -m knowledge_store.server.api_reference [--write] [--check]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from knowledge_store.config.settings import Settings
from knowledge_store.retrieval.engine import RetrievalEngine
from knowledge_store.server.access import PATH_SURFACES, WHY_PUBLIC
from knowledge_store.server.api_models import COMMON_ERRORS
from knowledge_store.server.app import create_app

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "API.md"
METHODS = ("get", "post", "put", "patch", "delete")

HEADER = """# HTTP API reference

Generated from the served OpenAPI schema by `python -m knowledge_store.server.api_reference --write`
(`tests/integration/test_api_reference.py` fails when this file is stale). The live schema is at
`/openapi.json` and browsable at `/docs` on a running `groundwork serve` (not in remote mode). The MCP tools are
in docs/MCP.md.

Conventions: every error has the body `{error, message}` (422 adds `errors: [{field, message}]`);
the server answers from the moment it starts: while its embedding model loads (on a fresh data folder it is
first exported to ONNX and quantised, a minute or two) `/health` is `degraded` with the model `loading` and
the routes that embed a query answer **503** `model_loading` with `Retry-After` (the estimated seconds until
it is ready); a model that failed to load is `error` in `/health` and 503 `model_load_failed` on those routes;
timestamps are ISO-8601; the `reranker` and `answer` enums list what this server can run
(a cross-encoder appears when `GROUNDWORK_CROSS_ENCODER_PATH` is set, `llm` when an
OpenAI-compatible endpoint is configured). Contracts other systems build on: `/api/kb/articles` (articles),
`/api/ask`, `/api/ask-local` (questions and answers with sources), citations with `rev_label`, `valid_from`,
`valid_to` and entities (the document model), `/metrics` and `/health` (operations).
"""


def served_schema(embedder: Any = None) -> dict[str, Any]:
    """The OpenAPI document of an app over an empty data folder (the schema does not depend on data).

    ``embedder``: a query embedder to reuse (tests); else the configured one is made (never loaded: building
    the schema needs no model)."""
    with tempfile.TemporaryDirectory(prefix="gw-api-reference-") as tmp:
        settings = Settings(data_dir=Path(tmp), cross_encoder_path=None, llm_base_url=None, llm_model=None)
        engine = RetrievalEngine(settings, embedder=embedder) if embedder is not None else None
        return create_app(settings, engine, mount_mcp=False).openapi()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def type_of(schema: dict[str, Any]) -> str:
    """A short, readable type: `string`, `integer[]`, `Citation`, `string | null`, enum values."""
    if not schema:
        return "any"
    if "$ref" in schema:
        return f"[{_ref_name(schema['$ref'])}](#{_ref_name(schema['$ref']).lower()})"
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " \\| ".join(dict.fromkeys(type_of(option) for option in schema[key]))
    kind = schema.get("type")
    if kind == "array":
        inner = type_of(schema.get("items", {}))
        return f"{inner}[]" if " " not in inner else f"({inner})[]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"object of {type_of(extra)}" if isinstance(extra, dict) and extra else "object"
    if isinstance(kind, list):
        return " \\| ".join(kind)
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt and kind else str(kind or "any")


def _cell(text: Any) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _limits(schema: dict[str, Any]) -> str:
    parts = []
    for key, label in (("minimum", "≥"), ("maximum", "≤"), ("exclusiveMinimum", ">"), ("minLength", "min length "),
                       ("maxLength", "max length "), ("maxItems", "max items ")):
        if key in schema:
            parts.append(f"{label}{schema[key]}")
    if "default" in schema and schema["default"] not in (None, [], {}):
        parts.append(f"default `{schema['default']}`")
    return ", ".join(parts)


def _fields_table(schema: dict[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    if not properties:
        return ["(no fields)" if schema.get("type") == "object" else f"type: {type_of(schema)}", ""]
    required = set(schema.get("required", []))
    lines = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in properties.items():
        limits = _limits(prop)
        description = _cell(prop.get("description", "")) + (f" ({limits})" if limits else "")
        lines.append(f"| `{name}` | {type_of(prop)} | {'yes' if name in required else ''} | {description} |")
    return lines + [""]


def _body_schema(content: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    for media, value in content.items():
        return media, value.get("schema", {})
    return None


SURFACES_TEXT = """## Who may call what

Every route belongs to one of two surfaces (`knowledge_store/server/access.py`; a route with no surface stops the
server at start-up, and a test walks this schema for them):

- **public**: what a docs site's readers need. Callers without the admin token are answered, cited and served
  files only from sources whose `visibility` is `public`, and each client address may make
  `GROUNDWORK_PUBLIC_RATE` requests per second (burst `GROUNDWORK_PUBLIC_BURST`) to the public `/api/` routes:
  over it, **429** with `Retry-After`.
- **admin**: everything that registers, changes, syncs, uploads, deletes, retries, reads settings, jobs, logs or
  evaluation results, or lists the whole store. It needs `Authorization: Bearer <GROUNDWORK_ADMIN_TOKEN>`
  whenever a token is configured and always in remote mode (`GROUNDWORK_ALLOW_REMOTE=true`, which generates one
  into `<data_dir>/admin_token` when none is set); without it, **401** (the same answer for a missing and a wrong
  token). On loopback with no token set, the admin surface is open. A token that is sent and wrong is 401 on
  any route.
"""


def _surfaces_section(schema: dict[str, Any]) -> list[str]:
    """The table of every route and path with its surface, from the schema's ``x-surface`` and the paths
    outside the schema (``access.PATH_SURFACES``)."""
    lines = [SURFACES_TEXT, "| route | surface | note |", "|---|---|---|"]
    for path, item in schema.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                surface = item[method].get("x-surface", "?")
                note = WHY_PUBLIC.get(path, "") if surface == "public" else ""
                if path == "/metrics":
                    note = "public with GROUNDWORK_PUBLIC_METRICS=true"
                lines.append(f"| `{method.upper()} {path}` | {surface} | {note} |")
    for prefix, surface in PATH_SURFACES:
        lines.append(f"| `{prefix}{'*' if prefix.endswith('/') and prefix != '/' else ''}` (outside the schema) | {surface} | |")
    return lines + ["", "The console's page (`/`) and files are public: they hold no data; each of its pages asks the "
                        "API, which checks.", ""]


def render(schema: dict[str, Any]) -> str:
    """The Markdown reference: endpoints grouped by tag, then every model's fields.

    The error statuses every route can answer (``COMMON_ERRORS``) are listed once; each
    endpoint lists its success and its own error statuses, and a common status it says more about
    (the 503 of the routes that embed a query)."""
    common = {str(status): entry["description"] for status, entry in COMMON_ERRORS.items()}
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in schema.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                operation = item[method]
                tag = (operation.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((path, method, operation))
    out = [HEADER, "Errors any route can answer:", "", "| status | meaning |", "|---|---|"]
    for status in sorted(common):
        out.append(f"| {status} | {_cell(common[status])} |")
    out += ["", *_surfaces_section(schema), "## Endpoints", ""]
    for tag in by_tag:
        out.append(f"- **{tag}**: " + ", ".join(f"`{m.upper()} {p}`" for p, m, _ in by_tag[tag]))
    out.append("")
    for tag, operations in by_tag.items():
        out += [f"## {tag}", ""]
        for path, method, operation in operations:
            out += [f"### `{method.upper()} {path}`", "", f"Surface: **{operation.get('x-surface', '?')}**.", ""]
            summary = operation.get("summary", "")
            description = operation.get("description", "")
            if description:
                out += [description.strip(), ""]
            elif summary:
                out += [summary, ""]
            parameters = operation.get("parameters", [])
            if parameters:
                out += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
                for parameter in parameters:
                    param_schema = parameter.get("schema", {})
                    limits = _limits(param_schema)
                    text = _cell(parameter.get("description", param_schema.get("description", "")))
                    out.append(f"| `{parameter['name']}` | {parameter['in']} | {type_of(param_schema)} | "
                               f"{'yes' if parameter.get('required') else ''} | {text}{f' ({limits})' if limits else ''} |")
                out.append("")
            body = operation.get("requestBody")
            if body:
                media, body_schema = _body_schema(body.get("content", {})) or ("", {})
                out += [f"Request body (`{media}`): {type_of(body_schema)}", ""]
            responses = operation.get("responses", {})
            rows = []
            for status in sorted(responses):
                response = responses[status]
                if common.get(status) == response.get("description") or status == "401":  # 401: "Who may call what"
                    continue
                found = _body_schema(response.get("content", {}))
                kind = f"{type_of(found[1])} (`{found[0]}`)" if found else ""
                headers = ", ".join(f"`{name}` header" for name in response.get("headers", {}))
                rows.append(f"| {status} | {kind}{' + ' + headers if headers else ''} | "
                            f"{_cell(response.get('description', ''))} |")
            out += ["| status | body | meaning |", "|---|---|---|", *rows, ""]
    components = schema.get("components", {}).get("schemas", {})
    out += ["## Models", ""]
    for name in sorted(components):
        model = components[name]
        out += [f"### {name}", ""]
        if model.get("description"):
            out += [_cell(model["description"]), ""]
        out += _fields_table(model)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {REFERENCE}")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs from the schema")
    args = parser.parse_args(argv)
    text = render(served_schema())
    if args.write:
        REFERENCE.write_text(text)
        print(f"wrote {REFERENCE} ({len(text.splitlines())} lines)")
    elif args.check:
        current = REFERENCE.read_text() if REFERENCE.is_file() else ""
        if current != text:
            print(f"{REFERENCE} is stale: run python -m knowledge_store.server.api_reference --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
