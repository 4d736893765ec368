# PVM: `make demo` runs the pipeline on the embedded stack; `make test` runs the suite (the docs site
# included: tests/test_docs.py builds it with mkdocs --strict); `make docs` serves the site.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install tools demo test test-fast lint bench up docs docs-build clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,mcp,dev]'
	touch $(STAMP)

install: $(STAMP)

# What the tests run for real, from Debian's packages: Prometheus and promtool, and the headless Chromium the
# console's browser tests drive (tests/workers/console/test_browser.py; Playwright launches this binary and never
# downloads a browser of its own).
tools:
	@missing=""; \
	if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then missing="prometheus"; fi; \
	if [ ! -x /usr/bin/chromium ]; then missing="$$missing chromium"; fi; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian's packages for the tests:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

demo: $(STAMP)
	$(PY) -m workers.ops.cli demo

up: $(STAMP)
	$(PY) -m workers.ops.cli up

# Everything: the unit tests as `make test-fast` runs them (xdist, temporary files in RAM), then the slow and
# integration tests (chaos, kill -9, load, real Prometheus) in one process, as their timing assumes, their
# temporary files in RAM too (what they kill is processes, whose writes the page cache keeps either way:
# 441 -> 396 s on the 2-core host).
test: $(STAMP) tools
	TMPDIR=$(or $(FAST_TMPDIR),$${TMPDIR:-/tmp}) $(PY) -m pytest -q -m "not slow and not integration" -n $(FAST_JOBS)
	TMPDIR=$(or $(FAST_TMPDIR),$${TMPDIR:-/tmp}) $(PY) -m pytest -q -m "slow or integration" --durations=15

# The unit tests: neither `slow` nor `integration` (tests/conftest.py names the integration tests),
# one pytest-xdist worker per core, each with its own Valkey (one worker when PVM_TEST_REDIS_URL
# names a server: workers would flush each other's database). Their temporary files go to RAM
# where there is some: on a virtual disk, fsync is most of their time.
FAST_TMPDIR ?= $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm)
FAST_JOBS ?= $(if $(PVM_TEST_REDIS_URL),0,auto)
test-fast: $(STAMP)
	TMPDIR=$(or $(FAST_TMPDIR),$${TMPDIR:-/tmp}) $(PY) -m pytest -q -m "not slow and not integration" -n $(FAST_JOBS)

lint: $(STAMP)
	$(VENV)/bin/ruff check contracts pvm workers tests bench docs/hooks
	$(PY) -m mypy

# The docs site (mkdocs.yml): served with live reload on 127.0.0.1:8000, or built into site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --strict

docs-build: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

bench: $(STAMP)
	$(PY) bench/ingest.py --json

clean:
	rm -rf var site .pytest_cache
