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
# Every sandbox QEMU runs jailed (FORKVM_NO_JAIL=0 is forced for experiments 1-4,
# whatever the environment says); the bench's own QMP saves (naive baseline,
# live references) write into the source's own directories, which is all a
# jailed QEMU can see. After the experiments, the jail comparison times live,
# full and diff pauses at --jail-sizes and chain spawns (depth 0 and the
# deepest) under daemons jailed, unjailed (FORKVM_NO_JAIL=1), unjailed, jailed,
# one at a time; RESULTS.md's "Jail cost" gives jailed / unjailed ratios.
#
# Usage: bash bench/branch/run.sh [--runs N] [--smoke] [--sizes 256,512,1024,2048,4096]
#                                 [--dirty 0,100,250,500,1000] [--consecutive 10]
#                                 [--chain-runs 10] [--wait-quiet S] [--out DIR]
#                                 [--jail-compare | --no-jail-compare] [--jail-runs N]
#                                 [--jail-sizes 512,2048] [--jail-chain | --no-jail-chain]
#   --runs N          branches per mode and size (default 10; at least 10 for a valid result)
#   --smoke           allow --runs/--chain-runs below 10 for a quick check; results say SMOKE
#   --sizes LIST      guest sizes in MiB for the pause-vs-size experiment
#   --dirty LIST      MiB dirtied (and held) in a 2048 MiB guest before the branch
#   --consecutive K   back-to-back branches of one 512 MiB source per mode (0: skip)
#   --chain-runs N    spawns from each chain depth and from the flat snapshot (default 10;
#                     0: skip the chain experiment)
#   --wait-quiet S    first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR         results directory (default bench/branch/results)
#   --jail-compare / --no-jail-compare
#                     run (default) or skip the jail comparison (experiments 1-4 are jailed
#                     either way)
#   --jail-runs N     branches per mode and size, and chain spawns, per side in the jail
#                     comparison, split over its two segments per side (default: --runs)
#   --jail-sizes LIST guest sizes of the jail comparison (default 512,2048)
#   --jail-chain / --no-jail-chain
#                     include (default) or leave out the chain spawns in the jail comparison
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
# Full run (about 35-45 min on a quiet 2-core TCG host with the jail comparison; up to
# ~1 h on a busy one):
#   bash bench/branch/run.sh --wait-quiet 600
# Smoke test (a few minutes; not a valid result):
#   bash bench/branch/run.sh --smoke --runs 2 --sizes 256,512 --dirty 0,100 --consecutive 3 \
#       --chain-runs 3 --jail-runs 2 --jail-sizes 256 --out /tmp/bench-branch-smoke
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_branch.py "$@"
