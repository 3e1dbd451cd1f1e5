#!/usr/bin/env python3
"""forkvm branch benchmark: how long a branch pauses the source, against naive QEMU save.

Run through bench/branch/run.sh (which builds the release binary first).

Every sandbox QEMU runs jailed (the daemon's default; FORKVM_NO_JAIL=0 is
set explicitly, so an inherited FORKVM_NO_JAIL=1 cannot unjail the run; every
source's QEMU uid is checked to be non-root). The bench's own QMP saves (the
naive baseline, the live references) write into the source's own directories,
the only ones a jailed QEMU can write to.

The experiments below are measured in one run against one private jailed
daemon. Then, with --jail-compare (the default), the jail comparison: one
private daemon at a time, jailed, unjailed (FORKVM_NO_JAIL=1), unjailed,
jailed, each doing --jail-runs / 2 branches per mode (full and live
alternating on a booted source, then diff on its clone, as in `size`) at
each of --jail-sizes, and (--jail-chain) building its own depth-3 diff chain
and spawning --jail-runs / 2 times from depth 0 and from depth 3 (as in
`chain`). Its rows have experiment `jail_size`, `jail_chain_build`,
`jail_chain`.

Two kinds of source are used, and each mode is measured on the kind it is
made for:

* booted -- cold-booted (`use_template: false`): owns its RAM (a share=on file
            in /dev/shm). Modes live and full, the naive baselines and the
            references run on it.
* clone  -- right after the booted source of the same experiment has settled
            (and before anything else is done to it), `POST /v1/sandboxes/{id}
            /snapshot` takes a `shared` base snapshot of it; once the booted
            source's measurements are done and it is deleted, the clone is
            spawned from that base: the booted source's twin at that instant
            (same size, processes, page cache), whose RAM is a private mapping
            of the base's memory image. Mode diff runs on it, then the naive
            baselines again (`naive_clone`, `naive_nolimit_clone`).
            Whatever an experiment does to the booted source (fill D MiB, run
            a counter loop) is done to the clone the same way.

1. size        -- for each guest size M: a booted source rests, the base is
                  taken, then N branches per mode (`POST /v1/sandboxes/{id}/
                  branch {"mode": live|full, "count": 0}`), alternating full,
                  live, ..., each snapshot deleted (force) right after; the
                  naive baseline (stop, full migration of all RAM to a file,
                  cont) with QEMU's default migration parameters (`naive`) and
                  with the bandwidth cap lifted as forkvm's live mode does
                  (`naive_nolimit`); references: a bare QMP stop + cont
                  (`stop_cont`, the floor) and the live mapped-ram save done by
                  the bench over QMP with the file on the store's filesystem
                  (`qemu_live_disk`) and on /dev/shm (`qemu_live_shm`). Then
                  the clone: N diff branches (each snapshot must be kind
                  `diff`, depth 1) and the naive baselines on it.
2. dirty       -- per D, a fresh 2048 MiB booted source and its clone: a guest
                  process fills D MiB and holds it (in the clone: after the
                  spawn, so the D MiB are pages the diff must carry), then the
                  branches, references and baselines as above.
3. consecutive -- one 512 MiB booted source running a counter loop (the base
                  is taken with the loop running, so the clone runs it too):
                  K live then K full branches back to back on the booted
                  source, K diff branches on the clone; each source's counter
                  must keep advancing.
4. chain       -- spawn time vs diff-chain depth: a 512 MiB booted source's
                  `shared` snapshot is depth 0; link k: spawn from the head,
                  fill --chain-dirty MiB and write a file in the guest, branch
                  diff (count 0) -> depth k; then `flatten` of the deepest head.
                  Then N rounds of `POST /v1/sandboxes {"snapshot": id,
                  "count": 1}` from every depth and from the flattened
                  snapshot (pools off, order rotated each round), the child
                  deleted after each.

Outputs (in --out): branch.csv (a `jail` column, jailed/unjailed, and the
`segment`: main or the comparison's 1-4), RESULTS.md, pause_vs_size.png,
pause_vs_dirty.png, consecutive.png, spawn_vs_depth.png.

This file holds the command line and the run loop (`main`); the rest is in
branch_modes.py (modes, one measured pause each), branch_cases.py (sources
and experiments), branch_stats.py, branch_jail.py (the jail comparison),
branch_text.py (verdicts and method), branch_plots.py, branch_report.py
(RESULTS.md); what every bench shares is in bench/common (report.py: the
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
from branch_modes import CHAIN_TARGET_DEPTH, Ctx, FIELDS, MIN_RUNS, delete_snapshots  # noqa: E402
from branch_cases import exp_chain, exp_consecutive, exp_dirty, exp_size  # noqa: E402
from branch_stats import add_ratios  # noqa: E402
from branch_jail import jail_ratios, jail_segment  # noqa: E402
from branch_text import print_summary  # noqa: E402
from branch_plots import write_plots  # noqa: E402
from branch_report import write_results  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10,
                    help=f"branches per mode and size (>= {MIN_RUNS} unless --smoke)")
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --runs < {MIN_RUNS}; results are marked SMOKE")
    ap.add_argument("--sizes", default="256,512,1024,2048,4096", help="guest sizes (MiB)")
    ap.add_argument("--dirty", default="0,100,250,500,1000",
                    help="MiB dirtied before the branch (on a --dirty-memory guest)")
    ap.add_argument("--dirty-memory", type=int, default=2048, help="guest MiB for --dirty")
    ap.add_argument("--dirty-runs", type=int, default=3, help="branches per mode and D")
    ap.add_argument("--dirty-naive-runs", type=int, default=2, help="naive runs per variant and D")
    ap.add_argument("--dirty-ref-runs", type=int, default=1, help="live references per D")
    ap.add_argument("--consecutive", type=int, default=10,
                    help="back-to-back branches per mode (0: skip)")
    ap.add_argument("--consecutive-memory", type=int, default=512)
    ap.add_argument("--counter-gap", type=float, default=2.0, metavar="SECONDS",
                    help="between the counter readings")
    ap.add_argument("--naive-runs", type=int, default=None,
                    help="naive runs per variant and size (default: --runs)")
    ap.add_argument("--naive-runs-large", type=int, default=10,
                    help="at most this many naive runs per variant at 4096 MiB and above "
                         "(at least 3)")
    ap.add_argument("--clone-naive-runs", type=int, default=3,
                    help="naive runs per variant and size on the clone source (at most "
                         "--naive-runs)")
    ap.add_argument("--chain-runs", type=int, default=10,
                    help=f"spawns per snapshot in the chain experiment (>= {MIN_RUNS} unless "
                         "--smoke; 0: skip it)")
    ap.add_argument("--chain-depth", type=int, default=CHAIN_TARGET_DEPTH,
                    help="deepest diff link of the chain")
    ap.add_argument("--chain-memory", type=int, default=512, help="guest MiB of the chain")
    ap.add_argument("--chain-dirty", type=int, default=64,
                    help="MiB each chain link fills (held by a guest process) before its diff")
    ap.add_argument("--ref-runs", type=int, default=3, help="live reference runs per size")
    ap.add_argument("--floor-runs", type=int, default=3, help="stop+cont runs per size")
    ap.add_argument("--settle", type=float, default=3.0, metavar="SECONDS",
                    help="rest after each cold boot (and after filling memory)")
    ap.add_argument("--skip", default="", help="comma-separated experiments to skip: "
                    "size,dirty,consecutive,chain (for debugging; RESULTS.md says so)")
    ap.add_argument("--jail-compare", action=argparse.BooleanOptionalAction, default=True,
                    help="after the experiments, time branches (and chain spawns) under "
                         "daemons jailed, unjailed, unjailed, jailed, one at a time, for the "
                         "jail's cost (default on)")
    ap.add_argument("--jail-runs", type=int, default=None,
                    help="branches per mode and size (and chain spawns) per side in the jail "
                         "comparison, split over its two segments per side (default: --runs)")
    ap.add_argument("--jail-sizes", default="512,2048", help="guest sizes of the jail comparison")
    ap.add_argument("--jail-chain", action=argparse.BooleanOptionalAction, default=True,
                    help="include chain spawns (depth 0 and the deepest) in the jail comparison")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    args.sizes = rp.int_list(args.sizes, "--sizes", ap)
    args.dirty = rp.int_list(args.dirty, "--dirty", ap)
    args.jail_sizes = rp.int_list(args.jail_sizes, "--jail-sizes", ap)
    if args.jail_runs is None:
        args.jail_runs = args.runs
    if args.jail_compare and (args.jail_runs < 2 or not args.jail_sizes
                              or min(args.jail_sizes) < 128):
        ap.error("--jail-runs must be >= 2 and --jail-sizes non-empty, each >= 128 MiB")
    if args.naive_runs is None:
        args.naive_runs = args.runs
    if min(args.runs, args.dirty_runs, args.naive_runs, args.ref_runs, args.floor_runs,
           args.dirty_naive_runs, args.dirty_ref_runs, args.clone_naive_runs) < 1 \
            or args.consecutive < 0 or args.chain_runs < 0:
        ap.error("run counts must be >= 1 (--consecutive and --chain-runs >= 0)")
    if args.runs < MIN_RUNS and not args.smoke:
        ap.error(f"--runs {args.runs} is below the minimum of {MIN_RUNS} for a valid result; "
                 "add --smoke for a quick smoke test")
    if 0 < args.chain_runs < MIN_RUNS and not args.smoke:
        ap.error(f"--chain-runs {args.chain_runs} is below the minimum of {MIN_RUNS} for a valid "
                 "result; add --smoke for a quick smoke test")
    if args.chain_depth < 1 or args.chain_memory < 128 or args.chain_dirty < 0 \
            or args.chain_dirty * args.chain_depth > args.chain_memory - 256:
        ap.error("--chain-depth must be >= 1, --chain-memory >= 128, and the chain's "
                 "--chain-dirty × --chain-depth MiB must fit the guest with 256 MiB to spare")
    if args.naive_runs_large < 3 and not args.smoke:
        ap.error("--naive-runs-large must be at least 3")
    if args.dirty and max(args.dirty) > args.dirty_memory - 512:
        ap.error(f"--dirty up to {max(args.dirty)} MiB does not fit a {args.dirty_memory} MiB "
                 "guest with room for its kernel")
    if min(args.sizes or [256]) < 128:
        ap.error("--sizes below 128 MiB do not boot")
    skip = {x.strip() for x in args.skip.split(",") if x.strip()}

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    revision = rp.git_revision()  # now, right after run.sh built the binary
    quiet = fb.wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    ctx: dict = {"machine": rp.machine_info(), "started": started, "quiet": quiet,
                 "revision": revision, "others": {}, "busy_runs": 0}
    shm = tempfile.mkdtemp(prefix="fvb-branch-", dir="/dev/shm")
    home = None
    c = None
    rows: list[dict] = []
    try:
        with fb.Daemon(binary=args.binary, env=rp.jail_env(rp.JAILED)) as d:
            home = d.home
            c = Ctx(d, shm, args, rp.JAILED)
            rows = c.rows
            try:
                info = d.api.info()
                ctx["info"] = info
                print(f"forkvm {info.get('version')} | accel {info['accel']['kind']} "
                      f"({info['accel'].get('reason', '')}) | QEMU "
                      f"{info['qemu'].get('version')} | home {d.home}", flush=True)
                c.check_others()
                c.busy_runs = 0
                if "size" not in skip:
                    for s in args.sizes:
                        exp_size(c, s)
                if "dirty" not in skip:
                    for x in args.dirty:
                        exp_dirty(c, x)
                if "consecutive" not in skip and args.consecutive:
                    exp_consecutive(c, ctx)
                if "chain" not in skip and args.chain_runs:
                    exp_chain(c, ctx)
            except (fb.BenchError, OSError) as e:
                ctx["error"] = str(e)
                print(f"bench_branch: error: {e}\n(writing what was measured so far)",
                      file=sys.stderr, flush=True)
            finally:
                delete_snapshots(c)
                try:
                    left = d.api.request("GET", "/v1/snapshots").get("snapshots") or []
                    if left:
                        print(f"cleanup: snapshots still listed: {[x['id'] for x in left]}",
                              flush=True)
                        for x in left:
                            d.api.request("DELETE", f"/v1/snapshots/{x['id']}?force=true",
                                          expect=(204, 404))
                except Exception as e:  # noqa: BLE001
                    print(f"cleanup: listing snapshots: {e}", flush=True)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        if home:
            left = fb.qemu_pids_mentioning(home) + fb.qemu_pids_mentioning(shm)
            if left:
                print(f"cleanup: QEMU processes still name our files: {left}", flush=True)
            for p in (home, str(fb.run_dir_for_home(home))):
                if os.path.exists(p):
                    print(f"cleanup: {p} still exists", flush=True)
    if c is None or "info" not in ctx:
        return 1
    ctx["jail_uids"] = {rp.JAILED: set(c.uids)}
    ctx["others"].update(c.others)
    ctx["busy_runs"] += c.busy_runs
    for r in rows:
        r.setdefault("jail", rp.JAILED)
        r.setdefault("segment", "main")
    # The jail comparison: one daemon at a time, ABBA.
    if args.jail_compare and not ctx.get("error"):
        per_side = {s: rp.split_runs(args.jail_runs, rp.JAIL_ORDER.count(s)) for s in (rp.JAILED, rp.UNJAILED)}
        try:
            for seg, side in enumerate(rp.JAIL_ORDER, start=1):
                n = per_side[side][rp.JAIL_ORDER[:seg - 1].count(side)]
                rows += jail_segment(seg, side, n, args, ctx)
        except (fb.BenchError, OSError) as e:
            ctx["error"] = f"jail comparison: {e}"
            print(f"bench_branch: error: {ctx['error']}\n(writing what was measured so far)",
                  file=sys.stderr, flush=True)
    ctx["jail"] = jail_ratios(rows, args)
    ctx["elapsed"] = time.monotonic() - t_start
    ctx["qemu_defaults"] = c.qemu_defaults
    ctx["notes"] = c.notes + ([f"skipped experiments: {', '.join(sorted(skip))}"] if skip else [])
    ctx["diff_fallback"] = c.diff_fallback
    add_ratios(rows)
    rp.write_csv(out / "branch.csv", rows, FIELDS)
    m = ctx["machine"]
    title = (f"forkvm branch bench — {ctx['info']['accel']['kind']}, {m['cpu_model']}, "
             f"{m['cores']} cores, {started:%Y-%m-%d}" + (" (SMOKE)" if args.smoke else ""))
    plots = write_plots(out, rows, ctx, args, title)
    write_results(out / "RESULTS.md", rows, ctx, args, plots)
    print_summary(rows, ctx, args)
    print(f"\nwrote {out / 'branch.csv'}, {out / 'RESULTS.md'}, "
          + ", ".join(str(out / p) for p in plots) + f"  ({ctx['elapsed'] / 60:.1f} min)")
    return 1 if ctx.get("error") else 0


if __name__ == "__main__":
    rp.run_main("bench_branch", main)
