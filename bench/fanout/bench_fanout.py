#!/usr/bin/env python3
"""forkvm fan-out benchmark: 100 children of one running clone, against 100 naive QEMU restores.

Run through bench/fanout/run.sh (which builds the release binary first).

Every sandbox QEMU runs jailed (FORKVM_NO_JAIL=0 is set explicitly for the
main daemon). The naive baseline's source comes from a second, unjailed
private daemon (a jailed QEMU's command line names a tap fd it inherited and
cannot be replayed), made first and stopped before the main daemon starts.

* source        -- one sandbox of the main daemon, `POST /v1/sandboxes
                   {"memory_mib": 512}`: the defaults, so a clone of the
                   image's boot template with the default network (nat);
                   checked to be a clone (it names a snapshot and has a
                   `restore_ms`), then left idle --settle seconds.
* branch_<mode> -- per run: `POST /v1/sandboxes/{source}/branch {"mode":
                   mode, "count": N}`, then `true` exec'd in every child at
                   once (one thread per child); the run's wall is from the
                   request until the last exec answered. The branch call's
                   own wall, `pause_ms`, `snapshot_ms` and `spawn_ms` are
                   recorded too.
* spawn_count   -- per run: `POST /v1/sandboxes {"snapshot": id, "count": N}`
                   from a snapshot of the same source (taken once, before the
                   runs; one warm-up clone of it is spawned and deleted), then
                   the same execs.
* naive         -- N naive restores of a VM of the same image and size
                   (cold-booted with network none by the unjailed daemon,
                   settled, saved with a plain full QEMU migration to a file:
                   bench/common/naive.py), run by a pool of os.cpu_count()
                   workers: each starts a fresh QEMU from the source's command
                   line, `migrate-incoming`, `cont`, waits for the agent's pong,
                   reads its QEMU's CPU time and stops it (100 naive copies at
                   ~0.5 GiB each do not fit in RAM together). Wall: from the
                   first start until the last pong.

CPU per child: the QEMU's utime+stime (/proc/<pid>/stat, read right after its
exec answered); the daemon's own utime+stime over the run (request until the
last answer) and its cutime+cstime (the processes it started and reaped in that
window: ip, nft, qemu-img, ...), both divided by N. Children are deleted after
each run, outside the measured window, and the next run starts only once
their QEMUs are gone and the daemon has reaped them.

Outputs: results/fanout.csv (one row per run), results/children.csv (one row
per child and per naive restore), results/RESULTS.md, results/fanout.png
(walls) and results/cpu.png (CPU and wall per child, stacked).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))
# Its report module sits beside it: found when run as a script, and when a
# test loads this file by path too.
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import naive as nv  # noqa: E402
import report as rp  # noqa: E402

from fanout_report import (  # noqa: E402  (RESULTS.md and the plots)
    MIN_RUNS, NAIVE_CASE, SPAWN_CASE, STAGES, key_figures, ms, write_plots, write_results,
)

MODES = ("diff", "live", "full")

RUN_FIELDS = [
    "case", "mode", "run", "count", "ok", "total_ms", "call_ms", "exec_phase_ms",
    "first_answer_ms", "pause_ms", "snapshot_ms", "spawn_ms", "server_total_ms",
    "qemu_cpu_ms", "daemon_cpu_ms", "helper_cpu_ms", "daemon_cpu_per_child_ms",
    "helper_cpu_per_child_ms", "qemu_cpu_per_child_ms", "other_cpu_cores", "workers", "error",
]
CHILD_FIELDS = [
    "case", "mode", "run", "child", "id", "pid", "uid", "answered_ms", "exec_ms",
    "total_ms", *STAGES, "server_total_ms", "load_ms", "cont_ms", "agent_ms", "disk_copy_ms",
    "netns_ms", "qemu_cpu_ms", "daemon_cpu_ms", "helper_cpu_ms", "cpu_total_ms",
]


# --------------------------------------------------------------------------
# Pure helpers (unit-tested in bench/common/test_fanout.py)
# --------------------------------------------------------------------------


def parse_proc_stat(text: str) -> dict[str, int]:
    """utime, stime, cutime, cstime (clock ticks) and ppid from the text of
    /proc/<pid>/stat. The command name may hold spaces and parentheses, so
    the fields are counted from the last ')'."""
    rest = text.rsplit(")", 1)[1].split()
    # rest[0] = state, rest[1] = ppid, rest[11..14] = utime stime cutime cstime
    return {"ppid": int(rest[1]), "utime": int(rest[11]), "stime": int(rest[12]),
            "cutime": int(rest[13]), "cstime": int(rest[14])}


def proc_cpu(pid: int, hz: int | None = None) -> dict[str, float] | None:
    """{"own_ms", "reaped_ms", "ppid"} of a live process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = parse_proc_stat(f.read())
    except (OSError, IndexError, ValueError):
        return None
    ms = 1000.0 / (hz or os.sysconf("SC_CLK_TCK"))
    return {"own_ms": (s["utime"] + s["stime"]) * ms, "reaped_ms": (s["cutime"] + s["cstime"]) * ms,
            "ppid": s["ppid"]}


def cpu_shares(child_rows: list[dict], daemon_own_ms: float, helper_ms: float) -> dict:
    """Spread the daemon's own CPU and its helpers' over the children of one
    run (equal shares), fill each row's daemon_cpu_ms, helper_cpu_ms and
    cpu_total_ms, and return the run's sums and per-child means."""
    n = len(child_rows)
    d = daemon_own_ms / n if n else math.nan
    h = helper_ms / n if n else math.nan
    qsum = 0.0
    qn = 0
    for r in child_rows:
        r["daemon_cpu_ms"] = d
        r["helper_cpu_ms"] = h
        q = r.get("qemu_cpu_ms")
        if q is not None and q == q:
            qsum += q
            qn += 1
            r["cpu_total_ms"] = q + d + h
    return {"qemu_cpu_ms": qsum, "daemon_cpu_ms": daemon_own_ms, "helper_cpu_ms": helper_ms,
            "qemu_cpu_per_child_ms": qsum / qn if qn else math.nan,
            "daemon_cpu_per_child_ms": d, "helper_cpu_per_child_ms": h}


# --------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------


def process_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def exec_all(d: fb.Daemon, sbs: list[dict], t0: float, timeout: float) -> list[dict]:
    """`true` in every sandbox at once, one thread each. Returns one row per
    child: answered_ms (since t0), exec_ms (its own request), and its QEMU's
    CPU read right after the answer. Raises on the first failed exec after
    all have finished."""
    rows: list[dict] = [None] * len(sbs)  # type: ignore[list-item]
    errors: list[str] = []
    hz = os.sysconf("SC_CLK_TCK")
    start = threading.Barrier(len(sbs)) if len(sbs) <= 1000 else None

    def one(i: int, sb: dict) -> None:
        if start is not None:
            try:
                start.wait(timeout=30)
            except threading.BrokenBarrierError:
                pass
        t = time.perf_counter()
        try:
            r = d.api.request("POST", f"/v1/sandboxes/{sb['id']}/exec", {"argv": ["true"]},
                              timeout=timeout)
        except Exception as e:  # noqa: BLE001 - reported with the child's id
            errors.append(f"exec in {sb['id']}: {e}")
            return
        t_ans = time.perf_counter()
        cpu = proc_cpu(sb["pid"], hz) if sb.get("pid") else None
        if r.get("exit_code") != 0:
            errors.append(f"exec true in {sb['id']} answered {r}")
        rows[i] = {"answered_ms": (t_ans - t0) * 1000, "exec_ms": (t_ans - t) * 1000,
                   "qemu_cpu_ms": cpu["own_ms"] if cpu else math.nan}

    threads = [threading.Thread(target=one, args=(i, sb), daemon=True)
               for i, sb in enumerate(sbs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise fb.BenchError(f"{len(errors)} of {len(sbs)} execs failed; first: {errors[0]}")
    return rows


def child_row(case: str, mode: str, run: int, i: int, sb: dict, ex: dict) -> dict:
    t = sb.get("timings") or {}
    row = {"case": case, "mode": mode, "run": run, "child": i, "id": sb["id"],
           "pid": sb.get("pid"), "uid": process_uid(sb["pid"]) if sb.get("pid") else None,
           "server_total_ms": t.get("total_ms"), **ex}
    row["total_ms"] = row["answered_ms"]
    for s in STAGES:
        row[s] = t.get(s)
    return row


def check_children(sbs: list[dict], count: int, what: str, snap_id: str | None = None) -> None:
    if len(sbs) != count:
        raise fb.BenchError(f"{what}: asked for {count} children, got {len(sbs)}")
    for sb in sbs:
        t = sb.get("timings") or {}
        if sb.get("state") != "running" or t.get("restore_ms") is None or not sb.get("pid"):
            raise fb.BenchError(f"{what}: child {sb.get('id')} is not a running clone: {sb}")
        if snap_id is not None and sb.get("snapshot") != snap_id:
            raise fb.BenchError(f"{what}: child {sb.get('id')} names snapshot "
                                f"{sb.get('snapshot')}, expected {snap_id}")
        uid = process_uid(sb["pid"])
        if uid == 0:
            raise fb.BenchError(f"{what}: child {sb['id']} runs QEMU pid {sb['pid']} as root: "
                                "the main daemon is meant to be jailed")


class Ctx:
    def __init__(self, d: fb.Daemon, args, source: dict):
        self.d = d
        self.args = args
        self.source = source
        self.meter = fb.CpuMeter(roots=[d.proc.pid])
        self.hz = os.sysconf("SC_CLK_TCK")
        self.others: dict[int, str] = {}
        self.busy_runs = 0
        self.ppids: set = set()

    def daemon_cpu(self) -> dict:
        c = proc_cpu(self.d.proc.pid, self.hz)
        if c is None:
            raise fb.BenchError("the daemon is gone:\n" + self.d.log_tail())
        return c

    def check_others(self) -> None:
        self.busy_runs += fb.warn_other_qemus(self.others, exclude_substrings=(self.d.home,))

    def clean(self) -> None:
        """Delete every sandbox but the source (not measured), then wait until
        their QEMUs are gone and the daemon's reaped-children CPU is stable
        (so no child's exit lands in the next run's helper CPU)."""
        ids = [s["id"] for s in self.d.api.list() if isinstance(s, dict)
               and s.get("id") != self.source["id"]]
        def rm(sid: str) -> None:
            try:
                self.d.delete(sid)
            except fb.ApiError as e:
                if e.status != 404:
                    raise
        with cf.ThreadPoolExecutor(max_workers=8) as pool:
            for f in [pool.submit(rm, sid) for sid in ids]:
                f.result()
        deadline = time.monotonic() + 120
        while len(fb.qemu_pids_mentioning(self.d.home)) > 1:
            if time.monotonic() > deadline:
                raise fb.BenchError(f"QEMUs left after deleting {len(ids)} children: "
                                    f"{fb.qemu_pids_mentioning(self.d.home)}")
            time.sleep(0.2)
        last = self.daemon_cpu()["reaped_ms"]
        for _ in range(50):
            time.sleep(0.5)
            now = self.daemon_cpu()["reaped_ms"]
            if now == last:
                break
            last = now
        time.sleep(self.args.rest)


def measure(c: Ctx, case: str, mode: str, run: int, n_runs: int, call) -> tuple[dict, list]:
    """One timed fan-out: `call()` makes the request and returns (children,
    extra run fields). Then exec in every child; CPU around it."""
    args = c.args
    c.check_others()
    run_row = {"case": case, "mode": mode, "run": run, "count": args.count, "ok": False}
    kids: list[dict] = []
    c.meter.start()
    cpu0 = c.daemon_cpu()
    t0 = time.perf_counter()
    try:
        sbs, extra = call()
        t_call = time.perf_counter()
        for sb in sbs:
            c.d.sandboxes.add(sb["id"])
        run_row.update(extra, call_ms=(t_call - t0) * 1000)
        ex = exec_all(c.d, sbs, t0, args.exec_timeout)
        t_end = time.perf_counter()
        cpu1 = c.daemon_cpu()
        run_row["other_cpu_cores"] = c.meter.other_cores()
        kids = [child_row(case, mode, run, i, sb, e)
                for i, (sb, e) in enumerate(zip(sbs, ex), start=1)]
        for sb in sbs:
            c.ppids.add((proc_cpu(sb["pid"]) or {}).get("ppid"))
        run_row.update(cpu_shares(kids, cpu1["own_ms"] - cpu0["own_ms"],
                                  cpu1["reaped_ms"] - cpu0["reaped_ms"]))
        answers = [k["answered_ms"] for k in kids]
        run_row.update(ok=True, total_ms=(t_end - t0) * 1000,
                       exec_phase_ms=(t_end - t_call) * 1000, first_answer_ms=min(answers))
        q = rp.summarize(k["qemu_cpu_ms"] for k in kids)
        print(f"[{case} {run}/{n_runs}] {args.count} children answered exec in "
              f"{run_row['total_ms']:,.0f} ms (call {run_row['call_ms']:,.0f} ms"
              + (f": pause {run_row['pause_ms']:.0f}, snapshot {run_row['snapshot_ms']:.0f}, "
                 f"spawn {run_row['spawn_ms']:,.0f}" if "pause_ms" in run_row else "")
              + f"; execs {run_row['exec_phase_ms']:,.0f} ms). CPU per child: QEMU p50 "
              f"{q['p50']:.0f} ms, daemon {run_row['daemon_cpu_per_child_ms']:.1f} ms, helpers "
              f"{run_row['helper_cpu_per_child_ms']:.1f} ms; other processes "
              f"{run_row['other_cpu_cores']:.2f} cores", flush=True)
    except Exception as e:  # noqa: BLE001 - recorded, exactly, in the CSV and RESULTS.md
        run_row.update(ok=False, error=str(e), total_ms=(time.perf_counter() - t0) * 1000,
                       other_cpu_cores=c.meter.other_cores())
        print(f"[{case} {run}/{n_runs}] FAILED after {run_row['total_ms']:,.0f} ms: {e}",
              flush=True)
        if c.d.proc.poll() is not None:
            raise
    return run_row, kids


def branch_call(c: Ctx, mode: str):
    def call():
        r = c.d.api.request("POST", f"/v1/sandboxes/{c.source['id']}/branch",
                            {"mode": mode, "count": c.args.count, **net_fields(c.args)},
                            expect=(201,),
                            timeout=c.args.call_timeout)
        sbs = r.get("children") or []
        snap = r.get("snapshot") or {}
        c.branch_snaps.append(snap.get("id"))
        check_children(sbs, c.args.count, f"branch {mode}", snap.get("id"))
        return sbs, {"pause_ms": r.get("pause_ms"), "snapshot_ms": r.get("snapshot_ms"),
                     "spawn_ms": r.get("spawn_ms"), "server_total_ms": r.get("total_ms"),
                     "snapshot_kind": snap.get("kind")}
    return call


def spawn_call(c: Ctx, snap_id: str):
    def call():
        r = c.d.api.request("POST", "/v1/sandboxes", {"snapshot": snap_id, "count": c.args.count,
                                                      **net_fields(c.args)},
                            expect=(201,), timeout=c.args.call_timeout)
        sbs = r.get("sandboxes") or []
        check_children(sbs, c.args.count, "spawn --count", snap_id)
        return sbs, {"server_total_ms": r.get("total_ms")}
    return call


def net_fields(args) -> dict:
    """`wait_for_network` for the fan-out requests: left out (the daemon's
    default, true) unless --wait-for-network was given."""
    return {} if args.wait_for_network is None else {"wait_for_network": args.wait_for_network}


def drop_branch_snapshots(c: Ctx) -> None:
    for sid in c.branch_snaps:
        if sid:
            try:
                c.d.api.request("DELETE", f"/v1/snapshots/{sid}?force=true", expect=(204, 404))
            except Exception as e:  # noqa: BLE001 - the daemon's stop cleans up too
                print(f"cleanup: DELETE snapshot {sid}: {e}", flush=True)
    c.branch_snaps.clear()


# -- naive ------------------------------------------------------------------


def make_naive_source(args, ctx: dict) -> None:
    """An unjailed daemon cold-boots a VM of the same image and size
    (network none), lets it settle and saves it the naive way into its home
    (kept until the end; ctx['naive_home'])."""
    d = fb.Daemon(binary=args.binary, env={"FORKVM_NO_JAIL": "1"}, keep_home=True)
    with d:
        ctx["naive_home"] = d.home
        src = d.create_cold(memory_mib=args.memory, cpus=1, network="none")
        print(f"[naive source] {src['id']} cold-booted in {src['timings']['total_ms']:.0f} ms "
              f"(unjailed daemon, network none); settling {args.settle:.0f} s", flush=True)
        time.sleep(args.settle)
        work = os.path.join(d.home, "naive")
        os.mkdir(work)
        saved = nv.naive_save(d, src["id"], src["pid"], args.memory, work)
        d.delete(src["id"])
    ctx["saved"], ctx["naive_work"] = saved, work
    ctx["naive_nic"] = nv.copy_netns(saved, "x") is not None
    print(f"[naive save] {saved.save_ms:.0f} ms, state file {saved.state_bytes / 2**20:.1f} MiB",
          flush=True)


def naive_batch(args, ctx: dict, run: int, n_runs: int, shm: str, meter) -> tuple[dict, list]:
    """`count` naive restores by a pool of os.cpu_count() workers; each is
    stopped right after its pong and CPU read."""
    saved, work = ctx["saved"], ctx["naive_work"]
    workers = args.naive_workers or os.cpu_count() or 1
    hz = os.sysconf("SC_CLK_TCK")
    kids: list[dict] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        tag = f"b{run}-{i}"
        vm = nv.naive_restore(saved, os.path.join(work, tag), os.path.join(shm, f"{tag}.mem"),
                              f"fvb-fanout-{tag}", netns=nv.copy_netns(saved, tag))
        t_ans = time.perf_counter()
        try:
            cpu = proc_cpu(vm.pid, hz)
        finally:
            vm.stop()
        row = {"case": NAIVE_CASE, "mode": "", "run": run, "child": i, "pid": vm.pid, "uid": 0,
               "answered_ms": (t_ans - t0) * 1000, **vm.timings,
               "qemu_cpu_ms": cpu["own_ms"] if cpu else math.nan}
        with lock:
            kids.append(row)

    run_row = {"case": NAIVE_CASE, "mode": "", "run": run, "count": args.count, "ok": False,
               "workers": workers}
    meter.start()
    own0 = os.times()
    t0 = time.perf_counter()
    try:
        with cf.ThreadPoolExecutor(max_workers=workers) as pool:
            futs = [pool.submit(one, i) for i in range(1, args.count + 1)]
            for f in cf.as_completed(futs):
                f.result()
        own1 = os.times()
        kids.sort(key=lambda r: r["child"])
        run_row["other_cpu_cores"] = meter.other_cores()
        own = ((own1.user + own1.system) - (own0.user + own0.system)) * 1000
        # The bench process plays the daemon's part here (QMP, file copies, the pings).
        run_row.update(cpu_shares(kids, own, math.nan))
        for k in kids:
            k["helper_cpu_ms"] = None
            k["cpu_total_ms"] = k["qemu_cpu_ms"] + k["daemon_cpu_ms"]
        run_row["helper_cpu_ms"] = run_row["helper_cpu_per_child_ms"] = None
        run_row.update(ok=True, total_ms=max(k["answered_ms"] for k in kids),
                       first_answer_ms=min(k["answered_ms"] for k in kids))
        q = rp.summarize(k["qemu_cpu_ms"] for k in kids)
        t = rp.summarize(k["total_ms"] for k in kids)
        print(f"[naive {run}/{n_runs}] {args.count} restores by {workers} workers, last pong "
              f"after {run_row['total_ms']:,.0f} ms (each p50 {t['p50']:,.0f} ms); QEMU CPU p50 "
              f"{q['p50']:.0f} ms; other processes {run_row['other_cpu_cores']:.2f} cores",
              flush=True)
    except Exception as e:  # noqa: BLE001
        run_row.update(ok=False, error=str(e), total_ms=(time.perf_counter() - t0) * 1000)
        print(f"[naive {run}/{n_runs}] FAILED: {e}", flush=True)
    return run_row, kids


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help=f"runs per case (>= {MIN_RUNS})")
    ap.add_argument("--count", type=int, default=100, help="children per fan-out")
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --runs < {MIN_RUNS}; results are marked SMOKE")
    ap.add_argument("--modes", default="diff",
                    help="comma-separated branch modes among diff,live,full (default diff)")
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    ap.add_argument("--naive-runs", type=int, default=1, help="naive batches of --count restores")
    ap.add_argument("--naive-workers", type=int, default=0,
                    help="concurrent naive restores (default os.cpu_count())")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive baseline (debugging)")
    ap.add_argument("--settle", type=float, default=5.0, metavar="SECONDS",
                    help="idle time of the source before the first run")
    ap.add_argument("--rest", type=float, default=2.0, metavar="SECONDS",
                    help="rest after each cleanup before the next run")
    ap.add_argument("--wait-for-network", action=argparse.BooleanOptionalAction, default=None,
                    help="send wait_for_network true/false with every branch and spawn "
                         "(default: leave it out, i.e. the daemon's default, true)")
    ap.add_argument("--exec-timeout", type=float, default=600.0, metavar="SECONDS")
    ap.add_argument("--call-timeout", type=float, default=1800.0, metavar="SECONDS")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        ap.error(f"--modes takes a comma-separated list among {','.join(MODES)}")
    if args.runs < 1 or args.count < 1 or args.naive_runs < 1:
        ap.error("--runs, --count and --naive-runs must be >= 1")
    if args.runs < MIN_RUNS and not args.smoke:
        print(f"note: --runs {args.runs} is below {MIN_RUNS}; RESULTS.md says so", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fb.wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    ctx: dict = {"machine": rp.machine_info(), "started": started,
                 "revision": rp.git_revision(),
                 "command": "bash bench/fanout/run.sh " + " ".join(sys.argv[1:]).replace(
                     f"--binary {args.binary}", "").strip()}
    runs: list[dict] = []
    children: list[dict] = []
    shm = tempfile.mkdtemp(prefix="fvb-", dir="/dev/shm")
    try:
        if not args.no_naive:
            make_naive_source(args, ctx)
        d = fb.Daemon(binary=args.binary, env={"FORKVM_NO_JAIL": "0"})
        with d:
            info = d.api.info()
            ctx["info"] = info
            ctx["memory_commit_mib"] = (info.get("capacity") or {}).get("memory_commit_mib")
            print(f"forkvm {info.get('version')} | accel {info['accel']['kind']} | QEMU "
                  f"{info['qemu'].get('version')} | home {d.home}", flush=True)
            src = d.create(memory_mib=args.memory)
            t = src.get("timings") or {}
            if not src.get("snapshot") or t.get("restore_ms") is None:
                raise fb.BenchError(f"the source is not a clone of the boot template: {src}")
            ctx.update(source_snapshot=src.get("snapshot"), source_restore_ms=t.get("restore_ms"),
                       source_network=(src.get("network") or {}).get("mode", "none"))
            print(f"[source] {src['id']}: a clone of {src['snapshot']} (restore "
                  f"{t['restore_ms']:.0f} ms, total {t['total_ms']:.0f} ms"
                  + (f", template {t['template_ms']:.0f} ms" if t.get("template_ms") else "")
                  + f"; network {ctx['source_network']}); idle {args.settle:.0f} s", flush=True)
            c = Ctx(d, args, src)
            c.branch_snaps = []
            snap = d.api.request("POST", f"/v1/sandboxes/{src['id']}/snapshot",
                                 {"tag": "bench-fanout"}, expect=(201,))
            snap_id = snap["id"]
            print(f"[snapshot] {snap_id} kind {snap.get('kind')}", flush=True)
            warm = d.api.request("POST", "/v1/sandboxes", {"snapshot": snap_id}, expect=(201,))
            d.sandboxes.add(warm["id"])
            d.delete(warm["id"])
            time.sleep(args.settle)
            c.clean()
            c.busy_runs = 0
            # The naive baseline first (with the source idle, as during the
            # forkvm runs), so a failure shows before the long part.
            if not args.no_naive:
                meter = fb.CpuMeter(roots=[d.proc.pid])
                ctx["naive_workers"] = args.naive_workers or os.cpu_count()
                for i in range(1, args.naive_runs + 1):
                    c.check_others()
                    row, kids = naive_batch(args, ctx, i, args.naive_runs, shm, meter)
                    runs.append(row)
                    children.extend(kids)
            for i in range(1, args.runs + 1):
                for m in args.modes:
                    row, kids = measure(c, f"branch_{m}", m, i, args.runs, branch_call(c, m))
                    runs.append(row)
                    children.extend(kids)
                    c.clean()
                    drop_branch_snapshots(c)
                row, kids = measure(c, SPAWN_CASE, "", i, args.runs, spawn_call(c, snap_id))
                runs.append(row)
                children.extend(kids)
                c.clean()
            ctx["others"], ctx["busy_runs"] = c.others, c.busy_runs
            ppids = {p for p in c.ppids if p}
            ctx["qemu_parent"] = ("children of the daemon (so counted as ours)"
                                  if ppids == {d.proc.pid} else
                                  f"children of pid(s) {sorted(ppids)} (the daemon is "
                                  f"{d.proc.pid})")
            home = d.home
        leaked = fb.qemu_pids_mentioning(home)
        ctx["leaked"] = "none" if not leaked else f"{leaked}"
        if leaked:
            print(f"warning: QEMUs left naming {home}: {leaked}", flush=True)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        if ctx.get("naive_home"):
            shutil.rmtree(ctx["naive_home"], ignore_errors=True)
            shutil.rmtree(fb.run_dir_for_home(ctx["naive_home"]), ignore_errors=True)
        ctx["elapsed"] = time.monotonic() - t_start
        if runs and "info" in ctx:
            rp.write_csv(out / "fanout.csv", runs, RUN_FIELDS)
            rp.write_csv(out / "children.csv", children, CHILD_FIELDS)
    title = (f"forkvm fan-out: {args.count} children of a {args.memory} MiB clone, "
             f"{ctx['info']['accel']['kind']}, {ctx['machine']['cores']} cores"
             + (" (SMOKE)" if args.smoke else ""))
    write_plots(out, runs, children, args.modes, title)
    write_results(out / "RESULTS.md", runs, children, ctx, args)
    kf = key_figures(runs, args.modes, args.count)
    print(f"\nnaive: {args.count} restores in {ms(kf['naive']['p50'])} ms (p50 of "
          f"{kf['naive']['n']})")
    for cname, f in kf["cases"].items():
        print(f"{cname}: p50 {ms(f['wall']['p50'])} ms, p90 {ms(f['wall']['p90'])} ms, "
              f"{f['speedup']:.2f}× faster than naive; failed runs {f['failed']}")
    print(f"wrote {out}/RESULTS.md, fanout.csv, children.csv, fanout.png, cpu.png")
    return 0 if all(f["failed"] == 0 for f in kf["cases"].values()) else 1


if __name__ == "__main__":
    rp.run_main("bench_fanout", main, on_signal=None)
