#!/usr/bin/env bash
# Loop check of the jail (issue 30): N cold boots and N clone spawns in a
# fresh home, against a private daemon with its own --net-pool and
# --jail-uids. Every sandbox's QEMU is checked for the jail's namespaces and
# rlimits, then removed. Prints one line per run and a summary; exits 1 if
# any run failed.
#
# Usage: bash bench/jail/loop.sh [N] [BINARY]   (default 40, target/release/forkvm)
# Needs root and the guest artefacts in $FORKVM_ARTIFACTS (/var/lib/forkvm).
set -uo pipefail

N=${1:-40}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${2:-$HERE/../../target/release/forkvm}
ART=${FORKVM_ARTIFACTS:-/var/lib/forkvm}
HOME_DIR=$(mktemp -d /tmp/fvloop-XXXXXX)
export FORKVM_HOME=$HOME_DIR
unset FORKVM_URL FORKVM_TOKEN
ln -s "$ART/guest" "$HOME_DIR/guest"
mkdir "$HOME_DIR/images"
for i in "$ART"/images/*; do ln -s "$i" "$HOME_DIR/images/"; done

"$BIN" serve --net-pool 10.213.0.0/16 --jail-uids 3100000-3100999 --pool-size 0 \
    >"$HOME_DIR/daemon.log" 2>&1 &
DPID=$!
cleanup() {
    kill -TERM "$DPID" 2>/dev/null
    wait "$DPID" 2>/dev/null
    rm -rf "$HOME_DIR"
}
trap cleanup EXIT
for _ in $(seq 600); do
    [[ -S $HOME_DIR/forkvm.sock ]] && "$BIN" ps >/dev/null 2>&1 && break
    sleep 0.1
done

HOST_PID_NS=$(readlink /proc/self/ns/pid)
HOST_IPC_NS=$(readlink /proc/self/ns/ipc)
fail=0
declare -A ok=([cold]=0 [clone]=0)
declare -A ms=([cold]="" [clone]="")

check_jail() { # pid -> "" or what is wrong
    local pid=$1 why=""
    [[ $(readlink "/proc/$pid/ns/pid") != "$HOST_PID_NS" ]] || why+=" host-pid-ns"
    [[ $(readlink "/proc/$pid/ns/ipc") != "$HOST_IPC_NS" ]] || why+=" host-ipc-ns"
    grep -q '^Max open files *2048 *2048' "/proc/$pid/limits" || why+=" nofile"
    grep -q '^Max file size *unlimited' "/proc/$pid/limits" && why+=" fsize"
    echo "$why"
}

run() { # kind, i
    local kind=$1 i=$2 args=() t0 t1 out id pid why
    [[ $kind == cold ]] && args=(--no-template)
    t0=$(date +%s%N)
    if ! out=$("$BIN" spawn "${args[@]}" 2>&1); then
        echo "$kind $i FAILED: $out"
        fail=$((fail + 1))
        return
    fi
    t1=$(date +%s%N)
    id=$(echo "$out" | tail -1)
    pid=$("$BIN" --json inspect "$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
    why=$(check_jail "$pid")
    if [[ -n $why ]] || [[ $("$BIN" exec "$id" -- echo ok 2>&1) != ok ]]; then
        echo "$kind $i $id FAILED:${why:- exec did not answer}"
        fail=$((fail + 1))
    else
        ok[$kind]=$((ok[$kind] + 1))
        ms[$kind]+="$(((t1 - t0) / 1000000)) "
        echo "$kind $i $id ok $(((t1 - t0) / 1000000)) ms (pid $pid, $(ls /proc/"$pid"/fd | wc -l) fds)"
    fi
    "$BIN" rm "$id" >/dev/null 2>&1 || { echo "$kind $i rm $id FAILED"; fail=$((fail + 1)); }
}

for i in $(seq "$N"); do run cold "$i"; done
for i in $(seq "$N"); do run clone "$i"; done
left=$(ls "$HOME_DIR/sandboxes" 2>/dev/null | wc -l)
echo "cold: ${ok[cold]}/$N ok; clone: ${ok[clone]}/$N ok; failures: $fail; sandbox dirs left: $left"
for k in cold clone; do
    # shellcheck disable=SC2086
    echo "$k ms: $(printf '%s\n' ${ms[$k]} | sort -n | awk '{a[NR]=$1} END {if (NR) printf "min %d p50 %d max %d", a[1], a[int((NR+1)/2)], a[NR]}')"
done
grep -ci 'error\|panic' "$HOME_DIR/daemon.log" | sed 's/^/daemon.log error\/panic lines: /'
[[ $fail -eq 0 ]]
