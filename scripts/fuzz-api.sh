#!/usr/bin/env bash
# Fuzz the REST API with schemathesis, from the checked-in OpenAPI document,
# against a real daemon on loopback TCP (bearer token on). Every operation is
# exercised with generated valid and invalid input; the run fails on any 5xx,
# any status the document does not list, and any response that violates its
# schema.
#
# Usage: scripts/fuzz-api.sh [--max-examples N] [--max-time S]
# Environment: FORKVM_BIN (default target/debug/forkvm), FORKVM_ARTIFACTS
# (where guest/ and images/ live; default /var/lib/forkvm).
#
# The daemon gets a private home and `--max-sandboxes 3`, so generated spawn
# requests (count up to 1000) are bounded by the documented 429 instead of
# filling the host, and `--allowed-registries 127.0.0.1:9`, so generated
# pulls never leave the machine, and `--memory-commit-mib` far above any
# request, since a generated spawn cannot know the host's capacity and
# admission's 503 would read as a server error (admission has its own VM
# test, crates/forkvm-cli/tests/lifetime.rs). It is stopped by PID at the
# end, and its sandboxes with it.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${FORKVM_BIN:-$REPO/target/debug/forkvm}
ART=${FORKVM_ARTIFACTS:-/var/lib/forkvm}
ST=$REPO/.venv/bin/schemathesis
MAX_EXAMPLES=25
MAX_TIME=
while [ $# -gt 0 ]; do
    case $1 in
        --max-examples) MAX_EXAMPLES=$2; shift 2 ;;
        --max-time) MAX_TIME=$2; shift 2 ;;
        *) echo "usage: $0 [--max-examples N] [--max-time S]" >&2; exit 2 ;;
    esac
done
[ -x "$BIN" ] || { echo "fuzz-api: no forkvm binary at $BIN; run cargo build" >&2; exit 1; }
[ -x "$ST" ] || { echo "fuzz-api: schemathesis missing; run scripts/setup.sh" >&2; exit 1; }
[ -d "$ART/guest" ] || { echo "fuzz-api: no guest artefacts in $ART; run scripts/setup.sh" >&2; exit 1; }

HOME_DIR=$(mktemp -d /tmp/forkvm-fuzz.XXXXXX)
ln -s "$ART/guest" "$HOME_DIR/guest"
# Images of its own (the built ones linked in), so generated imports,
# builds and removals never touch the shared ones.
mkdir "$HOME_DIR/images"
for img in "$ART"/images/*/; do
    ln -s "${img%/}" "$HOME_DIR/images/$(basename "$img")"
done
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
DAEMON=
cleanup() {
    if [ -n "$DAEMON" ]; then
        # Remove what the fuzzer made, then stop our daemon (by its PID).
        for id in $(FORKVM_HOME=$HOME_DIR "$BIN" --json ps 2>/dev/null |
                    python3 -c 'import json, sys; [print(s["id"]) for s in json.load(sys.stdin)["sandboxes"]]' 2>/dev/null || true); do
            FORKVM_HOME=$HOME_DIR "$BIN" rm "$id" >/dev/null 2>&1 || true
        done
        kill "$DAEMON" 2>/dev/null || true
        wait "$DAEMON" 2>/dev/null || true
    fi
    rm -rf "$HOME_DIR"
}
trap cleanup EXIT

# Generated pull references must not reach registries off this machine:
# only a loopback port nothing listens on is allowed.
FORKVM_TOKEN=$TOKEN "$BIN" serve --home "$HOME_DIR" --listen "127.0.0.1:$PORT" \
    --max-sandboxes 3 --allowed-registries "127.0.0.1:9" --memory-commit-mib 100000000 >"$HOME_DIR/serve.log" 2>&1 &
DAEMON=$!
for _ in $(seq 1 100); do
    curl -sf -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/v1/health" >/dev/null && break
    sleep 0.1
done
curl -sf -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/v1/health" >/dev/null || {
    echo "fuzz-api: the daemon did not start:" >&2; cat "$HOME_DIR/serve.log" >&2; exit 1; }

echo "fuzz-api: schemathesis against http://127.0.0.1:$PORT (max $MAX_EXAMPLES examples per operation)"
args=(run "$REPO/docs/openapi.json" --url "http://127.0.0.1:$PORT"
      -H "Authorization: Bearer $TOKEN"
      --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance
      --max-examples "$MAX_EXAMPLES" --workers 1 --seed 1 --no-color
      --request-timeout 300 --suppress-health-check all --generation-database none
      # The event stream and a directory watch never end by themselves, so
      # no response would complete and each example would wait out the
      # request timeout (a watch on a sandbox the fuzzer had made once held
      # a CI run past its limit). crates/forkvm-cli/tests/events.rs tests
      # the events (auth, order, replay), tests/processes.rs the watch.
      --exclude-path /v1/events --exclude-path /v1/sandboxes/{id}/fs/watch)
[ -n "$MAX_TIME" ] && args+=(--max-time "$MAX_TIME")
# A bound on the whole run (it takes about 2 minutes here), so a request that
# hangs fails this stage with the daemon's log instead of stalling `make test`.
rc=0
timeout --foreground "${FUZZ_DEADLINE:-900}" "$ST" "${args[@]}" || rc=$?
if [ "$rc" = 124 ]; then
    echo "fuzz-api: schemathesis did not finish within ${FUZZ_DEADLINE:-900} s: a request hung." >&2
    echo "fuzz-api: the daemon's last log lines:" >&2
    tail -n 40 "$HOME_DIR/serve.log" >&2
fi
exit "$rc"
