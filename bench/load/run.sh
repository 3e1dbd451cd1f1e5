#!/usr/bin/env bash
# API load test: N concurrent clients drive one daemon with a random mix of
# spawn (from the boot template or an own snapshot), exec, file write + read
# back, branch (live/diff/full, 0 or 1 child), snapshot rm and sandbox rm for
# D seconds; every request is recorded; then everything is removed and the
# daemon's QEMU processes, fds, taps/netns and files are compared with the
# baseline taken after a warm-up. Exits non-zero on any failed request (a
# status other than 2xx/409/429, or a wrong answer) or any leak.
#
# Usage: bash bench/load/run.sh [--clients N] [--duration S] [--out DIR] [--smoke]
#   --clients N     concurrent clients, each with its own connection (default 16)
#   --duration S    seconds of load (default 300; at least 120 for a valid result)
#   --out DIR       results directory (default bench/load/results)
#   --smoke         allow a shorter run; results say SMOKE
#   (bench_load.py --help lists the rest: --memory, --client-sandboxes,
#    --client-snapshots, --settle-timeout, --seed, --daemon-max-requests,
#    --daemon-max-sandboxes, --keep-home, --wait-quiet, ...)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#   FORKVM_BIN        use this forkvm binary as it is (no cargo build); otherwise
#                     the release binary is built first (bench/common/run_bench.sh)
#
# Writes requests.csv, leaks.csv, RESULTS.md, latency_over_time.png,
# latency_by_op.png, daemon.log (and failures.json if any) into the results dir.
#
# Full run (about 8 min: warm-up, 5 min of load, cleanup and settle):
#   bash bench/load/run.sh
# Smoke test:
#   bash bench/load/run.sh --smoke --clients 4 --duration 45 --out /tmp/load-smoke
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -n "${FORKVM_BIN:-}" ]]; then
    REPO=$(cd "$HERE/../.." && pwd)
    PY="$REPO/.venv/bin/python"
    if [[ ! -x "$PY" ]] || ! "$PY" -c 'import matplotlib' 2>/dev/null; then
        echo "run.sh: $PY with matplotlib is missing: run scripts/setup.sh" >&2
        exit 1
    fi
    echo "==> bench_load.py (binary $FORKVM_BIN, not rebuilt) $*"
    exec "$PY" "$HERE/bench_load.py" --binary "$FORKVM_BIN" "$@"
fi
exec "$HERE/../common/run_bench.sh" "$HERE" bench_load.py "$@"
