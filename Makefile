# `make demo` and `make test` each set up .venv when missing (torch pinned first), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
TORCH_PIN := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup test test-unit test-slow demo lint bench docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project metadata changes; a second run is a no-op.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# Two processes (pytest-xdist; a file's tests stay together): CI's machine has two cores.
test: $(STAMP)
	$(PY) -m pytest -m "not slow and not gpu" -n 2 --dist loadfile $(PYTEST_ARGS)

# The same without the integration tests (subprocesses, DDP workers): a quick check.
test-unit: $(STAMP)
	$(PY) -m pytest -m "not slow and not gpu and not integration" -n 2 --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m "slow" $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m experiments.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) -m experiments.bench_sim

# The docs extra (MkDocs, Material, mkdocstrings) on top of the project's install (torch pinned first).
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,docs]"
	touch $(DOCS_STAMP)

# The site in site/ (mkdocs.yml); strict: a broken link or anchor, a page left out of the nav or a
# docstring mkdocstrings cannot read fails the build.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache outputs multirun site
