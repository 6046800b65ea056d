#!/usr/bin/env bash
# Runs each make target named on the command line in turn, stopping at the first that fails, and
# prints how long each took at the end (on failure and Ctrl-C too), so a slow or failing part of
# `make test` is named without rereading the whole log. NVMFLAB_TIMINGS=FILE also writes the table
# there as tab-separated "target seconds status" lines.
set -uo pipefail
declare -a names=() seconds=() states=()
started=$SECONDS

breakdown() {
    local total=$((SECONDS - started))
    echo
    echo "make test: time per part (total ${total} s of the 25-minute target)"
    local i
    for i in "${!names[@]}"; do
        printf '  %-20s %5d s  %s\n' "${names[$i]}" "${seconds[$i]}" "${states[$i]}"
        if [ -n "${NVMFLAB_TIMINGS:-}" ]; then
            printf '%s\t%d\t%s\n' "${names[$i]}" "${seconds[$i]}" "${states[$i]}" >> "$NVMFLAB_TIMINGS"
        fi
    done
}

for part in "$@"; do
    begin=$SECONDS
    names+=("$part"); seconds+=(0); states+=("running")
    last=$((${#names[@]} - 1))
    trap 'seconds[$last]=$((SECONDS - begin)); states[$last]="interrupted"; breakdown; exit 130' INT TERM
    make --no-print-directory "$part"
    rc=$?
    seconds[$last]=$((SECONDS - begin))
    if [ "$rc" -ne 0 ]; then
        states[$last]="FAILED (exit $rc)"
        breakdown
        exit "$rc"
    fi
    states[$last]="ok"
done
trap - INT TERM
breakdown
