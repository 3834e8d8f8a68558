# One command each: `make quick` (set up + main job), `make test` (set up + tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: setup quick test test-slow lint mutants clean

# Two stamps: the quick run needs mecheval alone; the tests also need the dev, ray and
# tensorboard extras (scipy, pytest, ruff, Ray, TensorBoard's reader), which would add a good
# part of the install to `make quick`.
$(BIN)/mecheval: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.extras: $(BIN)/mecheval
	$(BIN)/pip install -q -e '.[dev,ray,tensorboard]'
	touch $@

setup: $(VENV)/.extras

quick: $(BIN)/mecheval
	$(BIN)/mecheval reproduce ar --preset quick --workers 2

# The tests in up to four processes (two on a 2-core machine; the tests of one xdist_group in
# one of them); `pytest` alone runs them all in this one. `make test` runs all but the
# end-to-end tests marked `slow` (pyproject.toml), `make test-slow` those, CI both.
PYTEST := $(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadgroup

test: setup
	$(PYTEST) -m "not slow"

test-slow: setup
	$(PYTEST) -m slow

lint: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

# Named mutants of the core (scripts/mutants.py): each must make its tests fail. Minutes; not
# part of `make test`.
mutants: setup
	$(BIN)/python scripts/mutants.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
