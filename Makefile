# The README's two commands: `make demo` and `make test`. Each sets up .venv first when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DURATION ?= 30

.PHONY: demo test bench lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python deploy/demo.py --duration $(DURATION)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	@set -e; for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b $(BENCH_ARGS); done

clean:
	rm -rf $(VENV) demo-data .pytest_cache .ruff_cache
