# The two set-up commands of the README: `make demo` (main job) and `make test` (the suite).
# Both build .venv first. On CPU machines torch is installed first as the CPU build (2.13.0), so that
# nothing pulls a multi-GB CUDA build.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# bench/ joins the lint once it exists.
LINT := olmo_repo scripts tests $(wildcard bench)

.PHONY: install test lint demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

test: install
	$(BIN)/ruff check $(LINT)
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check $(LINT)
	$(BIN)/ruff format --check $(LINT)

demo: install
	$(BIN)/python scripts/demo.py

clean:
	rm -rf $(VENV) runs
