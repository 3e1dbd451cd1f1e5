#!/usr/bin/env python3
"""forkvm branch benchmark: how long a branch pauses the source, against naive QEMU save.

Run through bench/branch/run.sh (which builds the release binary first).

Everything is measured in one run against one private daemon:

1. size        -- for each guest size M: a source is cold-booted
                  (use_template: false) and left to settle; N branches per mode
                  (`POST /v1/sandboxes/{id}/branch {"mode": live|full,
                  "count": 0}`), alternating full, live, full, ..., each
                  snapshot deleted (force) right after; then the naive
                  baseline on the same source (stop, full migration of all RAM
                  to a file, cont) with QEMU's default migration parameters
                  (`naive`) and with the bandwidth cap lifted as forkvm's live
                  mode does (`naive_nolimit`). Reference points: a bare QMP
                  stop + cont (`stop_cont`, the floor), and the live mapped-ram
                  save done by the bench itself over QMP with the file on the
                  store's filesystem (`qemu_live_disk`) and on /dev/shm
                  (`qemu_live_shm`), to show where the live pause goes.
2. dirty       -- a fresh 2048 MiB source per D: a guest process allocates and
                  fills D MiB and keeps it resident (idle), then branches in
                  each mode, the two live references and the naive baselines.
3. consecutive -- one 512 MiB source running a counter loop; K live branches
                  back to back (then K full), each pause and total recorded;
                  the counter must keep advancing afterwards.

Outputs: results/branch.csv, results/RESULTS.md, results/pause_vs_size.png,
results/pause_vs_dirty.png, results/consecutive.png.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))

import forkvm_bench as fb  # noqa: E402

MIN_RUNS = 10
NOISY_CORES = 0.25          # a run during which other processes used more than this is flagged
LIVE_TARGET_MS = 5.0        # live pause p50 under this at every size
LIVE_SCALE_TARGET = 1.5     # live pause at 4096 MiB within this factor of 512 MiB
NAIVE_TARGET = 50.0         # every mode's pause at least this many times shorter than naive at 4096
LIVE_MAX_BANDWIDTH = 64 << 30   # what forkvm's live mode sets (migrate.rs set_live_parameters)
LIVE_DOWNTIME_LIMIT = 5

FIELDS = [
    "experiment", "mode", "size_mib", "dirty_mib", "run",
    "pause_ms", "pause_source",
    # forkvm: the snapshot's server timings, then the branch response
    "save_state_ms", "freeze_disk_ms", "copy_memory_ms", "publish_ms", "snapshot_total_ms",
    "snapshot_ms", "spawn_ms", "branch_total_ms", "wall_ms",
    # QEMU's own account of the last migration (query-migrate right after)
    "qemu_downtime_ms", "qemu_total_ms", "ram_transferred_mib", "dirty_sync_count",
    # bench-driven live save: STOP -> `completed` seen by polling, and -> RESUME
    "stop_to_completed_ms", "completed_to_resume_ms",
    # naive: client clock, migrate stage, parameters
    "clock_ms", "migrate_ms", "max_bandwidth",
    "snapshot_kind", "device_state_mib", "snapshot_alloc_mib", "state_file_mib",
    "ram_file_before_mib", "ram_file_after_mib",
    "counter",
    "naive_p50_ms", "x_shorter_than_naive", "naive_nolimit_p50_ms", "x_shorter_than_naive_nolimit",
    "other_cpu_cores", "note",
]

MODE_ORDER = ["live", "full", "naive", "naive_nolimit", "qemu_live_disk", "qemu_live_shm",
              "stop_cont"]
MODE_LABEL = {
    "live": "forkvm branch live",
    "full": "forkvm branch full",
    "naive": "naive stop+save+cont (QEMU defaults)",
    "naive_nolimit": "naive, bandwidth cap lifted",
    "qemu_live_disk": "bench live save, file on disk (reference)",
    "qemu_live_shm": "bench live save, file on /dev/shm (reference)",
    "stop_cont": "QMP stop+cont, nothing in between (floor)",
}
MODE_STYLE = {
    "live": ("tab:blue", "o", "-"),
    "full": ("tab:orange", "s", "-"),
    "naive": ("tab:red", "^", "-"),
    "naive_nolimit": ("tab:purple", "v", "--"),
    "qemu_live_disk": ("tab:cyan", "D", ":"),
    "qemu_live_shm": ("tab:green", "P", ":"),
    "stop_cont": ("tab:gray", "x", ":"),
}

ms_since = fb.ms_since


def mib(b) -> float | None:
    return None if b is None else b / 2**20


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------


class Ctx:
    """What every measurement needs: the daemon, the snapshots alive, the
    scratch dirs and the rows."""

    def __init__(self, d: fb.Daemon, shm: str, args):
        self.d = d
        self.shm = shm
        self.args = args
        self.rows: list[dict] = []
        self.snaps: set[str] = set()
        self.meter = fb.CpuMeter(roots=[d.proc.pid])
        self.t_start = time.monotonic()
        self.qemu_defaults: dict | None = None
        self.others: dict[int, str] = {}
        self.busy_runs = 0
        self.notes: list[str] = []
        self.diff_probe: str | None = None

    def elapsed(self) -> str:
        return f"t+{time.monotonic() - self.t_start:.0f}s"

    def qmp_path(self, sid: str) -> str:
        return os.path.join(self.d.sandbox_dir(sid), "qmp.sock")

    def ram_file(self, sid: str) -> Path:
        return fb.run_dir_for_home(self.d.home) / f"{sid}.mem"

    def ram_alloc_mib(self, sid: str) -> float:
        return fb.allocated_bytes(self.ram_file(sid)) / 2**20

    def check_others(self) -> None:
        now = fb.other_qemu_processes(exclude_substrings=(self.d.home, self.shm))
        new = {p: c for p, c in now.items() if p not in self.others}
        if new:
            print("warning: QEMU processes not started by this bench are running; they compete "
                  "for CPU and skew the timings:\n  "
                  + "\n  ".join(f"{p}: {c}" for p, c in new.items()), flush=True)
        self.others.update(now)
        self.busy_runs += bool(now)

    def measured(self, fn, *a, **kw) -> dict:
        """Run one measurement with the host-noise meter around it."""
        self.check_others()
        self.meter.start()
        row = fn(self, *a, **kw)
        row["other_cpu_cores"] = self.meter.other_cores()
        self.rows.append(row)
        if row["other_cpu_cores"] > NOISY_CORES:
            print(f"    (other processes kept {row['other_cpu_cores']:.2f} cores busy during "
                  "this run)", flush=True)
        return row


def delete_snapshot(c: Ctx, snap_id: str) -> None:
    c.d.api.request("DELETE", f"/v1/snapshots/{snap_id}?force=true", expect=(204,))
    c.snaps.discard(snap_id)


def query_last_migration(c: Ctx, sid: str) -> dict:
    """QEMU's figures for the migration the daemon just ran (its QMP socket is
    free again once the branch call has returned)."""
    with fb.Qmp(c.qmp_path(sid), timeout=30) as q:
        return fb.migration_stats(q.execute("query-migrate"))


def branch(c: Ctx, sid: str, mode: str, exp: str, size: int, dirty, run: int, n: int,
           keep: bool = False) -> dict:
    """One timed `POST /v1/sandboxes/{sid}/branch {"mode": mode, "count": 0}`.
    The snapshot is deleted right after unless `keep` (then it is in c.snaps)."""
    before = c.ram_alloc_mib(sid)
    t0 = time.perf_counter()
    r = c.d.api.request("POST", f"/v1/sandboxes/{sid}/branch", {"mode": mode, "count": 0},
                        expect=(201,), timeout=900)
    wall = ms_since(t0)
    snap = r["snapshot"]
    c.snaps.add(snap["id"])
    after = c.ram_alloc_mib(sid)
    try:
        if r.get("mode") != mode or r.get("children"):
            raise fb.BenchError(f"branch {mode} answered mode {r.get('mode')} with "
                                f"{len(r.get('children') or [])} children: {r}")
        want_kind = "live" if mode == "live" else "shared"
        if snap.get("kind") != want_kind or snap.get("state") != "ready":
            raise fb.BenchError(f"branch {mode}: expected a ready {want_kind} snapshot, got "
                                f"{snap.get('kind')} / {snap.get('state')}")
        t = snap.get("timings") or {}
        sdir = os.path.join(c.d.home, "snapshots", snap["id"])
        sizes = snap.get("sizes") or {}
        mig = query_last_migration(c, sid)
        row = {
            "experiment": exp, "mode": mode, "size_mib": size, "dirty_mib": dirty, "run": run,
            "pause_ms": r["pause_ms"], "pause_source": "daemon",
            "save_state_ms": t.get("save_state_ms"), "freeze_disk_ms": t.get("freeze_disk_ms"),
            "copy_memory_ms": t.get("copy_memory_ms"), "publish_ms": t.get("publish_ms"),
            "snapshot_total_ms": t.get("total_ms"), "snapshot_ms": r.get("snapshot_ms"),
            "spawn_ms": r.get("spawn_ms"), "branch_total_ms": r.get("total_ms"), "wall_ms": wall,
            "qemu_downtime_ms": mig.get("qemu_downtime_ms"),
            "qemu_total_ms": mig.get("qemu_total_ms"),
            "ram_transferred_mib": mib(mig.get("ram_transferred_bytes")),
            "dirty_sync_count": mig.get("dirty_sync_count"),
            "snapshot_kind": snap.get("kind"),
            "device_state_mib": mib(sizes.get("device_state_bytes")),
            "snapshot_alloc_mib": fb.allocated_bytes_tree(sdir) / 2**20,
            "ram_file_before_mib": before, "ram_file_after_mib": after,
        }
        # In live mode the daemon falls back to its own clock, started before the
        # precopy, when an event is missing: a pause as long as the whole save.
        if mode == "live" and row["save_state_ms"] and row["pause_ms"] >= row["save_state_ms"]:
            row["note"] = "pause >= save_state: the daemon's clock fallback?"
    finally:
        if not keep:
            delete_snapshot(c, snap["id"])
    print(f"[{where_label(exp, size, dirty)} {mode} {run}/{n}] "
          f"pause {row['pause_ms']:.1f} ms  (save_state {row['save_state_ms']:.0f}, freeze "
          f"{row['freeze_disk_ms']:.1f}, copy_memory {row['copy_memory_ms']:.0f}, publish "
          f"{row['publish_ms']:.0f}; branch total {row['branch_total_ms']:.0f}; QEMU downtime "
          f"{fb_fmt(row['qemu_downtime_ms'])}; RAM file {before:.0f}->{after:.0f} MiB)  "
          f"{c.elapsed()}", flush=True)
    return row


def naive(c: Ctx, sid: str, variant: str, exp: str, size: int, dirty, run: int, n: int) -> dict:
    """The naive baseline on the running source (see fb.naive_pause)."""
    if variant == "naive":
        params = dict(c.qemu_defaults)
    else:
        params = {"max-bandwidth": LIVE_MAX_BANDWIDTH,
                  "downtime-limit": c.qemu_defaults["downtime-limit"]}
    state = os.path.join(c.d.home, "naive-state.bin")  # same filesystem as the store
    before = c.ram_alloc_mib(sid)
    r = fb.naive_pause(c.qmp_path(sid), state, params=params)
    row = {
        "experiment": exp, "mode": variant, "size_mib": size, "dirty_mib": dirty, "run": run,
        "pause_ms": r["pause_ms"], "pause_source": r["pause_source"], "clock_ms": r["clock_ms"],
        "migrate_ms": r["migrate_ms"], "max_bandwidth": r["params"].get("max-bandwidth"),
        "qemu_downtime_ms": r.get("qemu_downtime_ms"), "qemu_total_ms": r.get("qemu_total_ms"),
        "ram_transferred_mib": mib(r.get("ram_transferred_bytes")),
        "dirty_sync_count": r.get("dirty_sync_count"),
        "state_file_mib": mib(r["state_bytes"]),
        "ram_file_before_mib": before, "ram_file_after_mib": c.ram_alloc_mib(sid),
    }
    if r["state_bytes"] < (dirty or 0) * 2**20 * 0.9:
        raise fb.BenchError(f"naive state file is {r['state_bytes']} bytes but {dirty} MiB "
                            "were dirtied: RAM was not saved into it")
    print(f"[{where_label(exp, size, dirty)} {variant} {run}/{n}] "
          f"pause {row['pause_ms']:.1f} ms ({r['pause_source']}; client clock "
          f"{row['clock_ms']:.0f}, migrate {row['migrate_ms']:.0f}) state file "
          f"{row['state_file_mib']:.0f} MiB, max-bandwidth "
          f"{row['max_bandwidth'] / 2**20:.0f} MiB/s  {c.elapsed()}", flush=True)
    return row


def qemu_live(c: Ctx, sid: str, where: str, exp: str, size: int, dirty, run: int, n: int) -> dict:
    """Reference: the live save forkvm's live mode runs (mapped-ram precopy to a
    file, downtime-limit 5 ms, no bandwidth cap, `query-migrate` polled every
    1 ms), done by the bench over QMP, then `cont` at once (no disk freeze, no
    publish). `where` = "disk" (the daemon home, the store's filesystem) or
    "shm" (/dev/shm). Pause from the STOP/RESUME events; STOP -> `completed`
    seen and `completed` -> RESUME split it (event timestamps are
    CLOCK_REALTIME, as is time.time())."""
    state = os.path.join(c.d.home if where == "disk" else c.shm, "live-ref.bin")
    before = c.ram_alloc_mib(sid)
    with fb.Qmp(c.qmp_path(sid), timeout=60) as q:
        caps_on, old = fb.migration_settings(q)
        try:
            change = [{"capability": cap, "state": False} for cap in caps_on if cap != "mapped-ram"]
            change.append({"capability": "mapped-ram", "state": True})
            q.execute("migrate-set-capabilities", {"capabilities": change})
            q.execute("migrate-set-parameters", {"downtime-limit": LIVE_DOWNTIME_LIMIT,
                                                 "max-bandwidth": LIVE_MAX_BANDWIDTH})
            q.events.clear()
            t0 = time.perf_counter()
            q.execute("migrate", {"uri": f"file:{state}"})
            try:
                m = fb.wait_migration(q, timeout=600, poll=0.001)
                t_done = time.time() * 1000
            finally:
                if q.execute("query-status")["status"] != "running":
                    q.execute("cont")
            total = ms_since(t0)
            q.execute("query-status")
            stop = [fb.event_time_ms(e) for e in q.events if e["event"] == "STOP"]
            resume = [fb.event_time_ms(e) for e in q.events if e["event"] == "RESUME"]
            pause = fb.pause_from_events(q.events)
            file_bytes = os.path.getsize(state)
            file_alloc = fb.allocated_bytes(state)
        finally:
            try:
                fb.restore_migration_settings(q, caps_on, old)
            finally:
                try:
                    os.unlink(state)
                except FileNotFoundError:
                    pass
    st = fb.migration_stats(m)
    row = {
        "experiment": exp, "mode": f"qemu_live_{where}", "size_mib": size, "dirty_mib": dirty,
        "run": run, "pause_ms": pause, "pause_source": "events", "wall_ms": total,
        "qemu_downtime_ms": st["qemu_downtime_ms"], "qemu_total_ms": st["qemu_total_ms"],
        "ram_transferred_mib": mib(st["ram_transferred_bytes"]),
        "dirty_sync_count": st["dirty_sync_count"],
        "stop_to_completed_ms": (t_done - stop[-1]) if stop else None,
        "completed_to_resume_ms": (resume[-1] - t_done) if resume else None,
        "state_file_mib": mib(file_alloc), "device_state_mib": mib(file_bytes),
        "ram_file_before_mib": before, "ram_file_after_mib": c.ram_alloc_mib(sid),
    }
    if pause is None:
        raise fb.BenchError(f"no STOP/RESUME pair in the events of the live reference save: "
                            f"{[e['event'] for e in q.events]}")
    print(f"[{where_label(exp, size, dirty)} qemu_live_{where} "
          f"{run}/{n}] pause {pause:.1f} ms (STOP->completed seen "
          f"{fb_fmt(row['stop_to_completed_ms'], 1)}, ->RESUME "
          f"{fb_fmt(row['completed_to_resume_ms'], 1)}; QEMU downtime "
          f"{fb_fmt(row['qemu_downtime_ms'])}; save {total:.0f} ms, file "
          f"{row['state_file_mib']:.0f} MiB allocated)  {c.elapsed()}", flush=True)
    return row


def stop_cont(c: Ctx, sid: str, exp: str, size: int, dirty, run: int, n: int) -> dict:
    """The floor: QMP `stop` then `cont`, nothing in between."""
    with fb.Qmp(c.qmp_path(sid), timeout=30) as q:
        q.events.clear()
        t0 = time.perf_counter()
        q.execute("stop")
        q.execute("cont")
        clock = ms_since(t0)
        q.execute("query-status")
        pause = fb.pause_from_events(q.events)
    row = {"experiment": exp, "mode": "stop_cont", "size_mib": size, "dirty_mib": dirty,
           "run": run, "pause_ms": pause if pause is not None else clock,
           "pause_source": "events" if pause is not None else "clock", "clock_ms": clock}
    print(f"[{where_label(exp, size, dirty)} stop_cont {run}/{n}] "
          f"pause {row['pause_ms']:.2f} ms ({row['pause_source']})  {c.elapsed()}", flush=True)
    return row


def where_label(exp: str, size: int, dirty) -> str:
    if exp == "dirty":
        return f"dirty D={dirty} MiB ({size} MiB guest)"
    return f"{exp} {size} MiB"


def fb_fmt(v, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    return f"{v:,.{digits}f}"


# --------------------------------------------------------------------------
# Sources and guest helpers
# --------------------------------------------------------------------------


def need_memory(size: int, extra_mib: int = 3072) -> None:
    avail = fb.meminfo()["MemAvailable"] // 1024
    if avail < size + extra_mib:
        raise fb.BenchError(f"not enough free memory for a {size} MiB source: MemAvailable "
                            f"{avail} MiB < {size + extra_mib} MiB (a live branch makes the "
                            "whole RAM file resident)")


def boot_source(c: Ctx, size: int, label: str) -> dict:
    need_memory(size)
    src = c.d.create_cold(memory_mib=size, cpus=1)
    sid = src["id"]
    if not c.ram_file(sid).exists():
        raise fb.BenchError(f"the source's RAM file {c.ram_file(sid)} is missing")
    with fb.Qmp(c.qmp_path(sid), timeout=30) as q:
        p = q.execute("query-migrate-parameters")
        caps = [x["capability"] for x in q.execute("query-migrate-capabilities") if x["state"]]
    defaults = {"max-bandwidth": p["max-bandwidth"], "downtime-limit": p["downtime-limit"]}
    if c.qemu_defaults is None:
        c.qemu_defaults = defaults
    elif defaults != c.qemu_defaults:
        c.notes.append(f"source {sid} booted with migration parameters {defaults}, not "
                       f"{c.qemu_defaults}")
    if caps:
        c.notes.append(f"source {sid} booted with capabilities on: {caps}")
    print(f"[{label}] source {sid}: {size} MiB cold-booted in "
          f"{src['timings']['total_ms']:.0f} ms (RAM file {c.ram_alloc_mib(sid):.0f} MiB "
          f"allocated); settling {c.args.settle:.0f} s  {c.elapsed()}", flush=True)
    time.sleep(c.args.settle)
    return src


def guest_sh(c: Ctx, sid: str, script: str, *args, timeout_ms: int = 60000) -> dict:
    r = c.d.api.exec(sid, ["sh", "-c", script, *args], timeout_ms=timeout_ms)
    return r


def start_holder(c: Ctx, sid: str, dirty: int, timeout: float = 300.0) -> dict:
    """In the guest, a python3 process fills `dirty` MiB (a random 1 MiB block
    repeated: no page is zero) and sleeps holding it. Returns its pid, fill
    time and VmRSS once it reports ready through a file."""
    code = (
        "import os, time\n"
        "t = time.time()\n"
        f"buf = bytearray(os.urandom(1 << 20)) * {dirty}\n"
        "open('/tmp/holder.tmp', 'w').write('%d %.2f' % (len(buf), time.time() - t))\n"
        "os.rename('/tmp/holder.tmp', '/tmp/holder.ready')\n"
        "time.sleep(10 ** 9)\n"
    )
    r = guest_sh(c, sid, 'rm -f /tmp/holder.ready; setsid python3 -c "$0" >/dev/null 2>&1 '
                 '</dev/null & echo $!', code)
    if r["exit_code"] != 0:
        raise fb.BenchError(f"cannot start the holder in the guest: {r}")
    pid = int(r["stdout"].strip())
    t0 = time.monotonic()
    while True:
        r = c.d.api.exec(sid, ["cat", "/tmp/holder.ready"])
        if r["exit_code"] == 0:
            break
        if time.monotonic() - t0 > timeout:
            raise fb.BenchError(f"the guest holder of {dirty} MiB was not ready after "
                                f"{timeout:.0f} s")
        time.sleep(0.5)
    nbytes, fill_s = r["stdout"].split()
    st = c.d.api.exec(sid, ["cat", f"/proc/{pid}/status"])["stdout"]
    rss_kib = next((int(x.split()[1]) for x in st.splitlines() if x.startswith("VmRSS:")), 0)
    if int(nbytes) != dirty << 20 or rss_kib < dirty * 1024 * 0.95:
        raise fb.BenchError(f"holder holds {nbytes} bytes, VmRSS {rss_kib} KiB; wanted "
                            f"{dirty} MiB resident")
    return {"pid": pid, "fill_s": float(fill_s), "rss_mib": rss_kib / 1024,
            "wait_s": time.monotonic() - t0}


COUNTER_LOOP = ("i=0; while true; do i=$((i+1)); echo $i > /tmp/c.tmp; "
                "mv /tmp/c.tmp /tmp/counter; sleep 0.05; done")


def start_counter(c: Ctx, sid: str) -> int:
    r = guest_sh(c, sid, 'rm -f /tmp/counter; setsid sh -c "$0" >/dev/null 2>&1 </dev/null & '
                 'echo $!', COUNTER_LOOP)
    if r["exit_code"] != 0:
        raise fb.BenchError(f"cannot start the counter loop: {r}")
    deadline = time.monotonic() + 60
    while read_counter(c, sid) is None:
        if time.monotonic() > deadline:
            raise fb.BenchError("the guest counter did not start within 60 s")
        time.sleep(0.2)
    return int(r["stdout"].strip())


def read_counter(c: Ctx, sid: str) -> int | None:
    r = c.d.api.exec(sid, ["cat", "/tmp/counter"])
    try:
        return int(r["stdout"].strip()) if r["exit_code"] == 0 else None
    except ValueError:
        return None


def disk_chain_depth(c: Ctx, sid: str) -> int:
    """Layers in the source's disk chain (its newest top layer down to the image)."""
    sdir = Path(c.d.sandbox_dir(sid))
    tops = sorted(sdir.glob("disk*.qcow2"), key=lambda p: p.stat().st_mtime_ns)
    if not tops:
        return 0
    return len(fb._qemu_img_chain(str(tops[-1])))


# --------------------------------------------------------------------------
# Experiments
# --------------------------------------------------------------------------


def exp_size(c: Ctx, size: int) -> None:
    a = c.args
    src = boot_source(c, size, f"size {size} MiB")
    sid = src["id"]
    try:
        probe_diff(c, sid)
        for i in range(1, a.floor_runs + 1):
            c.measured(stop_cont, sid, "size", size, None, i, a.floor_runs)
        # Alternate, full first: full's run 1 sees the RAM file as the boot left it
        # (sparse); from the first live branch on it is fully allocated (see RESULTS).
        for i in range(1, a.runs + 1):
            for mode in ("full", "live"):
                c.measured(branch, sid, mode, "size", size, None, i, a.runs)
        for i in range(1, a.ref_runs + 1):
            for where in ("disk", "shm"):
                c.measured(qemu_live, sid, where, "size", size, None, i, a.ref_runs)
        nn = a.naive_runs if size < 4096 else min(a.naive_runs, a.naive_runs_large)
        for i in range(1, nn + 1):
            for v in ("naive", "naive_nolimit"):
                c.measured(naive, sid, v, "size", size, None, i, nn)
    finally:
        c.d.delete(sid)


def exp_dirty(c: Ctx, dirty: int) -> None:
    a = c.args
    size = a.dirty_memory
    src = boot_source(c, size, f"dirty {dirty} MiB")
    sid = src["id"]
    try:
        if dirty:
            h = start_holder(c, sid, dirty)
            print(f"[dirty {dirty} MiB] guest pid {h['pid']} holds {h['rss_mib']:.0f} MiB "
                  f"resident (filled in {h['fill_s']:.1f} s guest time); settling "
                  f"{a.settle:.0f} s  {c.elapsed()}", flush=True)
            c.notes.append(f"dirty {dirty}: holder filled {dirty} MiB in {h['fill_s']:.1f} s, "
                           f"VmRSS {h['rss_mib']:.0f} MiB")
            time.sleep(a.settle)
        for i in range(1, a.dirty_runs + 1):
            for mode in ("full", "live"):
                c.measured(branch, sid, mode, "dirty", size, dirty, i, a.dirty_runs)
        for i in range(1, a.dirty_ref_runs + 1):
            for where in ("disk", "shm"):
                c.measured(qemu_live, sid, where, "dirty", size, dirty, i, a.dirty_ref_runs)
        for i in range(1, a.dirty_naive_runs + 1):
            for v in ("naive", "naive_nolimit"):
                c.measured(naive, sid, v, "dirty", size, dirty, i, a.dirty_naive_runs)
    finally:
        c.d.delete(sid)


def exp_consecutive(c: Ctx, ctx: dict) -> None:
    a = c.args
    size, k = a.consecutive_memory, a.consecutive
    src = boot_source(c, size, "consecutive")
    sid = src["id"]
    checks = []
    try:
        probe_diff(c, sid)
        cpid = start_counter(c, sid)
        print(f"[consecutive] counter loop running in the guest (pid {cpid})", flush=True)
        for mode in ("live", "full"):
            depth0 = disk_chain_depth(c, sid)
            readings = []

            def reading(label):
                v = read_counter(c, sid)
                readings.append((label, time.monotonic(), v))
                c.rows.append({"experiment": "consecutive", "mode": f"counter_{mode}",
                               "size_mib": size, "run": len(readings), "counter": v,
                               "note": label})
                return v

            reading("before")
            time.sleep(a.counter_gap)
            reading(f"before + {a.counter_gap:.0f} s")
            t0 = time.perf_counter()
            kept = []
            try:
                for i in range(1, k + 1):
                    row = c.measured(branch, sid, mode, "consecutive", size, None, i, k, keep=True)
                    kept.append(row)
                block_ms = ms_since(t0)
                reading(f"right after the {k} branches")
                time.sleep(a.counter_gap)
                reading(f"after + {a.counter_gap:.0f} s")
            finally:
                for s in sorted(c.snaps):
                    delete_snapshot(c, s)
            depth1 = disk_chain_depth(c, sid)
            (_, tb0, v0), (_, tb1, v1), (_, ta0, v2), (_, ta1, v3) = readings
            ok = None not in (v0, v1, v2, v3) and v0 <= v1 <= v2 < v3
            rate_b = (v1 - v0) / (tb1 - tb0) if ok else math.nan
            rate_a = (v3 - v2) / (ta1 - ta0) if ok else math.nan
            pauses = sum(r["pause_ms"] for r in kept)
            check = {"mode": mode, "k": k, "values": [v0, v1, v2, v3], "ok": ok,
                     "rate_before": rate_b, "rate_after": rate_a, "block_ms": block_ms,
                     "during_rate": (v2 - v1) / (ta0 - tb1) if ok else math.nan,
                     "pauses_ms": pauses, "depth_before": depth0, "depth_after": depth1}
            checks.append(check)
            print(f"[consecutive {mode}] {k} branches in {block_ms / 1000:.1f} s (sum of pauses "
                  f"{pauses:.0f} ms); counter {v0} -> {v1} (+{a.counter_gap:.0f} s) | {v2} after "
                  f"-> {v3} (+{a.counter_gap:.0f} s): {'advancing' if ok else 'NOT ADVANCING'}; "
                  f"rate {rate_b:.1f}/s before, {rate_a:.1f}/s after; disk chain {depth0} -> "
                  f"{depth1} layers  {c.elapsed()}", flush=True)
            if not ok:
                raise fb.BenchError(f"the source's counter did not keep advancing: {readings}")
    finally:
        ctx["counter_checks"] = checks
        c.d.delete(sid)


# --------------------------------------------------------------------------
# Statistics and output
# --------------------------------------------------------------------------


def sel(rows, exp, mode, size=None, dirty=None):
    return [r for r in rows if r["experiment"] == exp and r["mode"] == mode
            and (size is None or r["size_mib"] == size)
            and (dirty is None or r.get("dirty_mib") == dirty)]


def pstat(rows, key="pause_ms") -> dict:
    return fb.summarize(r.get(key) for r in rows)


def cell_key(r):
    return (r["experiment"], r["size_mib"], r.get("dirty_mib"))


def add_ratios(rows) -> None:
    """Every pause as a ratio to the naive pauses of the same cell (same
    experiment and size/dirty, same run)."""
    for exp in ("size", "dirty"):
        cells = {cell_key(r) for r in rows if r["experiment"] == exp}
        for key in cells:
            in_cell = [r for r in rows if cell_key(r) == key]
            nv = pstat([r for r in in_cell if r["mode"] == "naive"])["p50"]
            nl = pstat([r for r in in_cell if r["mode"] == "naive_nolimit"])["p50"]
            for r in in_cell:
                if r.get("pause_ms") is None:
                    continue
                r["naive_p50_ms"], r["naive_nolimit_p50_ms"] = nv, nl
                r["x_shorter_than_naive"] = nv / r["pause_ms"] if r["pause_ms"] else math.nan
                r["x_shorter_than_naive_nolimit"] = (nl / r["pause_ms"] if r["pause_ms"]
                                                     else math.nan)


def write_csv(path: Path, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()
                        if k in FIELDS})


def fmt(v, digits: int = 0) -> str:
    return fb_fmt(v, digits)


def fmt_ms(v) -> str:
    if v is None or v != v:
        return "–"
    return f"{v:,.2f}" if v < 10 else f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def ratio(a, b) -> float:
    return a / b if b and a == a and b == b else math.nan


def key_figures(rows, sizes) -> dict:
    live = {s: pstat(sel(rows, "size", "live", s))["p50"] for s in sizes}
    full = {s: pstat(sel(rows, "size", "full", s))["p50"] for s in sizes}
    nv = {s: pstat(sel(rows, "size", "naive", s))["p50"] for s in sizes}
    nl = {s: pstat(sel(rows, "size", "naive_nolimit", s))["p50"] for s in sizes}
    return {"live": live, "full": full, "naive": nv, "naive_nolimit": nl}


def plot_lines(ax, rows, exp, xkey, xs, modes):
    for mode in modes:
        pts = []
        for x in xs:
            rs = [r for r in rows if r["experiment"] == exp and r["mode"] == mode
                  and r[xkey] == x]
            if rs:
                s = pstat(rs)
                pts.append((x, s["p50"], s["min"], s["max"], s["n"]))
        if not pts:
            continue
        color, marker, ls = MODE_STYLE[mode]
        X = [p[0] for p in pts]
        Y = [p[1] for p in pts]
        ax.errorbar(X, Y, yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                    color=color, marker=marker, ls=ls, capsize=3, ms=5, lw=1.5,
                    label=f"{MODE_LABEL[mode]} (p50, min–max)")
        if mode in ("live", "full", "naive"):
            for x, y, *_ in pts:
                ax.annotate(fmt_ms(y), (x, y), textcoords="offset points", xytext=(5, 4),
                            fontsize=7, color=color)


def write_plots(out: Path, rows, ctx, args, title_base: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ["naive", "naive_nolimit", "full", "qemu_live_disk", "live", "qemu_live_shm",
             "stop_cont"]

    # 1. pause vs size
    sizes = sorted({r["size_mib"] for r in rows if r["experiment"] == "size"})
    if sizes:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 7.5),
                                      gridspec_kw={"width_ratios": [1.5, 1]})
        plot_lines(ax, rows, "size", "size_mib", sizes, modes)
        ax.axhline(LIVE_TARGET_MS, color="tab:blue", ls="--", lw=0.8, alpha=0.6)
        ax.annotate(f"target: live < {LIVE_TARGET_MS:.0f} ms", (sizes[0], LIVE_TARGET_MS),
                    textcoords="offset points", xytext=(0, -11), fontsize=7, color="tab:blue")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_yscale("log")
        ax.set_xlabel("guest memory (MiB), idle guest")
        ax.set_ylabel("source paused (ms, log scale; STOP→RESUME events)")
        ax.set_title("Pause of the source vs guest memory size", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2)
        # ratios
        for mode in ("live", "full"):
            color, marker, ls = MODE_STYLE[mode]
            for base, bls in (("naive", "-"), ("naive_nolimit", "--")):
                X, Y = [], []
                for s in sizes:
                    v = ratio(pstat(sel(rows, "size", base, s))["p50"],
                              pstat(sel(rows, "size", mode, s))["p50"])
                    if v == v:
                        X.append(s)
                        Y.append(v)
                ax2.plot(X, Y, color=color, marker=marker, ls=bls,
                         label=f"{mode}: naive{' (cap lifted)' if base != 'naive' else ''} p50 "
                               f"÷ {mode} p50")
        ax2.axhline(NAIVE_TARGET, color="black", ls=":", lw=1)
        ax2.annotate(f"target ≥ {NAIVE_TARGET:.0f}× at 4096 MiB", (sizes[0], NAIVE_TARGET),
                     textcoords="offset points", xytext=(0, 4), fontsize=7)
        ax2.axhline(1, color="gray", lw=0.6)
        ax2.set_xscale("log", base=2)
        ax2.set_xticks(sizes, [str(s) for s in sizes])
        ax2.set_yscale("log")
        ax2.set_xlabel("guest memory (MiB)")
        ax2.set_ylabel("× shorter than the naive pause (log)")
        ax2.set_title("Pause ratio naive ÷ forkvm (same source, same run)", fontsize=10)
        ax2.grid(alpha=0.3, which="both")
        ax2.legend(fontsize=7)
        fig.suptitle(title_base + f" — N={args.runs} branches per mode and size", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "pause_vs_size.png", dpi=100)
        plt.close(fig)

    # 2. pause vs dirty
    dirties = sorted({r["dirty_mib"] for r in rows if r["experiment"] == "dirty"})
    if dirties:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 7.5),
                                      gridspec_kw={"width_ratios": [1.5, 1]})
        plot_lines(ax, rows, "dirty", "dirty_mib", dirties, modes[:-1])
        ax.axhline(LIVE_TARGET_MS, color="tab:blue", ls="--", lw=0.8, alpha=0.6)
        ax.set_yscale("log")
        ax.set_xticks(dirties, [str(x) for x in dirties])
        ax.set_xlabel(f"memory dirtied and held resident before the branch (MiB), "
                      f"{args.dirty_memory} MiB guest")
        ax.set_ylabel("source paused (ms, log scale)")
        ax.set_title("Pause vs memory dirtied before the branch", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2)
        # where the live pause goes: stacked STOP->completed vs completed->RESUME (reference)
        w = 0.35
        for j, where in enumerate(("disk", "shm")):
            a_, b_ = [], []
            for x in dirties:
                rs = sel(rows, "dirty", f"qemu_live_{where}", dirty=x)
                a_.append(pstat(rs, "stop_to_completed_ms")["p50"])
                b_.append(pstat(rs, "completed_to_resume_ms")["p50"])
            idx = [i + (j - 0.5) * w for i in range(len(dirties))]
            ax2.bar(idx, a_, w, color=MODE_STYLE[f"qemu_live_{where}"][0],
                    label=f"file on {'disk' if where == 'disk' else '/dev/shm'}: STOP → "
                          "`completed` visible")
            ax2.bar(idx, b_, w, bottom=a_, color="lightgray", edgecolor="gray",
                    label="`completed` → RESUME (cont)" if j == 0 else None)
        live_p50 = [pstat(sel(rows, "dirty", "live", dirty=x))["p50"] for x in dirties]
        ax2.plot(range(len(dirties)), live_p50, "o-", color="tab:blue",
                 label="forkvm live pause p50")
        ax2.set_xticks(range(len(dirties)), [str(x) for x in dirties])
        ax2.set_xlabel("dirtied MiB")
        ax2.set_ylabel("ms")
        ax2.set_title("Where a live pause goes (bench's own live save, p50)", fontsize=10)
        ax2.grid(axis="y", alpha=0.3)
        ax2.legend(fontsize=7)
        fig.suptitle(title_base + f" — {args.dirty_runs} branches per mode and D", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "pause_vs_dirty.png", dpi=100)
        plt.close(fig)

    # 3. consecutive
    cons = [r for r in rows if r["experiment"] == "consecutive" and r["mode"] in ("live", "full")]
    if cons:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
        for mode in ("live", "full"):
            rs = sorted(sel(rows, "consecutive", mode), key=lambda r: r["run"])
            color, marker, _ = MODE_STYLE[mode]
            ax.plot([r["run"] for r in rs], [r["pause_ms"] for r in rs], marker=marker,
                    color=color, label=f"{mode}: pause")
            ax2.plot([r["run"] for r in rs], [r["branch_total_ms"] / 1000 for r in rs],
                     marker=marker, color=color, label=f"{mode}: branch total_ms")
        ax.set_yscale("log")
        ax.axhline(LIVE_TARGET_MS, color="tab:blue", ls="--", lw=0.8, alpha=0.6)
        ax.set_xlabel("branch # (back to back, same source)")
        ax.set_xticks(range(1, args.consecutive + 1))
        ax2.set_xticks(range(1, args.consecutive + 1))
        ax.set_ylabel("source paused (ms, log)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        ax.set_title(f"{args.consecutive} consecutive branches of one {args.consecutive_memory} "
                     "MiB source (counter loop running)", fontsize=10)
        ax2.set_xlabel("branch #")
        ax2.set_ylabel("branch total (s)")
        ax2.set_ylim(bottom=0)
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8)
        txt = "; ".join(f"{ch['mode']}: counter {ch['values'][1]}→{ch['values'][2]}→"
                        f"{ch['values'][3]} ({'advancing' if ch['ok'] else 'STUCK'})"
                        for ch in ctx.get("counter_checks", []))
        ax2.set_title("Time per branch (server total_ms)\n" + txt, fontsize=8)
        fig.suptitle(title_base, fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "consecutive.png", dpi=100)
        plt.close(fig)


def stats_table(rows, exp, xkey, xs, modes, L, xname):
    L += [f"| {xname} | mode | n | min | p50 | p90 | max | ÷ naive p50 → × shorter | "
          "÷ naive (cap lifted) p50 → × shorter |",
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in xs:
        cell = [r for r in rows if r["experiment"] == exp and r[xkey] == x]
        nv = pstat([r for r in cell if r["mode"] == "naive"])["p50"]
        nl = pstat([r for r in cell if r["mode"] == "naive_nolimit"])["p50"]
        for mode in modes:
            rs = [r for r in cell if r["mode"] == mode]
            if not rs:
                continue
            s = pstat(rs)
            b = "**" if mode in ("live", "full") else ""
            L.append(f"| {x} | {b}{mode}{b} | {s['n']} | {fmt_ms(s['min'])} | "
                     f"{b}{fmt_ms(s['p50'])}{b} | {fmt_ms(s['p90'])} | {fmt_ms(s['max'])} | "
                     f"{fmt(ratio(nv, s['p50']), 1)}× | {fmt(ratio(nl, s['p50']), 1)}× |")


def stages_table(rows, exp, xkey, xs, L, xname):
    L += [f"| {xname} | mode | save_state | freeze_disk | copy_memory | publish | "
          "snapshot total | QEMU downtime | RAM sent (MiB) | snapshot on disk (MiB) | "
          "RAM file before→after (MiB, p50) |",
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in xs:
        for mode in ("live", "full"):
            rs = [r for r in rows if r["experiment"] == exp and r[xkey] == x
                  and r["mode"] == mode]
            if not rs:
                continue
            p = lambda k: pstat(rs, k)["p50"]  # noqa: E731
            L.append(f"| {x} | {mode} | {fmt_ms(p('save_state_ms'))} | "
                     f"{fmt_ms(p('freeze_disk_ms'))} | {fmt_ms(p('copy_memory_ms'))} | "
                     f"{fmt_ms(p('publish_ms'))} | {fmt_ms(p('snapshot_total_ms'))} | "
                     f"{fmt_ms(p('qemu_downtime_ms'))} | {fmt(p('ram_transferred_mib'))} | "
                     f"{fmt(p('snapshot_alloc_mib'))} | {fmt(p('ram_file_before_mib'))}→"
                     f"{fmt(p('ram_file_after_mib'))} |")


def refs_table(rows, exp, xkey, xs, L, xname):
    L += [f"| {xname} | reference | n | pause p50 | STOP→`completed` seen p50 | "
          "`completed`→RESUME p50 | QEMU downtime p50 | save total p50 | file allocated (MiB) |",
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in xs:
        for where in ("disk", "shm"):
            rs = [r for r in rows if r["experiment"] == exp and r[xkey] == x
                  and r["mode"] == f"qemu_live_{where}"]
            if not rs:
                continue
            p = lambda k: pstat(rs, k)["p50"]  # noqa: E731
            L.append(f"| {x} | file on {'store disk' if where == 'disk' else '/dev/shm'} | "
                     f"{len(rs)} | {fmt_ms(p('pause_ms'))} | {fmt_ms(p('stop_to_completed_ms'))} | "
                     f"{fmt_ms(p('completed_to_resume_ms'))} | {fmt_ms(p('qemu_downtime_ms'))} | "
                     f"{fmt_ms(p('wall_ms'))} | {fmt(p('state_file_mib'))} |")


def write_results(path: Path, rows, ctx, args) -> None:
    info, machine = ctx["info"], ctx["machine"]
    accel, qemu = info.get("accel", {}), info.get("qemu", {})
    sizes = sorted({r["size_mib"] for r in rows if r["experiment"] == "size"})
    dirties = sorted({r["dirty_mib"] for r in rows if r["experiment"] == "dirty"})
    kf = key_figures(rows, sizes)
    qd = ctx.get("qemu_defaults") or {}
    L = []
    if args.smoke:
        L += [f"> **SMOKE RUN** (N={args.runs} < {MIN_RUNS}): not a valid result; re-run with "
              "`bash bench/branch/run.sh` for real figures.", ""]
    if ctx.get("error"):
        L += [f"> **INCOMPLETE RUN**: {ctx['error']}", ""]
    naive_sizes = {s: len(sel(rows, "size", "naive", s)) for s in sizes}
    L += [
        "# Branch benchmark: how long a branch pauses the source",
        "",
        f"- Date: {ctx['started'].strftime('%Y-%m-%d %H:%M:%S %Z')} (run took "
        f"{ctx['elapsed'] / 60:.1f} min)",
        f"- forkvm: {info.get('version', '?')}, git {ctx.get('revision')} (when the bench "
        "started, right after the build)",
        f"- Machine: {machine['cpu_model']} ({machine['cpu_detail']}), {machine['cores']} cores, "
        f"{machine['mem_gib']:.1f} GiB RAM; kernel Linux {machine['kernel']}; load average at "
        "start " + " / ".join(f"{x:.2f}" for x in machine["loadavg"]),
        f"- Accelerator: **{accel.get('kind', '?')}** — {accel.get('reason', '')}",
        f"- QEMU: {qemu.get('version', '?')} ({qemu.get('path', '?')}); its default migration "
        f"parameters (read from a freshly booted source): max-bandwidth "
        f"{(qd.get('max-bandwidth') or 0) / 2**20:.0f} MiB/s, downtime-limit "
        f"{qd.get('downtime-limit')} ms",
        "- Guests: 1 vCPU, image `default`, cold-booted (`use_template: false`), "
        f"{args.settle:.0f} s of rest before measuring",
        f"- N per cell: **size** — {args.runs} branches per mode (live, full) per size; naive "
        + ", ".join(f"{s} MiB: {n}" for s, n in naive_sizes.items())
        + f" per variant; {args.ref_runs} per live reference; {args.floor_runs} stop+cont. "
        f"**dirty** ({args.dirty_memory} MiB guest) — {args.dirty_runs} branches per mode per D, "
        f"{args.dirty_naive_runs} naive per variant, {args.dirty_ref_runs} per live reference. "
        f"**consecutive** — {args.consecutive} live then {args.consecutive} full branches of one "
        f"{args.consecutive_memory} MiB source" + (" (SMOKE)" if args.smoke else ""),
    ]
    timed = [r for r in rows if r.get("other_cpu_cores") is not None]
    oc = fb.summarize(r["other_cpu_cores"] for r in timed)
    noisy = sum(r["other_cpu_cores"] > NOISY_CORES for r in timed)
    L += [f"- Host noise — cores kept busy by other processes during each measurement "
          f"(`other_cpu_cores`): p50 {oc['p50']:.2f}, p90 {oc['p90']:.2f}, max {oc['max']:.2f}; "
          f"{noisy} of {len(timed)} measurements above {NOISY_CORES} cores"
          + (f"; at start the bench waited for a quiet host and measured "
             f"{ctx['quiet']:.2f} cores" if ctx.get("quiet") is not None else "")]
    if ctx.get("others"):
        L += [f"- Other QEMU processes (not this bench's) were running during "
              f"{ctx['busy_runs']} measurements: " + "; ".join(
                  f"pid {p}" for p in list(ctx["others"])[:8])]
    L += ["- `diff` mode is **not measured** (not implemented); asked once on a running source, "
          f"the daemon answered {ctx.get('diff_probe') or '(not asked)'}. Every diff target "
          "below is N/A."]

    # ---- targets
    live_ok = all(v < LIVE_TARGET_MS for v in kf["live"].values()) if sizes else None
    worst = max(kf["live"].items(), key=lambda kv: kv[1]) if sizes else (None, math.nan)
    L += ["", "## Targets", "",
          "| target | figure | verdict |", "|---|---|---|"]
    L.append(f"| live pause p50 < {LIVE_TARGET_MS:.0f} ms at every memory size | "
             + ", ".join(f"{s} MiB: {fmt_ms(v)} ms" for s, v in kf["live"].items())
             + f" | **{'PASS' if live_ok else 'MISS'}** |")
    if 512 in kf["live"] and 4096 in kf["live"]:
        sc = ratio(kf["live"][4096], kf["live"][512])
        sc_ok = sc <= LIVE_SCALE_TARGET
        L.append(f"| live pause at 4096 MiB within {LIVE_SCALE_TARGET}× of 512 MiB | "
                 f"{fmt_ms(kf['live'][4096])} / {fmt_ms(kf['live'][512])} ms = {sc:.2f}× | "
                 f"**{'PASS' if sc_ok else 'MISS'}** |")
    else:
        sc, sc_ok = math.nan, None
        L.append("| live pause at 4096 MiB within 1.5× of 512 MiB | sizes not measured | N/A |")
    L.append("| diff pause within 3× of live | diff is not implemented (400) | **N/A** |")
    t4 = {}
    if 4096 in kf["live"]:
        for mode in ("live", "full"):
            r1 = ratio(kf["naive"][4096], kf[mode][4096])
            r2 = ratio(kf["naive_nolimit"][4096], kf[mode][4096])
            t4[mode] = (r1, r2)
            L.append(f"| {mode} pause ≥ {NAIVE_TARGET:.0f}× shorter than naive at 4096 MiB | "
                     f"naive (QEMU defaults) {fmt_ms(kf['naive'][4096])} ms ÷ {mode} "
                     f"{fmt_ms(kf[mode][4096])} ms = **{r1:.1f}×**; naive with the bandwidth "
                     f"cap lifted {fmt_ms(kf['naive_nolimit'][4096])} ms ÷ {mode} = "
                     f"**{r2:.1f}×** | **{'PASS' if r1 >= NAIVE_TARGET else 'MISS'}** vs "
                     f"defaults; **{'PASS' if r2 >= NAIVE_TARGET else 'MISS'}** vs cap lifted |")
        L.append("| diff pause ≥ 50× shorter than naive at 4096 MiB | diff is not implemented | "
                 "**N/A** |")
    else:
        L.append("| every mode ≥ 50× shorter than naive at 4096 MiB | 4096 MiB not measured | "
                 "N/A |")

    # ---- reasons
    L += ["", "### Why (read from this run's own measurements)", ""]
    L += reasons(rows, sizes, dirties, kf, ctx, args, live_ok, sc, sc_ok, t4)

    # ---- tables
    L += ["", "## 1. Pause vs guest memory size (idle guest)", "",
          "All pauses in ms, STOP→RESUME from QEMU's event timestamps (the daemon's `pause_ms` "
          "for live/full; the bench's own QMP events for the others — `pause_source` in the "
          "CSV). \"× shorter\" = the naive p50 of the same size, same source, ÷ this row's "
          "p50.", ""]
    stats_table(rows, "size", "size_mib", sizes, MODE_ORDER, L, "MiB")
    L += ["", "Stage p50s of the forkvm branches (ms; server `timings`, plus QEMU's own "
          "`query-migrate` figures read right after each branch):", ""]
    stages_table(rows, "size", "size_mib", sizes, L, "MiB")
    first_full = [r for r in rows if r["experiment"] == "size" and r["mode"] == "full"
                  and r["run"] == 1]
    if first_full:
        L += ["", "Full mode, run 1 (before any live branch of that source) vs runs 2…N (after): "
              + "; ".join(
                  f"{r['size_mib']} MiB: {fmt_ms(r['pause_ms'])} ms with the RAM file at "
                  f"{fmt(r['ram_file_before_mib'])} MiB allocated vs p50 "
                  f"{fmt_ms(pstat([x for x in sel(rows, 'size', 'full', r['size_mib']) if x['run'] > 1])['p50'])}"
                  f" ms at {fmt(pstat([x for x in sel(rows, 'size', 'full', r['size_mib']) if x['run'] > 1], 'ram_file_before_mib')['p50'])} MiB"
                  for r in first_full) + "."]
    L += ["", "Live references (the bench runs the same mapped-ram live save itself over QMP and "
          "`cont`s at once — no disk freeze, no publish — once with the file in the daemon "
          "home, on the store's filesystem, and once on /dev/shm):", ""]
    refs_table(rows, "size", "size_mib", sizes, L, "MiB")

    if dirties:
        L += ["", f"## 2. Pause vs memory dirtied before the branch ({args.dirty_memory} MiB "
              "guest)", "",
              "A fresh source per D. A guest process fills D MiB (a random 1 MiB block "
              "repeated, so no page is zero) and sleeps holding it; then the branches.", ""]
        stats_table(rows, "dirty", "dirty_mib", dirties, MODE_ORDER, L, "dirty MiB")
        L += ["", "Stage p50s (ms):", ""]
        stages_table(rows, "dirty", "dirty_mib", dirties, L, "dirty MiB")
        L += ["", "Live references:", ""]
        refs_table(rows, "dirty", "dirty_mib", dirties, L, "dirty MiB")

    checks = ctx.get("counter_checks") or []
    cons = [r for r in rows if r["experiment"] == "consecutive" and r["mode"] in ("live", "full")]
    if cons:
        L += ["", f"## 3. {args.consecutive} consecutive branches of one "
              f"{args.consecutive_memory} MiB source (counter loop running)", "",
              "| mode | # | pause | save_state | copy_memory | publish | branch total_ms | "
              "client wall | QEMU downtime |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for mode in ("live", "full"):
            for r in sorted(sel(rows, "consecutive", mode), key=lambda r: r["run"]):
                L.append(f"| {mode} | {r['run']} | {fmt_ms(r['pause_ms'])} | "
                         f"{fmt_ms(r['save_state_ms'])} | {fmt_ms(r['copy_memory_ms'])} | "
                         f"{fmt_ms(r['publish_ms'])} | {fmt_ms(r['branch_total_ms'])} | "
                         f"{fmt_ms(r['wall_ms'])} | {fmt_ms(r['qemu_downtime_ms'])} |")
        L += ["", "| mode | pause p50 | p90 | min | max | total_ms p50 | counter before → +"
              f"{args.counter_gap:.0f} s | right after → +{args.counter_gap:.0f} s | rate before "
              "/ during / after (per s) | disk chain layers before → after | verdict |",
              "|---|---:|---:|---:|---:|---:|---|---|---|---|---|"]
        for ch in checks:
            rs = sel(rows, "consecutive", ch["mode"])
            s, t = pstat(rs), pstat(rs, "branch_total_ms")
            v = ch["values"]
            L.append(f"| {ch['mode']} | {fmt_ms(s['p50'])} | {fmt_ms(s['p90'])} | "
                     f"{fmt_ms(s['min'])} | {fmt_ms(s['max'])} | {fmt_ms(t['p50'])} | "
                     f"{v[0]} → {v[1]} | {v[2]} → {v[3]} | {ch['rate_before']:.1f} / "
                     f"{ch['during_rate']:.1f} / {ch['rate_after']:.1f} | "
                     f"{ch['depth_before']} → {ch['depth_after']} | "
                     f"**{'source kept running, counter advancing' if ch['ok'] else 'STUCK'}** |")
        L += ["", "The counter is read through the agent (`cat /tmp/counter`) before the block, "
              f"{args.counter_gap:.0f} s later, right after the last branch, and "
              f"{args.counter_gap:.0f} s after that; \"during\" is the rate between the second "
              "and third readings, i.e. over the whole block of branches. The loop sleeps 50 ms "
              "per step, so ~20/s is the most it can do; under TCG fork+exec of `sleep` and "
              "`mv` slows it. The snapshots of a block are kept until the block ends, then "
              "deleted (force)."]
    if ctx.get("notes"):
        L += ["", "Notes:"] + [f"- {n}" for n in ctx["notes"]]
    L += ["", "Raw data: `branch.csv` (one row per measurement; `counter_*` rows are the counter "
          "readings). Plots: `pause_vs_size.png`, `pause_vs_dirty.png`, `consecutive.png`.", ""]
    L += ["## Method", ""] + method_text(args)
    path.write_text("\n".join(L) + "\n")


def reasons(rows, sizes, dirties, kf, ctx, args, live_ok, sc, sc_ok, t4) -> list[str]:
    out = []
    ref = lambda where, s, k="pause_ms": pstat(sel(rows, "size", f"qemu_live_{where}", s), k)["p50"]  # noqa: E731
    floor = pstat([r for r in rows if r["mode"] == "stop_cont"])["p50"]
    if sizes:
        fr = [r["stop_to_completed_ms"] / r["pause_ms"] for r in rows
              if r["experiment"] == "size" and r["mode"] == "qemu_live_disk"
              and r.get("stop_to_completed_ms") is not None and r["pause_ms"]]
        frac_disk = fb.percentile(fr, 50) if fr else math.nan
        dt_ = pstat([r for r in rows if r["experiment"] == "size" and r["mode"] == "live"],
                    "qemu_downtime_ms")
        out.append(
            f"- **Live pause.** QEMU's own downtime for the final stop-and-copy (its "
            f"`query-migrate` `downtime`, read after every live branch) is p50 "
            f"{fmt_ms(dt_['p50'])} ms (max {fmt_ms(dt_['max'])}), and a bare QMP stop + cont "
            f"pauses the guest {fmt_ms(floor)} ms, yet the source stays stopped "
            + ", ".join(f"{fmt_ms(kf['live'][s])} ms at {s} MiB" for s in sizes)
            + ". The bench's own live save (same capabilities and parameters, `cont` as soon as "
            "`query-migrate` says `completed`) shows where it goes: with the file in the daemon "
            "home (the store's filesystem) the pause is "
            + ", ".join(f"{fmt_ms(ref('disk', s))}" for s in sizes)
            + f" ms, {frac_disk:.0%} of it (p50 over all sizes) between STOP and the moment "
            "`query-migrate` reports `completed` ("
            + ", ".join(f"{fmt_ms(ref('disk', s, 'stop_to_completed_ms'))}" for s in sizes)
            + " ms); the same save with the file on /dev/shm pauses "
            + ", ".join(f"{fmt_ms(ref('shm', s))}" for s in sizes)
            + " ms. So the time is spent after QEMU has copied the last pages, in finishing the "
            "file on the disk filesystem (it grows with the data written, see section 2, and "
            "vanishes on tmpfs: consistent with the file being synced or its dirty page cache "
            "written back before QEMU reports completion), while the guest stays stopped. "
            "The daemon writes the live snapshot's mapped-ram `device.state` straight into "
            "its store on disk. Writing it to tmpfs (and moving it to the store after `cont`, "
            "or letting the page cache be written back during the precopy) would bring the "
            "pause to about the /dev/shm figure; "
            + ("that would meet the 5 ms target here." if all(
                ref("shm", s) < LIVE_TARGET_MS for s in sizes) else
               "under TCG that is still not under 5 ms everywhere."))
    if sc_ok is not None:
        out.append(
            f"- **Live scaling 512 → 4096 MiB: {sc:.2f}×.** Even an idle guest gives the "
            "live save more to write at 4096 MiB (QEMU sent "
            f"{fmt(pstat(sel(rows, 'size', 'live', 512), 'ram_transferred_mib')['p50'])} MiB at "
            f"512 vs {fmt(pstat(sel(rows, 'size', 'live', 4096), 'ram_transferred_mib')['p50'])} "
            "MiB at 4096, p50), and the pause tracks what has to be finished on disk, as above. "
            + ("" if sc_ok else "The target assumes a pause independent of memory size; here it "
               "is not, because of the disk-side finish."))
    if t4:
        r = t4
        out.append(
            f"- **× shorter than naive at 4096 MiB.** live {r['live'][0]:.1f}× / "
            f"{r['live'][1]:.1f}×, full {r['full'][0]:.1f}× / {r['full'][1]:.1f}× (vs naive with "
            "QEMU's defaults / with the bandwidth cap lifted). The naive save of an idle guest "
            "is cheap: QEMU sends a zero page as a few bytes, so the state file is only the "
            f"touched memory ({fmt(pstat(sel(rows, 'size', 'naive', 4096), 'state_file_mib')['p50'])}"
            " MiB at 4096), though QEMU still reads all of RAM to find the zero pages; QEMU's "
            "default bandwidth cap of "
            f"{(ctx.get('qemu_defaults') or {}).get('max-bandwidth', 0) / 2**20:.0f} MiB/s "
            "throttles the rest (with the cap lifted the naive pause is "
            f"{fmt_ms(kf['naive_nolimit'][4096])} ms). A 50× margin over a pause of that size "
            f"needs a branch pause of {fmt_ms(kf['naive'][4096] / NAIVE_TARGET)} ms (defaults) or "
            f"{fmt_ms(kf['naive_nolimit'][4096] / NAIVE_TARGET)} ms (cap lifted). Live mode is "
            "held back by the disk-side finish described above. Full mode copies the RAM file "
            "inside the pause (`copy_memory`), and after the first live branch of a source "
            "that file is fully allocated (see below), so it then reads and zero-checks the "
            "whole guest RAM size while the guest is stopped.")
    alloc_rows = [r for r in rows if r["experiment"] == "size" and r["mode"] == "live"
                  and r["run"] == 1]
    if alloc_rows:
        out.append(
            "- **A live branch makes the source's whole RAM file resident.** The source's "
            "`share=on` RAM file in /dev/shm went from "
            + ", ".join(f"{fmt(r['ram_file_before_mib'])}→{fmt(r['ram_file_after_mib'])} MiB "
                        f"({r['size_mib']} MiB guest)" for r in alloc_rows)
            + " allocated across the first live branch: the precopy reads every guest page "
            "(zero-page detection), and a read fault on a shared tmpfs mapping allocates the "
            "page. Each branched source then costs its full memory size in host RAM, and "
            "every later `full` branch sparse-copies (reads and zero-checks) the whole file "
            "inside its pause.")
    out += full_stalls(rows)
    if dirties:
        hi = max(dirties)
        lv = pstat(sel(rows, "dirty", "live", dirty=hi))["p50"]
        fu = pstat(sel(rows, "dirty", "full", dirty=hi))["p50"]
        nv = pstat(sel(rows, "dirty", "naive", dirty=hi))["p50"]
        nl = pstat(sel(rows, "dirty", "naive_nolimit", dirty=hi))["p50"]
        sh = pstat(sel(rows, "dirty", "qemu_live_shm", dirty=hi))["p50"]
        out.append(
            f"- **With {hi} MiB dirtied** ({args.dirty_memory} MiB guest): live "
            f"{fmt_ms(lv)} ms, full {fmt_ms(fu)} ms, naive {fmt_ms(nv)} ms (cap lifted "
            f"{fmt_ms(nl)} ms): live is {ratio(nv, lv):.1f}× / {ratio(nl, lv):.1f}× shorter "
            f"than naive. The same live save with its file on /dev/shm pauses {fmt_ms(sh)} ms.")
    return out


def full_stalls(rows, factor: float = 3.0) -> list[str]:
    """Full-mode branches of the size experiment whose `copy_memory` took more
    than `factor` × the p50 of their size: stalls while writing memory.img."""
    hits = []
    for size in sorted({r["size_mib"] for r in rows if r["experiment"] == "size"}):
        rs = sel(rows, "size", "full", size)
        med = pstat(rs, "copy_memory_ms")["p50"]
        hits += [(r, med) for r in rs if med == med and r["copy_memory_ms"] > factor * med]
    if not hits:
        return []
    return [
        "- **Full-mode stalls.** "
        + "; ".join(f"{r['size_mib']} MiB run {r['run']}: pause {fmt_ms(r['pause_ms'])} ms, of "
                    f"which `copy_memory` {fmt_ms(r['copy_memory_ms'])} ms (p50 of that size "
                    f"{fmt_ms(med)} ms; RAM file {fmt(r['ram_file_before_mib'])} MiB allocated)"
                    for r, med in hits)
        + ". Full mode writes `memory.img` into the store on disk while the source is "
        "stopped, so a write that waits on the page cache's writeback (this host's disk was "
        "shared with other work) lands in the pause; these runs are in the p90/max columns."]


def method_text(args) -> list[str]:
    return [
        "One private daemon (`forkvm serve`, release build) in a temp home under /tmp whose "
        "`guest` and `images` are symlinks to the installed artefacts; everything in one run. "
        "Percentiles use linear interpolation between closest ranks (numpy's default). No run "
        "is discarded.",
        "",
        "**forkvm branches**: `POST /v1/sandboxes/{id}/branch {\"mode\": \"live\"|\"full\", "
        "\"count\": 0}`, one at a time; `pause_ms` is the daemon's, from QEMU's STOP and RESUME "
        "event timestamps (how long the source's vCPUs were stopped). The other columns are "
        "the snapshot's server `timings` and the response's `snapshot_ms`/`total_ms`; "
        "`wall_ms` is the client's time until the 201. Right after each branch the bench reads "
        "`query-migrate` on the source's QMP socket (free again once the call returned) for "
        "QEMU's own `downtime`, RAM sent and dirty-sync count, and stats the source's RAM "
        "file in /dev/shm before and after. In the size and dirty experiments each snapshot "
        "is deleted (`DELETE /v1/snapshots/{id}?force=true`) right after; modes alternate "
        "full, live, full, live, … on one source.",
        "",
        "**naive** (the baseline): over the source's QMP socket, every migration capability "
        "turned off (forkvm leaves `x-ignore-shared` or `mapped-ram` on), `max-bandwidth` and "
        "`downtime-limit` set to QEMU's defaults (read from the freshly booted source, before "
        "any branch), then `stop`, `migrate {\"uri\": \"file:<daemon home>/naive-state.bin\"}` "
        "(all RAM and device state, to the same filesystem as the store), `query-migrate` "
        "polled every 1 ms until `completed`, `cont`. The pause is STOP→RESUME from QEMU's "
        "event timestamps, exactly as the daemon measures (the client clock from sending "
        "`stop` to the `cont` reply is in `clock_ms`; it is used only if an event is missing, "
        "and `pause_source` says so). **naive_nolimit** is the same with `max-bandwidth` "
        "lifted to 64 GiB/s, as forkvm's live mode sets it: QEMU's default cap (meant for "
        "networks) also throttles a save to a local file, so it is the stronger baseline. "
        "Capabilities and parameters are put back afterwards and the state file removed. "
        "The naive runs come after the branches of a source, alternating the two variants.",
        "",
        "**References** (not forkvm): `stop_cont` is QMP `stop` then `cont` with nothing in "
        "between (the floor). `qemu_live_disk`/`qemu_live_shm` run the live save forkvm's "
        "live mode runs (capability `mapped-ram` on and the others off, `downtime-limit` 5 ms, "
        "`max-bandwidth` 64 GiB/s, `migrate` to a file, `query-migrate` polled every 1 ms) "
        "from the bench, with the file in the daemon home (same filesystem as the store) or "
        "on /dev/shm, then `cont` at once (no disk freeze, no hashing). The pause is split at "
        "the moment the poll saw `completed` (QEMU's event timestamps are CLOCK_REALTIME, as "
        "is the bench's `time.time()`).",
        "",
        f"**size**: for each size a source is cold-booted (`POST /v1/sandboxes {{\"memory_mib\": "
        f"M, \"cpus\": 1, \"use_template\": false}}`), rests {args.settle:.0f} s, then: "
        f"{args.floor_runs} × stop_cont; {args.runs} × (full, live); {args.ref_runs} × "
        f"(qemu_live_disk, qemu_live_shm); then the naive pairs; then the source is deleted.",
        "",
        f"**dirty**: for each D a fresh {args.dirty_memory} MiB source; a guest "
        "`python3 -c` started with `setsid` in the background allocates `bytearray("
        "os.urandom(1 MiB)) * D` and, once filled, reports through a file and sleeps; the "
        "bench checks its VmRSS, waits "
        f"{args.settle:.0f} s, then {args.dirty_runs} × (full, live), {args.dirty_ref_runs} × "
        f"(qemu_live_disk, qemu_live_shm), {args.dirty_naive_runs} × (naive, naive_nolimit); "
        "the source is deleted afterwards.",
        "",
        f"**consecutive**: one {args.consecutive_memory} MiB source runs "
        f"`{COUNTER_LOOP}` (started with setsid in the background). Counter read, "
        f"{args.counter_gap:.0f} s, read; {args.consecutive} live branches back to back (each "
        "call starts as soon as the previous one has returned; the snapshots are kept until "
        f"the block ends); read at once, {args.counter_gap:.0f} s, read; all snapshots deleted; "
        "the same with full. The source must keep counting.",
        "",
        "**Host noise**: around every measurement, the CPU time of everything on the host "
        "except this bench and the daemon with their descendants (guests included) is "
        "summed from /proc, divided by the wall time (`other_cpu_cores` in the CSV).",
    ]


def print_summary(rows) -> None:
    print("\nSummary: pause (ms)")
    print(f"{'experiment':<12}{'x':>6} {'mode':<16}{'n':>4}{'min':>10}{'p50':>10}{'p90':>10}"
          f"{'max':>10}{'naive/p50':>11}")
    keys = sorted({(r["experiment"], r["size_mib"] if r["experiment"] != "dirty"
                    else r["dirty_mib"]) for r in rows if r["experiment"] in ("size", "dirty")},
                  key=lambda k: (k[0] != "size", k[1]))
    for exp, x in keys:
        xkey = "size_mib" if exp == "size" else "dirty_mib"
        cell = [r for r in rows if r["experiment"] == exp and r[xkey] == x]
        nv = pstat([r for r in cell if r["mode"] == "naive"])["p50"]
        for mode in MODE_ORDER:
            rs = [r for r in cell if r["mode"] == mode]
            if rs:
                s = pstat(rs)
                print(f"{exp:<12}{x:>6} {mode:<16}{s['n']:>4}{fmt_ms(s['min']):>10}"
                      f"{fmt_ms(s['p50']):>10}{fmt_ms(s['p90']):>10}{fmt_ms(s['max']):>10}"
                      f"{fmt(ratio(nv, s['p50']), 1):>10}×")
    for mode in ("live", "full"):
        rs = sel(rows, "consecutive", mode)
        if rs:
            s = pstat(rs)
            print(f"{'consecutive':<12}{rs[0]['size_mib']:>6} {mode:<16}{s['n']:>4}"
                  f"{fmt_ms(s['min']):>10}{fmt_ms(s['p50']):>10}{fmt_ms(s['p90']):>10}"
                  f"{fmt_ms(s['max']):>10}")


# --------------------------------------------------------------------------


def parse_list(s: str, what: str, ap) -> list[int]:
    try:
        v = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        ap.error(f"{what} takes a comma-separated list of integers")
    if any(x < 0 for x in v):
        ap.error(f"{what} takes non-negative integers")
    return v


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
    ap.add_argument("--ref-runs", type=int, default=3, help="live reference runs per size")
    ap.add_argument("--floor-runs", type=int, default=3, help="stop+cont runs per size")
    ap.add_argument("--settle", type=float, default=3.0, metavar="SECONDS",
                    help="rest after each cold boot (and after filling memory)")
    ap.add_argument("--skip", default="", help="comma-separated experiments to skip: "
                    "size,dirty,consecutive (for debugging; RESULTS.md says so)")
    ap.add_argument("--out", default=str(HERE / "results"), help="results directory")
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "forkvm"))
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="before starting, wait up to this long for the host to be quiet "
                         "(other processes using < 0.2 cores over 5 s); 0: only warn")
    args = ap.parse_args()
    args.sizes = parse_list(args.sizes, "--sizes", ap)
    args.dirty = parse_list(args.dirty, "--dirty", ap)
    if args.naive_runs is None:
        args.naive_runs = args.runs
    if min(args.runs, args.dirty_runs, args.naive_runs, args.ref_runs, args.floor_runs,
           args.dirty_naive_runs, args.dirty_ref_runs) < 1 or args.consecutive < 0:
        ap.error("run counts must be >= 1 (--consecutive >= 0)")
    if args.runs < MIN_RUNS and not args.smoke:
        ap.error(f"--runs {args.runs} is below the minimum of {MIN_RUNS} for a valid result; "
                 "add --smoke for a quick smoke test")
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
    revision = fb.git_revision()  # now, right after run.sh built the binary
    quiet = fb.wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    ctx: dict = {"machine": fb.machine_info(), "started": started, "quiet": quiet,
                 "revision": revision}
    shm = tempfile.mkdtemp(prefix="fvb-branch-", dir="/dev/shm")
    home = None
    c = None
    rows: list[dict] = []
    try:
        with fb.Daemon(binary=args.binary) as d:
            home = d.home
            c = Ctx(d, shm, args)
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
            except (fb.BenchError, OSError) as e:
                ctx["error"] = str(e)
                print(f"bench_branch: error: {e}\n(writing what was measured so far)",
                      file=sys.stderr, flush=True)
            finally:
                for s in sorted(c.snaps):
                    try:
                        delete_snapshot(c, s)
                    except Exception as e:  # noqa: BLE001 - the daemon stop cleans up too
                        print(f"cleanup: DELETE snapshot {s}: {e}", flush=True)
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
            for p in (home, shm, str(fb.run_dir_for_home(home))):
                if os.path.exists(p):
                    print(f"cleanup: {p} still exists", flush=True)
    if c is None or "info" not in ctx:
        return 1
    ctx["elapsed"] = time.monotonic() - t_start
    ctx["others"], ctx["busy_runs"] = c.others, c.busy_runs
    ctx["qemu_defaults"] = c.qemu_defaults
    ctx["notes"] = c.notes + ([f"skipped experiments: {', '.join(sorted(skip))}"] if skip else [])
    ctx["diff_probe"] = c.diff_probe
    add_ratios(rows)
    write_csv(out / "branch.csv", rows)
    m = ctx["machine"]
    title = (f"forkvm branch bench — {ctx['info']['accel']['kind']}, {m['cpu_model']}, "
             f"{m['cores']} cores, {started:%Y-%m-%d}" + (" (SMOKE)" if args.smoke else ""))
    write_plots(out, rows, ctx, args, title)
    write_results(out / "RESULTS.md", rows, ctx, args)
    print_summary(rows)
    print(f"\nwrote {out / 'branch.csv'}, {out / 'RESULTS.md'}, {out / 'pause_vs_size.png'}, "
          f"{out / 'pause_vs_dirty.png'}, {out / 'consecutive.png'}  "
          f"({ctx['elapsed'] / 60:.1f} min)")
    return 1 if ctx.get("error") else 0


def probe_diff(c: Ctx, sid: str) -> None:
    """Ask a running source once for `"mode": "diff"` (not measured: it is not
    implemented) and record the answer for RESULTS.md. A 201 would create a
    snapshot, which is then deleted."""
    if c.diff_probe is not None:
        return
    try:
        r = c.d.api.request("POST", f"/v1/sandboxes/{sid}/branch", {"mode": "diff", "count": 0},
                            expect=(201,))
        c.snaps.add(r["snapshot"]["id"])
        delete_snapshot(c, r["snapshot"]["id"])
        c.diff_probe = "HTTP 201: diff was accepted (this bench does not measure it)"
    except fb.ApiError as e:
        c.diff_probe = f"HTTP {e.status}: {str(e).split('] ', 1)[-1]}"
    print(f"[diff probe] {c.diff_probe}", flush=True)


def _interrupt(signum, _frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    # Ctrl-C and SIGTERM unwind through the try/finally blocks, so every
    # sandbox, snapshot, QEMU process, RAM file and the temp home are cleaned up.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sys.exit(main())
    except fb.BenchError as e:
        print(f"bench_branch: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("bench_branch: interrupted", file=sys.stderr)
        sys.exit(130)
