#!/usr/bin/env bash
# Run the SDK test suites, each against a real daemon it starts itself with
# the test launcher, `forkvm serve --ephemeral` (docs/testing.md): the Python SDK with pytest, the TypeScript SDK with Node's test
# runner. Both include their examples (examples/tree_search.py,
# examples/quickstart.ts) and a test that fails when the SDK lacks a method
# for an operation of docs/openapi.json.
#
# Usage: scripts/test-sdks.sh [python|typescript]...   (default: both)
# Environment: FORKVM_BIN (default target/debug/forkvm).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export FORKVM_BIN=${FORKVM_BIN:-$REPO/target/debug/forkvm}
export FORKVM_IMAGES_HOME=${FORKVM_ARTIFACTS:-/var/lib/forkvm}
[ -x "$FORKVM_BIN" ] || { echo "test-sdks: no forkvm binary at $FORKVM_BIN; run cargo build" >&2; exit 1; }
[ -d "$FORKVM_IMAGES_HOME/guest" ] || { echo "test-sdks: no guest artefacts in $FORKVM_IMAGES_HOME; run scripts/setup.sh" >&2; exit 1; }
# The suites start their own daemons; a FORKVM_URL from the caller's shell
# would point them at someone else's.
unset FORKVM_URL FORKVM_TOKEN

which=("$@")
[ ${#which[@]} -gt 0 ] || which=(python typescript)
for w in "${which[@]}"; do
    case $w in
        python)
            echo "== Python SDK (pytest)"
            [ -x "$REPO/.venv/bin/pytest" ] || { echo "test-sdks: pytest missing; run scripts/setup.sh" >&2; exit 1; }
            # This checkout's SDK, whatever checkout the venv's editable install points at.
            (cd "$REPO/sdk/python" && PYTHONPATH="$REPO/sdk/python/src${PYTHONPATH:+:$PYTHONPATH}" \
                "$REPO/.venv/bin/python" -m pytest -q -p no:cacheprovider tests)
            ;;
        typescript)
            echo "== TypeScript SDK (node --test)"
            [ -d "$REPO/sdk/typescript/node_modules" ] || { echo "test-sdks: sdk/typescript/node_modules missing; run scripts/setup.sh" >&2; exit 1; }
            (cd "$REPO/sdk/typescript" && npm test --silent)
            ;;
        *) echo "usage: $0 [python|typescript]..." >&2; exit 2 ;;
    esac
done
