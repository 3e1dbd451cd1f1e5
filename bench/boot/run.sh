#!/usr/bin/env bash
# Boot benchmark: forkvm cold boot vs the naive QEMU save/restore baseline.
#
# Usage: bash bench/boot/run.sh [--runs N] [--loop N] [--memory MiB] [--smoke] [--out DIR] [--wait-quiet S]
#   --runs N      runs per case (default 10; at least 10 for a valid result)
#   --smoke       allow --runs below 10 for a quick check; results say SMOKE
#   --loop N      boot-loop mode: N cold boots in a row in a fresh home, counting
#                 failures; writes results/loop.csv, LOOP.md, loop.png; exits 1 if any failed
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
exec "$HERE/../common/run_bench.sh" "$HERE" bench_boot.py "$@"
