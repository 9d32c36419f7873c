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

# Three test processes on two cores (a quarter of the suite waits: stacks starting, bounds running
# out), pytest-xdist (tests/xdist_groups.py keeps a file, and the files that share a stack, in one),
# one torch intra-op thread each: several torch processes run at once on CI's two cores (stack
# workers, in-process references), where two threads each spin-wait against the others. The 30
# slowest tests are listed at the end: the suite's time cap (20 min on two cores) is planned from them.
test: $(STAMP)
	$(BIN)/ruff check shared services tests bench
	$(BIN)/ruff format --check shared services tests bench
	OMP_NUM_THREADS=1 TRITON_INTERPRET=1 $(BIN)/pytest -q -n 3 --durations=30

run: $(STAMP)
	$(BIN)/dayzero up --example

bench: $(STAMP)
	$(BIN)/python bench/model.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
