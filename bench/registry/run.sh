#!/usr/bin/env bash
# Registry benchmark: `forkvm snapshot push` and `snapshot pull` of two
# snapshots of one boot template through a local OCI registry (cold, then
# the second snapshot after the first: what is skipped, in time and bytes),
# against the same files as one tar layer pushed and pulled with skopeo, in
# the same run; plus an offline replay of the chunking at 1-16 MiB chunks.
#
# Usage: bash bench/registry/run.sh [--runs N] [--data-mib MiB] [--memory MiB]
#                                   [--no-chunk-sizes] [--wait-quiet S]
#                                   [--out DIR] [--binary PATH]
#   --runs N          repetitions (default 5; fewer than 3 is a smoke run); each
#                     run has a fresh registry and fresh daemon homes
#   --data-mib MiB    random data each sandbox writes before its snapshot (64)
#   --memory MiB      guest RAM (default 512)
#   --no-chunk-sizes  skip the offline chunk-size table (run 1, ~1 min)
#   --wait-quiet S    first wait up to S seconds for other processes to leave
#                     the CPUs idle
#   --out DIR         results directory (default bench/registry/results)
#   --binary PATH     use this forkvm binary instead of building the release one
# Environment:
#   FORKVM_ARTIFACTS  where guest/ and images/default live (default /var/lib/forkvm)
#   BENCH_PYTHON      the Python with matplotlib to use (default: this checkout's
#                     .venv, else, in a git worktree, the main checkout's .venv)
#
# Needs docker-registry, skopeo, GNU tar and gzip (Debian: apt-get install
# docker-registry skopeo); fails, naming what is missing, without them. Uses
# the `zstandard` module or the `zstd` tool for the chunk-size table, if any.
# Writes results/registry.csv, chunk_sizes.csv, RESULTS.md, registry.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

missing=()
for tool in docker-registry skopeo tar gzip; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if (( ${#missing[@]} )); then
    echo "run.sh: missing tool(s): ${missing[*]}." >&2
    echo "run.sh: this bench needs them all; on Debian: apt-get install docker-registry skopeo tar gzip" >&2
    exit 1
fi

has_matplotlib() { [[ -x $1 ]] && "$1" -c 'import matplotlib' 2>/dev/null; }

for arg in "$@"; do
    if [[ $arg == --binary || $arg == --binary=* ]]; then
        # A given binary: no build. The .venv as run_bench.sh checks it, or
        # (a git worktree has none of its own) the main checkout's.
        PY=${BENCH_PYTHON:-$REPO/.venv/bin/python}
        if ! has_matplotlib "$PY" && [[ -z ${BENCH_PYTHON:-} ]]; then
            common=$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
            [[ -n $common ]] && has_matplotlib "$(dirname "$common")/.venv/bin/python" \
                && PY="$(dirname "$common")/.venv/bin/python"
        fi
        if ! has_matplotlib "$PY"; then
            echo "run.sh: no Python with matplotlib: $PY (run scripts/setup.sh, or set BENCH_PYTHON)" >&2
            exit 1
        fi
        exec "$PY" "$HERE/bench_registry.py" "$@"
    fi
done
exec "$REPO/bench/common/run_bench.sh" "$HERE" bench_registry.py "$@"
