# Everything a newcomer needs: `make demo` runs the demo, `make test` runs the tests.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test lint bench redis-server

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,bench,dev]"
	touch $@

# Debian's redis-server; the tests and the demo start their own instances of it.
redis-server:
	@command -v redis-server >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
		else echo "please install redis-server (sudo apt-get install redis-server)"; exit 1; fi; }

demo: redis-server $(BIN)/.installed
	$(BIN)/python -m testproject.demo.run

test: redis-server $(BIN)/.installed lint
	$(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: redis-server $(BIN)/.installed
	$(BIN)/python bench/throughput.py
