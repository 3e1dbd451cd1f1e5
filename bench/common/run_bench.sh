#!/usr/bin/env bash
# Shared launcher of every benchmark: checks the repo's .venv (made by
# scripts/setup.sh), builds the release binary, then runs the named Python
# harness with the given arguments.
#
# Usage: bench/common/run_bench.sh <bench dir> <script.py> [args...]
set -euo pipefail

HERE=$1
SCRIPT=$2
shift 2
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY="$REPO/.venv/bin/python"

if [[ ! -x "$PY" ]]; then
    echo "run.sh: $PY is missing: run scripts/setup.sh (it creates .venv with matplotlib)" >&2
    exit 1
fi
if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
    echo "run.sh: matplotlib is not installed in $REPO/.venv: run scripts/setup.sh" >&2
    exit 1
fi

# Where cargo puts the binary: $CARGO_TARGET_DIR if set (relative to the
# repo, where cargo runs), else the repo's target/.
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
[[ $TARGET == /* ]] || TARGET="$REPO/$TARGET"

echo "==> cargo build --release -p forkvm-cli"
(cd "$REPO" && cargo build --release -p forkvm-cli)

echo "==> $SCRIPT $*"
exec "$PY" "$HERE/$SCRIPT" --binary "$TARGET/release/forkvm" "$@"
