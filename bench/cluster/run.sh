#!/usr/bin/env bash
# Cluster benchmark (issue 32): what one endpoint in front of several forkvm
# nodes costs, each figure a ratio against its baseline in the same run:
#   1. exec `true` through the gateway against straight to the node
#      (p50 / p90 / p99, interleaved);
#   2. a child spawned on another node (which first pulls the snapshot from
#      the source node's /v2/forkvm/snapshots) against one on the source's
#      node: time to a running child and bytes moved, with the source node's
#      template not yet on the target (cold) and already there (warm);
#   3. a 64-way branch spread by the gateway over 3 nodes against 64
#      children on one node: wall until every child answered an exec.
# No Ray: the harness starts four node daemons (n1, n2, n3, solo) and two
# gateways on 127.0.0.1 in a temp dir, and stops them by pid at the end.
#
# Usage: bash bench/cluster/run.sh [--requests N] [--rounds N] [--count N]
#                                  [--runs N] [--smoke] [--wait-quiet S]
#                                  [--home-parent DIR] [--out DIR]
#   --requests N   exec `true` per path for 1. (default 1000)
#   --rounds N     rounds of 2. (default 10)
#   --count N      children per branch in 3. (default 64)
#   --runs N       branch runs per case in 3. (default 5)
#   --smoke        a quick check (30 requests, 2 rounds, 9 children, 1 run); results say SMOKE
#   --home-parent  where the temp dir with the nodes' homes goes (default /tmp)
#   --out DIR      results directory (default bench/cluster/results)
#   (bench_cluster.py --help lists the rest: --memory, --parts, --warmup,
#    --rest, --call-timeout)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_cluster.py with the repo's .venv
# (created by scripts/setup.sh). Writes results/requests.csv, transfer.csv,
# branch.csv, RESULTS.md and cluster.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_cluster.py "$@"
