# Fresh machine: `make demo` (main job) and `make test` create .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint install mutation

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch first, so nothing pulls the multi-GB CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/harnesslab demo

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Mutation testing of the trusted modules (tests/mutation/config.toml): a table of mutants
# killed per module; fails below a module's threshold. MUTATION_ARGS="-m ledger" for one module,
# "--changed --budget-s 300" for what CI runs.
mutation: $(STAMP)
	$(PY) tests/mutation/mutate.py $(MUTATION_ARGS)
