# toolgate: `make demo` runs the site with a demo agent; `make test` runs every test.
# Both create .venv on first use. Override the interpreter with PYTHON=..., the
# environment folder with VENV=...
SHELL := /bin/bash
VENV ?= .venv
# Newest Python that actually runs (pyenv shims for inactive versions fail the probe).
PYTHON ?= $(shell for p in python3.13 python3.12 python3; do \
	if $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then echo $$p; break; fi; done)
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup setup-dev static migrate demo test test-services fuzz bench lint format clean

PIP := $(PY) -m pip --disable-pip-version-check
# Collected static files (STATIC_ROOT in toolgate_site/settings.py); the manifest is the stamp.
STATIC_STAMP := staticfiles/staticfiles.json
STATIC_SOURCES := $(shell find approvals toolgate_site -path '*/static/*' -type f 2>/dev/null)

$(PY):
	@if [ -z "$(PYTHON)" ]; then echo "No Python 3.11+ found: install one or pass PYTHON=/path/to/python3" >&2; exit 1; fi
	@echo "Creating $(VENV) with $$($(PYTHON) --version)"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) install --quiet --upgrade pip

# What the site and the demo need (requirements.txt) ...
$(VENV)/.installed: requirements.txt pyproject.toml | $(PY)
	@echo "Installing requirements.txt into $(VENV) ..."
	@$(PIP) install --quiet -r requirements.txt
	@touch $@

# ... and on top of it the test, lint and benchmark tools (requirements-dev.txt).
$(VENV)/.installed-dev: requirements-dev.txt $(VENV)/.installed
	@echo "Installing requirements-dev.txt into $(VENV) ..."
	@$(PIP) install --quiet -r requirements-dev.txt
	@touch $@

setup: $(VENV)/.installed
setup-dev: $(VENV)/.installed-dev

# Hashed, compressed copies the site serves with DJANGO_DEBUG=0 (and the tests run on).
$(STATIC_STAMP): $(VENV)/.installed $(STATIC_SOURCES)
	@TOOLGATE_QUIET=1 $(PY) manage.py collectstatic --noinput -v 0

static: $(STATIC_STAMP)

migrate: setup static
	@TOOLGATE_QUIET=1 $(PY) manage.py migrate --noinput -v 0

demo: migrate
	@TOOLGATE_QUIET=1 $(PY) -m toolgate_site.demo --host $(HOST) --port $(PORT)

# pytest's exit code 5 ("no tests collected") is a failure here, not a pass.
# Then the client distribution's own tests (clients/python), against a real daphne
# of this site run by $(PY) (TOOLGATE_SERVER_PYTHON).
test: setup-dev migrate
	@TOOLGATE_QUIET=1 $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; \
	cd clients/python && TOOLGATE_SERVER_PYTHON=$(abspath $(PY)) TOOLGATE_QUIET=1 \
	  $(abspath $(PY)) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: the client tests collected nothing" >&2; exit 1; fi; exit $$rc

# The same suite on PostgreSQL and Redis (needs TOOLGATE_TEST_DATABASE_URL and
# TOOLGATE_TEST_REDIS_URL; .ci/run sets them).
test-services: setup-dev static
	@test -n "$$TOOLGATE_TEST_DATABASE_URL" || { echo "set TOOLGATE_TEST_DATABASE_URL" >&2; exit 1; }
	@test -n "$$TOOLGATE_TEST_REDIS_URL" || { echo "set TOOLGATE_TEST_REDIS_URL" >&2; exit 1; }
	@DATABASE_URL="$$TOOLGATE_TEST_DATABASE_URL" REDIS_URL="$$TOOLGATE_TEST_REDIS_URL" TOOLGATE_QUIET=1 \
	  $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-services: pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: setup-dev migrate
	@TOOLGATE_QUIET=1 $(PY) bench/run_all.py

# The hostile-input tests with a larger budget (CI runs about 2,000 cases).
FUZZ_EXAMPLES ?= 5000
fuzz: setup-dev migrate
	@TOOLGATE_QUIET=1 TOOLGATE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/test_fuzz.py -p no:logging $(PYTEST_ARGS)

lint: setup-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	TOOLGATE_QUIET=1 $(PY) manage.py makemigrations --check --dry-run

format: setup-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .venv-* db.sqlite3* .test-db.sqlite3* dist build staticfiles
