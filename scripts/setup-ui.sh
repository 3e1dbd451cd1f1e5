#!/usr/bin/env bash
# Build and install the web dashboard (ui/), and install what its browser test
# needs (Debian's chromium, tests/ui's npm packages).
#
# Idempotent: each step checks a stamp first and only acts when its inputs
# changed, so a run on a ready machine takes about a second. Output in the
# style of scripts/setup.sh.
#
# Usage: scripts/setup-ui.sh [--force]
#   --force    rebuild and reinstall the dashboard even if nothing changed
# Environment:
#   FORKVM_HOME=/var/lib/forkvm   the dashboard is installed to $FORKVM_HOME/ui
#   FORKVM_UI_SKIP_CHROMIUM=1     do not install chromium (build hosts without the test)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UI=$REPO/ui
TESTS=$REPO/tests/ui
HOME_DIR=${FORKVM_HOME:-/var/lib/forkvm}
DEST=$HOME_DIR/ui
LOG_DIR=$HOME_DIR/logs
FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "error: unknown argument: $arg (usage: scripts/setup-ui.sh [--force])" >&2
            exit 2
            ;;
    esac
done

# Output, errors and long commands as in setup.sh (step, die, run_long).
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$REPO/scripts/lib.sh"
T0=$(now)
# hash_of FILE...: one short hash of the files' contents (missing files count as empty).
hash_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }

mkdir -p "$LOG_DIR" 2>/dev/null || LOG_DIR=$(mktemp -d)

# --- 1. Node.js and chromium -----------------------------------------------
step "Node.js and Chromium"
command -v node >/dev/null && command -v npm >/dev/null ||
    die "node and npm are missing." "Run scripts/setup.sh first (it installs Node.js), then re-run scripts/setup-ui.sh."
node_major=$(node -p 'process.versions.node.split(".")[0]')
((node_major >= 20)) || die "Node.js $(node --version) is too old; the dashboard's build needs 20 or newer." \
    "Install Node.js 20+ and re-run scripts/setup-ui.sh."
did=''
if [[ -z "${FORKVM_UI_SKIP_CHROMIUM:-}" && ! -x /usr/bin/chromium ]]; then
    [[ $EUID -eq 0 ]] || die "chromium is missing and installing it needs root." \
        "Re-run as root (sudo scripts/setup-ui.sh), or: apt-get install chromium"
    export DEBIAN_FRONTEND=noninteractive
    run_long "$LOG_DIR/apt-chromium.log" apt-get update -q ||
        die "apt-get update failed (log: $LOG_DIR/apt-chromium.log)." "Check access to the Debian mirror and re-run."
    run_long "$LOG_DIR/apt-chromium.log" apt-get install -y -q --no-install-recommends chromium ||
        die "apt-get install chromium failed (log: $LOG_DIR/apt-chromium.log)." "Fix the apt error above and re-run."
    did="installed chromium"
fi
chromium_ver=$(/usr/bin/chromium --version 2>/dev/null | awk '{print $2}' || true)
if [[ -n "$did" ]]; then
    step_done "node $(node --version), $did ${chromium_ver}"
else
    step_skip "node $(node --version), chromium ${chromium_ver:-(skipped)}"
fi

# --- 2. npm packages ----------------------------------------------------------
# npm ci installs exactly the lockfile; a stamp in node_modules records which
# lockfile that was, so an unchanged one costs nothing.
npm_ci() {
    local dir=$1 name=$2 lock
    lock=$(hash_of "$dir/package-lock.json")
    if ((FORCE)) || [[ "$(cat "$dir/node_modules/.forkvm-lock" 2>/dev/null)" != "$lock" ]]; then
        (cd "$dir" && run_long "$LOG_DIR/npm-$name.log" npm ci --no-audit --no-fund) ||
            die "npm ci in ${dir#"$REPO"/} failed (log: $LOG_DIR/npm-$name.log)." \
                "Check access to the npm registry and re-run scripts/setup-ui.sh."
        echo "$lock" >"$dir/node_modules/.forkvm-lock"
        return 0
    fi
    return 1
}
step "npm packages (ui/, tests/ui/)"
[[ -f "$UI/package-lock.json" && -f "$TESTS/package-lock.json" ]] ||
    die "ui/package-lock.json or tests/ui/package-lock.json is missing." "Restore them from git (git checkout -- ui tests/ui)."
did=()
npm_ci "$UI" ui && did+=(ui)
npm_ci "$TESTS" tests-ui && did+=(tests/ui)
if ((${#did[@]})); then step_done "npm ci in ${did[*]}"; else step_skip "lockfiles unchanged"; fi

# --- 3. build ui/dist ---------------------------------------------------------
# The build's inputs: sources, public files, configs and the lockfile. Their
# hash is stamped into dist/, so the build runs only when one changed.
step "Dashboard build (ui/dist)"
src_hash=$(bash "$UI/build-inputs.sh")
if ((FORCE)) || [[ "$(cat "$UI/dist/.forkvm-build" 2>/dev/null)" != "$src_hash" ]]; then
    (cd "$UI" && run_long "$LOG_DIR/ui-build.log" npm run build) ||
        die "npm run build in ui/ failed (log: $LOG_DIR/ui-build.log)." \
            "Fix the TypeScript or build error shown above and re-run scripts/setup-ui.sh."
    [[ -f "$UI/dist/index.html" ]] || die "the build left no ui/dist/index.html." "See $LOG_DIR/ui-build.log."
    echo "$src_hash" >"$UI/dist/.forkvm-build"
    step_done "$(find "$UI/dist" -type f | wc -l) files, $(du -sh "$UI/dist" | cut -f1)"
else
    step_skip "sources unchanged ($src_hash)"
fi

# --- 4. install into $FORKVM_HOME/ui ---------------------------------------------
# Copied to a temporary directory beside the target, then two renames swap it
# in (old out, new in): the daemon never serves a half-copied dashboard, only,
# for the microseconds between the renames, none.
step "Install to $DEST"
if ((!FORCE)) && [[ "$(cat "$DEST/.forkvm-build" 2>/dev/null)" == "$src_hash" ]]; then
    step_skip "installed build is current"
else
    mkdir -p "$HOME_DIR" || die "cannot create $HOME_DIR." "Run as a user that may write it (root), or set FORKVM_HOME."
    tmp=$(mktemp -d "$HOME_DIR/.ui.new.XXXXXX")
    trap 'rm -rf "$tmp" "${old:-}"; kill_run_long' EXIT
    cp -a "$UI/dist/." "$tmp/"
    chmod -R a+rX "$tmp"
    old=''
    if [[ -e "$DEST" ]]; then
        old=$(mktemp -u "$HOME_DIR/.ui.old.XXXXXX")
        mv "$DEST" "$old"
    fi
    mv "$tmp" "$DEST"
    [[ -n "$old" ]] && rm -rf "$old"
    trap kill_run_long EXIT
    step_done "$(find "$DEST" -type f | wc -l) files"
fi
log "${C_DIM}dashboard setup finished in $(elapsed "$T0")${C_RESET}"
