#!/usr/bin/env bash
# Boot benchmark: forkvm cold boot vs the naive QEMU save/restore baseline.
#
# Usage: bash bench/boot/run.sh [--runs N] [--memory MiB] [--smoke] [--out DIR] [--wait-quiet S]
#   --runs N      runs per case (default 10; at least 10 for a valid result)
#   --smoke       allow --runs below 10 for a quick check; results say SMOKE
#   --memory MiB  guest RAM (default 512)
#   --out DIR     results directory (default bench/boot/results)
#   --wait-quiet S  first wait up to S seconds for other processes to leave the CPUs idle
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_boot.py with the repo's .venv
# (created by scripts/setup.sh). Writes results/boot.csv, RESULTS.md, boot.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY="$REPO/.venv/bin/python"

if [[ ! -x "$PY" ]]; then
    echo "run.sh: $PY is missing: run scripts/setup.sh (it creates .venv with matplotlib)" >&2
    exit 1
fi
if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
    echo "run.sh: matplotlib is not installed in $REPO/.venv: run scripts/setup.sh" >&2
    exit 1
fi

echo "==> cargo build --release -p forkvm-cli"
(cd "$REPO" && cargo build --release -p forkvm-cli)

echo "==> bench_boot.py $*"
exec "$PY" "$HERE/bench_boot.py" --binary "$REPO/target/release/forkvm" "$@"
