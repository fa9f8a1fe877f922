# Two entry points for a fresh machine: `make demo` (set up, then pretrain the tiny TISA model on the embedded
# corpus) and `make test` (set up with the peer-reference extras, then run the test suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
WORKDIR ?= runs/demo

.PHONY: demo test test-all install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# The CPU build of torch first, so that the test extra's `torch` requirement does not pull a CUDA build.
$(VENV)/.installed-test: pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(BIN)/jaxpos train --config configs/mlm/tiny.py --workdir $(WORKDIR)

# Two workers: the suite is dominated by single-threaded XLA compiles.
test: $(VENV)/.installed-test
	$(BIN)/lint-imports
	JAX_PLATFORMS=cpu $(BIN)/python -m pytest -x -q -n 2 -m "not slow" --durations=15

test-all: $(VENV)/.installed-test
	$(BIN)/lint-imports
	JAX_PLATFORMS=cpu $(BIN)/python -m pytest -x -q -n 2

clean:
	rm -rf $(VENV) runs
