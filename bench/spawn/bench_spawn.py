#!/usr/bin/env python3
"""forkvm spawn benchmark: clones from a snapshot, against naive QEMU save/restore.

Run through bench/spawn/run.sh (which builds the release binary first).

Every sandbox QEMU runs jailed (the daemon's default; FORKVM_NO_JAIL=0 is
set explicitly, so an inherited FORKVM_NO_JAIL=1 cannot unjail the run), and
every clone's QEMU uid is checked to be non-root. The main measurements use
one private jailed daemon. Before them come the segments of the jail
comparison (--jail-compare, the default): one private daemon at a time,
jailed, unjailed (FORKVM_NO_JAIL=1), unjailed, jailed, each with its own
source and snapshot, timing spawn_cold_pool_off and spawn_warm_pool with
--jail-runs / 2 runs per segment (so --jail-runs per side). The naive
baseline is plain QEMU started by the bench as root; its saved state comes
from the source of the first unjailed segment (a jailed QEMU cannot write
outside its own directories, and its command line names an inherited tap fd,
so it cannot be replayed). With --no-jail-compare an unjailed daemon only
boots, snapshots and saves that source.

* source         -- one sandbox is cold-booted (use_template: false,
                    network: none), left to settle, and snapshotted (`shared`
                    snapshot); the naive baseline's source (unjailed, see
                    above) is made the same way and then saved by a plain full
                    QEMU migration to a file and deleted. With networking on
                    the host, a `none` sandbox
                    still has its NIC (a tap alone in its own namespace) but
                    no uplink; every clone below is spawned with network: none
                    too, and every naive copy gets a namespace with that tap.
* spawn_cold_pool_off -- N sequential POST /v1/sandboxes {"snapshot": id,
                    "network": "none"} with no warm pool; DELETE after each.
* naive_restore  -- N times a fresh QEMU from the source's rewritten command
                    line loads the saved file (`migrate-incoming`), `cont`,
                    until its agent answers (interleaved with the case above).
* spawn_warm_pool -- pool size 2; N times: wait until the pool is full, time
                    one spawn (must be a pool hit); DELETE after each.
* spawn_warm_pool_nat -- the same with a second source cold-booted with the
                    default networking (nat) and its clones spawned with the
                    defaults (nat, wait_for_network): the default configuration.
* burst10        -- one POST {"snapshot": id, "count": 10}, repeated.
* memory         -- K clones (K in --clones) idle, their PSS/RSS/private
                    dirty summed; then up to max(K) naive copies (each with
                    its own share=on RAM file in /dev/shm) summed likewise.

Outputs: results/spawn.csv (a `jail` column: jailed/unjailed, and the
`segment`: main or the comparison's 1-4), results/memory.csv,
results/RESULTS.md, results/spawn.png.

This file holds the command line and the run loop (`main`); the rest is in
spawn_cases.py (one run of each case), spawn_memory.py, spawn_stats.py
(key figures and verdicts), spawn_plots.py, spawn_report.py (RESULTS.md); what every bench shares is in bench/common (report.py: the
command line, statistics, CSV, RESULTS.md pieces, plots).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402
from spawn_cases import (  # noqa: E402
    FIELDS, MEM_FIELDS, MIN_RUNS, NAT, NOISY_CORES, clone_row, delete_snapshot, jail_ratios,
    jail_segment, make_source, pool_off, run_burst, run_naive, run_nat_case, run_spawn_cold,
    run_spawn_warm, spawn_one, start_daemon, swap_total_kib, wait_pool,
)
from spawn_memory import memory_forkvm, memory_naive  # noqa: E402
from spawn_stats import key_figures, mem_explanation, speed_reason  # noqa: E402
from spawn_plots import write_plot  # noqa: E402
from spawn_report import method_text, print_summary, write_results  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help=f"runs per latency case (>= {MIN_RUNS})")
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --runs < {MIN_RUNS}; results are marked SMOKE")
    ap.add_argument("--clones", default="1,10,50",
                    help="comma-separated clone counts for the memory measurement")
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    ap.add_argument("--burst-runs", type=int, default=20, help="how many bursts to time (the issue asks for 20 runs per case)")
    ap.add_argument("--burst-size", type=int, default=10, help="clones per burst POST")
    ap.add_argument("--pool-size", type=int, default=2, help="warm-pool size for spawn_warm_pool")
    ap.add_argument("--pool-settle", type=float, default=0.25, metavar="SECONDS",
                    help="rest after the pool is full, before each timed pooled spawn")
    ap.add_argument("--settle", type=float, default=2.0, metavar="SECONDS",
                    help="rest after the source's cold boot before the snapshot")
    ap.add_argument("--idle", type=float, default=5.0, metavar="SECONDS",
                    help="idle time before each memory measurement")
    ap.add_argument("--mem-reserve-mib", type=int, default=4096,
                    help="never let naive copies / clones push MemAvailable below this")
    rp.add_common_args(ap, HERE)
    ap.add_argument("--jail-compare", action=argparse.BooleanOptionalAction, default=True,
                    help="first time spawn_cold_pool_off and spawn_warm_pool under daemons "
                         "jailed, unjailed, unjailed, jailed (one at a time) for the jail's "
                         "cost (default on)")
    ap.add_argument("--jail-runs", type=int, default=None,
                    help="runs per case and side in the jail comparison, split over its two "
                         "segments per side (default: --runs)")
    args = ap.parse_args()
    if args.jail_runs is None:
        args.jail_runs = args.runs
    if args.jail_compare and args.jail_runs < 2:
        ap.error("--jail-runs must be >= 2 (one per segment)")
    try:
        args.clones = sorted({int(x) for x in args.clones.split(",") if x.strip()})
    except ValueError:
        ap.error("--clones takes a comma-separated list of integers, e.g. 1,10,50")
    if not args.clones or min(args.clones) < 1:
        ap.error("--clones needs positive counts")
    if args.runs < 1 or args.burst_runs < 1 or args.burst_size < 1 or args.pool_size < 1:
        ap.error("--runs, --burst-runs, --burst-size and --pool-size must be >= 1")
    if args.runs < MIN_RUNS and not args.smoke:
        ap.error(f"--runs {args.runs} is below the minimum of {MIN_RUNS} for a valid result; "
                 "add --smoke for a quick smoke test")
    burst = f"burst{args.burst_size}"

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fb.wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    machine = rp.machine_info()
    rows: list[dict] = []
    mem_rows: list[dict] = []
    ctx: dict = {"machine": machine, "started": started, "swap_kib": swap_total_kib()}
    shm = tempfile.mkdtemp(prefix="fvb-", dir="/dev/shm")
    others: dict[int, str] = {}
    busy_runs = 0
    naive_vms: list = []   # naive QEMUs alive right now (stopped in finally)
    home = None
    jrows: list[dict] = []  # the jail comparison's runs
    ctx.update(others={}, busy_segments=0, shm=shm)

    def check_others() -> None:
        nonlocal busy_runs
        busy_runs += fb.warn_other_qemus(others, exclude_substrings=(home, shm))

    try:
        # The jail comparison's segments; the first unjailed one also makes the
        # naive baseline's saved state (kept in its home until the end).
        if args.jail_compare:
            per_seg = {s: rp.split_runs(args.jail_runs, rp.JAIL_ORDER.count(s))
                       for s in (rp.JAILED, rp.UNJAILED)}
            for seg, side in enumerate(rp.JAIL_ORDER, start=1):
                runs = per_seg[side][rp.JAIL_ORDER[:seg - 1].count(side)]
                jail_segment(seg, side, runs, args, ctx, jrows,
                             make_naive=side == rp.UNJAILED and "saved" not in ctx)
        else:
            jail_segment(0, rp.UNJAILED, 0, args, ctx, jrows, make_naive=True)
        others.update(ctx["others"])
        saved, work = ctx["saved"], ctx["naive_work"]
        with start_daemon(args, rp.JAILED) as d:
            home = d.home
            snap_id = None
            try:
                info = d.api.info()
                ctx["info"] = info
                print(f"forkvm {info.get('version')} | accel {info['accel']['kind']} "
                      f"({info['accel'].get('reason', '')}) | QEMU "
                      f"{info['qemu'].get('version')} | home {d.home}", flush=True)
                check_others()
                busy_runs = 0
                meter = fb.CpuMeter(roots=[d.proc.pid])

                def measured(fn, *a):
                    check_others()
                    meter.start()
                    out_rows = fn(*a)
                    cores = meter.other_cores()
                    for r in out_rows if isinstance(out_rows, list) else [out_rows]:
                        r["other_cpu_cores"] = cores
                        rows.append(r)
                    if cores > NOISY_CORES:
                        print(f"    (other processes kept {cores:.2f} cores busy during this "
                              "run)", flush=True)

                # 1. Source and snapshot (jailed). network: none, as the naive
                # baseline's source (the naive copies cannot have forkvm's uplink).
                src, snap, ctx["snapshot_wall_ms"] = make_source(d, args, "main")
                d.delete(src["id"])
                snap_id = snap["id"]
                ctx["snapshot"] = snap
                ctx["main_uid"] = src["_uid"]
                st = snap.get("timings") or {}
                rows.append({"case": "snapshot", "run": 1, "total_ms": ctx["snapshot_wall_ms"],
                             "server_total_ms": st.get("total_ms"), "uid": src["_uid"],
                             **{k: st.get(k) for k in ("pause_ms", "save_state_ms",
                                                       "freeze_disk_ms", "copy_memory_ms",
                                                       "publish_ms")}})

                # Warm-up: the first clone verifies the snapshot's files once.
                sb, wall = spawn_one(d, snap_id)
                d.delete(sb["id"])
                ctx["first_spawn"] = clone_row("first_spawn", 1, sb, wall)
                print(f"[first clone, not counted] {wall:.0f} ms", flush=True)

                # 2 + 4. Clones without a pool, interleaved with naive restores.
                for i in range(1, args.runs + 1):
                    measured(run_spawn_cold, d, snap_id, i, args.runs)
                    measured(run_naive, saved, work, shm, i, args.runs)

                # 3. Warm pool.
                d.api.request("PUT", f"/v1/snapshots/{snap_id}/pool", {"size": args.pool_size})
                try:
                    for i in range(1, args.runs + 1):
                        measured(run_spawn_warm, d, snap_id, args.pool_size, args.pool_settle,
                                 i, args.runs)
                    # Shrink only once the refill is over: a refill in flight when the size
                    # drops to 0 still parks its QEMU in the pool (see pool_off).
                    wait_pool(d, snap_id, args.pool_size)
                finally:
                    d.api.request("PUT", f"/v1/snapshots/{snap_id}/pool", {"size": 0})
                ctx["pool_leftovers"] = pool_off(d, snap_id)

                # 3b. Warm pool in the default configuration: nat, wait_for_network.
                if (info.get("network") or {}).get("available"):
                    run_nat_case(d, args, measured, ctx)
                    delete_snapshot(d, ctx.pop("nat_snapshot_id"))
                else:
                    ctx["nat_skipped"] = (f"the host cannot give sandboxes a network: "
                                          f"{(info.get('network') or {}).get('reason')}")
                    print(f"[{NAT}] skipped: {ctx['nat_skipped']}", flush=True)

                # 5. Bursts.
                for i in range(1, args.burst_runs + 1):
                    measured(run_burst, d, snap_id, args.burst_size, i, args.burst_runs)

                # 6. Memory.
                for k in args.clones:
                    check_others()
                    mem_rows.append(memory_forkvm(d, snap_id, k, args))
                check_others()
                mem_rows += memory_naive(saved, work, shm, max(args.clones), args.clones, args,
                                         naive_vms)
                ctx["snapshots_after"] = d.api.info().get("snapshots")
            finally:
                for vm in naive_vms:
                    vm.stop()
                if d.proc is not None and d.proc.poll() is None:
                    for sid in (snap_id, ctx.get("nat_snapshot_id")):
                        if sid is not None:
                            delete_snapshot(d, sid)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        nhome = ctx.get("naive_home")
        if nhome:  # kept by its daemon for the naive copies (their disks and state)
            shutil.rmtree(nhome, ignore_errors=True)
            shutil.rmtree(fb.run_dir_for_home(nhome), ignore_errors=True)
        for h in (home, nhome):
            if not h:
                continue
            left = fb.qemu_pids_mentioning(h) + fb.qemu_pids_mentioning(shm)
            if left:
                print(f"cleanup: QEMU processes still name our files: {left}", flush=True)
            for p in (h, shm, str(fb.run_dir_for_home(h))):
                if os.path.exists(p):
                    print(f"cleanup: {p} still exists", flush=True)
    ctx["elapsed"] = time.monotonic() - t_start
    ctx["others"], ctx["busy_runs"] = others, busy_runs
    for r in rows:  # the naive baseline is plain QEMU run by the bench as root
        r.setdefault("jail", rp.UNJAILED if r["case"].startswith("naive") else rp.JAILED)
        r.setdefault("segment", "main")
    for r in mem_rows:
        r["jail"] = rp.JAILED if r["kind"] == "forkvm" else rp.UNJAILED
    ctx["jail"] = jail_ratios(jrows, rows)

    kf = key_figures(rows, mem_rows, max(args.clones))
    ctx["speed_reason"] = speed_reason(rows, kf, ctx["info"]["accel"]["kind"])
    ctx["mem_reason"] = ("the clones' private (written) pages plus their share of the snapshot's "
                         "page cache exceed a quarter of what the naive copies use; see the "
                         "per-VM columns.")
    ctx["mem_explanation"] = mem_explanation(mem_rows, ctx, args)
    ctx["method"] = method_text(args, burst, ctx)

    rp.write_csv(out / "spawn.csv", rows + jrows, FIELDS)
    rp.write_csv(out / "memory.csv", mem_rows, MEM_FIELDS)
    title = (f"forkvm spawn bench — {ctx['info']['accel']['kind']}, {args.memory} MiB, "
             f"N={args.runs}{' (SMOKE)' if args.smoke else ''}, {machine['cpu_model']}, "
             f"{machine['cores']} cores, {started:%Y-%m-%d}")
    write_plot(out / "spawn.png", rows, mem_rows, title, args.burst_size)
    write_results(out / "RESULTS.md", rows, mem_rows, ctx, args, jrows)
    print_summary(rows, mem_rows, max(args.clones), ctx["jail"])
    print(f"\nwrote {out / 'spawn.csv'}, {out / 'memory.csv'}, {out / 'RESULTS.md'}, "
          f"{out / 'spawn.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_spawn", main)
