# nvmflab: `make run` for a quick characterization on loopback, `make test` for the whole suite.
SHELL   := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
VENV    := .venv
PYTHON  ?= python3
STAMPS  := .cache/stamps
BIN_DIR := target/release
RESULTS ?= results/quick
# Python caches compiled modules (__pycache__, ignored by git) unless the environment forbids it, as
# CI's does: then every `nvmflab` process compiles the harness's modules again, about 0.4 s of CPU
# each, and the tests start some hundreds of them.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: all deps deps-test deps-spdk build venv test test-msrv test-rust test-python interop run bench clean

all: build venv

# Package sets (scripts/install-deps.sh): `deps` is what building and running need; `deps-test` adds
# the browser, qemu + a kernel image, sshd and SPDK's build dependencies that only tests use.
deps: $(STAMPS)/deps-run
$(STAMPS)/deps-run: scripts/install-deps.sh
	bash scripts/install-deps.sh --for run
	@mkdir -p $(STAMPS) && touch $@
deps-spdk: $(STAMPS)/deps-spdk
$(STAMPS)/deps-spdk: scripts/install-deps.sh
	bash scripts/install-deps.sh --for spdk
	@mkdir -p $(STAMPS) && touch $@
deps-test: $(STAMPS)/deps-test
$(STAMPS)/deps-test: scripts/install-deps.sh
	bash scripts/install-deps.sh --for test
	@mkdir -p $(STAMPS) && touch $@

build: deps
	@echo "build: cargo build --release (nvmf-target, nvmf-perf; a few minutes the first time, seconds after)"
	cargo build --release --workspace --bins

# pip is silent with -q and pages long without it: keep one line per package.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml | deps
	@echo "venv: creating $(VENV) with the harness, pandas, matplotlib, pyarrow, pytest (about a minute the first time)"
	$(PYTHON) -m venv $(VENV)
	set -o pipefail; $(VENV)/bin/pip install --progress-bar off --upgrade pip | sed -u -n 's/^Successfully/  pip: &/p'
	set -o pipefail; $(VENV)/bin/pip install --progress-bar off -e '.[dev]' \
	  | sed -u -n -E '/^(Collecting|Successfully installed)/s/^/  pip: /p'
	@touch $@

# Every part of `make test`, in order; scripts/timed-parts.sh runs them one after another and prints
# the seconds each took at the end (CI's breakdown), stopping at the first that fails. Parts joined
# by + run side by side, a comma chaining parts on one side: the bookworm guests of `interop` beside
# the trixie guests (one chain; the bed beside it shares their image's cache, built under
# build-guest.sh's lock), which wait on their hosts and
# on qemu's device emulation (2026-12-06: 457 s side by side, 562 s one after another). The bed's
# slice (test-bed-quick) follows interop, the shorter side once interop leaves its long tests to
# interop-all: in the evening rehearsal interop 277 s + the bed 215 s beside the chain's 460 s. Three
# sides (four guests at once) were slower: about 700 s for the step (2026-12-06, 13bc76a). test-msrv
# beside test-rust was slower than the two in turn (296 s against 275 s): cargo keeps both cores
# busy; test-msrv with its dependencies already checked (below) keeps about one core busy, and the
# RDMA build (rdma-bins) takes the other. The build and the venv come first, side by side (cargo
# compiles while pip downloads).
TEST_PARTS := test-msrv+rdma-bins test-rust test-python test-spdk test-fio test-fuzz test-soak \
              interop,test-bed-quick+test-guest,test-tls-interop,test-conformance,test-rdma-quick
test: deps-test
	@$(MAKE) --no-print-directory -j2 build venv spdk
	@NVMFLAB_RDMA_BIN=$(CURDIR)/$(BIN_DIR)/rdma bash scripts/timed-parts.sh $(TEST_PARTS)

# The workspace must build with Debian 12's own Rust (rustc-web at the workspace's rust-version,
# which install-deps --for test puts in /usr/bin beside rustup's), as on a fresh machine without
# rustup: a lockfile entry that needs a newer compiler fails here, not on a user's machine. Its
# target directory lives in the cache beside SPDK's build, not in the checkout: each dependency is
# checked once per machine and compiler (cargo keys its results by both), not again in every clean
# clone (about 200 CPU-s, 100 s of CI); the workspace's own crates are checked every time.
MSRV_CARGO := /usr/bin/cargo
MSRV_TARGET_DIR ?= $(HOME)/.cache/nvmflab/msrv-target
test-msrv: deps-test
	@test -x $(MSRV_CARGO) -a -x /usr/bin/rustc || { echo "test-msrv: Debian's cargo-web/rustc-web missing (bash scripts/install-deps.sh --for test installs them)"; exit 1; }
	@echo "test-msrv: cargo check --locked with $$(/usr/bin/rustc --version) (Debian's own; the workspace says rust-version $$(sed -n -E 's/^rust-version *= *"(.*)"/\1/p' Cargo.toml))"
	env -u RUSTUP_TOOLCHAIN RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc CARGO_TARGET_DIR=$(MSRV_TARGET_DIR) \
	  $(MSRV_CARGO) check --locked --quiet --workspace --all-targets

# The test binaries side by side with cargo-nextest where install-deps could build it (they spend
# most of their time waiting on sockets and timers: 37 s of CPU in 57 s run one binary
# after another; .config/nextest.toml), then the doctests (nextest does not run them), else cargo
# test. clippy where the toolchain has it (rustup's does; Debian's rustc-web does not).
test-rust: build
	@if cargo nextest --version >/dev/null 2>&1; then \
	  echo "test-rust: cargo nextest run --release --workspace (.config/nextest.toml)"; \
	  cargo nextest run --release --workspace --cargo-quiet && cargo test --release --workspace --doc --quiet; \
	else \
	  echo "test-rust: cargo-nextest not installed (install-deps --for test builds it): cargo test, one binary after another"; \
	  cargo test --release --workspace; \
	fi
	@if cargo clippy --version >/dev/null 2>&1; then \
	  echo "clippy: cargo clippy --all-targets -D warnings"; \
	  cargo clippy --release --workspace --all-targets --quiet -- -D warnings; \
	else echo "clippy: not in this toolchain, lint skipped"; fi

# Tests marked `long` (minutes each; see pyproject.toml) run in `make test-long`, not in `make test`.
# Two workers (pytest-xdist, one test file each at a time, the longest first) for all but the
# `serial` modules (assertions another worker's load could decide; conftest.SERIAL_FILES), which
# run alone afterwards.
test-python: deps-test build venv spdk
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/pytest -q --durations=15 -n 2 --dist loadfile \
	  -m "not long and not serial" python/tests
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/pytest -q --durations=15 -m "serial and not long" python/tests

.PHONY: test-long
test-long: deps-test build venv spdk
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/pytest -q -m long python/tests

# `interop` (in make test) leaves out the tests marked long (two of the three newer studies with
# the kernel stack on the SSH guest, and the kernel target's ram variant, whose path the bed's TLS
# point takes); `interop-all` runs every one.
.PHONY: interop-all
interop: deps-test build venv
	bash tests/interop/run.sh -m "not long"
interop-all: deps-test build venv
	bash tests/interop/run.sh

# NVMe over RDMA on Soft-RoCE (rdma_rxe) in the trixie guest (tests/rdma, docs/rdma.md): the kernel
# host and nvmf-perf -t rdma against nvmet-rdma (control) and against nvmf-target, both built with
# their `rdma` features (needs librdmacm-dev and libibverbs-dev) in target/release, where only
# nvmf-rdma, nvmf-host and nvmf-target compile again, and copied to target/release/rdma.
# test-rdma-quick (in `make test`): those pairs, one guest boot. test-rdma: the same boot plus SPDK
# over RDMA (its target with the kernel host and nvmf-perf, its hosts against all three targets).
# rdma-bins: that build alone (tests/rdma/check.py build()). `make test` runs it early, beside
# test-msrv (which keeps about one core busy), and its test-rdma-quick takes the result
# (NVMFLAB_RDMA_BIN): about 100 CPU-s less in the guest step, where it competed with the guests,
# and no relinking of target/release's binaries while interop runs them on the other side.
.PHONY: test-rdma test-rdma-quick rdma-bins
rdma-bins: deps-test build
	python3 -c 'import sys; sys.path.insert(0, "tests/rdma"); import check; check.build()'
test-rdma-quick: deps-test build venv
	$(VENV)/bin/pytest -q tests/rdma
test-rdma: deps-test build venv spdk
	NVMFLAB_RDMA_SPDK=1 $(VENV)/bin/pytest -q tests/rdma

# The two-server bed (tests/bed, docs/topologies.md): two trixie guests under qemu (TCG) joined by a
# private link with Soft-RoCE on it, reached over SSH through an inventory like real servers;
# `nvmflab env --topology` against them, then the transports (TCP, RDMA; kernel and ours) and
# security (kernel, plain and TLS with tlshd) studies through the harness. Functional runs: timings
# under emulation are not performance. Not in `make test`: about 20-40 minutes on 2 loaded cores.
# The RDMA build comes from tests/rdma/check.py (as conformance-rdma); BED_DIR keeps logs and results.
# test-bed-quick (in `make test`): the bed booted without our binaries, one kernel TLS point and one
# kernel RDMA point through `nvmflab run` (tests/bed/test_bed_quick.py); skipped, saying why,
# where the guests' packages cannot be downloaded. timeout stops a hung run: the bed's fixture
# kills both qemus on SIGTERM, and each qemu dies with pytest in any case.
.PHONY: test-bed test-bed-quick
BED_DIR ?=
test-bed: deps-test build venv rdma-bins
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) NVMFLAB_BED_RDMA_BIN=$(CURDIR)/$(BIN_DIR)/rdma NVMFLAB_BED_DIR=$(BED_DIR) \
	  $(VENV)/bin/pytest -q -p no:cacheprovider --durations=10 tests/bed
test-bed-quick: deps-test build venv
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) NVMFLAB_BED_OURS=0 NVMFLAB_BED_DIR=$(BED_DIR) timeout -k 30 900 \
	  $(VENV)/bin/pytest -q -p no:cacheprovider -rs --durations=5 tests/bed/test_bed_quick.py

# blktests' nvme tests in a Debian trixie qemu guest (TCG) against nvmf-target, through
# tests/blktests/nvmf-target-control (docs/conformance.md). The guest is built from apt-get
# downloads into ~/.cache/nvmflab/blktests; blktests' source comes from ../shared/peers.
# `conformance`: every nvme test (both columns: nvmf-target and the kernel's nvmet as control);
# `test-conformance`: the control script alone on loopback (seconds), then the subset in
# tests/blktests/subset.txt, each test ending as recorded there.
.PHONY: conformance test-conformance test-guest
# The shared trixie guest (tests/guest/trixie.py) that the blktests, TLS and RDMA checks boot.
test-guest: deps-test venv
	$(VENV)/bin/pytest -q tests/guest
CONFORMANCE_RESULTS ?= results/conformance
conformance: deps-test build
	python3 tests/blktests/run.py --all --columns "nvmf-target nvmet" --timeout 7200 --results $(CONFORMANCE_RESULTS)

test-conformance: deps-test build
	bash tests/blktests/test-control.sh
	python3 tests/blktests/run.py --expect tests/blktests/subset.txt --img-size 16M --per-test-timeout 120 --results .cache/blktests-ci --timeout 480

# The same over NVMe/RDMA on Soft-RoCE in the guest, both columns (nvmf-target built with the rdma
# feature as tests/rdma builds it, into target/release/rdma; nvmet-rdma the control). Not in
# `make test`: about an hour under TCG. Needs librdmacm-dev and libibverbs-dev.
.PHONY: conformance-rdma
CONFORMANCE_RDMA_RESULTS ?= results/conformance-rdma
conformance-rdma: deps-test build rdma-bins
	python3 tests/blktests/run.py --all --trtype rdma --columns "nvmf-target nvmet" --timeout 7200 --results $(CONFORMANCE_RDMA_RESULTS)

# NVMe/TCP over TLS 1.3 against Linux 6.12 (tlshd, nvme-cli 2.13, keyutils) in the trixie guest,
# both directions, right and wrong keys, keys as `nvme gen-tls-key --insert` makes them, plain
# connects refused (tests/tls, docs/tls.md). About four to five minutes under TCG; skipped saying
# why when the guest's packages cannot be downloaded. NVMFLAB_NVME_CLI_CURRENT=PATH (an nvme binary
# of 2.16 or later, docs/tls.md) adds that release's gen-tls-key checks.
.PHONY: test-tls-interop
test-tls-interop: deps-test build venv
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/pytest -q tests/tls

run: build venv
	@echo "run: nvmflab study all --quick into $(RESULTS) (progress below: one line per point when not on a terminal)"
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/nvmflab study all --quick --results $(RESULTS)

# Side by side with SPDK (bench/README.md): builds SPDK like `make spdk` (skipped with the reason
# when no source is found), then the matrix, scaling and memory suites, about 6 minutes on 2 cores.
# BENCH_ARGS="--quick" for a smoke run, "--rounds 5 --seconds 8" to go bigger, "--suites all" for all.
bench: build venv spdk
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/python bench/run.py $(BENCH_ARGS)

# TCP's instructions per I/O under valgrind's callgrind, 786b8ae against the working tree (bench/README.md,
# *Instructions per I/O*): about 4 minutes, plus a build of the base revision the first time; exits 1
# when a row is over --max-ratio. CALLGRIND_ARGS="--base REV --new REV --max-ratio 1.02" for others.
.PHONY: bench-callgrind
bench-callgrind:
	$(PYTHON) bench/callgrind.py $(CALLGRIND_ARGS)

clean:
	cargo clean
	rm -rf $(VENV) .cache/stamps

# SPDK v24.01 from ../shared/peers (or NVMFLAB_SPDK_SRC) into ~/.cache/nvmflab; reused when built.
.PHONY: spdk test-spdk
spdk: deps-spdk
	bash scripts/build-spdk.sh

test-spdk: build venv spdk
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/pytest -q tests/spdk

# fio external ioengine (crates/nvmf-fio) -> target/release/libnvmf_fio.so; docs/fio-engine.md.
# Needs fio's source for its headers: ../shared/peers/fio-3.33.tar.gz or NVMFLAB_FIO_SRC. Without
# it the crate builds as a stub (cargo prints why) and tests/fio skips; NVMFLAB_FIO_REQUIRE=1 makes
# that an error.
.PHONY: fio-engine test-fio
fio-engine:
	@echo "fio-engine: cargo build --release -p nvmf-fio (unpacks and configures fio's source once, ~10 s)"
	cargo build --release -p nvmf-fio

test-fio: deps-test build venv fio-engine
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/pytest -q tests/fio
bench: fio-engine

# Coverage-guided fuzzing (fuzz/, docs/fuzzing.md): cargo-fuzz + libFuzzer on the stable compiler
# (RUSTC_BOOTSTRAP=1), built into ~/.cache/nvmflab/fuzz-target so the release build above is untouched. `make fuzz`
# installs cargo-fuzz if missing and runs every target FUZZ_SECONDS (default 600) each, or with
# FUZZ_RUNS=N until N executions each; FUZZ_SANITIZER=leak (leaks only) or none trades
# AddressSanitizer (memory errors, leaks) for speed.
.PHONY: fuzz fuzz-smoke test-fuzz
FUZZ_SECONDS ?= 600
FUZZ_SANITIZER ?= address
FUZZ_RUNS ?=
fuzz:
	FUZZ_SANITIZER=$(FUZZ_SANITIZER) bash fuzz/run.sh $(if $(FUZZ_RUNS),--runs $(FUZZ_RUNS),--seconds $(FUZZ_SECONDS))

# Half a minute of fuzzing in all (5 s per target), after the build; `make fuzz` fuzzes for long.
fuzz-smoke:
	FUZZ_SANITIZER=$(FUZZ_SANITIZER) bash fuzz/run.sh --seconds 5

# In `make test`: test-rust already replays fuzz/corpus and fuzz/regressions (cargo test). The live
# smoke runs where cargo-fuzz is installed, or with NVMFLAB_FUZZ_SMOKE=1 (which installs it: about
# 4 more minutes on a fresh 2-core machine, mostly the sanitizer build).
test-fuzz:
	@if command -v cargo-fuzz >/dev/null 2>&1 || [ "$${NVMFLAB_FUZZ_SMOKE:-0}" = 1 ]; then \
	  $(MAKE) --no-print-directory fuzz-smoke; \
	else \
	  echo "test-fuzz: cargo-fuzz not installed, live smoke skipped (corpus replayed by cargo test; NVMFLAB_FUZZ_SMOKE=1 or make fuzz installs it)"; \
	fi

# Soak (docs/reliability.md): verified mixed load from several hosts while the target is restarted
# and hostile clients connect; fails on any lost block, crash or growing memory. MINUTES=30 for the
# documented run; `make test` runs half a minute with a restart every 5 s (two restarts in the first
# half, then the quiet half whose memory must stay flat).
.PHONY: soak test-soak
MINUTES ?= 30
soak: build venv
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/nvmflab soak --minutes $(MINUTES) --workdir results/soak

test-soak: build venv
	NVMFLAB_BIN_DIR=$(CURDIR)/$(BIN_DIR) $(VENV)/bin/nvmflab soak --minutes 0.5 --restart-every 5 --workdir .cache/soak-ci
