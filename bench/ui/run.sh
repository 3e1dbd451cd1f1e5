#!/usr/bin/env bash
# Dashboard render benchmark (issue 17): time for the web dashboard to show a
# 500-node branch tree in headless Chromium (navigation start to every node in
# the DOM and laid out), against the time the same page takes to fetch and
# parse the three raw lists the tree is drawn from.
#
# Usage: bash bench/ui/run.sh [--nodes N] [--runs N] [--sources N] [--children N]
#                             [--smoke] [--out DIR]
#   --nodes N     nodes in the tree (default 500; fewer needs --smoke)
#   --runs N      page loads measured (default 10; fewer needs --smoke)
#   --sources N   sandboxes spawned from the image (default 4)
#   --children N  children each source is branched into (default 2)
#   --out DIR     results directory (default bench/ui/results)
# Environment:
#   FORKVM_BIN=target/release/forkvm   the daemon (build it first: cargo build --release -p forkvm-cli)
#   PYTHON=.venv/bin/python            Python with matplotlib (scripts/setup.sh makes .venv)
#
# Needs ui/dist, chromium and tests/ui's packages (scripts/setup-ui.sh). The
# tree is built through the API (most nodes are branch points without
# children, since each sandbox is a VM): about 10 minutes under TCG, then
# about a minute of page loads. Writes ui.csv, meta.json, RESULTS.md, ui.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export FORKVM_BIN=${FORKVM_BIN:-$REPO/target/release/forkvm}
PY=${PYTHON:-$REPO/.venv/bin/python}
OUT=$HERE/results
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == --out ]] && OUT=${args[i + 1]:-$OUT}
    [[ ${args[i]} == --out=* ]] && OUT=${args[i]#--out=}
done

fail() {
    echo "run.sh: $*" >&2
    exit 1
}
[[ -x "$FORKVM_BIN" ]] || fail "no daemon at $FORKVM_BIN: cargo build --release -p forkvm-cli, or set FORKVM_BIN"
[[ -x "$PY" ]] || fail "$PY is missing: run scripts/setup.sh (it creates .venv with matplotlib), or set PYTHON"
"$PY" -c 'import matplotlib' 2>/dev/null || fail "matplotlib is not installed for $PY: run scripts/setup.sh"
[[ -x /usr/bin/chromium && -d "$REPO/tests/ui/node_modules/playwright-core" ]] ||
    fail "chromium or tests/ui/node_modules is missing: run scripts/setup.sh"
[[ -f "$REPO/ui/dist/index.html" ]] || fail "ui/dist is not built: run scripts/setup-ui.sh"
[[ "$(cat "$REPO/ui/dist/.forkvm-build" 2>/dev/null)" == "$(bash "$REPO/ui/build-inputs.sh")" ]] ||
    fail "ui/dist is older than ui/'s sources: run scripts/setup-ui.sh"

echo "==> bench_ui.mjs $*"
node "$HERE/bench_ui.mjs" "$@"
echo "==> report_ui.py"
"$PY" "$HERE/report_ui.py" --out "$OUT"
