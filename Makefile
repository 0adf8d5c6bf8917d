# Everything a newcomer needs: `make demo` runs the demo, `make test` runs the tests, `make docs` builds the docs site.
# `make check` is the loop to run on every change: lint and the tiers that start no worker process, on both cores.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# Two pytest-xdist workers, each with a temp dir, a Redis, a database and Celery workers of its own (tests/settings.py).
PARALLEL := -n 2 --ds=tests.settings

.PHONY: demo test check compat topologies lint docs bench redis-server postgresql chromium prometheus

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,bench,dev,docs]"
	touch $@

# Debian's redis-server; the tests and the demo start their own instances of it.
redis-server:
	@command -v redis-server >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
		else echo "please install redis-server (sudo apt-get install redis-server)"; exit 1; fi; }

# Debian's PostgreSQL: `make test` runs the django tier again on a server of its own (not on PATH in Debian).
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
		else echo "please install postgresql (sudo apt-get install postgresql)"; exit 1; fi; }

# Debian's Chromium, driven headless by the browser tests (never a browser download of Playwright's own).
chromium:
	@command -v chromium >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
		else echo "please install chromium (sudo apt-get install chromium)"; exit 1; fi; }

# The demo needs the package alone (and the metrics page's client), not the tests' or the docs' packages.
$(BIN)/.demo: setup.cfg pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e ".[metrics]"
	touch $@

# Debian's promtool (its prometheus package): the tests fire the docs' alert rules with `promtool test rules`.
prometheus:
	@command -v promtool >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
		else echo "please install promtool (sudo apt-get install prometheus)"; exit 1; fi; }

demo: redis-server $(BIN)/.demo
	$(BIN)/python -m testproject.demo.run

test: redis-server postgresql chromium prometheus $(BIN)/.installed lint
	$(BIN)/python -m pytest $(PARALLEL)
	KEYED_QUEUE_TESTS_DATABASE=postgresql $(BIN)/python -m pytest $(PARALLEL) tests/django

# Lint, then the gate's tier, the in-process Django tier (no worker process), the history checks and the docs.
check: redis-server $(BIN)/.installed lint
	$(BIN)/python -m pytest $(PARALLEL) -m "not compat and not topologies and not workers" \
		tests/gate tests/django tests/test_history_checks.py tests/test_docs.py

# Celery's documented task behaviours on plain tasks and their keyed twins, side by side (tests/compat).
compat: redis-server $(BIN)/.installed
	$(BIN)/python -m pytest $(PARALLEL) -m compat tests/compat

# The gate on a real local Redis Cluster (3 masters) and behind Sentinel (1 master, 1 replica, 3 sentinels):
# the gate and django tiers again with the gate on the cluster, then the user's project on each, with a
# failover (tests/topologies).
topologies: redis-server $(BIN)/.installed
	KEYED_QUEUE_TESTS_GATE_REDIS=cluster $(BIN)/python -m pytest $(PARALLEL) tests/gate tests/django
	$(BIN)/python -m pytest $(PARALLEL) -m topologies tests/topologies

# Style, then the layers' import contract (pyproject.toml), then the types.
lint: $(BIN)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

# The docs site from docs/ into site/; strict: a broken link, anchor or reference fails the build.
docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: redis-server $(BIN)/.installed
	$(BIN)/python -m bench.throughput
