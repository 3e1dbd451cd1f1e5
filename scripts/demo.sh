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
"$FORKVM" --json inspect "$ID" | python3 -c 'import json,sys; s=json.load(sys.stdin); t=s["timings"]; print(f"sandbox {s[\"id\"]}: {s[\"memory_mib\"]} MiB, {s[\"cpus\"]} vCPU, accel {s[\"accel\"]}; booted in {t[\"total_ms\"]:.0f} ms (QEMU start {t[\"qemu_start_ms\"]:.0f} ms, guest boot {t[\"boot_ms\"]:.0f} ms)")'

say "Run Python inside it"
"$FORKVM" exec "$ID" -- python3 -c 'import platform, os; print(f"Hello from Python {platform.python_version()} in a {platform.system()} {platform.release()} microVM, hostname {os.uname().nodename}"); print("6 * 7 =", 6 * 7)'

say "Files go in and come out"
echo "print(sum(range(101)))" > /tmp/forkvm-demo.py
"$FORKVM" exec "$ID" -- mkdir -p /work
"$FORKVM" exec -i "$ID" -- sh -c 'cat > /work/sum.py' < /tmp/forkvm-demo.py
"$FORKVM" exec "$ID" -- python3 /work/sum.py
rm -f /tmp/forkvm-demo.py

say "Sandboxes"
"$FORKVM" ps

say "Remove it"
"$FORKVM" rm "$ID"
trap - EXIT

say "One-shot: forkvm run -- python3 -c 'print(6*7)'"
"$FORKVM" run -- python3 -c 'print(6*7)'
