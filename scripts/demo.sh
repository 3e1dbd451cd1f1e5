#!/usr/bin/env bash
# The main job, for a new user: boot the default image, run Python in it,
# and show the result. `make demo` runs this after setup and build.
set -euo pipefail
cd "$(dirname "$0")/.."
FORKVM=${FORKVM:-target/release/forkvm}
export FORKVM_HOME=${FORKVM_HOME:-/var/lib/forkvm}

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "forkvm doctor"
"$FORKVM" doctor

say "forkvm info (the CLI starts a local daemon if none is running)"
"$FORKVM" info

say "Spawn a microVM from the default image"
ID=$("$FORKVM" spawn)
trap '"$FORKVM" rm "$ID" >/dev/null 2>&1 || true' EXIT
"$FORKVM" --json inspect "$ID" | python3 -c '
import json, sys
s = json.load(sys.stdin)
t = s["timings"]
if t.get("template_ms") is not None:
    how = ("booted in %.0f ms, saved as the boot template in %.0f ms, then cloned from it in %.0f ms"
           % (t["boot_ms"], t["template_ms"], t.get("restore_ms", 0) + t.get("identity_ms", 0)))
elif s.get("snapshot"):
    how = "restored from the boot template in %.0f ms" % (t.get("restore_ms", 0) + t.get("identity_ms", 0))
else:
    how = "booted in %.0f ms" % t["boot_ms"]
print("sandbox %s: %s MiB, %s vCPU, accel %s; %s; %.0f ms in all"
      % (s["id"], s["memory_mib"], s["cpus"], s["accel"], how, t["total_ms"]))
'

say "Run Python inside it"
"$FORKVM" exec "$ID" -- python3 -c 'import platform, os; print(f"Hello from Python {platform.python_version()} in a {platform.system()} {platform.release()} microVM, hostname {os.uname().nodename}"); print("6 * 7 =", 6 * 7)'

say "Files go in and come out"
echo "print(sum(range(101)))" > /tmp/forkvm-demo.py
"$FORKVM" exec "$ID" -- mkdir -p /work
"$FORKVM" exec -i "$ID" -- sh -c 'cat > /work/sum.py' < /tmp/forkvm-demo.py
"$FORKVM" exec "$ID" -- python3 /work/sum.py
rm -f /tmp/forkvm-demo.py

say "Fork it: snapshot the running sandbox and spawn two children from that instant"
"$FORKVM" exec "$ID" -- sh -c 'echo "written before the fork" > /work/state.txt'
SNAP=$("$FORKVM" snapshot "$ID" --tag "demo-$ID")
KIDS=$("$FORKVM" spawn --snapshot "$SNAP" --count 2)
trap '"$FORKVM" snapshot rm --force "$SNAP" >/dev/null 2>&1 || true; "$FORKVM" rm "$ID" >/dev/null 2>&1 || true' EXIT
n=0
for K in $KIDS; do
  n=$((n + 1))
  "$FORKVM" exec "$K" -- python3 -c "import os, uuid; print(f'child {os.uname().nodename}: sees {open(\"/work/state.txt\").read().strip()!r}, its own uuid {uuid.uuid4()}')"
  "$FORKVM" exec "$K" -- sh -c "echo 'child $n was here' >> /work/state.txt"
done
for K in $KIDS; do
  printf '%s: ' "$K"; "$FORKVM" exec "$K" -- tail -n1 /work/state.txt
done
printf 'source %s: ' "$ID"; "$FORKVM" exec "$ID" -- tail -n1 /work/state.txt

say "Sandboxes and snapshots"
"$FORKVM" ps
"$FORKVM" snapshot ls
"$FORKVM" snapshot rm --force "$SNAP"

say "Remove it"
"$FORKVM" rm "$ID"
trap - EXIT

say "One-shot: forkvm run -- python3 -c 'print(6*7)'"
"$FORKVM" run -- python3 -c 'print(6*7)'
