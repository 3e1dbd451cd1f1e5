"""The branch benchmark's modes and how one pause is measured: the CSV
columns and mode names, the run context (`Ctx`: daemon, meter, rows), and
one measurement each of a forkvm branch (live, full, diff), the naive QEMU
baselines, QEMU's own live migration and a bare stop/cont.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import forkvm_bench as fb
import naive as nv
import report as rp


MIN_RUNS = 10
NOISY_CORES = 0.25          # a run during which other processes used more than this is flagged
LIVE_TARGET_MS = 5.0        # live pause p50 under this at every size
LIVE_SCALE_TARGET = 1.5     # live pause at 4096 MiB within this factor of 512 MiB
DIFF_LIVE_TARGET = 3.0      # diff pause (idle guest) within this factor of live, at every size
NAIVE_TARGET = 50.0         # every mode's pause at least this many times shorter than naive at 4096
CHAIN_TARGET = 1.2          # spawn from a depth-3 diff chain within this factor of the flat snapshot
CHAIN_TARGET_DEPTH = 3
LIVE_MAX_BANDWIDTH = 64 << 30   # what forkvm's live mode sets (migrate.rs set_live_parameters)
LIVE_DOWNTIME_LIMIT = 5

FIELDS = [
    "experiment", "mode", "source", "size_mib", "dirty_mib", "run",
    "pause_ms", "pause_source",
    # forkvm: the snapshot's server timings, then the branch response
    "save_state_ms", "freeze_disk_ms", "copy_memory_ms", "publish_ms", "snapshot_total_ms",
    "snapshot_ms", "spawn_ms", "branch_total_ms", "wall_ms",
    # QEMU's own account of the last migration (query-migrate right after; not for diff)
    "qemu_downtime_ms", "qemu_total_ms", "ram_transferred_mib", "dirty_sync_count",
    # bench-driven live save: STOP -> `completed` seen by polling, and -> RESUME
    "stop_to_completed_ms", "completed_to_resume_ms",
    # naive: client clock, migrate stage, parameters
    "clock_ms", "migrate_ms", "max_bandwidth",
    "snapshot", "snapshot_kind", "depth", "device_state_mib", "memory_diff_mib",
    "snapshot_alloc_mib", "state_file_mib",
    # booted source: its RAM file in /dev/shm; clone: the pages it wrote (private RAM)
    "ram_file_before_mib", "ram_file_after_mib", "clone_private_mib",
    "counter",
    # chain: spawn from a snapshot (server timings; wall_ms is the client's)
    "position", "spawn_total_ms", "prepare_ms", "qemu_start_ms", "restore_ms", "identity_ms",
    "from_pool",
    "naive_p50_ms", "x_shorter_than_naive", "naive_nolimit_p50_ms", "x_shorter_than_naive_nolimit",
    "other_cpu_cores", "jail", "segment", "uid", "note",
]

MODE_ORDER = ["live", "full", "diff", "naive", "naive_nolimit", "naive_clone",
              "naive_nolimit_clone", "qemu_live_disk", "qemu_live_shm", "stop_cont"]
BRANCH_MODES = ("live", "full", "diff")
CLONE_MODES = {"diff", "naive_clone", "naive_nolimit_clone"}
MODE_LABEL = {
    "live": "forkvm branch live (booted source)",
    "full": "forkvm branch full (booted source)",
    "diff": "forkvm branch diff (clone source)",
    "naive": "naive stop+save+cont (QEMU defaults)",
    "naive_nolimit": "naive, bandwidth cap lifted",
    "naive_clone": "naive on the clone (QEMU defaults)",
    "naive_nolimit_clone": "naive on the clone, cap lifted",
    "qemu_live_disk": "bench live save, file on disk (reference)",
    "qemu_live_shm": "bench live save, file on /dev/shm (reference)",
    "stop_cont": "QMP stop+cont, nothing in between (floor)",
}
MODE_STYLE = {
    "live": ("tab:blue", "o", "-"),
    "full": ("tab:orange", "s", "-"),
    "diff": ("tab:brown", "*", "-"),
    "naive": ("tab:red", "^", "-"),
    "naive_nolimit": ("tab:purple", "v", "--"),
    "naive_clone": ("lightcoral", "^", "-."),
    "naive_nolimit_clone": ("plum", "v", "-."),
    "qemu_live_disk": ("tab:cyan", "D", ":"),
    "qemu_live_shm": ("tab:green", "P", ":"),
    "stop_cont": ("tab:gray", "x", ":"),
}


def check_jail(c: "Ctx", sb: dict) -> int:
    """A jailed daemon's QEMU runs as a non-root uid, an unjailed one's as
    root; anything else fails the bench (a mislabelled run). Returns the uid."""
    uid = rp.check_side_uid(c.side, sb)
    c.uids.add(uid)
    return uid


def source_of(mode: str) -> str:
    return "clone" if mode in CLONE_MODES else "booted"


def naive_modes(mode: str) -> tuple[str, str]:
    """The naive baselines measured on the same source as `mode`."""
    if source_of(mode) == "clone":
        return "naive_clone", "naive_nolimit_clone"
    return "naive", "naive_nolimit"


ms_since = fb.ms_since


def mib(b) -> float | None:
    return None if b is None else b / 2**20


class Ctx:
    """What every measurement needs: the daemon, the snapshots alive, the
    scratch dirs and the rows."""

    def __init__(self, d: fb.Daemon, shm: str, args, side: str = rp.JAILED):
        self.d = d
        self.side = side                        # the daemon's jail setting
        self.uids: set[int] = set()             # QEMU uids seen (checked against side)
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
        self.diff_fallback: str | None = None   # what a diff of a booted source gave
        self.chain: dict = {}                   # the chain experiment's snapshots and build

    def elapsed(self) -> str:
        return f"t+{time.monotonic() - self.t_start:.0f}s"

    def qmp_path(self, sid: str) -> str:
        return os.path.join(self.d.sandbox_dir(sid), "qmp.sock")

    def shm_dir(self, sid: str) -> str:
        """A /dev/shm directory the source's QEMU can write to: its RAM scratch
        directory (`<run dir>/<id>.d`, in a jailed QEMU's view) when it
        exists, else the bench's own."""
        d = fb.run_dir_for_home(self.d.home) / f"{sid}.d"
        return str(d) if d.is_dir() else self.shm

    def ram_file(self, sid: str) -> Path:
        return fb.run_dir_for_home(self.d.home) / f"{sid}.mem"

    def ram_alloc_mib(self, sid: str) -> float:
        return fb.allocated_bytes(self.ram_file(sid)) / 2**20

    def clone_private_mib(self, sid: str) -> float | None:
        """MiB of a clone's guest RAM that are private to it (pages it wrote):
        the `Anonymous` part of its QEMU's mapping of its snapshot's memory
        (the chain's flattened `memory.head` for a clone of a diff snapshot,
        the base memory image for a clone of a shared one). This is what a
        diff branch reads while the clone is stopped."""
        sb = self.d.api.request("GET", f"/v1/sandboxes/{sid}")
        snap = sb.get("snapshot")
        if not snap or not sb.get("pid"):
            return None
        snaps = os.path.join(self.d.home, "snapshots")
        for path in (os.path.join(snaps, snap, "memory.head"),
                     os.path.join(snaps, self.base_of(snap), "memory.img")):
            m = fb.mapping_smaps(sb["pid"], path, sb["memory_mib"] << 20)
            if "Anonymous" in m:
                return m["Anonymous"] / 1024
        return None

    def base_of(self, snap_id: str) -> str:
        """The snapshot at the bottom of a diff chain (the one holding memory.img)."""
        for _ in range(100):
            s = self.d.api.request("GET", f"/v1/snapshots/{snap_id}")
            if s.get("kind") != "diff" or not s.get("parent"):
                return snap_id
            snap_id = s["parent"]
        raise fb.BenchError(f"the diff chain of {snap_id} does not end")

    def check_others(self) -> None:
        self.busy_runs += fb.warn_other_qemus(self.others,
                                              exclude_substrings=(self.d.home, self.shm))

    def measured(self, fn, *a, **kw) -> dict:
        """Run one measurement with the host-noise meter around it."""
        self.check_others()
        self.meter.start()
        row = fn(self, *a, **kw)
        row["other_cpu_cores"] = self.meter.other_cores()
        row["jail"] = self.side
        row.setdefault("source", source_of(row["mode"]))
        self.rows.append(row)
        if row["other_cpu_cores"] > NOISY_CORES:
            print(f"    (other processes kept {row['other_cpu_cores']:.2f} cores busy during "
                  "this run)", flush=True)
        return row


def delete_snapshot(c: Ctx, snap_id: str) -> None:
    """DELETE with force (which also removes the snapshots built on it and
    the sandboxes spawned from it); gone already (a parent's force took it)
    is fine."""
    c.d.api.request("DELETE", f"/v1/snapshots/{snap_id}?force=true", expect=(204, 404))
    c.snaps.discard(snap_id)


def delete_snapshots(c: Ctx) -> None:
    """Delete every snapshot `c` still holds; a failure is printed, not
    raised (this runs in cleanup, and the daemon's stop removes the rest)."""
    for snap in sorted(c.snaps):
        try:
            delete_snapshot(c, snap)
        except Exception as e:  # noqa: BLE001 - the daemon stop cleans up too
            print(f"cleanup: DELETE snapshot {snap}: {e}", flush=True)


def query_last_migration(c: Ctx, sid: str) -> dict:
    """QEMU's figures for the migration the daemon just ran (its QMP socket is
    free again once the branch call has returned)."""
    with fb.Qmp(c.qmp_path(sid), timeout=30) as q:
        return nv.migration_stats(q.execute("query-migrate"))


WANT_KIND = {"live": "live", "full": "shared", "diff": "diff"}


def branch(c: Ctx, sid: str, mode: str, exp: str, size: int, dirty, run: int, n: int,
           keep: bool = False, want_depth: int | None = None) -> dict:
    """One timed `POST /v1/sandboxes/{sid}/branch {"mode": mode, "count": 0}`.
    The snapshot must be of the kind the mode makes on this source (live:
    `live`; full: `shared`, the source being a booted one; diff: `diff`, the
    source being a clone, at depth `want_depth` if given). It is deleted right
    after unless `keep` (then it is in c.snaps)."""
    is_diff = mode == "diff"
    before = None if is_diff else c.ram_alloc_mib(sid)
    private = c.clone_private_mib(sid) if is_diff else None
    t0 = time.perf_counter()
    r = c.d.api.request("POST", f"/v1/sandboxes/{sid}/branch", {"mode": mode, "count": 0},
                        expect=(201,), timeout=900)
    wall = ms_since(t0)
    snap = r["snapshot"]
    c.snaps.add(snap["id"])
    after = None if is_diff else c.ram_alloc_mib(sid)
    try:
        if r.get("mode") != mode or r.get("children"):
            raise fb.BenchError(f"branch {mode} answered mode {r.get('mode')} with "
                                f"{len(r.get('children') or [])} children: {r}")
        want_kind = WANT_KIND[mode]
        if snap.get("kind") != want_kind or snap.get("state") != "ready":
            raise fb.BenchError(f"branch {mode}: expected a ready {want_kind} snapshot, got "
                                f"{snap.get('kind')} / {snap.get('state')}"
                                + (" (is the source a clone of a shared/diff snapshot?)"
                                   if is_diff else ""))
        if want_depth is not None and snap.get("depth") != want_depth:
            raise fb.BenchError(f"branch {mode}: expected depth {want_depth}, got "
                                f"{snap.get('depth')} (parent {snap.get('parent')})")
        t = snap.get("timings") or {}
        sdir = os.path.join(c.d.home, "snapshots", snap["id"])
        sizes = snap.get("sizes") or {}
        # A diff saves device state with xen-save-devices-state, not a
        # migration: query-migrate would show an older one.
        mig = {} if is_diff else query_last_migration(c, sid)
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
            "snapshot": snap["id"], "snapshot_kind": snap.get("kind"), "depth": snap.get("depth"),
            "device_state_mib": mib(sizes.get("device_state_bytes")),
            "memory_diff_mib": mib(sizes.get("memory_diff_bytes")),
            "snapshot_alloc_mib": fb.allocated_bytes_tree(sdir) / 2**20,
            "ram_file_before_mib": before, "ram_file_after_mib": after,
            "clone_private_mib": private,
        }
        # In live mode the daemon falls back to its own clock, started before the
        # precopy, when an event is missing: a pause as long as the whole save.
        if mode == "live" and row["save_state_ms"] and row["pause_ms"] >= row["save_state_ms"]:
            row["note"] = "pause >= save_state: the daemon's clock fallback?"
    finally:
        if not keep:
            delete_snapshot(c, snap["id"])
    if is_diff:
        detail = (f"device state {fb_fmt(row['save_state_ms'], 1)}, read private pages "
                  f"{fb_fmt(row['copy_memory_ms'], 1)}, freeze {fb_fmt(row['freeze_disk_ms'], 1)}, "
                  f"publish {fb_fmt(row['publish_ms'])}; branch total "
                  f"{fb_fmt(row['branch_total_ms'])}; clone private {fb_fmt(private)} MiB -> "
                  f"memory.diff {fb_fmt(row['memory_diff_mib'], 1)} MiB, depth {row['depth']}")
    else:
        detail = (f"save_state {fb_fmt(row['save_state_ms'])}, freeze "
                  f"{fb_fmt(row['freeze_disk_ms'], 1)}, copy_memory {fb_fmt(row['copy_memory_ms'])}, "
                  f"publish {fb_fmt(row['publish_ms'])}; branch total "
                  f"{fb_fmt(row['branch_total_ms'])}; QEMU downtime "
                  f"{fb_fmt(row['qemu_downtime_ms'])}; RAM file {before:.0f}->{after:.0f} MiB")
    print(f"[{where_label(exp, size, dirty)} {mode} {run}/{n}] "
          f"pause {row['pause_ms']:.1f} ms  ({detail})  {c.elapsed()}", flush=True)
    return row


def naive(c: Ctx, sid: str, variant: str, exp: str, size: int, dirty, run: int, n: int) -> dict:
    """The naive baseline on the running source (see nv.naive_pause).
    `variant`: naive / naive_nolimit on a booted source, naive_clone /
    naive_nolimit_clone on a clone (the same thing; the name says the source)."""
    if "nolimit" not in variant:
        params = dict(c.qemu_defaults)
    else:
        params = {"max-bandwidth": LIVE_MAX_BANDWIDTH,
                  "downtime-limit": c.qemu_defaults["downtime-limit"]}
    # In the source's own directory: the same filesystem as the store, and one
    # a jailed QEMU can write to.
    state = os.path.join(c.d.sandbox_dir(sid), "naive-state.bin")
    clone = source_of(variant) == "clone"
    before = None if clone else c.ram_alloc_mib(sid)
    private = c.clone_private_mib(sid) if clone else None
    r = nv.naive_pause(c.qmp_path(sid), state, params=params)
    row = {
        "experiment": exp, "mode": variant, "size_mib": size, "dirty_mib": dirty, "run": run,
        "pause_ms": r["pause_ms"], "pause_source": r["pause_source"], "clock_ms": r["clock_ms"],
        "migrate_ms": r["migrate_ms"], "max_bandwidth": r["params"].get("max-bandwidth"),
        "qemu_downtime_ms": r.get("qemu_downtime_ms"), "qemu_total_ms": r.get("qemu_total_ms"),
        "ram_transferred_mib": mib(r.get("ram_transferred_bytes")),
        "dirty_sync_count": r.get("dirty_sync_count"),
        "state_file_mib": mib(r["state_bytes"]),
        "ram_file_before_mib": before,
        "ram_file_after_mib": None if clone else c.ram_alloc_mib(sid),
        "clone_private_mib": private,
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
    publish). `where` = "disk" (the source's own directory in the daemon home,
    the store's filesystem) or "shm" (its RAM scratch directory on /dev/shm;
    a jailed QEMU can write nowhere else). Pause from the STOP/RESUME events; STOP -> `completed`
    seen and `completed` -> RESUME split it (event timestamps are
    CLOCK_REALTIME, as is time.time())."""
    state = os.path.join(c.d.sandbox_dir(sid) if where == "disk" else c.shm_dir(sid),
                         "live-ref.bin")
    before = c.ram_alloc_mib(sid)
    with fb.Qmp(c.qmp_path(sid), timeout=60) as q:
        caps_on, old = nv.migration_settings(q)
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
            stop = [nv.event_time_ms(e) for e in q.events if e["event"] == "STOP"]
            resume = [nv.event_time_ms(e) for e in q.events if e["event"] == "RESUME"]
            pause = nv.pause_from_events(q.events)
            file_bytes = os.path.getsize(state)
            file_alloc = fb.allocated_bytes(state)
        finally:
            try:
                nv.restore_migration_settings(q, caps_on, old)
            finally:
                try:
                    os.unlink(state)
                except FileNotFoundError:
                    pass
    st = nv.migration_stats(m)
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
        pause = nv.pause_from_events(q.events)
    row = {"experiment": exp, "mode": "stop_cont", "size_mib": size, "dirty_mib": dirty,
           "run": run, "pause_ms": pause if pause is not None else clock,
           "pause_source": "events" if pause is not None else "clock", "clock_ms": clock}
    print(f"[{where_label(exp, size, dirty)} stop_cont {run}/{n}] "
          f"pause {row['pause_ms']:.2f} ms ({row['pause_source']})  {c.elapsed()}", flush=True)
    return row


def where_label(exp: str, size: int, dirty) -> str:
    if exp == "dirty":
        return f"dirty D={dirty} MiB ({size} MiB guest)"
    if exp == "chain_build":
        return f"chain {size} MiB, link"
    return f"{exp} {size} MiB"


fb_fmt = rp.fmt
