#!/usr/bin/env bash
# Coverage-guided fuzzing: cargo-fuzz (libFuzzer) on the stable toolchain. docs/fuzzing.md.
#
#   fuzz/run.sh [--seconds N] [--runs N] [--sanitizer address|leak|none] [TARGET...]
#
# Installs cargo-fuzz if missing, builds into ~/.cache/nvmflab/fuzz-target/<sanitizer> (never the
# workspace's target/; NVMFLAB_FUZZ_TARGET_DIR moves it), then runs each target for N seconds
# (default 300), or with --runs until N executions (no time limit unless --seconds is given too),
# on fuzz/work/<target> (new inputs, git-ignored) seeded with fuzz/corpus/<target>. Crashes and hangs land in
# fuzz/artifacts/<target>/; the summary prints executions per target. Exit 1 on any finding.
# `--sanitizer leak` (LeakSanitizer alone, 2-3x faster than address) is what the 10^7 runs in
# docs/fuzzing.md used.
set -euo pipefail
cd "$(dirname "$0")"

seconds=${FUZZ_SECONDS:-}
runs=
sanitizer=${FUZZ_SANITIZER:-address}
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --sanitizer) sanitizer=$2; shift 2 ;;
        -h|--help) sed -n 2,12p "$0"; exit 0 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=(frame target_conn target_rdma host_pdus config_toml config_nvmetcli tls_server)
case "$sanitizer" in address|leak|none) ;; *) echo "fuzz: --sanitizer $sanitizer: address, leak or none" >&2; exit 2 ;; esac
for n in "$seconds" "$runs"; do
    [[ -z "$n" || "$n" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: --seconds and --runs take a positive whole number, not '$n'" >&2; exit 2; }
done
# Stop after N executions when asked, else after N seconds (300 by default).
if [ -n "$runs" ]; then
    limit=(-runs="$runs" -max_total_time="${seconds:-0}")
else
    limit=(-max_total_time="${seconds:-300}")
fi
# Allocation stacks one frame deep: unwinding every malloc dominated the leak-checking runs; a
# leak found is re-run with the full stack (LSAN_OPTIONS unset) to see where it came from.
export LSAN_OPTIONS="${LSAN_OPTIONS:-malloc_context_size=1}"

# Per target: largest input (bytes) and the time one input may take before it counts as a hang.
declare -A max_len=([frame]=8192 [target_conn]=4096 [target_rdma]=4096 [host_pdus]=8192 [config_toml]=4096 [config_nvmetcli]=4096 [tls_server]=4096)
declare -A timeout=([frame]=10 [target_conn]=20 [target_rdma]=20 [host_pdus]=20 [config_toml]=10 [config_nvmetcli]=10 [tls_server]=20)

export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (cargo install --locked cargo-fuzz, about a minute on 2 cores)"
    cargo install --locked cargo-fuzz
fi
# cargo-fuzz passes nightly-only flags (-Zsanitizer, sanitizer-coverage passes); RUSTC_BOOTSTRAP=1
# lets the stable compiler accept them, so no nightly toolchain is needed.
export RUSTC_BOOTSTRAP=1
# Outside the clone (like SPDK's build), so a fresh clone reuses the instrumented dependencies.
target_dir="${NVMFLAB_FUZZ_TARGET_DIR:-$HOME/.cache/nvmflab/fuzz-target}/$sanitizer"
echo "fuzz: building ${targets[*]} (sanitizer $sanitizer, into $target_dir)"
cargo fuzz build -O -s "$sanitizer" --target-dir "$target_dir"

failed=0
for t in "${targets[@]}"; do
    [ -n "${max_len[$t]:-}" ] || { echo "fuzz: unknown target $t" >&2; exit 2; }
    mkdir -p "work/$t" "artifacts/$t"
    log="work/$t.log"
    echo "fuzz: $t, ${limit[*]} (log fuzz/$log)"
    rc=0
    cargo fuzz run -O -s "$sanitizer" --target-dir "$target_dir" "$t" "work/$t" "corpus/$t" -- \
        "${limit[@]}" -max_len="${max_len[$t]}" -timeout="${timeout[$t]}" \
        -print_final_stats=1 >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "fuzz: $t FOUND A PROBLEM (exit $rc): $(grep -m1 -E 'panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer|ERROR: LeakSanitizer' "$log" || true)"
        grep -E 'Test unit written to|cargo fuzz run' "$log" | sed 's/^/    /' | head -3
    else
        echo "fuzz: $t ok: ${execs:-?} executions, ${rate:-?}/s, ${cov:-cov ?}, 0 crashes"
    fi
done
exit $failed
