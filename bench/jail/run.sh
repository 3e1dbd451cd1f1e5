#!/usr/bin/env bash
# Jail benchmark: what the QEMU jail costs, as ratios jailed / unjailed, with
# the naive QEMU save/restore baseline measured in the same run.
#
# Usage: bash bench/jail/run.sh [--runs N] [--smoke] [--cold-runs N] [--mem-runs N]
#                               [--rounds N] [--wait-quiet S] [--out DIR]
#   --runs N        clone spawns, branches per mode (diff, live) and naive runs per side
#                   (default 20; at least 10 for a valid result)
#   --smoke         allow --runs below 10 for a quick check; results say SMOKE
#   --cold-runs N   cold boots (use_template: false) per side (default 5)
#   --mem-runs N    idle clones whose QEMU PSS is read, per side (default 4)
#   --rounds N      jailed/unjailed pairs of daemons, one at a time, ABBA order (default 2)
#   --wait-quiet S  first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR       results directory (default bench/jail/results)
#   (bench_jail.py --help lists the rest: --memory, --settle, --idle)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Needs root (the jail does). Builds the release binary, then runs
# bench_jail.py with the repo's .venv (created by scripts/setup.sh). Writes
# results/jail.csv, RESULTS.md and jail.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_jail.py "$@"
