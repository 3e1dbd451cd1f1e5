#!/usr/bin/env bash
# Everything `make test` runs, in lanes that run side by side (docs/testing.md#how-long-it-takes).
#
# 1. `cargo fmt --check`, then one build of every test binary (`cargo test
#    --workspace --no-run`), which also builds target/debug/forkvm for the
#    suites below.
# 2. Lanes, at most $TEST_JOBS at a time, longest first: each Rust test
#    binary run directly with `--include-ignored` (unit tests and the VM
#    tests), the doc tests, clippy (`-D warnings`), the Python and TypeScript
#    SDK suites, the cluster test, the E2B and MCP compatibility suites, the
#    dashboard test, the bench unit tests and the API fuzzer. Most of them
#    wait on guests and daemons much of the time, so a few at once fill the
#    cores that one alone leaves idle. Every daemon comes from the test
#    launcher (`forkvm serve --ephemeral`: its own home, net pool, jail uids
#    and port) or picks a free port and a private home itself, so lanes never
#    share one.
#
# Each lane writes its own log; the terminal shows lanes starting and
# ending, and at the end a table of every lane's time. The run exits non-zero
# if any step or lane failed, after printing the tail of each failed lane's log.
#
# Usage: scripts/test-all.sh [LANE...]   (default: every lane; `--list` prints them)
# Environment:
#   TEST_JOBS=3          lanes at once (fewer when /tmp has under 2 GB free per lane)
#   TEST_LOG_DIR=target/test-logs   where the lane logs go (emptied first)
#   CARGO=cargo
#   TEST_LANE_LIMIT=900  seconds a lane may run, at least (8x its estimate if
#                        more), before it is stopped and fails as timed out
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
CARGO=${CARGO:-cargo}
JOBS=${TEST_JOBS:-3}
LOGS=${TEST_LOG_DIR:-$REPO/target/test-logs}
export FORKVM_HOME=${FORKVM_HOME:-/var/lib/forkvm}
T0=$SECONDS

mkdir -p "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/*.rc "$LOGS"/*.time
say() { printf '[%s +%4d s] %s\n' "$(date +%T)" $((SECONDS - T0)) "$*"; }

# /proc/stat's busy and total jiffies, to report how much of the two cores a
# phase used (the rest was waiting).
cpu_now() { awk '/^cpu /{b=$2+$3+$4+$7+$8; t=b+$5+$6; print b, t; exit}' /proc/stat; }
cpu_use() { # start-sample end-sample -> busy percent of all cores
    local b0 t0 b1 t1
    read -r b0 t0 <<<"$1"
    read -r b1 t1 <<<"$2"
    echo $(((b1 - b0) * 100 / ((t1 - t0) > 0 ? (t1 - t0) : 1)))
}

declare -a SUMMARY=()
FAILED=()
step() { # name command... : a step that runs alone, before the lanes
    local name=$1 t=$SECONDS c0 rc=0
    shift
    c0=$(cpu_now)
    say "step $name: $*"
    "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
    SUMMARY+=("$(printf '%-28s %-4s %5d s  cores busy %3d%%' "$name" "$([ $rc = 0 ] && echo ok || echo FAIL)" $((SECONDS - t)) "$(cpu_use "$c0" "$(cpu_now)")")")
    if [ $rc != 0 ]; then
        FAILED+=("$name")
        say "step $name FAILED (exit $rc); its log ends:"
        tail -n 60 "$LOGS/$name.log"
        return 1
    fi
    say "step $name ok ($((SECONDS - t)) s)"
}

# --- lanes -----------------------------------------------------------------
# A lane is a name, an expected length in seconds (to start the longest
# first; the lengths of a measured run) and a command. Rust test binaries are added after the build.
declare -A LANE_CMD=() LANE_EST=()
lane() { LANE_CMD[$1]=$3; LANE_EST[$1]=$2; }
lane clippy 120 "$CARGO clippy --workspace --all-targets -- -D warnings"
lane doctests 60 "$CARGO test --workspace --doc --no-fail-fast"
lane sdk-python 363 "bash scripts/test-sdks.sh python"
lane sdk-typescript 220 "bash scripts/test-sdks.sh typescript"
lane cluster 241 "bash scripts/test-cluster.sh"
lane compat-e2b 194 "bash scripts/test-compat.sh e2b e2b-npm"
lane compat-mcp 191 "bash scripts/test-compat.sh mcp mcp-conformance"
lane ui 26 "bash scripts/test-ui.sh"
lane bench-units 20 ".venv/bin/python -m pytest -q -p no:cacheprovider bench/common bench/jail bench/registry"
lane fuzz-api 171 "bash scripts/fuzz-api.sh"
# clippy and the doc tests take cargo's lock on target/: one after the other,
# in one lane, while the test binaries (run without cargo) go on beside them.
lane cargo-lint-doc 326 "${LANE_CMD[clippy]} && ${LANE_CMD[doctests]}"
unset 'LANE_CMD[clippy]' 'LANE_CMD[doctests]'

# Lanes whose checks are about time or CPU share on this host: the flood
# test's health answers within 1 s under 2,100 hostile connections, and the
# limits test's guest gets 30-55 % of a core under a 50 % quota. Other lanes
# beside them would measure the neighbours' load, so they run first, with
# nothing beside them but each other: the flood's daemon uses a few CPU
# seconds a minute and the limited guest half a core, so on 2 cores neither
# disturbs the other (three runs of the pair on an idle host: all green,
# about 62 s each, as alone).
ALONE=(rust:cli/flood rust:cli/limits)

# Seconds each Rust test binary took in a measured run of this script (for
# ordering only: the longest start first, so the run does not end on one).
declare -A RUST_EST=([cli/chain]=290 [cli/branching]=220 [cli/images]=185 [cli/registry]=126
    [cli/snapshots]=121 [cli/crashpoints]=113 [cli/lifetime]=102 [cli/network]=100 [cli/docker_images]=82
    [cli/node_transfer]=80 [cli/discard]=62 [cli/disk_pressure]=62 [cli/diff_head]=57 [cli/gc]=53
    [cli/volumes]=50 [cli/timetravel]=65 [cli/jail]=41 [cli/vm]=38 [cli/launcher]=34 [cli/processes]=31 [cli/identity]=29)

if [ "${1:-}" = --list ]; then
    printf '%s\n' "${!LANE_CMD[@]}" | sort
    echo "rust:<binary> for each test binary of the workspace (after the build)"
    exit 0
fi
WANT=("$@")
wanted() { [ ${#WANT[@]} = 0 ] && return 0; local w; for w in "${WANT[@]}"; do [[ $1 == $w ]] && return 0; done; return 1; }

# --- steps -----------------------------------------------------------------
step fmt "$CARGO" fmt --all -- --check || { say "fix the formatting: cargo fmt --all"; exit 1; }
build_tests() {
    "$CARGO" test --workspace --no-run --message-format=json-render-diagnostics >"$LOGS/build.json"
}
step build-tests build_tests || exit 1
# Every test executable: "name<TAB>cwd<TAB>path" (cargo runs a test binary in
# its package's directory; so do we).
python3 - "$LOGS/build.json" >"$LOGS/binaries.tsv" <<'EOF' || { say "could not read the build's list of test binaries"; exit 1; }
import json, os, sys
seen = set()
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    t = m["target"]
    crate = m["manifest_path"].split(os.sep)[-2].removeprefix("forkvm-")
    # cli/chain for tests/chain.rs of forkvm-cli; engine/lib for a crate's unit tests.
    name = f"{crate}/{t['name'] if t['kind'] == ['test'] else '-'.join(t['kind'])}"
    if m["executable"] in seen:
        continue
    seen.add(m["executable"])
    print(f"{name}\t{os.path.dirname(m['manifest_path'])}\t{m['executable']}")
EOF
while IFS=$'\t' read -r name dir exe; do
    lane "rust:$name" "${RUST_EST[$name]:-20}" "cd '$dir' && '$exe' --include-ignored"
done <"$LOGS/binaries.tsv"

# --- run the lanes ---------------------------------------------------------
# Room in /tmp, where the daemons' homes are: each refuses to spawn or branch
# with under 512 MiB free there, and a lane holds up to about 2 GB at once
# (the cluster test's three nodes 1.7 GB). Fewer lanes at once where less
# is free, rather than failures that only say the disk was full.
free_mib=$(df -Pm "${TMPDIR:-/tmp}" | awk 'NR == 2 {print $4}')
fit=$(((free_mib - 512) / 2048))
[ "$fit" -ge 1 ] || fit=1
if [ "$fit" -lt "$JOBS" ]; then
    say "only $free_mib MiB free in ${TMPDIR:-/tmp}: $fit lane(s) at a time instead of $JOBS"
    JOBS=$fit
fi
alone() { local a; for a in "${ALONE[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1; }
mapfile -t ORDER < <(for l in "${!LANE_CMD[@]}"; do wanted "$l" && ! alone "$l" && echo "${LANE_EST[$l]} $l"; done | sort -k1,1nr -k2 | cut -d' ' -f2)
mapfile -t FIRST < <(for l in "${ALONE[@]}"; do [ -n "${LANE_CMD[$l]:-}" ] && wanted "$l" && echo "$l"; done)
[ $((${#ORDER[@]} + ${#FIRST[@]})) -gt 0 ] || { say "no lane matches: ${WANT[*]} (see --list)"; exit 2; }
say "${#FIRST[@]} lanes side by side alone, then ${#ORDER[@]} lanes, $JOBS at a time; logs in $LOGS"
declare -A PID_LANE=() LANE_T0=() TIMED_OUT=()
LIMIT_MIN=${TEST_LANE_LIMIT:-900}
# A hung lane (a guest that stopped answering, say) fails on its own after
# its limit, with the others' results intact, rather than holding the whole
# run until CI gives up on it.
lane_limit() { local e=$((LANE_EST[$1] * 8)); echo $((e > LIMIT_MIN ? e : LIMIT_MIN)); }
stop_overdue() {
    local p l
    for p in "${!PID_LANE[@]}"; do
        l=${PID_LANE[$p]}
        if [ -z "${TIMED_OUT[$l]:-}" ] && [ $((SECONDS - LANE_T0[$l])) -gt "$(lane_limit "$l")" ]; then
            TIMED_OUT[$l]=1
            say "TIMEOUT $l: still running after $(lane_limit "$l") s; stopping it"
            kill -TERM -- "-$p" 2>/dev/null
            (sleep 10; kill -KILL -- "-$p" 2>/dev/null) &
        fi
    done
}
C0=$(cpu_now)
L0=$SECONDS
start_lane() {
    local l=$1 f=${1//[:\/]/_}
    LANE_T0[$l]=$SECONDS
    # A session of its own (setsid runs in place: $! is its process group),
    # so an interrupted run can stop the whole lane and nothing else.
    setsid bash -c '/usr/bin/time -f "%e %U %S" -o "$2.time" bash -c "$1" </dev/null >"$2.log" 2>&1; echo $? >"$2.rc"' \
        _ "${LANE_CMD[$l]}" "$LOGS/$f" &
    PID_LANE[$!]=$l
    say "start $l"
}
finish_lane() {
    local l=$1 f=${1//[:\/]/_} rc cpu
    rc=$(cat "$LOGS/$f.rc" 2>/dev/null || echo 1)
    read -r _ u s <"$LOGS/$f.time" 2>/dev/null || { u=0 s=0; }
    cpu=$(awk -v u="${u:-0}" -v s="${s:-0}" 'BEGIN{printf "%d", u+s}')
    SUMMARY+=("$(printf '%-28s %-4s %5d s  cpu %5d s' "$l" "$([ "$rc" = 0 ] && echo ok || echo FAIL)" $((SECONDS - LANE_T0[$l])) "$cpu")")
    [ -n "${TIMED_OUT[$l]:-}" ] && rc="timed out"
    if [ "$rc" = 0 ]; then say "ok    $l ($((SECONDS - LANE_T0[$l])) s)"; else FAILED+=("$l"); say "FAIL  $l ($((SECONDS - LANE_T0[$l])) s, exit $rc)"; fi
}
# Interrupted: stop the running lanes (their daemons end with them) and say so.
stop_lanes() {
    local p
    for p in "${!PID_LANE[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
    say "interrupted; stopped: ${PID_LANE[*]}"
    exit 130
}
trap stop_lanes INT TERM
for l in "${FIRST[@]}"; do
    start_lane "$l"
done
for p in "${!PID_LANE[@]}"; do
    wait "$p" 2>/dev/null
    finish_lane "${PID_LANE[$p]}"
    unset "PID_LANE[$p]"
done
next=0
while [ $next -lt ${#ORDER[@]} ] || [ ${#PID_LANE[@]} -gt 0 ]; do
    while [ $next -lt ${#ORDER[@]} ] && [ ${#PID_LANE[@]} -lt "$JOBS" ]; do
        start_lane "${ORDER[$next]}"
        next=$((next + 1))
    done
    # Wake at least every 5 s to check the lanes' limits.
    sleep 5 &
    wait -n "${!PID_LANE[@]}" $! 2>/dev/null
    stop_overdue
    # wait -n reports one pid; collect every lane that has ended.
    for p in "${!PID_LANE[@]}"; do
        if ! kill -0 "$p" 2>/dev/null; then
            wait "$p" 2>/dev/null
            finish_lane "${PID_LANE[$p]}"
            unset "PID_LANE[$p]"
        fi
    done
done
SUMMARY+=("$(printf '%-28s %-4s %5d s  cores busy %3d%%' "lanes (all)" "$([ ${#FAILED[@]} = 0 ] && echo ok || echo FAIL)" $((SECONDS - L0)) "$(cpu_use "$C0" "$(cpu_now)")")")

echo
echo "== make test: $((SECONDS - T0)) s in all ($JOBS lanes at a time; logs in $LOGS)"
printf '%s\n' "${SUMMARY[@]}"
if [ ${#FAILED[@]} -gt 0 ]; then
    for l in "${FAILED[@]}"; do
        echo
        echo "== FAILED: $l; the end of $LOGS/${l//[:\/]/_}.log:"
        tail -n 60 "$LOGS/${l//[:\/]/_}.log"
    done
    echo
    echo "== FAILED: ${FAILED[*]}"
    exit 1
fi
echo "== all passed"
