#!/usr/bin/env bash
# Time-travel benchmark (issue 34): checkpoint pause and bytes per step of a
# 50-step agent loop against a full snapshot, rewind against a fresh spawn of
# the same checkpoint, diff of a 10,000-file tree against `git status` in the
# guest, merge against `git diff | git apply`; all ratios within one run.
#
# Usage: bash bench/timetravel/run.sh [--steps N] [--runs N] [--files N] [--out DIR]
#   --steps N   agent-loop steps, one checkpoint each (default 50)
#   --runs N    rewinds and fresh spawns, each (default 5)
#   --files N   files in the diff tree (default 10000; 100 changed per child)
#   --out DIR   results directory (default bench/timetravel/results)
#   (bench_timetravel.py --help lists the rest)
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/ live (default /var/lib/forkvm)
#
# Builds the release binary, then runs bench_timetravel.py with the repo's
# .venv (created by scripts/setup.sh). Writes results/*.csv, RESULTS.md and
# timetravel.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../common/run_bench.sh" "$HERE" bench_timetravel.py "$@"
