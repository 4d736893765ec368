# PVM: `make demo` runs the pipeline on the embedded stack; `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install tools demo test lint bench up clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,dev]'
	touch $(STAMP)

install: $(STAMP)

# Servers the tests run for real: Prometheus and promtool from Debian's package.
tools:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
		echo "installing Debian's prometheus package (prometheus, promtool) for the tests"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	fi

demo: $(STAMP)
	$(PY) -m workers.cli demo

up: $(STAMP)
	$(PY) -m workers.cli up

test: $(STAMP) tools
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check contracts pvm workers tests bench
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) bench/ingest.py --json

clean:
	rm -rf var .pytest_cache
