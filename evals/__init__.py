"""Evaluation as data: suites (``evals/suites``), set manifests (``evals/sets``), the committed regression baseline
(``evals/baseline.json``), the experiments (``evals.experiments``) and their results of record (``evals/results``).
Not part of the wheel; the metric code and runners live in ``knowledge_store.evaluation``."""
