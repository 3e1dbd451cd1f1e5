#!/usr/bin/env bash
# Boot benchmark: forkvm cold boot vs the naive QEMU save/restore baseline.
#
# Usage: bash bench/boot/run.sh [--runs N] [--memory MiB] [--smoke] [--out DIR] [--wait-quiet S]
#        bash bench/boot/run.sh --loop [N] [--memory MiB] [--smoke] [--out DIR] [--wait-quiet S]
#   --runs N      runs per case (default 10; at least 10 for a valid result)
#   --loop [N]    boot-loop mode instead: N cold boots in a row (default 200) in a
#                 fresh home, each checked with `echo ok` through exec and deleted;
#                 writes loop.csv, loop.png, LOOP.md; exit status 1 if any failed
#   --smoke       allow --runs below 10 (or --loop below 200) for a quick check;
#                 results say SMOKE
#   --memory MiB  guest RAM (default 512)
#   --out DIR     results directory (default bench/boot/results)
#   --wait-quiet S  first wait up to S seconds for other processes to leave the CPUs idle
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_boot.py with the repo's .venv
# (created by scripts/setup.sh). Writes results/boot.csv, RESULTS.md, boot.png
# (in --loop mode: results/loop.csv, LOOP.md, loop.png).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_boot.py "$@"
