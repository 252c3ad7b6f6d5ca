"""The HTTP API, one ``APIRouter`` per domain; ``create_app`` includes them in this order.

- ``knowledge``: query, ask, ask-local, feedback, config
- ``ingestion``: upload and job status
- ``sources``: the source registry (CRUD, sync) and ingestion failures (list, retry)
- ``documents``: documents, relations, original files, knowledge-base articles
- ``server/admin_api.py``: the console's ranking settings and the evaluation summary
- ``operations``: health and Prometheus metrics
- ``console``: the console page and the docs-site widget script (not in the schema)

Handlers reach the app's state through the ``State`` dependency (``server/state.py``).
"""
