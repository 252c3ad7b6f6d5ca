"""Dagster definitions for Groundwork: ``dagster dev -w workspace.yaml`` or ``-m pipelines``."""

from pipelines.definitions import build_definitions, defs

__all__ = ["build_definitions", "defs"]
