# ragrpc — see README.md. Every target installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
TORCH_PIN := torch==2.13.0
PYTEST_ARGS ?=

export RAGRPC_MILVUS_URI ?= http://127.0.0.1:19530

.PHONY: install proto proto-check config-doc run stop run-milvus run-ingest run-query demo test test-fast \
        test-reliability eval bench lint clean status

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# CPU torch first (a plain `torch` requirement would pull a multi-GB CUDA build)
	$(PIP) install --quiet $(TORCH_PIN)
	$(PIP) install --quiet -e ".[server,dev,tracing]"
	touch $(STAMP)

proto: $(STAMP)
	PYTHON=$(PY) bash scripts/gen_protos.sh

proto-check: $(STAMP)
	PYTHON=$(PY) bash scripts/proto_check.sh

config-doc: $(STAMP)
	$(PY) -m scripts.configuration_doc

run: $(STAMP)
	bash scripts/stack.sh start

stop:
	bash scripts/stack.sh stop

status:
	bash scripts/stack.sh status

run-milvus: $(STAMP)
	mkdir -p data/milvus
	$(VENV)/bin/milvus-lite server --data-dir data/milvus --host 127.0.0.1 --port $${RAGRPC_MILVUS_PORT:-19530}

run-ingest: $(STAMP)
	$(PY) -m ingest_service

run-query: $(STAMP)
	$(PY) -m query_service

demo: $(STAMP)
	bash scripts/demo.sh

test: $(STAMP)
	@# the whole suite (unit, gRPC, integration with milvus-lite + the real model, end-to-end);
	@# pytest's exit code 5 (no tests collected) counts as a failure
	$(PY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: no tests were collected" >&2; exit 1; fi; exit $$rc

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not e2e and not reliability" $(PYTEST_ARGS)

test-reliability: $(STAMP)
	$(PY) -m pytest -q -m reliability --run-reliability $(PYTEST_ARGS)

eval: $(STAMP)
	$(PY) -m scripts.eval $(EVAL_ARGS)

bench: $(STAMP)
	$(PY) -m scripts.bench $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy ragrpc ingest_service query_service clients
	$(VENV)/bin/buf lint
	PYTHON=$(PY) bash scripts/proto_check.sh
	$(PY) -m scripts.configuration_doc --check

clean:
	rm -rf data/ .pytest_cache .mypy_cache .ruff_cache
