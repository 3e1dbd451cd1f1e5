#!/usr/bin/env bash
# Branch benchmark: how long `POST /v1/sandboxes/{id}/branch` pauses the source
# in modes live, full and diff, against a naive QEMU stop + full save + cont,
# vs guest memory size, vs memory dirtied before the branch, and over
# consecutive branches of one source; plus spawn time from a diff chain vs
# its depth (0-3) and from the flattened chain.
#
# live and full run on a cold-booted source (it owns its RAM); diff runs on a
# clone of it (spawned from a `shared` snapshot of that source: the same guest,
# whose RAM is a private mapping of the snapshot's memory image), with the same
# memory dirtied the same way. RESULTS.md says what each source was.
#
# Usage: bash bench/branch/run.sh [--runs N] [--smoke] [--sizes 256,512,1024,2048,4096]
#                                 [--dirty 0,100,250,500,1000] [--consecutive 10]
#                                 [--chain-runs 10] [--wait-quiet S] [--out DIR]
#   --runs N          branches per mode and size (default 10; at least 10 for a valid result)
#   --smoke           allow --runs/--chain-runs below 10 for a quick check; results say SMOKE
#   --sizes LIST      guest sizes in MiB for the pause-vs-size experiment
#   --dirty LIST      MiB dirtied (and held) in a 2048 MiB guest before the branch
#   --consecutive K   back-to-back branches of one 512 MiB source per mode (0: skip)
#   --chain-runs N    spawns from each chain depth and from the flat snapshot (default 10;
#                     0: skip the chain experiment)
#   --wait-quiet S    first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR         results directory (default bench/branch/results)
#   (bench_branch.py --help lists the rest: --chain-depth, --chain-memory, --chain-dirty,
#    --clone-naive-runs, --dirty-runs, --dirty-naive-runs, --naive-runs, --naive-runs-large,
#    --ref-runs, --floor-runs, --settle, --dirty-memory, --skip, ...)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_branch.py with the repo's .venv
# (created by scripts/setup.sh). Writes branch.csv, RESULTS.md, pause_vs_size.png,
# pause_vs_dirty.png, consecutive.png and spawn_vs_depth.png into the results dir.
#
# Full run (about 30-35 min on a quiet 2-core TCG host; up to ~1 h on a busy one):
#   bash bench/branch/run.sh --wait-quiet 600
# Smoke test (a few minutes; not a valid result):
#   bash bench/branch/run.sh --smoke --runs 2 --sizes 256,512 --dirty 0,100 --consecutive 3 \
#       --chain-runs 3 --out /tmp/bench-branch-smoke
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_branch.py "$@"
