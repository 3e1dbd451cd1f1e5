#!/usr/bin/env bash
# Branch-point storage benchmark (issue 16, target 5): how much a branch point
# of a clone stores in each mode (live, full, diff), against the clone's
# private guest RAM and the naive QEMU save of the same clone, with the store
# on a loop-mounted ext4 and on XFS with reflinks. Needs root (loop mounts).
#
# Usage: bash bench/branchpoint/run.sh [--fs ext4,xfs] [--dirty 0,256] [--modes diff,full,live]
#                                      [--runs N] [--smoke] [--wait-quiet S] [--out DIR]
#   --fs LIST       filesystems to hold the store (default ext4,xfs)
#   --dirty LIST    MiB each source clone writes into a guest tmpfs first (default 0,256)
#   --modes LIST    in this order on each clone (default diff,full,live; keep live last)
#   --runs N        branch points per mode and case (default 10; below needs --smoke)
#   (bench_branchpoint.py --help lists the rest: --naive-runs, --memory, --image-gib, --settle)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_branchpoint.py with the repo's
# .venv. Writes branchpoint.csv, RESULTS.md and branchpoint.png into the
# results dir. About 10 minutes on a quiet 2-core TCG host.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_branchpoint.py "$@"
