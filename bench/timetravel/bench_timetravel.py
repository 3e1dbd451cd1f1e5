#!/usr/bin/env python3
"""forkvm time-travel benchmark (issue 34): checkpoints, rewind, diff, merge.

Run through bench/timetravel/run.sh (which builds the release binary first).

One private daemon (jailed, as the others start it: tests/launch) and, in one
run, four measurements, each against a baseline of the same run:

1. **Agent loop.** A 512 MiB sandbox spawned from the boot template
   (`network: none`) runs a Python process holding --hold-mib MiB (256) of
   random bytes, so at least that much has changed since the template. Each
   of --steps steps (50) writes --step-files files of 64 KiB, has the holder
   rewrite --region-mib MiB (16) of what it holds in place (from
   /dev/urandom, no temporary buffer), then takes a checkpoint (`POST
   /v1/sandboxes/{id}/checkpoints`, `forkvm checkpoint`): its `pause_ms`, its
   `bytes`, the checkpoint snapshot's sizes and the call's wall. The
   sandbox's retention policy (--keep-last 5, --keep-every 10) is set before
   the first step, so pruning runs inside the loop as it would for an agent.
   Baseline: a full snapshot (`POST /v1/sandboxes/{id}/snapshot`, `forkvm
   snapshot`, a diff against the template) of the same sandbox after the
   checkpoints of --snapshot-at steps (10, 25, 50), its pause and bytes;
   and, for the docs' naive baseline, QEMU's own stop + full save + cont of
   the same QEMU (--naive-runs). After the loop: the kept checkpoints' bytes
   (the API's and their snapshot directories' allocated bytes on the host)
   against what the agent wrote between them.
2. **Rewind** of the loop sandbox to a kept checkpoint near step 10 (`POST
   .../rewind`, `forkvm rewind`): `rewind_ms` and wall, against a fresh
   spawn of the same checkpoint (`POST /v1/sandboxes {"snapshot"}`,
   `forkvm spawn --snapshot`) and its removal; --runs of each, interleaved,
   each checked to be at the checkpoint's step.
3. **Diff** (timetravel_tree.py): a tree of --files files in a git
   repository committed in the guest, a branch into --children children
   that each change 100 files; `POST /v1/diff/{source}` (`forkvm diff
   SOURCE CHILD --path DIR`) against `git status --porcelain` inside the
   child (the guest image's own git).
4. **Merge** of each child into the source (`POST .../merge`, `forkvm merge
   CHILD --into SOURCE --path DIR`) for half the children, against the
   by-hand way with git for the other half: `git diff --binary` in the
   child, the patch carried over through exec, `git apply` in the source.

Outputs: results/steps.csv, results/ops.csv, results/RESULTS.md,
results/timetravel.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import naive as nv  # noqa: E402
import report as rp  # noqa: E402
import timetravel_report as tr  # noqa: E402
import timetravel_tree as tt  # noqa: E402

MIB = 1 << 20
FILE_KIB = 64

# The agent's memory: --hold-mib MiB filled from /dev/urandom at start, then
# per step `go` N rewrites slot N mod (hold/region) in place (readinto: no
# temporary buffer, so no other guest pages are dirtied), and answers in
# /tmp/done.
HOLDER = r"""
import os, sys, time
hold, region = int(sys.argv[1]) << 20, int(sys.argv[2]) << 20
buf = bytearray(hold)
view = memoryview(buf)
rnd = open('/dev/urandom', 'rb', buffering=0)
def fill(off, n):
    while n:
        got = rnd.readinto(view[off:off + min(n, 1 << 20)])
        off, n = off + got, n - got
def done(n):
    with open('/tmp/done.tmp', 'w') as f:
        f.write(str(n))
    os.rename('/tmp/done.tmp', '/tmp/done')
fill(0, hold)
done(0)
while True:
    try:
        with open('/tmp/go') as f:
            n = int(f.read())
    except (OSError, ValueError):
        time.sleep(0.02)
        continue
    os.remove('/tmp/go')
    fill((n % (hold // region)) * region, region)
    done(n)
"""


def sh(d: fb.Daemon, sid: str, script: str, **extra) -> str:
    r = d.api.exec(sid, ["sh", "-c", script], **extra)
    if r.get("exit_code") != 0:
        raise fb.BenchError(f"`{script[:200]}` failed in {sid}: {r}")
    return r.get("stdout", "")


def wait_done(n: int) -> str:
    return f'while [ "$(cat /tmp/done 2>/dev/null)" != {n} ]; do sleep 0.02; done'


def snapshot_info(d: fb.Daemon, snap: str) -> dict:
    return d.api.request("GET", f"/v1/snapshots/{snap}")


def snapshot_dir_bytes(d: fb.Daemon, snap: str) -> int | None:
    """Allocated bytes of the snapshot's directory in the daemon's store, as
    the host's filesystem counts them (None: no such directory)."""
    p = Path(d.home) / "snapshots" / snap
    return fb.allocated_bytes_tree(p) if p.is_dir() else None


def start_holder(d: fb.Daemon, sid: str, args) -> float:
    t0 = time.perf_counter()
    sh(d, sid, "cat > /tmp/holder.py; setsid python3 /tmp/holder.py "
               f"{args.hold_mib} {args.region_mib} >/tmp/holder.log 2>&1 </dev/null &",
       stdin=HOLDER)
    r = d.api.exec(sid, ["sh", "-c", wait_done(0)], timeout_ms=600_000)
    if r.get("exit_code") != 0:
        raise fb.BenchError(f"the holder did not start: {r}; "
                            f"{sh(d, sid, 'cat /tmp/holder.log; free -m')}")
    return fb.ms_since(t0)


def step_script(n: int, files: int) -> str:
    return (f"set -e; d=/root/work/step-{n}; mkdir -p $d; "
            f"for i in $(seq {files}); do head -c {FILE_KIB}K /dev/urandom > $d/f$i; done; "
            f"echo {n} > /root/work/last; printf {n} > /tmp/go; {wait_done(n)}")


def full_snapshot(d: fb.Daemon, sid: str, step: int) -> dict:
    """The baseline: `forkvm snapshot` of the loop sandbox, then removed."""
    t0 = time.perf_counter()
    s = d.api.request("POST", f"/v1/sandboxes/{sid}/snapshot", {})
    wall = fb.ms_since(t0)
    info = snapshot_info(d, s["id"])
    sizes = info.get("sizes") or {}
    pause = s.get("pause_ms")
    if pause is None:
        pause = (s.get("timings") or {}).get("pause_ms")
    row = {"op": "snapshot", "step": step, "run": step, "wall_ms": wall, "engine_ms": pause,
           "bytes": sizes.get("memory_diff_bytes", 0) + sizes.get("device_state_allocated_bytes", 0)
           + sizes.get("disk_bytes", 0),
           "memory_diff_bytes": sizes.get("memory_diff_bytes"),
           "on_disk_bytes": sizes.get("on_disk_bytes"),
           "dir_bytes": snapshot_dir_bytes(d, s["id"]), "count": None, "note": s.get("kind")}
    d.api.request("DELETE", f"/v1/snapshots/{s['id']}", expect=(204,))
    return row


def agent_loop(d: fb.Daemon, args, ctx: dict) -> tuple[str, list[dict], list[dict]]:
    sb = d.create(memory_mib=args.memory, network="none")
    sid = sb["id"]
    ctx["loop_spawn"] = sb.get("timings")
    d.api.request("PUT", f"/v1/sandboxes/{sid}/timeline/retention",
                  {"keep_last": args.keep_last, "keep_every": args.keep_every})
    print(f"[loop] sandbox {sid}: holder of {args.hold_mib} MiB filling", flush=True)
    ctx["holder_start_ms"] = start_holder(d, sid, args)
    ctx["guest_free"] = sh(d, sid, "free -m | sed -n 2p").split()
    steps, ops = [], []
    for n in range(1, args.steps + 1):
        t0 = time.perf_counter()
        sh(d, sid, step_script(n, args.step_files), timeout_ms=600_000)
        work_ms = fb.ms_since(t0)
        t1 = time.perf_counter()
        c = d.api.request("POST", f"/v1/sandboxes/{sid}/checkpoints", {})
        cp_ms = fb.ms_since(t1)
        sizes = (snapshot_info(d, c["id"]).get("sizes") or {})
        steps.append({"step": n, "checkpoint": c["id"], "pause_ms": c.get("pause_ms"),
                      "bytes": c["bytes"], "memory_diff_bytes": sizes.get("memory_diff_bytes"),
                      "device_state_allocated_bytes": sizes.get("device_state_allocated_bytes"),
                      "disk_bytes": sizes.get("disk_bytes"),
                      "on_disk_bytes": sizes.get("on_disk_bytes"),
                      "dir_bytes": snapshot_dir_bytes(d, c["id"]),
                      "checkpoint_ms": cp_ms, "work_ms": work_ms,
                      "step_ms": work_ms + cp_ms, "loadavg1": os.getloadavg()[0],
                      "kept": None})
        if n in args.snapshot_at:
            ops.append(full_snapshot(d, sid, n))
            print(f"[loop] step {n}: full snapshot paused {ops[-1]['engine_ms']:.1f} ms, "
                  f"{ops[-1]['bytes'] / MIB:.0f} MiB", flush=True)
        if n % 5 == 0 or n == 1:
            print(f"[loop] step {n}/{args.steps}: checkpoint paused {c.get('pause_ms'):.1f} ms, "
                  f"{c['bytes'] / MIB:.1f} MiB, call {cp_ms:.0f} ms", flush=True)
    # No tags: retention keeps every tagged checkpoint.
    tl = d.api.request("GET", f"/v1/sandboxes/{sid}/timeline")
    kept = {c["id"]: c for c in tl["checkpoints"]}
    for s in steps:
        s["kept"] = s["checkpoint"] in kept
    ctx["timeline"] = tl
    ctx["kept"] = [{**c, "step": next(s["step"] for s in steps if s["checkpoint"] == c["id"]),
                    "sizes": snapshot_info(d, c["id"]).get("sizes") or {},
                    "dir_bytes": snapshot_dir_bytes(d, c["id"])} for c in tl["checkpoints"]]
    # The docs' naive baseline: QEMU stop + full save + cont of this QEMU.
    sbdir = d.sandbox_dir(sid)
    for i in range(args.naive_runs):
        r = nv.naive_pause(os.path.join(sbdir, "qmp.sock"), os.path.join(sbdir, "naive.bin"))
        ops.append({"op": "naive_save", "step": args.steps, "run": i + 1,
                    "wall_ms": r["clock_ms"], "engine_ms": r["pause_ms"],
                    "bytes": r["state_bytes"], "note": r.get("pause_source")})
    return sid, steps, ops


def rewind_vs_spawn(d: fb.Daemon, sid: str, args, ctx: dict) -> list[dict]:
    kept = [c for c in ctx["kept"] if not c.get("head")]
    if not kept:
        raise fb.BenchError("no kept checkpoint besides the head to rewind to")
    target = min(kept, key=lambda c: abs(c["step"] - 10))
    cp, step = target["id"], target["step"]
    ctx["rewind_target"] = target
    check = "cat /root/work/last; cat /tmp/done"
    want = [str(step), str(step)]
    rows = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        r = d.api.request("POST", f"/v1/sandboxes/{sid}/rewind", {"to": cp})
        wall = fb.ms_since(t0)
        got = sh(d, sid, check).split()
        if got != want:
            raise fb.BenchError(f"after rewind to {cp} (step {step}) the sandbox is at {got}")
        rows.append({"op": "rewind", "step": step, "run": i + 1, "wall_ms": wall,
                     "engine_ms": r["rewind_ms"], "note": cp,
                     "detail": json.dumps((r.get("sandbox") or {}).get("timings"))})
        t0 = time.perf_counter()
        child = d.api.request("POST", "/v1/sandboxes", {"snapshot": cp, "network": "none"},
                              expect=(201,))
        wall = fb.ms_since(t0)
        d.sandboxes.add(child["id"])
        got = sh(d, child["id"], check).split()
        t1 = time.perf_counter()
        d.delete(child["id"])
        rm = fb.ms_since(t1)
        if got != want:
            raise fb.BenchError(f"a spawn of {cp} (step {step}) is at {got}")
        rows.append({"op": "spawn", "step": step, "run": i + 1, "wall_ms": wall,
                     "engine_ms": (child.get("timings") or {}).get("total_ms"),
                     "extra_ms": rm, "note": cp, "detail": json.dumps(child.get("timings"))})
        print(f"[rewind] {i + 1}/{args.runs}: rewind {rows[-2]['wall_ms']:.0f} ms "
              f"(rewind_ms {rows[-2]['engine_ms']:.0f}), spawn {wall:.0f} ms + rm {rm:.0f} ms",
              flush=True)
    return rows


def others(ctx: dict, d: fb.Daemon) -> None:
    """Note the QEMU processes this bench did not start, before each part
    (ours name the daemon's home, its RAM directory or one of its sandboxes)."""
    mine = [d.home, str(fb.run_dir_for_home(d.home))] + [f"forkvm-{s}," for s in d.sandboxes]
    seen = fb.other_qemu_processes(mine)
    ctx["others"].update(seen)
    ctx["busy_phases"] += bool(seen)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50, help="agent-loop steps (checkpoints)")
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    ap.add_argument("--hold-mib", type=int, default=256, help="memory the Python process holds")
    ap.add_argument("--region-mib", type=int, default=16, help="memory rewritten per step")
    ap.add_argument("--step-files", type=int, default=10, help=f"{FILE_KIB} KiB files per step")
    ap.add_argument("--snapshot-at", default="10,25,50",
                    help="steps after whose checkpoint a full snapshot is taken")
    ap.add_argument("--keep-last", type=int, default=5)
    ap.add_argument("--keep-every", type=int, default=10)
    ap.add_argument("--naive-runs", type=int, default=3, help="naive QEMU saves of the loop VM")
    ap.add_argument("--runs", type=int, default=5, help="rewinds and fresh spawns, each")
    ap.add_argument("--files", type=int, default=10000, help="files in the diff tree")
    ap.add_argument("--changed", type=int, default=100, help="files each child changes")
    ap.add_argument("--children", type=int, default=4,
                    help="children of the tree's source (even: half merge, half git apply)")
    ap.add_argument("--diff-runs", type=int, default=3, help="diffs and git statuses per child")
    ap.add_argument("--home-parent", default=os.environ.get("BENCH_HOME_PARENT", "/tmp"),
                    help="where the daemon's temporary home is made")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    args.snapshot_at = rp.int_list(args.snapshot_at, "--snapshot-at", ap)
    if args.steps < 1 or args.runs < 1 or args.children < 2 or args.children % 2:
        ap.error("--steps and --runs must be positive, --children even and at least 2")
    if args.hold_mib % args.region_mib or args.hold_mib + 128 > args.memory:
        ap.error("--hold-mib must be a multiple of --region-mib and leave 128 MiB of the guest")
    if args.files < args.changed * args.children:
        ap.error("--files must be at least --changed × --children")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.wait_quiet:
        fb.wait_for_quiet_host(args.wait_quiet)
    ctx = {"started": dt.datetime.now().astimezone(), "machine": rp.machine_info(),
           "build": "release" if "/release/" in args.binary else f"not release: {args.binary}",
           "others": {}, "busy_phases": 0}
    t0 = time.monotonic()
    with fb.Daemon(binary=args.binary, home_parent=args.home_parent) as d:
        ctx["info"] = d.api.info()
        ctx["store_fs"] = subprocess.run(["stat", "-f", "-c", "%T", d.home], text=True,
                                         capture_output=True).stdout.strip()
        ctx["home_parent"] = args.home_parent
        others(ctx, d)
        sid, steps, ops = agent_loop(d, args, ctx)
        others(ctx, d)
        ops += rewind_vs_spawn(d, sid, args, ctx)
        d.delete(sid)
        others(ctx, d)
        ops += tt.tree_ops(d, args, ctx, sh)
    ctx["elapsed"] = time.monotonic() - t0
    rp.write_csv(out / "steps.csv", steps, tr.STEP_FIELDS)
    rp.write_csv(out / "ops.csv", ops, tr.OP_FIELDS)
    tr.plot(steps, ops, out / "timetravel.png")
    lines = tr.write_results(out / "RESULTS.md", steps, ops, ctx, args)
    print("\n".join(lines))
    print(f"\nwrote {out}/steps.csv, ops.csv, RESULTS.md, timetravel.png")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_timetravel", main)
