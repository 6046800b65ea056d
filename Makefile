# nvmflab: `make run` for a quick characterization on loopback, `make test` for the whole suite.
SHELL   := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
VENV    := .venv
PYTHON  ?= python3
STAMPS  := .cache/stamps
BIN_DIR := target/release
RESULTS ?= results/quick

.PHONY: all deps build venv test test-rust test-python interop run bench clean

all: build venv

deps: $(STAMPS)/deps
$(STAMPS)/deps: scripts/install-deps.sh
	bash scripts/install-deps.sh
	@mkdir -p $(STAMPS) && touch $@

build: deps
	cargo build --release --workspace --bins

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	@touch $@

test: build venv spdk test-rust test-python test-spdk interop

test-rust: build
	cargo test --release --workspace

test-python: build venv spdk
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/pytest -q python/tests

interop: build venv
	bash tests/interop/run.sh

run: build venv
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/nvmflab study all --quick --results $(RESULTS)

bench: build venv
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/python bench/run.py

clean:
	cargo clean
	rm -rf $(VENV) .cache/stamps

# SPDK v24.01 from ../shared/peers (or NVMFLAB_SPDK_SRC) into ~/.cache/nvmflab; reused when built.
.PHONY: spdk test-spdk
spdk:
	bash scripts/build-spdk.sh

test-spdk: build venv spdk
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/pytest -q tests/spdk
