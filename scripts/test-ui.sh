#!/usr/bin/env bash
# Browser test of the web dashboard (tests/ui/dashboard.test.mjs): starts a
# real daemon on 127.0.0.1 with a random token, serving this tree's ui/dist,
# and drives Debian's Chromium through it: login, spawn, branch into 3, live
# update, terminal, remove, branching a paused child, a branch child's changes
# (with a patch) merged into its source, wrong token, keyboard
# navigation, axe-core, time travel (checkpoint twice, rewind to the first with
# an undo checkpoint, prune by retention), and
# no request to any other origin. Saves
# docs/img/dashboard-{tree,sandbox,changes,timeline}.png.
#
# Usage: scripts/test-ui.sh
# Environment:
#   FORKVM_BIN=target/debug/forkvm   the daemon binary (relative to the repo, or absolute)
#   FORKVM_IMAGES_HOME=/var/lib/forkvm   where the installed guest and images are
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export FORKVM_BIN=${FORKVM_BIN:-target/debug/forkvm}

fail() {
    printf 'error: %s\n' "$1" >&2
    shift
    local line
    for line in "$@"; do printf '       %s\n' "$line" >&2; done
    exit 1
}

# Each missing piece is named, with the command that provides it; nothing
# here installs anything (that is setup's job).
command -v node >/dev/null || fail "node is missing." "run scripts/setup.sh"
[[ -x /usr/bin/chromium ]] || fail "/usr/bin/chromium is missing." "run scripts/setup.sh (it runs scripts/setup-ui.sh, which installs Debian's chromium)"
[[ -d tests/ui/node_modules/playwright-core && -d tests/ui/node_modules/axe-core ]] ||
    fail "tests/ui/node_modules is missing playwright-core or axe-core." "run scripts/setup.sh"
[[ -f ui/dist/index.html ]] || fail "ui/dist is not built." "run scripts/setup.sh (or scripts/setup-ui.sh)"
[[ -x "$FORKVM_BIN" ]] || fail "no daemon binary at $FORKVM_BIN." "build it (make build) or set FORKVM_BIN"
# The dist must be the build of the current sources, or the test would pass
# on stale assets; setup-ui.sh stamps the build with its inputs' hash.
src_hash=$(bash ui/build-inputs.sh)
[[ "$(cat ui/dist/.forkvm-build 2>/dev/null)" == "$src_hash" ]] ||
    fail "ui/dist was not built from the current sources of ui/." "run scripts/setup-ui.sh"

cd tests/ui
exec node --test --test-reporter=spec dashboard.test.mjs
