#!/usr/bin/env bash
# Branch benchmark: how long `POST /v1/sandboxes/{id}/branch` pauses the source
# (live and full modes) against a naive QEMU stop + full save + cont, vs guest
# memory size, vs memory dirtied before the branch, and over consecutive
# branches of one source. (`diff` is not implemented and not measured.)
#
# Usage: bash bench/branch/run.sh [--runs N] [--smoke] [--sizes 256,512,1024,2048,4096]
#                                 [--dirty 0,100,250,500,1000] [--consecutive 10]
#                                 [--wait-quiet S] [--out DIR]
#   --runs N          branches per mode and size (default 10; at least 10 for a valid result)
#   --smoke           allow --runs below 10 for a quick check; results say SMOKE
#   --sizes LIST      guest sizes in MiB for the pause-vs-size experiment
#   --dirty LIST      MiB dirtied (and held) in a 2048 MiB guest before the branch
#   --consecutive K   back-to-back branches of one 512 MiB source per mode (0: skip)
#   --wait-quiet S    first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR         results directory (default bench/branch/results)
#   (bench_branch.py --help lists the rest: --dirty-runs, --dirty-naive-runs, --naive-runs,
#    --naive-runs-large, --ref-runs, --floor-runs, --settle, --dirty-memory, ...)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_branch.py with the repo's .venv
# (created by scripts/setup.sh). Writes results/branch.csv, RESULTS.md,
# pause_vs_size.png, pause_vs_dirty.png and consecutive.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_branch.py "$@"
