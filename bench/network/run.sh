#!/usr/bin/env bash
# Network benchmark: how soon a forked child reaches the network after its
# resume (resume -> first successful outbound request), against a naive QEMU
# full save/restore given the same network by hand; and TCP throughput with
# iperf3 (guest -> outside, host <-> guest through the port relay, and the
# host <-> "internet" ceiling without a VM).
#
# The bench makes its own "internet": a network namespace joined to the host
# by a veth pair, with a Python HTTP server that logs when each request
# arrives, and an iperf3 server. Needs root (namespaces, nft).
#
# Usage: bash bench/network/run.sh [--forks N] [--smoke] [--series diff,diff_nowait,live,live_nowait]
#                                  [--iperf-time S] [--iperf-runs N] [--wait-quiet S] [--out DIR]
#   --forks N        forks per series and naive restores (default 20; at least 10 for a valid result)
#   --smoke          allow --forks below 10 for a quick check; results say SMOKE
#   --series LIST    forkvm series: diff / live branches, with or without wait_for_network
#   --iperf-time S   iperf3 -t (default 10)
#   --iperf-runs N   iperf3 runs per direction (default 3; 0 skips the throughput part)
#   --wait-quiet S   first wait up to S seconds for other processes to leave the CPUs idle
#   --out DIR        results directory (default bench/network/results)
#   (bench_network.py --help lists the rest: --memory, --settle, --timeout)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_network.py with the repo's .venv
# (created by scripts/setup.sh). Writes network.csv, RESULTS.md and
# network.png into the results dir.
#
# Full run (about 15 min on a quiet 2-core TCG host):
#   bash bench/network/run.sh --wait-quiet 600
# Smoke test (a few minutes; not a valid result):
#   bash bench/network/run.sh --smoke --forks 3 --iperf-time 3 --iperf-runs 1 --out /tmp/bench-network-smoke
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_network.py "$@"
