#!/usr/bin/env bash
# The cluster acceptance test (issue 32, docs/cluster.md): a 3-node Ray
# cluster on 127.0.0.1 started with `python -m forkvm.ray up`, one daemon per
# node, everything through the cluster endpoint (tests/cluster). It stops
# what it started by PID and fails if anything is left.
#
# Usage: scripts/test-cluster.sh
# Environment: FORKVM_BIN (default target/debug/forkvm), FORKVM_ARTIFACTS
# (where guest/ and images/ live; default /var/lib/forkvm).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export FORKVM_BIN=${FORKVM_BIN:-$REPO/target/debug/forkvm}
PY=$REPO/.venv/bin/python
[ -x "$FORKVM_BIN" ] || { echo "test-cluster: no forkvm binary at $FORKVM_BIN; run cargo build" >&2; exit 1; }
[ -x "$PY" ] || { echo "test-cluster: $PY is missing; run scripts/setup.sh" >&2; exit 1; }
"$PY" -c 'import ray' 2>/dev/null || { echo "test-cluster: Ray is not in .venv; run scripts/setup.sh (it installs forkvm[ray])" >&2; exit 1; }
[ -x "$REPO/.venv-compat/bin/python" ] || { echo "test-cluster: .venv-compat (the e2b SDK) is missing; run scripts/setup.sh" >&2; exit 1; }
# The test starts its own cluster; a FORKVM_URL from the caller's shell would
# point the CLI checks at someone else's daemon.
unset FORKVM_URL FORKVM_TOKEN E2B_API_URL E2B_SANDBOX_URL E2B_API_KEY
echo "== cluster (3 Ray nodes on 127.0.0.1, tests/cluster)"
start=$(date +%s)
cd "$REPO"
PYTHONPATH="$REPO/sdk/python/src${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -s -p no:cacheprovider tests/cluster
echo "test-cluster: passed in $(( $(date +%s) - start )) s"
