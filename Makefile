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

.PHONY: setup test test-forge test-python lint devnet gas clean

setup: $(VENV)/.installed node_modules/.installed contracts/out/.built

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

contracts/out/.built: node_modules/.installed $(wildcard contracts/src/*.sol) contracts/foundry.toml
	cd contracts && $(FORGE) build
	touch $@

test: setup test-forge test-python

test-forge: setup
	cd contracts && $(FORGE) test

test-python: setup
	$(BIN)/python -m pytest -q

gas: setup
	FORGE=$(FORGE) bash contracts/script/gas_report.sh
	$(BIN)/python bench/gas.py --json bench/results/gas.json

devnet: setup
	$(BIN)/rollnet devnet

clean:
	rm -rf $(VENV) node_modules contracts/out contracts/cache

lint: setup
	$(BIN)/ruff check .
