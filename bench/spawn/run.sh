#!/usr/bin/env bash
# Spawn benchmark: forkvm clones from a snapshot (no pool, warm pool, bursts)
# and their memory, against the naive QEMU save/restore baseline.
#
# Usage: bash bench/spawn/run.sh [--runs N] [--smoke] [--clones 1,10,50] [--memory MiB]
#                                [--burst-runs N] [--wait-quiet S] [--out DIR]
#   --runs N        timed spawns per latency case (default 20; at least 10 for a valid result)
#   --smoke         allow --runs below 10 for a quick check; results say SMOKE
#   --clones LIST   clone counts for the memory measurement (default 1,10,50); the naive
#                   copies go up to the largest, as far as free memory allows
#   --memory MiB    guest RAM (default 512)
#   --burst-runs N  how many times one POST {"count": 10} is timed (default 20)
#   --wait-quiet S  first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR       results directory (default bench/spawn/results)
#   (bench_spawn.py --help lists the rest: --settle, --idle, --mem-reserve-mib, --burst-size)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_spawn.py with the repo's .venv
# (created by scripts/setup.sh). Writes results/spawn.csv, memory.csv,
# RESULTS.md and spawn.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_spawn.py "$@"
