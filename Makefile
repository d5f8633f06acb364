# The two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/streamrag demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: lint typecheck
	HF_HUB_OFFLINE=1 $(PY) -m pytest

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/run.py
	nice $(PY) benchmarks/index.py --sizes 100000
	HF_HUB_OFFLINE=1 $(PY) benchmarks/recovery.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .streamrag .streamrag-demo
