# shellcheck shell=bash
# Common helpers for scripts/setup.sh and scripts/build-guest.sh.
# Source it; do not run it. It expects `set -euo pipefail` in the caller.

if [[ -n "${FORKVM_LIB_SOURCED:-}" ]]; then
    return 0
fi
FORKVM_LIB_SOURCED=1

# --- output -----------------------------------------------------------------

if [[ -t 1 && -z "${NO_COLOR:-}" && "${TERM:-dumb}" != dumb ]]; then
    C_BOLD=$'\033[1m' C_DIM=$'\033[2m' C_RED=$'\033[31m' C_GREEN=$'\033[32m'
    C_YELLOW=$'\033[33m' C_BLUE=$'\033[34m' C_RESET=$'\033[0m'
else
    C_BOLD='' C_DIM='' C_RED='' C_GREEN='' C_YELLOW='' C_BLUE='' C_RESET=''
fi

# What to tell the user when a command fails unexpectedly; steps override it.
FAIL_HINT=''
STEP_NAME=''
STEP_T0=''

now() { printf '%s' "${EPOCHREALTIME/,/.}"; }

# elapsed <start> -> "1.2s" / "1m05s"
elapsed() {
    local start=$1 end ms
    end=$(now)
    ms=$(( (${end%.*} * 1000 + 10#$(printf '%.3s' "${end#*.}000")) \
         - (${start%.*} * 1000 + 10#$(printf '%.3s' "${start#*.}000")) ))
    if (( ms < 60000 )); then
        printf '%d.%ds' $((ms / 1000)) $(((ms % 1000) / 100))
    else
        printf '%dm%02ds' $((ms / 60000)) $(((ms % 60000) / 1000))
    fi
}

log()  { printf '%s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
warn() { printf '%swarning:%s %s\n' "$C_YELLOW" "$C_RESET" "$*" >&2; }

die() {
    printf '\n%serror:%s %s\n' "$C_RED$C_BOLD" "$C_RESET" "$1" >&2
    shift
    local line
    for line in "$@"; do printf '       %s\n' "$line" >&2; done
    exit 1
}

# step "Title": start a step; finish it with step_ok / step_done / step_skip.
step() {
    STEP_NAME=$1
    STEP_T0=$(now)
    printf '%s==>%s %s%s%s\n' "$C_BLUE$C_BOLD" "$C_RESET" "$C_BOLD" "$1" "$C_RESET"
}
_step_result() {
    local colour=$1 word=$2
    shift 2
    printf '    %s%s%s %s(%s)%s%s\n' "$colour" "$word" "$C_RESET" "$C_DIM" \
        "$(elapsed "$STEP_T0")" "$C_RESET" "${1:+ $1}"
    STEP_NAME=''
    FAIL_HINT=''
}
step_ok()   { _step_result "$C_GREEN" ok "${1:-}"; }
step_done() { _step_result "$C_GREEN" 'done' "${1:-}"; }
step_skip() { _step_result "$C_DIM" 'skip (present)' "${1:-}"; }

# ERR trap: say which step and command failed and what to do about it.
_on_err() {
    local rc=$1 line=$2 cmd=$3 src=$4
    trap - ERR
    printf '\n%serror:%s command failed (exit %s) at %s:%s%s:\n       %s\n' \
        "$C_RED$C_BOLD" "$C_RESET" "$rc" "${src##*/}" "$line" \
        "${STEP_NAME:+ during step \"$STEP_NAME\"}" "$cmd" >&2
    if [[ -n "$FAIL_HINT" ]]; then
        printf '       %s\n' "$FAIL_HINT" >&2
    fi
    printf '       Fix the problem above and re-run the script; it resumes where it stopped.\n' >&2
    exit "$rc"
}
set -E
trap '_on_err "$?" "$LINENO" "$BASH_COMMAND" "${BASH_SOURCE[0]}"' ERR

# Background command of run_long; stopped if the script exits early.
RUN_LONG_PID=''
kill_run_long() {
    if [[ -n "$RUN_LONG_PID" ]] && kill -0 "$RUN_LONG_PID" 2>/dev/null; then
        kill -TERM "$RUN_LONG_PID" 2>/dev/null || true
        wait "$RUN_LONG_PID" 2>/dev/null || true
        printf '\n' >&2
    fi
    RUN_LONG_PID=''
}
# Scripts that set their own EXIT trap must call kill_run_long from it.
trap kill_run_long EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# usage: print the comment block at the top of the running script.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

require_root() {
    if [[ $EUID -ne 0 ]]; then
        die "$1 must run as root." \
            "Re-run it as root, e.g.: sudo env \"PATH=\$PATH\" $1"
    fi
}

# Put a rustup-installed toolchain on PATH when the caller's PATH lacks it
# (typical under sudo).
ensure_cargo_path() {
    if ! command -v cargo >/dev/null 2>&1; then
        local d
        for d in "${CARGO_HOME:-$HOME/.cargo}/bin" "$HOME/.cargo/bin"; do
            if [[ -x "$d/cargo" ]]; then
                PATH="$d:$PATH"
                export PATH
                break
            fi
        done
    fi
}

# run_long <log file> <cmd...>: run a long command. On a terminal, its output
# goes to the log file while a spinner shows the elapsed time and the last
# output line; on failure the end of the log is printed. Without a terminal
# (CI), the output is shown as it comes and also kept in the log.
run_long() {
    local logf=$1
    shift
    local t0 rc=0
    t0=$(now)
    if [[ -t 1 ]]; then
        : >"$logf"
        "$@" >"$logf" 2>&1 &
        RUN_LONG_PID=$!
        local pid=$! i=0 spin="|/-\\" last cols
        cols=$(tput cols 2>/dev/null || true)
        [[ "$cols" =~ ^[0-9]+$ && $cols -ge 40 ]] || cols=80
        while kill -0 "$pid" 2>/dev/null; do
            last=$(tail -n 1 "$logf" 2>/dev/null | tr -d '\r\t' | cut -c 1-$((cols - 20)) || true)
            printf '\r\033[K    %s %s %s%s%s' "${spin:i++%4:1}" "$(elapsed "$t0")" \
                "$C_DIM" "$last" "$C_RESET"
            sleep 0.25
        done
        wait "$pid" || rc=$?
        RUN_LONG_PID=''
        printf '\r\033[K'
        if (( rc != 0 )); then
            printf '    last lines of %s:\n' "$logf" >&2
            tail -n 25 "$logf" | sed 's/^/    | /' >&2
        fi
    else
        "$@" 2>&1 | tee "$logf" | sed -u 's/^/    | /' || rc=$?
    fi
    return "$rc"
}

# --- stamps -----------------------------------------------------------------
# A stamp file next to an artefact holds the sha256 of everything the artefact
# was built from; the artefact is rebuilt when that hash changes.

inputs_hash() { printf '%s\n' "$@" | sha256sum | cut -d' ' -f1; }

# stamp_ok <stamp> <hash> <artefact...>: true when stamp matches and all
# artefacts exist.
stamp_ok() {
    local stamp=$1 hash=$2 f
    shift 2
    [[ -f "$stamp" && "$(cat "$stamp")" == "$hash" ]] || return 1
    for f in "$@"; do [[ -e "$f" ]] || return 1; done
}

stamp_write() {
    printf '%s\n' "$2" >"$1.tmp.$$"
    mv -f "$1.tmp.$$" "$1"
}

human_size() { numfmt --to=iec-i --suffix=B --format='%.1f' "$1"; }

# --- apt sources ----------------------------------------------------------------
# apt_find_suite <suite>: find the first enabled "deb" entry for <suite> in the
# host apt configuration (one-line sources.list files and deb822 .sources).
# Prints the URI on the first line and the raw Signed-By value (possibly
# several lines, possibly empty) after it. Returns 1 when there is none.
apt_find_suite() {
    local suite=$1 f etc=${FORKVM_APT_ETC:-/etc/apt}   # override for tests only
    local -a files=()
    [[ -f "$etc/sources.list" ]] && files+=("$etc/sources.list")
    for f in "$etc"/sources.list.d/*.list "$etc"/sources.list.d/*.sources; do
        [[ -f "$f" ]] && files+=("$f")
    done
    (( ${#files[@]} )) || return 1
    awk -v want="$suite" '
        function has(list, word,   n, a, i) {
            n = split(list, a, /[ \t]+/)
            for (i = 1; i <= n; i++) if (a[i] == word) return 1
            return 0
        }
        function flush() {
            if (!found && inst && enabled && has(types, "deb") && has(suites, want) && uris != "") {
                split(uris, u, /[ \t]+/)
                print u[1]
                if (signed != "") print signed
                found = 1
            }
            inst = 0; types = ""; uris = ""; suites = ""; signed = ""; enabled = 1; field = ""
        }
        FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
        found { next }
        # ---- one-line format ----
        !deb822 {
            line = $0; sub(/#.*/, "", line)
            if (line !~ /^[ \t]*deb[ \t]/) next
            sub(/^[ \t]*deb[ \t]+/, "", line)
            opts = ""
            if (line ~ /^\[/) {
                opts = substr(line, 2, index(line, "]") - 2)
                line = substr(line, index(line, "]") + 1)
                sub(/^[ \t]+/, "", line)
            }
            n = split(line, w, /[ \t]+/)
            if (n >= 2 && w[2] == want) {
                print w[1]
                m = split(opts, o, /[ \t]+/)
                for (i = 1; i <= m; i++) if (tolower(o[i]) ~ /^signed-by=/) print substr(o[i], 11)
                found = 1
            }
            next
        }
        # ---- deb822 format ----
        /^[ \t]*$/ { flush(); next }
        /^#/ { next }
        /^[ \t]/ {          # continuation line
            if (field == "signed-by") signed = signed "\n" $0
            else if (field == "uris") uris = uris " " $0
            else if (field == "suites") suites = suites " " $0
            else if (field == "types") types = types " " $0
            next
        }
        {
            inst = 1
            k = tolower(substr($0, 1, index($0, ":") - 1))
            v = substr($0, index($0, ":") + 1); sub(/^[ \t]+/, "", v); sub(/[ \t]+$/, "", v)
            field = k
            if (k == "types") types = v
            else if (k == "uris") uris = v
            else if (k == "suites") suites = v
            else if (k == "signed-by") signed = v
            else if (k == "enabled") enabled = (tolower(v) != "no")
        }
        END { flush(); exit(found ? 0 : 1) }
    ' "${files[@]}"
}

# apt_mirror_uri: the Debian mirror of the host for bookworm.
apt_mirror_uri() {
    local out
    out=$(apt_find_suite bookworm) || return 1
    printf '%s\n' "${out%%$'\n'*}"
}
