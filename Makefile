# dayzero: `make run` serves the built-in tiny checkpoint, `make test` runs lint + tests.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test run bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check shared services tests bench
	$(BIN)/ruff format --check shared services tests bench
	TRITON_INTERPRET=1 $(BIN)/pytest -q

run: $(STAMP)
	$(BIN)/dayzero up --example

bench: $(STAMP)
	$(BIN)/python bench/model.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
