# Two commands on a fresh machine: `make demo` runs the router end to end, `make test` runs the tests.
# Both create the virtual environment and install everything they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test lint clean

$(BIN)/chatwoot-router: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/chatwoot-router kafka --fetch-only
	@touch $@

install: $(BIN)/chatwoot-router

demo: install
	$(BIN)/chatwoot-router demo

# the whole suite in stages, fastest first (tests/stages.py, docs/testing.md); `$(BIN)/pytest` alone runs it all too
test: install
	$(BIN)/python -m tests.stages

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
