# The README's commands: `make demo` (`make demo-ingest DURATION=...` for the sensors alone), `make test`
# (`make test-fast` while editing), `make bench`.
# Each sets up .venv first when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DURATION ?= 30
BENCH_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo demo-ingest test test-fast lint format bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[all,test,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python deploy/demo.py --duration $(DURATION)

# the ingest-only demo (sensors -> gateway -> cloud, the exactly-once accounting) for longer soaks
demo-ingest: $(STAMP)
	$(BIN)/python deploy/demo.py --ingest-only --duration $(DURATION)

# The whole gate: every static check, then every test.
test: lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The edit-run loop: ruff and the tests not marked slow (no torchrun, no browser, no crash sweeps).
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Every benchmark in bench/ (helpers there start with "_"); BENCH_ARGS=--quick for the short runs.
bench: $(STAMP)
	@set -e; for b in bench/[!_]*.py; do \
	  name=$$(basename $$b .py); echo "== bench.$$name"; $(BIN)/python -m bench.$$name $(BENCH_ARGS); \
	done

clean:
	rm -rf $(VENV) demo-data .pytest_cache .ruff_cache .mypy_cache
