"""The ingestion stages, one module each, as plain functions over the store.

Every stage reads what the previous one wrote and is safe to re-run: a run
killed at any point leaves the last published index untouched, and the next
run picks up exactly the work that is missing (see docs/ARCHITECTURE.md).

    scan_sources -> record_raw_documents -> parse_pending -> chunk_parsed
        -> embed_missing -> publish_index

Dagster assets in ``pipelines/`` call these; so do the tests and the CLI.
"""
