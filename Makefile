# Groundwork: two commands do everything on a fresh machine with Python 3.11, pip and make.
#   make run   - create .venv, install, ingest the default corpus, start the Dagster UI
#   make test  - create .venv if needed, install, run the whole test suite
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/data/dagster_home
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAGAS_DO_NOT_TRACK := true
export DAGSTER_DISABLE_TELEMETRY := 1
DAGSTER_HOST ?= 127.0.0.1
DAGSTER_PORT ?= 3000

.PHONY: run test install ingest dagster status clean bench

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (Python 3.11 is required)"; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: it resolves to the local CPU wheel; anything else pulls GBs of CUDA
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

$(DAGSTER_HOME)/dagster.yaml: pipelines/dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp pipelines/dagster.yaml $(DAGSTER_HOME)/dagster.yaml

ingest: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/groundwork ingest

status: $(STAMP)
	$(BIN)/groundwork status

dagster: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -w workspace.yaml -h $(DAGSTER_HOST) -p $(DAGSTER_PORT)

run: ingest
	@echo "Dagster UI: http://$(DAGSTER_HOST):$(DAGSTER_PORT)"
	$(BIN)/dagster dev -w workspace.yaml -h $(DAGSTER_HOST) -p $(DAGSTER_PORT)

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/ingest_throughput.py

clean:
	rm -rf data/index data/store.duckdb* data/dagster_home
