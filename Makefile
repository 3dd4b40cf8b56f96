SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := venv

PYTHON      ?= python3
VENV        := .venv
VENV_PY     := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
TEST_STAMP  := $(VENV)/.installed-test
ARGS        ?=
PYTEST_ARGS ?=
TEST_WORKERS ?= 2   # pytest-xdist workers (one per core here); a file's tests stay on one worker (--dist loadfile)

.PHONY: venv run test bench clean

## venv: create .venv (if missing) and install the package with its runtime dependencies only
venv: $(STAMP)

## venv-test: venv plus the test extras (pytest, playwright, schemathesis, ruff, mypy, hadolint, ...)
.PHONY: venv-test
venv-test: $(TEST_STAMP)

# Re-install only when pyproject.toml changes. Two stamps: $(STAMP) says the runtime install is current,
# $(TEST_STAMP) that the test extras are too; so a venv made by `make run` gets the extras at `make test`,
# and `make run` after `make test` installs nothing. A venv whose interpreter no longer runs (e.g. the base
# python moved) is recreated from scratch (and both stamps go with it).
define make_venv
	@if ! $(VENV_PY) -c '' >/dev/null 2>&1; then \
	  echo "creating $(VENV) with $(PYTHON)"; \
	  if [ -e $(VENV) ]; then $(PYTHON) -m venv --clear $(VENV); else $(PYTHON) -m venv $(VENV); fi; \
	  $(VENV_PY) -m pip install --quiet --upgrade pip; \
	fi
endef

$(STAMP): pyproject.toml
	$(make_venv)
	$(VENV_PY) -m pip install --quiet -e .
	@touch $@

$(TEST_STAMP): $(STAMP)
	$(VENV_PY) -m pip install --quiet -e '.[test]'
	@touch $@

## run: start the hub (make run ARGS='...')
run: venv
	$(VENV)/bin/amux up $(ARGS)

# The MCP clients the suite connects to the hub (Claude Code, Codex, the TypeScript SDK), pinned in
# tests/clients/package.json and its lock file; reinstalled when the lock changes.
CLIENTS       := tests/clients
CLIENTS_STAMP := $(CLIENTS)/node_modules/.installed
$(CLIENTS_STAMP): $(CLIENTS)/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make: npm is missing; install Node.js 18+ (it brings npm)" >&2; exit 1; }
	cd $(CLIENTS) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

## clients: install the pinned MCP clients the tests run (npm ci in tests/clients)
.PHONY: clients
clients: $(CLIENTS_STAMP)

## test: run the test suite against PostgreSQL (make test PYTEST_ARGS='-k foo')
test: venv-test clients
	@if ! command -v bwrap >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1 \
	    || echo "make test: WARNING: could not install bubblewrap; the sandboxed box tests are skipped" >&2; \
	fi
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make test: installing chromium (apt-get) ..." >&2; \
	    log=$$(mktemp); \
	    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >"$$log" 2>&1 \
	       || { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$$log" 2>&1 \
	            && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>"$$log" 2>&1; }; then \
	      echo "make test: chromium installed" >&2; \
	    else \
	      tail -n 20 "$$log" >&2; \
	      echo "make test: WARNING: could not install chromium; browser tests may fail or be skipped" >&2; \
	    fi; \
	    rm -f "$$log"; \
	  else \
	    echo "make test: WARNING: /usr/bin/chromium missing (and cannot apt-get install it); browser tests may fail or be skipped" >&2; \
	  fi; \
	fi
	@url="$${AMUX_TEST_DATABASE_URL:-}"; \
	if [ -z "$$url" ]; then \
	  url="$$($(VENV_PY) .ci/ensure_postgres.py)" \
	    || { echo "make test: no PostgreSQL available (see above); set AMUX_TEST_DATABASE_URL to override" >&2; exit 1; }; \
	fi; \
	echo "make test: AMUX_TEST_DATABASE_URL=$$url" >&2; \
	echo "+ $(VENV_PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)" >&2; \
	AMUX_TEST_DATABASE_URL="$$url" $(VENV_PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

## bench: run the benchmarks (make bench ARGS='...')
bench: venv-test
	$(VENV_PY) -m bench $(ARGS)

## clean: remove the virtualenv, local state and caches
clean:
	rm -rf $(VENV) .amux .pytest_cache build *.egg-info
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

## i18n-extract / i18n-update / i18n-compile: the bot's Babel catalogs in bot/locales/ (English, Simplified Chinese).
## The .po files are the only source of translations; the compiled .mo files are committed (the wheel ships them).
.PHONY: i18n-extract i18n-update i18n-compile
I18N := bot/locales
i18n-extract: venv
	$(VENV)/bin/pybabel extract -F $(I18N)/babel.cfg --no-default-keywords -k _ --no-location --sort-output --no-wrap --project amux-hub -o $(I18N)/messages.pot .
i18n-update: i18n-extract
	$(VENV)/bin/pybabel update -D messages -i $(I18N)/messages.pot -d $(I18N) --no-wrap --ignore-obsolete --no-fuzzy-matching
	@echo "translate the empty msgstr entries in $(I18N)/zh_Hans/LC_MESSAGES/messages.po, then: make i18n-compile"
i18n-compile: venv
	$(VENV)/bin/pybabel compile -D messages -d $(I18N) --statistics

## lint: ruff over the tree, mypy over hub and bot, lint-imports (the import contracts in pyproject.toml: layers, no
##       cycles, SQL only in hub/store), hadolint on deploy/Dockerfile, sh -n on deploy/install.sh, kustomize renders
##       the example overlay (.ci/run runs it before the tests)
.PHONY: lint
lint: venv-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy hub bot
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint deploy/Dockerfile
	sh -n deploy/install.sh
	@command -v kubectl >/dev/null 2>&1 || { echo "make lint: kubectl is missing; install it to render deploy/k8s" >&2; exit 1; }
	kubectl kustomize deploy/k8s/overlays/example >/dev/null && echo "kustomize: deploy/k8s/overlays/example renders"

## soak: three hub replicas, real and simulated runners, faults (kill -9, PostgreSQL restart) for 10 minutes
##       (make soak SOAK_S=120 SOAK_SIM_RUNNERS=200); prints counts, throughput, p99 latencies, recovery times
SOAK_S           ?= 600
SOAK_SIM_RUNNERS ?= 200
.PHONY: soak
soak: venv-test
	AMUX_SOAK_DURATION_S=$(SOAK_S) AMUX_SOAK_SIM_RUNNERS=$(SOAK_SIM_RUNNERS) \
	  $(VENV_PY) -m pytest -q -s tests/integration/test_soak.py $(PYTEST_ARGS)

## fuzz: schemathesis against a live hub on SQLite and PostgreSQL, every /api/v1 operation, many more examples than
##       the suite's run (make fuzz FUZZ_EXAMPLES=500 FUZZ_SEED=7); zero 5xx and zero answers outside the schema
FUZZ_EXAMPLES ?= 200
FUZZ_SEED     ?= $(shell date +%s)
.PHONY: fuzz
fuzz: venv-test
	@url="$${AMUX_TEST_DATABASE_URL:-}"; \
	if [ -z "$$url" ]; then url="$$($(VENV_PY) .ci/ensure_postgres.py)" || { echo "make fuzz: no PostgreSQL" >&2; exit 1; }; fi; \
	echo "make fuzz: seed $(FUZZ_SEED), $(FUZZ_EXAMPLES) examples per operation" >&2; \
	AMUX_TEST_DATABASE_URL="$$url" AMUX_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) AMUX_FUZZ_SEED=$(FUZZ_SEED) AMUX_FUZZ_PHASES=examples,coverage,fuzzing \
	  $(VENV_PY) -m pytest -q -s tests/integration/test_openapi_fuzz.py -k schemathesis $(PYTEST_ARGS); \
	AMUX_PROPERTY_EXAMPLES=$$(( $(FUZZ_EXAMPLES) * 25 )) $(VENV_PY) -m pytest -q tests/unit/test_parsers_property.py $(PYTEST_ARGS)
