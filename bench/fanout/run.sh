#!/usr/bin/env bash
# Fan-out benchmark (issue 16): one running 512 MiB clone branched into 100
# children (`POST /v1/sandboxes/{id}/branch {"mode": "diff", "count": 100}`)
# and `spawn --count 100` from a snapshot of it, each until every child
# answers an exec, against 100 naive QEMU restores of a VM of the same image
# and size run by a pool of os.cpu_count() workers. Per child: the stages'
# wall and the CPU of its QEMU, of the daemon and of the daemon's helpers.
#
# Usage: bash bench/fanout/run.sh [--runs N] [--count N] [--modes diff,live,full]
#                                 [--smoke] [--wait-quiet S] [--out DIR]
#   --runs N        fan-outs per case (default 10; below 10 the results say so)
#   --count N       children per fan-out and naive restores per batch (default 100)
#   --modes LIST    branch modes to time (default diff)
#   --smoke         a quick check (e.g. --runs 2 --count 20); results say SMOKE
#   --wait-quiet S  first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR       results directory (default bench/fanout/results)
#   (bench_fanout.py --help lists the rest: --memory, --naive-runs, --naive-workers,
#    --settle, --rest, --exec-timeout, --call-timeout)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_fanout.py with the repo's .venv
# (created by scripts/setup.sh). Writes results/fanout.csv, children.csv,
# RESULTS.md, fanout.png and cpu.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_fanout.py "$@"
