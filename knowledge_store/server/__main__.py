"""``python -m knowledge_store.server [serve|mcp]``: the process `groundwork serve` and `groundwork mcp` become.

The CLI checks the settings it was given, puts its options into the environment (``GROUNDWORK_*``) and
replaces itself with this module, so the server is started by name, the way Dagster jobs are: the CLI does
not import the server, and a command line, a container or a process manager starts it the same way.
"""

from __future__ import annotations

import sys

from knowledge_store.config.settings import Settings
from knowledge_store.server.mcp_server import run_stdio


def main(argv: list[str] | None = None) -> int:
    command = (argv if argv is not None else sys.argv[1:] or ["serve"])[0]
    settings = Settings()
    if command == "mcp":
        run_stdio(settings)
        return 0
    if command != "serve":
        print(f"error: unknown command {command!r}: serve or mcp", file=sys.stderr)
        return 2
    # `serve` mounts the MCP endpoint too; `mcp` (stdio) needs no HTTP app
    from knowledge_store.server.app import serve  # noqa: PLC0415 - FastAPI and the routes, ~0.5 s, only to serve

    scheme = "https" if settings.ssl_certfile else "http"
    print(f"Groundwork API and console on {scheme}://{settings.server_host}:{settings.server_port} "
          f"(OpenAPI /docs, MCP /mcp); data dir {settings.data_dir}", file=sys.stderr, flush=True)
    serve(settings, announce=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
