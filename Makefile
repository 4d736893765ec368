# PVM: `make demo` runs the pipeline on the embedded stack; `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint bench up clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m pvm.cli demo

up: $(STAMP)
	$(PY) -m pvm.cli up

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check contracts pvm workers tests bench

bench: $(STAMP)
	$(PY) bench/ingest.py --json

clean:
	rm -rf var .pytest_cache
