# Fresh clone -> `make run` (main job) or `make test`. Both create .venv and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# PyTorch is installed first, and from PyTorch's CPU index: a version pin alone chooses no build, and on Linux the
# default index serves the multi-GB CUDA one. TORCH_INDEX points elsewhere, e.g. a CUDA build:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128
# When TORCH_INDEX cannot be reached within 10 s, pip's configured index (or its find-links) is asked instead.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
REACHABLE := import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)

.PHONY: setup run test lint bench clean

$(BIN)/fullband: pyproject.toml
	$(PY) -m venv $(VENV)
	@if $(BIN)/python -c '$(REACHABLE)' '$(TORCH_INDEX)' 2>/dev/null; then \
	  echo "torch==$(TORCH_VERSION) from $(TORCH_INDEX)"; \
	  $(BIN)/pip install -q --timeout 30 --index-url '$(TORCH_INDEX)' torch==$(TORCH_VERSION); \
	else \
	  echo "$(TORCH_INDEX) is unreachable: torch==$(TORCH_VERSION) from pip's configured index (on Linux PyPI's is a CUDA build)"; \
	  $(BIN)/pip install -q torch==$(TORCH_VERSION); \
	fi
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
