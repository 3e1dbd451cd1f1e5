#!/usr/bin/env bash
# Spawn benchmark: forkvm clones from a snapshot (no pool, warm pool, bursts)
# and their memory, against the naive QEMU save/restore baseline.
#
# Every sandbox QEMU runs jailed (FORKVM_NO_JAIL=0 is forced for the main run,
# whatever the environment says). Before the main run, the jail comparison
# times spawn_cold_pool_off and spawn_warm_pool under daemons jailed, unjailed
# (FORKVM_NO_JAIL=1), unjailed, jailed, one at a time; RESULTS.md's "Jail cost"
# gives jailed / unjailed ratios. The naive baseline's source comes from an
# unjailed daemon (a jailed QEMU's command line cannot be replayed).
#
# Usage: bash bench/spawn/run.sh [--runs N] [--smoke] [--clones 1,10,50] [--memory MiB]
#                                [--burst-runs N] [--wait-quiet S] [--out DIR]
#                                [--jail-compare | --no-jail-compare] [--jail-runs N]
#   --runs N        timed spawns per latency case (default 20; at least 10 for a valid result)
#   --smoke         allow --runs below 10 for a quick check; results say SMOKE
#   --clones LIST   clone counts for the memory measurement (default 1,10,50); the naive
#                   copies go up to the largest, as far as free memory allows
#   --memory MiB    guest RAM (default 512)
#   --burst-runs N  how many times one POST {"count": 10} is timed (default 20)
#   --wait-quiet S  first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR       results directory (default bench/spawn/results)
#   --jail-compare / --no-jail-compare
#                   run (default) or skip the jail comparison (the main run is jailed either way)
#   --jail-runs N   runs per case and side in the jail comparison, split over two segments
#                   per side (default: --runs)
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
