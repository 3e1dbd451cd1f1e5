#!/usr/bin/env bash
# Volumes benchmark (issue 15): file I/O inside a guest on a volume (a host
# directory served over FUSE through the daemon), against the same workload
# on the host directory itself (the baseline) and on the guest's root disk,
# all in one run, reported as ratios.
#
# Workloads (fcvm's published ones): 256 threads over 1,024 files of 4 KiB,
# reading every file / writing each with fsync (wall time, throughput); and
# single-operation latency: getattr, lookup, read 4 KiB, write 4 KiB,
# open+close, readdir of 1,024 entries, create+unlink.
#
# Usage: bash bench/volumes/run.sh [--repeats N] [--iters N] [--rounds N] [--workers N]
#                                  [--files N] [--memory MiB] [--cpus N] [--volume-opts OPTS]
#                                  [--targets host,guest_root,guest_volume] [--wait-quiet S]
#                                  [--out DIR]
#   --repeats N      parallel runs per target and round (default 5; at least 5 in all for a
#                    valid result)
#   --iters N        iterations per single operation (default 300; at least 200)
#   --rounds N       times each target runs, interleaved (default 1)
#   --workers N      parallel threads (default 256)
#   --files N        files in the parallel workloads and the big directory (default 1024)
#   --memory MiB     guest RAM (default 1024)
#   --cpus N         guest vCPUs (default 1: on this 2-core TCG host one uncached volume
#                    request took 1.4 ms with 1 vCPU and 7-14 ms with 2, likely because
#                    a second vCPU thread competes with the daemon that serves the volume)
#   --volume-opts O  OPTS of --volume HOST:GUEST[:OPTS], e.g. shared or copy (default none;
#                    ro is refused: the workload writes)
#   --wait-quiet S   first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR        results directory (default bench/volumes/results)
#   (bench_volumes.py --help lists the rest: --host-dir, --guest-root-dir, --guest-mount,
#    --host-python, --size, --exec-timeout)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_volumes.py with the repo's .venv
# (created by scripts/setup.sh). Writes volumes.csv, RESULTS.md and
# volumes.png into the results dir.
#
# Default run: about 4-5 minutes on a 2-core TCG host (most of it the volume: each
# uncached request is a round trip to the daemon). Longer, steadier figures:
#   bash bench/volumes/run.sh --rounds 3 --iters 3000 --wait-quiet 600
# Smoke test (not a valid result):
#   bash bench/volumes/run.sh --repeats 1 --iters 50 --out /tmp/bench-volumes-smoke
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_volumes.py "$@"
