"""Serving: the HTTP API (FastAPI) and the MCP server."""
