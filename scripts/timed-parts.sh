#!/usr/bin/env bash
# Runs each make target named on the command line in turn, stopping at the first step that fails,
# and prints how long each took at the end (on failure and Ctrl-C too), so a slow or failing part
# of `make test` is named without rereading the whole log, with each part's own CPU seconds (where
# a part leaves a core idle, or what another step could take from it). NVMFLAB_TIMINGS=FILE also
# writes the table there as tab-separated "target seconds status cpu-seconds" lines.
#
# A step "a+b" runs targets a and b side by side (parts that leave a core idle: a compile chain
# beside another, a guest that waits on its host), each output line prefixed with its target's
# name; the step ends when both have, and fails when either did. A side may be a chain "b,c,d":
# its targets run one after another, and it stops at the first that fails.
set -uo pipefail
set -m  # each side-by-side target in its own process group, so an interrupt can stop all of it
declare -a names=() seconds=() cpu=() states=() running=()
started=$SECONDS

breakdown() {
    local total=$((SECONDS - started))
    echo
    echo "make test: time per part (total ${total} s of the 25-minute target; parts joined by + ran side by side;"
    echo "cpu-s: the part's own CPU seconds, user + system, so a part that leaves a core idle shows fewer than 2 per second)"
    local i
    for i in "${!names[@]}"; do
        printf '  %-20s %5d s %6s cpu-s  %s\n' "${names[$i]}" "${seconds[$i]}" "${cpu[$i]}" "${states[$i]}"
        if [ -n "${NVMFLAB_TIMINGS:-}" ]; then
            printf '%s\t%d\t%s\t%s\n' "${names[$i]}" "${seconds[$i]}" "${states[$i]}" "${cpu[$i]}" >> "$NVMFLAB_TIMINGS"
        fi
    done
}

interrupted() {
    local pid
    for pid in "${running[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
    local i rc secs
    for i in "${!states[@]}"; do
        [ "${states[$i]}" = running ] || continue
        if read -r rc secs cpus 2>/dev/null < "$status_dir/${names[$i]}"; then
            seconds[$i]=$secs; cpu[$i]=$cpus; states[$i]="exit $rc, then interrupted"
        else
            states[$i]="interrupted"
        fi
    done
    breakdown
    exit 130
}
status_dir=$(mktemp -d)
trap interrupted INT TERM

# CPU time (user + system, in clock ticks) of shell PID's waited-for children so far: a part's own
# CPU time, whatever else runs on the machine, is the difference across its make.
children_ticks() {
    local stat fields
    stat=$(< "/proc/$1/stat")
    read -r -a fields <<< "${stat##*) }"  # after "pid (comm) ": field 3 is fields[0]
    echo $((fields[13] + fields[14]))
}
TICKS=$(getconf CLK_TCK 2>/dev/null || echo 100)
cpu_seconds() { printf '%d.%d' $(($1 / TICKS)) $(($1 * 10 / TICKS % 10)); }  # ticks to seconds, one decimal

# Runs the targets of one chain in turn, each one's output prefixed with "[name] " when it shares
# the terminal, and writes each one's exit status and seconds to $status_dir/NAME; stops at the
# first that fails.
run_chain() {
    local prefix=$1 part begin rc ticks me=$BASHPID
    shift
    for part in "$@"; do
        begin=$SECONDS
        ticks=$(children_ticks "$me")
        if [ "$prefix" = 1 ]; then
            make --no-print-directory "$part" 2>&1 | sed -u "s/^/[$part] /"
            rc=${PIPESTATUS[0]}
        else
            make --no-print-directory "$part"
            rc=$?
        fi
        printf '%d %d %s\n' "$rc" "$((SECONDS - begin))" "$(cpu_seconds $(($(children_ticks "$me") - ticks)))" > "$status_dir/$part"
        [ "$rc" -eq 0 ] || return "$rc"
    done
}

for step in "$@"; do
    IFS=+ read -r -a chains <<< "$step"
    prefix=0; [ "${#chains[@]}" -gt 1 ] && prefix=1
    first=${#names[@]}
    running=()
    for chain in "${chains[@]}"; do
        IFS=, read -r -a parts <<< "$chain"
        for part in "${parts[@]}"; do names+=("$part"); seconds+=(0); cpu+=("-"); states+=("running"); done
        run_chain "$prefix" "${parts[@]}" &
        running+=("$!")
    done
    failed_rc=0
    for pid in "${running[@]}"; do wait "$pid"; done
    running=()
    for ((i = first; i < ${#names[@]}; i++)); do
        if ! read -r rc secs cpus 2>/dev/null < "$status_dir/${names[$i]}"; then
            states[$i]="not run (its chain stopped)"
            continue
        fi
        seconds[$i]=$secs; cpu[$i]=$cpus
        if [ "$rc" -ne 0 ]; then
            states[$i]="FAILED (exit $rc)"
            [ "$failed_rc" -eq 0 ] && failed_rc=$rc
        elif [ "$prefix" = 1 ]; then
            states[$i]="ok (beside: $step)"
        else
            states[$i]="ok"
        fi
    done
    if [ "$failed_rc" -ne 0 ]; then
        rm -rf "$status_dir"
        breakdown
        exit "$failed_rc"
    fi
done
rm -rf "$status_dir"
trap - INT TERM
breakdown
