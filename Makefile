# Fresh clone -> `make run` (main job) or `make test`. Both create .venv and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run test lint bench clean

$(BIN)/fullband: pyproject.toml
	$(PY) -m venv $(VENV)
	# Pin the CPU build: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(BIN)/fullband

run: setup
	$(BIN)/fullband compare --threads auto --out_dir runs/compare-$$(date +%Y%m%d-%H%M%S)

test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/pytest

bench: setup
	$(BIN)/python benchmarks/decode_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
