#!/usr/bin/env bash
# Disk-chain benchmark: the pause of a source's 1st to Nth branch, with and
# without streaming, against the naive QEMU save baseline.
#
# Usage: bash bench/chain/run.sh [--rounds N] [--data-mib MiB] [--memory MiB] [--out DIR]
#   --rounds N      branches per case (default 100; at least 20)
#   --data-mib MiB  random data the source writes before branching (default 64)
#   --memory MiB    guest RAM (default 512)
#   --out DIR       results directory (default bench/chain/results)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_chain.py with the repo's .venv
# (created by scripts/setup.sh). Writes results/chain.csv, RESULTS.md, chain.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_chain.py "$@"
