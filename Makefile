# `make run` and `make test` bootstrap .venv from nothing (python3 + pip from PyPI), then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONHASHSEED ?= 0

.PHONY: run test venv lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,wandb,verl]'
	$(BIN)/python -m pip install -q --no-deps verl==0.9.1 transferqueue==0.1.11
	# both wheels also install their own top-level `tests` package, which would shadow ours
	rm -rf $(VENV)/lib/python*/site-packages/tests
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/replaylake demo --lake runs/demo/lake

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check pipeline schemas sql jobs tests

bench: $(STAMP)
	$(BIN)/replaylake bench ingest

clean:
	rm -rf $(VENV) runs .pytest_cache
