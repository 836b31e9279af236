# `make run` and `make test` bootstrap .venv from nothing (python3 + pip from PyPI), then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
export PYTHONHASHSEED ?= 0

.PHONY: run test venv lint bench soak clean test-vllm tools

$(STAMP): pyproject.toml pipeline/to_torch/_runs.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,wandb,verl]'
	$(BIN)/python -m pip install -q --no-deps verl==0.9.1 transferqueue==0.1.11
	# both wheels also install their own top-level `tests` package, which would shadow ours
	rm -rf $(VENV)/lib/python*/site-packages/tests
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP) $(RUN_STAMP)

# `make run` needs only the core and wandb, not the test suite's verl stack: a fresh clone reaches
# the demo in about half the install time.
$(RUN_STAMP): pyproject.toml pipeline/to_torch/_runs.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[wandb]'
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(RUN_STAMP)

# vLLM 0.33.0's Python sources without its engine or CUDA torch, for the vLLM adapter's tests
# against vLLM's real output classes (tests/support/install_vllm_classes.py). Measured on a
# 2-core machine: about 15 s on a fresh clone (a 336 MB download; pip's cache keeps it) and
# 220 MB on disk; the real-class run adds about 10 s to the tests.
VLLM_CLASSES := $(VENV)/vllm-classes
$(VLLM_CLASSES)/.installed: $(STAMP) tests/support/install_vllm_classes.py
	$(BIN)/python tests/support/install_vllm_classes.py $(VLLM_CLASSES)

venv: $(STAMP) $(VLLM_CLASSES)/.installed tools

# System tools the test suite runs: strace records the system calls of the power-loss and fsync
# tests. Installed with apt-get where it is missing and we are root (CI); otherwise those tests
# fail naming the package.
tools:
	@command -v strace >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace)

run: $(RUN_STAMP)
	$(BIN)/replaylake demo

# The suite runs on TEST_WORKERS pytest-xdist workers, one test file (or the Ray/verl tests, which
# share one Ray cluster) to a worker at a time: tests/support/xdist_groups.py groups them.
# TEST_WORKERS=0 runs it in one process. The 15 slowest tests are listed at the end (the suite is
# kept near 20 min).
TEST_WORKERS ?= 2
test: $(STAMP) $(VLLM_CLASSES)/.installed tools
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=15

# vLLM 0.33 brings its own CUDA torch (~10 GB): it gets its own venv, never .venv. The import works
# without a GPU. The conversion tests then run against vLLM's real output classes.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm==0.33.0
	$(VLLM_VENV)/bin/python -m pip install -q pyarrow==26.0.1 polars==2.1.0 duckdb==2.0.1 \
		google-crc32c==1.9.0 pytest==9.2.0 hypothesis==6.170.17
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	REPLAYLAKE_REAL_VLLM=1 PYTHONPATH=. $(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider \
		tests/adapters/vllm/test_vllm.py tests/adapters/vllm/test_vllm_resume.py

lint: $(STAMP)
	$(BIN)/ruff check pipeline schemas sql jobs tests

# Maintainer tools (`replaylake dev ...`), not needed to use replaylake: every benchmark, which
# rewrites the tables of docs/performance.md, README.md and docs/scaling.md; one round of the
# crash soak (about 25 minutes on 2 cores).
bench: $(STAMP)
	$(BIN)/replaylake dev bench all --doc docs/performance.md --doc README.md --doc docs/scaling.md

soak: $(STAMP)
	$(BIN)/replaylake dev soak --rounds 1

clean:
	rm -rf $(VENV) runs .pytest_cache
