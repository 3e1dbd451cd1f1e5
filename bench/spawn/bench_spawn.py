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
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))

import forkvm_bench as fb  # noqa: E402
import naive as nv  # noqa: E402
import report as rp  # noqa: E402
import smaps  # noqa: E402

MIN_RUNS = 10
NOISY_CORES = 0.25  # a run during which other processes used more than this is flagged
SPEED_TARGET = 10.0  # warm-pool spawn p50 at least this many times faster than naive restore p50
MEMORY_TARGET = 0.25  # 50 clones under this fraction of the memory of 50 naive copies
DENSITY_TARGET_MIB = 800  # issue 16, target 6: 50 idle clones in at most this Σ PSS
NAT_TARGET = 5.0  # issue 16, target 4: the default nat warm-pool spawn ≥ this × naive

FIELDS = [
    "case", "run", "child", "total_ms",
    # clones: the server's timings from the 201
    "prepare_ms", "qemu_start_ms", "restore_ms", "identity_ms", "network_ms", "network_ready_ms",
    "network", "from_pool", "server_total_ms",
    # naive_restore: QEMU start -> QMP, load, cont, agent pong; disk copy and
    # namespace + tap (not in total)
    "load_ms", "cont_ms", "agent_ms", "disk_copy_ms", "netns_ms",
    # warm pool: how long we waited for the pool to be full again (not timed)
    "pool_wait_ms",
    # snapshot: the server's snapshot timings; naive_save: state file size
    "pause_ms", "save_state_ms", "freeze_disk_ms", "copy_memory_ms", "publish_ms", "state_bytes",
    "other_cpu_cores", "jail", "segment", "uid",
]
MEM_FIELDS = [
    "k", "kind", "measured", "vms", "spawn_wall_ms",
    "pss_kib", "rss_kib", "private_dirty_kib", "pss_anon_kib", "pss_file_kib", "pss_shmem_kib",
    "shm_alloc_kib", "total_kib",
    "per_vm_pss_kib", "per_vm_rss_kib", "per_vm_private_dirty_kib", "per_vm_total_kib",
    "memavail_before_kib", "memavail_after_kib", "memavail_drop_kib", "shmem_delta_kib",
    "cached_delta_kib", "theoretical_kib", "note", "jail",
    # Σ over the clones of /proc/<pid>/smaps by class (bench/common/smaps.py).
    *[f"smaps_{c}_{f}_kib" for c in smaps.CLASSES for f in ("pss", "dirty")],
]

CLONE_STAGES = ["prepare_ms", "qemu_start_ms", "restore_ms", "identity_ms", "server_total_ms"]
RESTORE_STAGES = ["qemu_start_ms", "load_ms", "cont_ms", "agent_ms"]
# In the order they happen: the uplink is made before the resume, and
# network_ready_ms runs from the resume, so it includes identity_ms.
NAT_STAGES = ["network_ms", "restore_ms", "identity_ms", "network_ready_ms", "server_total_ms"]
NAT = "spawn_warm_pool_nat"
LABELS = {
    "spawn_cold_pool_off": "forkvm clone, no pool\n(POST → 201)",
    "spawn_warm_pool": "forkvm clone, warm pool\n(POST → 201)",
    NAT: "forkvm clone, warm pool,\nnat + wait_for_network\n(POST → 201)",
    "naive_restore": "naive QEMU restore\n(spawn → agent pong)",
}


# (case, metric, label) of the jail comparison; each is compared with the naive restore
JAIL_METRICS = [
    ("spawn_cold_pool_off", "total_ms", "clone, no pool: client wall"),
    ("spawn_cold_pool_off", "server_total_ms", "clone, no pool: timings.total_ms"),
    ("spawn_warm_pool", "total_ms", "clone, warm pool: client wall"),
    ("spawn_warm_pool", "server_total_ms", "clone, warm pool: timings.total_ms"),
]


def start_daemon(args, side: str, keep_home: bool = False) -> fb.Daemon:
    d = fb.Daemon(binary=args.binary, env=rp.jail_env(side), keep_home=keep_home)
    d.side = side  # spawn_one / spawn_batch check each clone's QEMU uid against it
    return d


def check_jail(d: fb.Daemon, sb: dict) -> int | None:
    """A jailed daemon's QEMU runs as a non-root uid, an unjailed one's as
    root; anything else fails the bench (a mislabelled run). Returns the uid."""
    side = getattr(d, "side", None)
    if side is None or not sb.get("pid"):
        return None
    return rp.check_side_uid(side, sb)


def jail_ratios(jrows, rows) -> list[dict]:
    """Per JAIL_METRICS entry: the jailed and unjailed summaries of the
    comparison's segments, jailed/unjailed at p50 and p90, and each side's
    p50 over the naive restore's p50 of the main run."""
    naive = rp.summarize(r["total_ms"] for r in rows if r["case"] == "naive_restore")
    out = []
    for case, metric, label in JAIL_METRICS:
        side = {s: rp.summarize(r.get(metric) for r in jrows
                                if r["case"] == case and r["jail"] == s) for s in (rp.JAILED, rp.UNJAILED)}
        if not (side[rp.JAILED]["n"] or side[rp.UNJAILED]["n"]):
            continue
        j, u = side[rp.JAILED], side[rp.UNJAILED]
        out.append({"case": case, "metric": metric, "label": label, rp.JAILED: j, rp.UNJAILED: u,
                    "naive": naive, "ratio_p50": rp.ratio(j["p50"], u["p50"]),
                    "ratio_p90": rp.ratio(j["p90"], u["p90"]),
                    "jailed_vs_naive": rp.ratio(j["p50"], naive["p50"]),
                    "unjailed_vs_naive": rp.ratio(u["p50"], naive["p50"])})
    return out


def cases_of(rows):
    """(case, stages) in report order; the burst case is named burst<size>."""
    bursts = sorted({r["case"] for r in rows if r["case"].startswith("burst")
                     and not r["case"].endswith("_child")})
    out = [("spawn_cold_pool_off", CLONE_STAGES),
           ("spawn_warm_pool", ["restore_ms", "identity_ms", "server_total_ms"]),
           (NAT, NAT_STAGES),
           ("naive_restore", RESTORE_STAGES)]
    for b in bursts:
        out += [(b, ["server_total_ms"]), (b + "_child", CLONE_STAGES)]
    return out

ms_since = fb.ms_since


# --------------------------------------------------------------------------
# forkvm clones
# --------------------------------------------------------------------------


def clone_row(case: str, run: int, sb: dict, wall_ms: float | None, child=None) -> dict:
    t = sb.get("timings") or {}
    return {
        "case": case, "run": run, "child": child, "total_ms": wall_ms,
        "prepare_ms": t.get("prepare_ms"), "qemu_start_ms": t.get("qemu_start_ms"),
        "restore_ms": t.get("restore_ms"), "identity_ms": t.get("identity_ms"),
        "network_ms": t.get("network_ms"), "network_ready_ms": t.get("network_ready_ms"),
        "network": (sb.get("network") or {}).get("mode"),
        "from_pool": t.get("from_pool"), "server_total_ms": t.get("total_ms"),
        "uid": sb.get("_uid"),
    }


def spawn_body(snap_id: str, network: str | None) -> dict:
    """The request body: `network` None leaves the daemon's defaults (nat and
    wait_for_network where the host has networking)."""
    return {"snapshot": snap_id} if network is None else {"snapshot": snap_id, "network": network}


def check_clone(sb: dict, snap_id: str, network: str | None = None) -> None:
    """`network`: the mode the clone must have (None: not checked)."""
    t = sb.get("timings") or {}
    if sb.get("snapshot") != snap_id or t.get("restore_ms") is None or sb.get("state") != "running":
        raise fb.BenchError(f"sandbox {sb.get('id')} is not a running clone of {snap_id}: {sb}")
    mode = (sb.get("network") or {}).get("mode")
    if network is not None and mode != network:
        raise fb.BenchError(f"clone {sb.get('id')} has network {mode!r}, expected {network!r}: "
                            f"{sb.get('network')}")


def spawn_one(d: fb.Daemon, snap_id: str, network: str | None = "none",
              expect_network: str | None = None) -> tuple[dict, float]:
    t0 = time.perf_counter()
    sb = d.api.request("POST", "/v1/sandboxes", spawn_body(snap_id, network), expect=(201,))
    wall = ms_since(t0)
    d.sandboxes.add(sb["id"])
    check_clone(sb, snap_id, expect_network or network)
    sb["_uid"] = check_jail(d, sb)
    return sb, wall


def spawn_batch(d: fb.Daemon, snap_id: str, count: int,
                network: str | None = "none") -> tuple[list[dict], float, float]:
    t0 = time.perf_counter()
    r = d.api.request("POST", "/v1/sandboxes", {**spawn_body(snap_id, network), "count": count},
                      expect=(201,), timeout=900)
    wall = ms_since(t0)
    sbs = r["sandboxes"]
    for sb in sbs:
        d.sandboxes.add(sb["id"])
    if len(sbs) != count:
        raise fb.BenchError(f"asked for {count} clones, got {len(sbs)}")
    for sb in sbs:
        check_clone(sb, snap_id, network)
        sb["_uid"] = check_jail(d, sb)
    return sbs, wall, r.get("total_ms")


def delete_all(d: fb.Daemon, sbs) -> None:
    for sb in sbs:
        d.delete(sb["id"])


def run_spawn_cold(d, snap_id, run, n) -> dict:
    sb, wall = spawn_one(d, snap_id)
    try:
        row = clone_row("spawn_cold_pool_off", run, sb, wall)
        if row["from_pool"]:
            raise fb.BenchError(f"spawn {run} came from a pool, but no pool was set: {sb}")
    finally:
        d.delete(sb["id"])
    print(f"[spawn_cold_pool_off {run}/{n}] {wall:.0f} ms  (server: prepare "
          f"{row['prepare_ms']:.0f}, qemu {row['qemu_start_ms']:.0f}, restore "
          f"{row['restore_ms']:.0f}, identity {row['identity_ms']:.0f}, total "
          f"{row['server_total_ms']:.0f})", flush=True)
    return row


def pool_state(d: fb.Daemon, snap_id: str) -> tuple[int, int]:
    for p in d.api.info().get("pools") or []:
        if p.get("snapshot") == snap_id:
            return p.get("size", 0), p.get("ready", 0)
    return 0, 0


def wait_pool(d: fb.Daemon, snap_id: str, want: int, timeout: float = 180.0) -> float:
    """Poll GET /v1/info until the pool of `snap_id` holds exactly `want`
    ready processes; return how long that took (ms)."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    while True:
        size, ready = pool_state(d, snap_id)
        if ready == want and size == want:
            return ms_since(t0)
        if time.monotonic() > deadline:
            raise fb.BenchError(f"the warm pool of {snap_id} is at {ready}/{size} after "
                                f"{timeout:.0f} s, expected {want}; daemon log:\n{d.log_tail()}")
        time.sleep(0.02)


def pool_off(d: fb.Daemon, snap_id: str, tries: int = 5, network: str | None = "none",
             expect_network: str | None = None) -> int:
    """Make sure no pooled QEMU is left for `snap_id` after its pool size was
    set to 0. GET /v1/info lists only pools with a size > 0, and a refill
    that was in flight when the size dropped still parks its process, so the
    only reliable check is a spawn: claim (and delete) clones until one is not
    from a pool. Not timed. Returns how many leftovers were claimed."""
    time.sleep(1.0)  # let any refill in flight finish
    for n in range(tries):
        sb, _ = spawn_one(d, snap_id, network, expect_network)
        d.delete(sb["id"])
        if not (sb.get("timings") or {}).get("from_pool"):
            if n:
                print(f"[pool off] claimed {n} pooled QEMU(s) left after the pool size went "
                      "to 0", flush=True)
            return n
    raise fb.BenchError(f"the pool of {snap_id} still serves spawns after {tries} claims")


def run_spawn_warm(d, snap_id, pool_size, settle, run, n, case="spawn_warm_pool",
                   network="none", expect_network=None) -> dict:
    """One timed pooled spawn. `network` is the request's field (None: the
    daemon's defaults), `expect_network` the mode the clone must get."""
    waited = wait_pool(d, snap_id, pool_size)
    time.sleep(settle)  # let the refill's QEMU start and the last DELETE finish
    sb, wall = spawn_one(d, snap_id, network, expect_network)
    try:
        row = clone_row(case, run, sb, wall)
        row["pool_wait_ms"] = waited
        if row["from_pool"] is not True:
            raise fb.BenchError(f"warm-pool spawn {run} was not a pool hit: {sb.get('timings')}")
    finally:
        d.delete(sb["id"])
    net, ready = "", ""
    if row["network"] == "nat":
        net = f"network {fmt(row['network_ms'])}, "
        ready = f", ready {fmt(row['network_ready_ms'])} after the resume"
    print(f"[{case} {run}/{n}] {wall:.0f} ms  (server: {net}restore {row['restore_ms']:.0f}, "
          f"identity {row['identity_ms']:.0f}{ready}, total {row['server_total_ms']:.0f}; "
          f"from_pool; pool refilled {waited:.0f} ms before)", flush=True)
    return row


def run_burst(d, snap_id, size, run, n) -> list[dict]:
    sbs, wall, server_total = spawn_batch(d, snap_id, size)
    try:
        rows = [{"case": f"burst{size}", "run": run, "total_ms": wall,
                 "server_total_ms": server_total}]
        rows += [clone_row(f"burst{size}_child", run, sb, None, child=i)
                 for i, sb in enumerate(sbs, start=1)]
        for r in rows[1:]:
            r["total_ms"] = r["server_total_ms"]
    finally:
        delete_all(d, sbs)
    pooled = sum(bool(r["from_pool"]) for r in rows[1:])
    if pooled:
        raise fb.BenchError(f"burst {run}: {pooled} clones came from a pool, but the pool is off")
    kids = [r["server_total_ms"] for r in rows[1:]]
    print(f"[burst{size} {run}/{n}] {wall:.0f} ms for {size} clones  (server batch "
          f"{server_total:.0f} ms; per child min {min(kids):.0f} / p50 "
          f"{rp.percentile(kids, 50):.0f} / max {max(kids):.0f} ms)", flush=True)
    return rows


def naive_netns(saved, tag: str) -> str | None:
    """A network namespace name for one naive copy when the source has a NIC
    (its tap must exist, alone, where the copy's QEMU runs), else None."""
    if not any(a.startswith("tap,") for a in saved.argv):
        return None
    return f"fvb-{os.getpid()}-{tag}"


def run_naive(saved, work, shm, run, n) -> dict:
    vm = nv.naive_restore(saved, os.path.join(work, f"r{run}"), os.path.join(shm, f"r{run}.mem"),
                          f"fvb-restore-{run}", netns=naive_netns(saved, f"r{run}"))
    try:
        row = {"case": "naive_restore", "run": run, **vm.timings}
    finally:
        vm.stop()
    print(f"[naive_restore {run}/{n}] {row['total_ms']:.0f} ms  (qemu {row['qemu_start_ms']:.0f}, "
          f"load {row['load_ms']:.0f}, cont {row['cont_ms']:.0f}, agent {row['agent_ms']:.0f})",
          flush=True)
    return row


# --------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------


def sum_vms(per_vm: list[dict]) -> dict:
    keys = ["pss_kib", "rss_kib", "private_dirty_kib", "pss_anon_kib", "pss_file_kib",
            "pss_shmem_kib", "shm_alloc_kib", "total_kib"]
    out = {k: sum(v[k] for v in per_vm) for k in keys}
    n = max(len(per_vm), 1)
    out.update({
        "vms": len(per_vm),
        "per_vm_pss_kib": out["pss_kib"] / n, "per_vm_rss_kib": out["rss_kib"] / n,
        "per_vm_private_dirty_kib": out["private_dirty_kib"] / n,
        "per_vm_total_kib": out["total_kib"] / n,
    })
    return out


def vm_memory(pid: int, rss=None, pss=None, dirty=None, shm_files=()) -> dict:
    """One VM's memory. The total counts each page once: PSS without its
    shmem part, plus the shmem the VM's own RAM files hold (pages of a share=on
    RAM file are in Pss_Shmem while mapped, and in the file's allocation)."""
    s = fb.smaps_rollup(pid)
    if not s:
        raise fb.BenchError(f"cannot read /proc/{pid}/smaps_rollup (QEMU gone?)")
    v = {
        "pss_kib": pss if pss is not None else s.get("Pss", 0),
        "rss_kib": rss if rss is not None else s.get("Rss", 0),
        "private_dirty_kib": dirty if dirty is not None else s.get("Private_Dirty", 0),
        "pss_anon_kib": s.get("Pss_Anon", 0), "pss_file_kib": s.get("Pss_File", 0),
        "pss_shmem_kib": s.get("Pss_Shmem", 0),
        "shm_alloc_kib": sum(fb.allocated_bytes(f) for f in shm_files) // 1024,
    }
    v["total_kib"] = v["pss_kib"] - v["pss_shmem_kib"] + v["shm_alloc_kib"]
    return v


def mem_delta(before: dict, after: dict) -> dict:
    return {
        "memavail_before_kib": before["MemAvailable"], "memavail_after_kib": after["MemAvailable"],
        "memavail_drop_kib": before["MemAvailable"] - after["MemAvailable"],
        "shmem_delta_kib": after["Shmem"] - before["Shmem"],
        "cached_delta_kib": after["Cached"] - before["Cached"],
    }


def memory_forkvm(d, snap_id, k, args) -> dict:
    need = args.mem_reserve_mib * 1024 + k * 160 * 1024
    before = fb.meminfo()
    if before["MemAvailable"] < need:
        raise fb.BenchError(f"not enough free memory for {k} clones: MemAvailable "
                            f"{before['MemAvailable'] // 1024} MiB < {need // 1024} MiB")
    note = f"one POST count={k}"
    try:
        sbs, wall, _ = spawn_batch(d, snap_id, k)
    except fb.ApiError as e:
        if e.status < 500 or k <= 10:
            raise
        # All or nothing: the daemon removed the clones it had started.
        print(f"[memory forkvm K={k}] one POST count={k} failed ({e}); spawning in batches "
              "of 10", flush=True)
        note = f"batches of 10 (one POST count={k} failed: {str(e)[:120]})"
        sbs, wall, t0 = [], 0.0, time.perf_counter()
        while len(sbs) < k:
            got, _, _ = spawn_batch(d, snap_id, min(10, k - len(sbs)))
            sbs += got
        wall = ms_since(t0)
    try:
        pooled = sum(bool((sb.get("timings") or {}).get("from_pool")) for sb in sbs)
        if pooled:
            note += f"; {pooled} came from a pool"
        print(f"[memory forkvm K={k}] {k} clones up in {wall:.0f} ms; idle {args.idle:.0f} s",
              flush=True)
        time.sleep(args.idle)
        per_vm = []
        classes: dict = {}
        run_dir = fb.run_dir_for_home(d.home)
        for sb in sbs:
            g = d.api.request("GET", f"/v1/sandboxes/{sb['id']}")
            m = g.get("memory")
            if not m or not g.get("pid"):
                raise fb.BenchError(f"GET /v1/sandboxes/{sb['id']} has no memory: {g}")
            # A clone maps the snapshot's memory.img copy-on-write; it has no
            # RAM file of its own in the run dir (checked just below).
            per_vm.append(vm_memory(g["pid"], m["rss_kib"], m["pss_kib"], m["private_dirty_kib"],
                                    shm_files=[run_dir / f"{sb['id']}.mem"]))
            try:
                smaps.add(classes, smaps.read(g["pid"], args.memory << 20))
            except OSError as e:
                raise fb.BenchError(f"cannot read /proc/{g['pid']}/smaps (QEMU gone?): {e}")
        after = fb.meminfo()
        run_dir_kib = fb.allocated_bytes_tree(run_dir) // 1024 if run_dir.exists() else 0
        daemon = fb.smaps_rollup(d.proc.pid)
        note += f"; the daemon itself (not counted): RSS {daemon.get('Rss', 0) // 1024} MiB"
    finally:
        delete_all(d, sbs)
    row = {"k": k, "kind": "forkvm", "measured": "yes", "spawn_wall_ms": wall,
           **sum_vms(per_vm), **mem_delta(before, after),
           "theoretical_kib": k * args.memory * 1024,
           "note": note + (f"; run dir holds {run_dir_kib} KiB" if run_dir_kib else ""),
           **{f"smaps_{c}_{f}_kib": classes[c][field]
              for c in smaps.CLASSES for f, field in (("pss", "Pss"), ("dirty", "Private_Dirty"))}}
    print(f"[memory forkvm K={k}] PSS {row['pss_kib'] / 1024:,.0f} MiB total "
          f"({row['per_vm_pss_kib'] / 1024:.1f}/clone: anon {row['pss_anon_kib'] / k / 1024:.1f}, "
          f"file {row['pss_file_kib'] / k / 1024:.1f}), RSS {row['rss_kib'] / 1024:,.0f} MiB, "
          f"private dirty {row['private_dirty_kib'] / 1024:,.0f} MiB; MemAvailable dropped "
          f"{row['memavail_drop_kib'] / 1024:,.0f} MiB", flush=True)
    return row


def memory_naive(saved, work, shm, target, sample_at, args, vms: list) -> list[dict]:
    """Start naive copies one after another (up to `target`, while free memory
    allows), measuring after an idle period whenever the count reaches one of
    `sample_at` and at the end. `vms` collects them for the caller's
    clean-up; they are all stopped before returning."""
    rows = []
    before = fb.meminfo()
    est_kib = (args.memory + 64) * 1024  # until one copy is measured
    stopped_early = ""
    samples = sorted({k for k in sample_at if k <= target} | {target})
    try:
        for i in range(1, target + 1):
            avail = fb.meminfo()["MemAvailable"]
            if avail - est_kib < args.mem_reserve_mib * 1024:
                stopped_early = (f"stopped at {i - 1} copies: MemAvailable {avail // 1024} MiB, "
                                 f"another copy needs ~{est_kib // 1024} MiB and "
                                 f"{args.mem_reserve_mib} MiB are kept free (--mem-reserve-mib)")
                print(f"[memory naive] {stopped_early}", flush=True)
                break
            vm = nv.naive_restore(saved, os.path.join(work, f"c{i}"),
                                  os.path.join(shm, f"c{i}.mem"), f"fvb-copy-{i}",
                                  netns=naive_netns(saved, f"c{i}"))
            vms.append(vm)
            m = vm_memory(vm.pid, shm_files=[vm.mem])
            est_kib = max(est_kib, m["total_kib"] + 16 * 1024)
            print(f"[memory naive copy {i}/{target}] up in {vm.timings['total_ms']:.0f} ms; "
                  f"RAM file {m['shm_alloc_kib'] / 1024:.0f} MiB allocated, PSS "
                  f"{m['pss_kib'] / 1024:.0f} MiB", flush=True)
            if i in samples:
                rows.append(measure_naive(vms, i, before, args))
        if stopped_early and (not rows or rows[-1]["vms"] != len(vms)) and vms:
            rows.append(measure_naive(vms, len(vms), before, args))
    finally:
        for vm in vms:
            vm.stop()
        vms.clear()
    if rows and rows[-1]["vms"] < target:
        last = rows[-1]
        rows[-1]["note"] += "; " + stopped_early
        ext = {"k": target, "kind": "naive", "measured": "extrapolated", "vms": target}
        for key in ("pss_kib", "rss_kib", "private_dirty_kib", "pss_anon_kib", "pss_file_kib",
                    "pss_shmem_kib", "shm_alloc_kib", "total_kib"):
            ext[key] = last[key] / last["vms"] * target
        for key in ("per_vm_pss_kib", "per_vm_rss_kib", "per_vm_private_dirty_kib",
                    "per_vm_total_kib"):
            ext[key] = last[key]
        ext["theoretical_kib"] = target * args.memory * 1024
        ext["note"] = (f"{target} × the per-copy mean of the {last['vms']} copies measured "
                       "(each copy's RAM is private, so the cost is linear)")
        rows.append(ext)
    return rows


def measure_naive(vms, k, before, args) -> dict:
    print(f"[memory naive K={k}] {k} copies up; idle {args.idle:.0f} s", flush=True)
    time.sleep(args.idle)
    per_vm = [vm_memory(vm.pid, shm_files=[vm.mem]) for vm in vms]
    after = fb.meminfo()
    row = {"k": k, "kind": "naive", "measured": "yes",
           "spawn_wall_ms": sum(vm.timings["total_ms"] for vm in vms),
           **sum_vms(per_vm), **mem_delta(before, after),
           "theoretical_kib": k * args.memory * 1024,
           "note": (f"started one after another; each restore (spawn → pong) took "
                    f"{vms[0].timings['total_ms']:,.0f} ms for the first copy and "
                    f"{vms[k - 1].timings['total_ms']:,.0f} ms for copy {k}, as the copies "
                    "already running compete for the host's cores" if k > 1 else
                    "started one after another")}
    print(f"[memory naive K={k}] total {row['total_kib'] / 1024:,.0f} MiB "
          f"(PSS {row['pss_kib'] / 1024:,.0f} of which shmem {row['pss_shmem_kib'] / 1024:,.0f}; "
          f"RAM files {row['shm_alloc_kib'] / 1024:,.0f} MiB; {row['per_vm_total_kib'] / 1024:.0f}"
          f"/copy); MemAvailable dropped {row['memavail_drop_kib'] / 1024:,.0f} MiB, Shmem "
          f"+{row['shmem_delta_kib'] / 1024:,.0f} MiB", flush=True)
    return row


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


fmt = rp.fmt


def mib(kib, digits: int = 0) -> str:
    return fmt(kib / 1024, digits)


def stats_rows(rows: list[dict]):
    # A child's server total is its total: not shown twice.
    return rp.case_stats(rows, cases_of(rows),
                         skip=lambda case, s: case.endswith("_child") and s == "server_total_ms")


def p50(rows, case, key="total_ms") -> float:
    return rp.percentile([r[key] for r in rows if r["case"] == case and r.get(key) is not None], 50)


def key_figures(rows, mem_rows, clones_max) -> dict:
    warm, naive = p50(rows, "spawn_warm_pool"), p50(rows, "naive_restore")
    fk = next((r for r in mem_rows if r["kind"] == "forkvm" and r["k"] == clones_max), None)
    nv = next((r for r in mem_rows if r["kind"] == "naive" and r["k"] == clones_max), None)
    nat = p50(rows, NAT)
    return {
        "warm_p50": warm, "naive_p50": naive, "cold_p50": p50(rows, "spawn_cold_pool_off"),
        "speedup": naive / warm if warm else math.nan,
        "nat_p50": nat, "nat_speedup": naive / nat if nat == nat and nat else math.nan,
        "cold_speedup": naive / p50(rows, "spawn_cold_pool_off"),
        "fk": fk, "nv": nv,
        "mem_ratio": (fk["pss_kib"] / nv["total_kib"]) if fk and nv else math.nan,
    }


def write_plot(path: Path, rows, mem_rows, title: str, burst_size: int) -> None:
    from matplotlib.lines import Line2D
    plt = rp.pyplot()

    cases = ["spawn_cold_pool_off", "spawn_warm_pool", NAT, "naive_restore", f"burst{burst_size}"]
    fig = plt.figure(figsize=(18, 9.5))
    gs = fig.add_gridspec(2, 5, height_ratios=[1, 1.05])
    noisy_any = False
    for i, c in enumerate(cases):
        ax = fig.add_subplot(gs[0, i])
        rs = [r for r in rows if r["case"] == c]
        ys = [r["total_ms"] for r in rs]
        if not ys:
            ax.set_axis_off()
            continue
        ax.boxplot([ys], widths=0.5, showfliers=False,
                   medianprops={"color": "tab:red", "linewidth": 2})
        xs = [1 + (j - (len(ys) - 1) / 2) * (0.35 / max(len(ys), 1)) for j in range(len(ys))]
        noisy = [(r.get("other_cpu_cores") or 0) > NOISY_CORES for r in rs]
        noisy_any |= any(noisy)
        ax.scatter(xs, ys, s=16, alpha=0.8, zorder=3,
                   color=["tab:orange" if n else "tab:blue" for n in noisy])
        m = rp.percentile(ys, 50)
        ax.axhline(m, color="tab:red", ls=":", lw=1)
        ax.annotate(f"p50 {m:,.0f} ms", (1.3, m), va="bottom", ha="center", color="tab:red",
                    fontsize=9)
        label = LABELS.get(c) or (f"burst: {burst_size} clones in one POST\n(POST → 201, wall)")
        ax.set_xticks([1], [label], fontsize=8)
        ax.set_ylim(0, max(ys) * 1.15)
        ax.set_ylabel("wall time (ms)" if i == 0 else "")
        ax.set_title(f"{c} (N={len(ys)})", fontsize=8.5)
        ax.grid(axis="y", alpha=0.3)
    if noisy_any:
        fig.axes[0].legend(handles=[
            Line2D([], [], marker="o", ls="", color="tab:blue", label="quiet host"),
            Line2D([], [], marker="o", ls="", color="tab:orange",
                   label=f"others > {NOISY_CORES} cores"),
        ], fontsize=7, loc="lower left")

    # Memory: total vs number of VMs.
    ax = fig.add_subplot(gs[1, 0:2])
    fk = sorted((r for r in mem_rows if r["kind"] == "forkvm"), key=lambda r: r["k"])
    nv = sorted((r for r in mem_rows if r["kind"] == "naive" and r["measured"] == "yes"),
                key=lambda r: r["k"])
    ext = [r for r in mem_rows if r["kind"] == "naive" and r["measured"] != "yes"]
    gib = lambda kib: kib / 2**20  # noqa: E731
    if fk:
        ax.plot([r["k"] for r in fk], [gib(r["pss_kib"]) for r in fk], "o-", color="tab:blue",
                label="forkvm clones: Σ PSS")
        for r in fk:
            ax.annotate(f"{gib(r['pss_kib']):.2f} GiB", (r["k"], gib(r["pss_kib"])),
                        textcoords="offset points", xytext=(4, -12), fontsize=8, color="tab:blue")
    if nv:
        ax.plot([r["k"] for r in nv], [gib(r["total_kib"]) for r in nv], "s-", color="tab:red",
                label="naive copies: Σ (PSS − shmem) + RAM files")
        for r in nv:
            ax.annotate(f"{gib(r['total_kib']):.1f} GiB", (r["k"], gib(r["total_kib"])),
                        textcoords="offset points", xytext=(-6, 8), ha="right", fontsize=8,
                        color="tab:red")
    if ext and nv:
        e = ext[0]
        ax.plot([nv[-1]["k"], e["k"]], [gib(nv[-1]["total_kib"]), gib(e["total_kib"])], "s--",
                color="tab:red", mfc="white", markevery=[1],
                label="naive copies, extrapolated (not enough RAM)")
        ax.annotate(f"{gib(e['total_kib']):.1f} GiB (extrap.)", (e["k"], gib(e["total_kib"])),
                    textcoords="offset points", xytext=(-40, 6), fontsize=8, color="tab:red")
    ks = sorted({r["k"] for r in mem_rows})
    if ks:
        per_vm = mem_rows[0]["theoretical_kib"] / mem_rows[0]["k"]
        ax.plot([0] + ks, [0] + [gib(k * per_vm) for k in ks], ":", color="gray",
                label="K × guest RAM (theoretical)")
    ax.set_xlabel("number of VMs (K)")
    ax.set_ylabel("memory (GiB)")
    ax.set_title("Memory of K idle VMs (after the idle period)", fontsize=10)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")

    # Stage p50s, stacked.
    ax2 = fig.add_subplot(gs[1, 2:5])
    stacks = [
        ("clone, no pool", "spawn_cold_pool_off",
         [("prepare", "prepare_ms"), ("QEMU start→QMP", "qemu_start_ms"),
          ("load device state + cont", "restore_ms"),
          ("agent identity + clock", "identity_ms")]),
        ("clone, warm pool", "spawn_warm_pool",
         [("load device state + cont", "restore_ms"),
          ("agent identity + clock", "identity_ms")]),
        ("clone, warm pool,\nnat + wait", NAT,
         [("network set-up (uplink, rules)", "network_ms"),
          ("load device state + cont", "restore_ms"),
          ("agent identity + clock", "identity_ms"),
          ("network probe (ready − identity)", "probe")]),
        ("naive restore", "naive_restore",
         [("QEMU start→QMP", "qemu_start_ms"), ("load state file (all RAM)", "load_ms"),
          ("cont", "cont_ms"), ("agent ping", "agent_ms")]),
    ]
    colors = {"prepare": "tab:gray", "QEMU start→QMP": "tab:orange",
              "load device state + cont": "tab:olive", "load state file (all RAM)": "tab:green",
              "cont": "tab:purple", "agent identity + clock": "tab:cyan",
              "agent ping": "tab:blue", "network set-up (uplink, rules)": "tab:brown",
              "network probe (ready − identity)": "tab:pink"}
    seen = set()
    for i, (_, case, parts) in enumerate(stacks):
        bottom = 0.0
        for name, key in parts:
            if key == "probe":  # network_ready_ms runs from the resume: it includes identity
                v = rp.percentile([r["network_ready_ms"] - r["identity_ms"] for r in rows
                                   if r["case"] == case and r.get("network_ready_ms") is not None
                                   and r.get("identity_ms") is not None], 50)
            else:
                v = p50(rows, case, key)
            if v != v:
                continue
            ax2.bar(i, v, bottom=bottom, color=colors[name], width=0.6,
                    label=name if name not in seen else None)
            seen.add(name)
            bottom += v
        ax2.annotate(f"{bottom:,.0f}", (i, bottom), ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(range(len(stacks)), [s[0] for s in stacks], fontsize=9)
    ax2.set_ylabel("p50 per stage (ms)")
    ax2.set_title("Where the time goes (server/QMP stage p50s, stacked)", fontsize=10)
    ax2.legend(fontsize=8)
    ax2.grid(axis="y", alpha=0.3)
    rp.save_figure(fig, path, dpi=100, title=title)


def unit_ms(v) -> str:
    return "–" if v is None or v != v else f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def jail_section(jrows, rows, ctx, args) -> list[str]:
    """RESULTS.md's "Jail cost": the comparison's table and per-segment p50s."""
    ratios = ctx["jail"]
    if not ratios:
        return ["", "## Jail cost", "", "Not measured (`--no-jail-compare`): every figure "
                "above is jailed; there is no unjailed counterpart in this run."]
    segs = sorted({r["segment"] for r in jrows if r["case"] in ("spawn_cold_pool_off",
                                                                 "spawn_warm_pool")})
    side_of = {r["segment"]: r["jail"] for r in jrows}
    n = {s: sum(1 for r in jrows if r["jail"] == s and r["case"] == "spawn_cold_pool_off")
         for s in (rp.JAILED, rp.UNJAILED)}
    L = ["", "## Jail cost", "",
         "Segments of this run, one private daemon each, one at a time, in this order: "
         + ", ".join(f"{s} {side_of[s]}" for s in segs)
         + " (`FORKVM_NO_JAIL=0` / `=1`), all before the main run; each cold-boots its own "
         f"source and snapshots it as the main run does, then times spawn_cold_pool_off, then "
         f"spawn_warm_pool (pool {args.pool_size}): {n[rp.JAILED]} runs per case jailed and "
         f"{n[rp.UNJAILED]} unjailed in all, split evenly over the segments of each side. Every "
         "clone's QEMU uid was checked: non-root when jailed, root when not. Milliseconds.", "",
         "| metric | jailed p50 | jailed p90 | unjailed p50 | unjailed p90 | **ratio p50** "
         "(jailed ÷ unjailed) | ratio p90 | naive restore p50 | jailed ÷ naive | "
         "unjailed ÷ naive |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ratios:
        j, u = r[rp.JAILED], r[rp.UNJAILED]
        L.append(f"| {r['label']} | {unit_ms(j['p50'])} | {unit_ms(j['p90'])} | "
                 f"{unit_ms(u['p50'])} | {unit_ms(u['p90'])} | **{r['ratio_p50']:.3f}×** | "
                 f"{r['ratio_p90']:.3f}× | {unit_ms(r['naive']['p50'])} | "
                 f"{r['jailed_vs_naive']:.3f}× | {r['unjailed_vs_naive']:.3f}× |")
    L += ["", "Ratios above 1 mean the jail costs time. \"÷ naive\" is each side's p50 over the "
          "naive restore's p50 of the main run (plain QEMU as root, no jail; below 1: forkvm is "
          "faster).", "",
          "Per segment (p50, ms; client wall / server `total_ms`):", "",
          "| segment | daemon | spawn_cold_pool_off | spawn_warm_pool | other cores p50 |",
          "|---:|---|---:|---:|---:|"]
    for sg in segs:
        rs = [r for r in jrows if r["segment"] == sg]
        cell = lambda c, k: rp.summarize(r.get(k) for r in rs if r["case"] == c)["p50"]  # noqa: E731
        oc = rp.summarize(r.get("other_cpu_cores") for r in rs)["p50"]
        L.append(f"| {sg} | {side_of[sg]} | "
                 f"{unit_ms(cell('spawn_cold_pool_off', 'total_ms'))} / "
                 f"{unit_ms(cell('spawn_cold_pool_off', 'server_total_ms'))} | "
                 f"{unit_ms(cell('spawn_warm_pool', 'total_ms'))} / "
                 f"{unit_ms(cell('spawn_warm_pool', 'server_total_ms'))} | {oc:.2f} |")
    spread = {}
    for c in ("spawn_cold_pool_off", "spawn_warm_pool"):
        for side in (rp.JAILED, rp.UNJAILED):
            v = [rp.summarize(r["total_ms"] for r in jrows if r["segment"] == sg
                              and r["case"] == c)["p50"] for sg in segs if side_of[sg] == side]
            if len(v) > 1 and min(v) > 0:
                spread[(c, side)] = max(v) / min(v)
    if spread:
        L += ["", "How far one side's segments differ from each other (client wall p50, larger "
              "over smaller): " + "; ".join(
                  f"{c} {side} {v:.2f}×" for (c, side), v in spread.items())
              + ". A jailed/unjailed ratio within that spread is not a jail cost this run can "
              "resolve from the host's drift."]
    main = {c: p50(rows, c) for c in ("spawn_cold_pool_off", "spawn_warm_pool")}
    L += ["", "The main run's jailed figures of the same cases (its own daemon, after these "
          f"segments, N = {args.runs}): client wall p50 {unit_ms(main['spawn_cold_pool_off'])} "
          f"ms without a pool, {unit_ms(main['spawn_warm_pool'])} ms from the warm pool."]
    return L


def write_results(path: Path, rows, mem_rows, ctx: dict, args, jrows=()) -> None:
    info, machine, snap, saved = ctx["info"], ctx["machine"], ctx["snapshot"], ctx["saved"]
    kf = key_figures(rows, mem_rows, max(args.clones))
    burst = f"burst{args.burst_size}"
    L = []
    if args.smoke:
        L += rp.smoke_banner(f"N={args.runs} < {MIN_RUNS}", "bash bench/spawn/run.sh")
    L += [
        "# Spawn benchmark: forkvm clones from a snapshot vs naive QEMU save/restore",
        "",
        rp.date_line(ctx["started"], ctx["elapsed"]),
        rp.forkvm_line(info, rp.git_revision()),
        f"- Machine: {rp.machine_text(machine)}, "
        + (f"{ctx['swap_kib'] // 1024} MiB swap" if ctx.get("swap_kib") else "no swap"),
        f"- Kernel: Linux {machine['kernel']}; load average at start: "
        + rp.loadavg_text(machine),
        rp.accel_line(info),
        f"- QEMU: {rp.qemu_text(info)}",
        f"- Guest: {args.memory} MiB RAM, 1 vCPU, image `default`; source cold-booted with "
        f"`network: none`, settled {args.settle:.0f} s, then snapshotted; its clones are "
        "spawned with `network: none` and the naive copies have no way out either"
        + (" (on this host a `none` sandbox still has its NIC, a tap alone in a network "
           "namespace of its own, with no uplink; each naive copy runs in a namespace of its "
           "own holding the same tap)" if ctx.get("naive_nic") else "")
        + f"; `{NAT}` uses a second source booted with the default network (`nat`)",
        f"- Runs: N = {args.runs} per latency case" + (" (SMOKE)" if args.smoke else "")
        + f"; {args.burst_runs} bursts of {args.burst_size}; memory at K = "
        + ", ".join(str(k) for k in args.clones),
    ]
    seg = ctx.get("naive_segment")
    L += ["- **Jail:** every figure of the main run is **jailed**: its daemon ran with "
          "`FORKVM_NO_JAIL=0`, and every sandbox QEMU (source, clones, pooled, bursts, the "
          "memory clones) was checked to run as a non-root uid (the source's: "
          f"{ctx.get('main_uid')}). The naive baseline is plain QEMU started by the bench as "
          "root (`jail` = unjailed in the CSV); its saved state comes from the source of "
          + (f"unjailed segment {seg} of the jail comparison" if seg else
             "an unjailed daemon started only for that")
          + " (a jailed QEMU cannot write outside its own directories, and its command line "
          "names a tap fd it inherited, so it cannot be replayed). "
          + ("The jail's cost is under **Jail cost** below." if ctx.get("jail") else
             "No jail comparison in this run (`--no-jail-compare`).")]
    oc = {c: rp.summarize(r.get("other_cpu_cores") for r in rows if r["case"] == c)
          for c in ("spawn_cold_pool_off", "spawn_warm_pool", NAT, "naive_restore", burst)}
    timed = [r for r in rows if r["case"] in oc]
    L += ["- Host noise — average cores kept busy by processes other than this bench's, per "
          "timed run (`other_cpu_cores` in spawn.csv): "
          + "; ".join(f"{c} p50 {s['p50']:.2f}, max {s['max']:.2f}" for c, s in oc.items()
                      if s["n"])
          + f" (of {machine['cores']}); {sum((r.get('other_cpu_cores') or 0) > NOISY_CORES for r in timed)}"
          + f" of {len(timed)} runs had more than {NOISY_CORES} (orange in the plot)"]
    busy = rp.summarize(r.get("other_cpu_cores") for r in [*timed, *jrows])
    if busy["n"] and busy["p50"] > NOISY_CORES:
        L += [f"- **Shared host:** other processes kept p50 {busy['p50']:.2f} (max "
              f"{busy['max']:.2f}) of the {machine['cores']} cores busy during the timed runs "
              "(main run and jail comparison), so absolute times are inflated against a quiet "
              "host; the jail comparison's alternating segments weigh that on both sides "
              "alike."]
    if ctx["others"]:
        L += [f"- **Host not quiet:** QEMU processes not started by this bench were alive when "
              f"{ctx['busy_runs']} of the timed runs started:"]
        L += [f"  - pid {p}: `{c[:110]}`" for p, c in sorted(ctx["others"].items())]
    else:
        L += ["- No other QEMU process was running on the host (checked before each timed run "
              "and each memory step)."]

    # Targets
    sp_ok = kf["speedup"] >= SPEED_TARGET
    mem_ok = kf["mem_ratio"] < MEMORY_TARGET
    fk, nv = kf["fk"], kf["nv"]
    K = max(args.clones)
    L += ["", "## Targets", "",
          "| target | result | verdict |", "|---|---|---|",
          f"| warm-pool spawn p50 ≥ {SPEED_TARGET:.0f}× faster than the naive restore p50 "
          "(both without a network) | "
          f"{kf['naive_p50']:,.0f} / {kf['warm_p50']:,.0f} ms = **{kf['speedup']:.2f}×** | "
          f"**{'PASS' if sp_ok else 'MISS'}** |",
          f"| {K} clones < {MEMORY_TARGET:.0%} of the memory of {K} naive copies | "
          + (f"{mib(fk['pss_kib'])} MiB / {mib(nv['total_kib'])} MiB"
             + (" (naive extrapolated)" if nv["measured"] != "yes" else "")
             + f" = **{kf['mem_ratio']:.1%}**" if fk and nv else "not measured")
          + f" | **{'PASS' if mem_ok else 'MISS'}** |",
          f"| default nat warm-pool spawn p50 ≥ {NAT_TARGET:.0f}× faster than the naive restore "
          "p50 (issue 16, target 4) | "
          + (f"{kf['naive_p50']:,.0f} / {kf['nat_p50']:,.0f} ms = **{kf['nat_speedup']:.2f}×** | "
             f"**{'PASS' if kf['nat_speedup'] >= NAT_TARGET else 'MISS'}** |"
             if kf["nat_p50"] == kf["nat_p50"] else "not run | **N/A** |"),
          f"| {K} idle clones ≤ {DENSITY_TARGET_MIB:,} MiB Σ PSS (issue 16, target 6) | "
          + (f"**{mib(fk['pss_kib'])} MiB** ({fk['per_vm_pss_kib'] / 1024:.1f} MiB per clone; "
             f"the target allows {DENSITY_TARGET_MIB / K:.1f}) | "
             f"**{'PASS' if density_ok(fk) else 'MISS'}** |" if fk else "not measured | **N/A** |"),
          ""]
    if kf["nat_p50"] == kf["nat_p50"]:
        L += [f"- The default configuration (nat networking, wait_for_network), `{NAT}`: "
              f"pooled spawn p50 **{kf['nat_p50']:,.0f} ms**, naive restore p50 / that = "
              f"{kf['naive_p50']:,.0f} / {kf['nat_p50']:,.0f} = **{kf['nat_speedup']:.2f}×**. "
              "Not like for like: the naive restore has no network (its NIC has no uplink; it "
              "sets none up and waits for no probe), while this spawn includes the uplink's "
              f"set-up (`network` p50 {p50(rows, NAT, 'network_ms'):,.0f} ms) and, after its "
              "identity, the agent's probe of the gateway (`network_ready` p50 "
              f"{p50(rows, NAT, 'network_ready_ms'):,.0f} ms from the resume, identity "
              "included). Against the no-network warm pool (p50 "
              f"{kf['warm_p50']:,.0f} ms) the default configuration costs "
              f"{kf['nat_p50'] - kf['warm_p50']:+,.0f} ms at the p50."]
    elif ctx.get("nat_skipped"):
        L += [f"- `{NAT}` was not run: {ctx['nat_skipped']}."]
    L += [f"- Clone without a pool: p50 {kf['cold_p50']:,.0f} ms, {kf['cold_speedup']:.2f}× "
          "faster than the naive restore.",
          f"- Burst: one `POST {{\"snapshot\", \"network\": \"none\", \"count\": "
          f"{args.burst_size}}}` p50 "
          f"**{p50(rows, burst):,.0f} ms** wall for {args.burst_size} clones "
          f"(min {fmt(min((r['total_ms'] for r in rows if r['case'] == burst), default=math.nan))}, "
          f"max {fmt(max((r['total_ms'] for r in rows if r['case'] == burst), default=math.nan))}); "
          f"per child server total p50 {p50(rows, burst + '_child'):,.0f} ms."]
    if not sp_ok:
        L += ["", f"**Why the speed target is missed.** {ctx['speed_reason']}"]
    if not mem_ok and fk and nv:
        L += ["", "**Why the memory target is missed.** " + ctx.get("mem_reason", "")]
    if fk:
        L += ["", ("**Why the density target is missed.** " if not density_ok(fk) else
                   "**Where the clones' memory goes.** ") + density_reason(fk, ctx)]

    L += jail_section(list(jrows), rows, ctx, args)

    # Latency table
    L += ["", "## Latency", ""]
    L += rp.stats_table(stats_rows(rows), with_n=True, total_label=lambda c: (
        "**total (server, per child)**" if c == burst + "_child" else "**total (client wall)**"))
    L += ["", f"All times in milliseconds. `{burst}` total is the wall time of one POST for all "
          f"{args.burst_size} clones; `{burst}_child` is each child's own server `total_ms` "
          f"({args.burst_runs} × {args.burst_size} children)."
          + (f" `{NAT}`: `network` is the host-side set-up before the resume (the uplink veth, "
             "its addresses and rules; a pooled process's namespace and tap exist already), "
             "`network_ready` runs from the resume until the agent's probe of the gateway came "
             "back, so it includes `identity`." if any(r["case"] == NAT for r in rows) else "")]
    nn = rp.summarize(r.get("netns_ms") for r in rows if r["case"] == "naive_restore")
    if nn["n"]:
        L += ["", "Each naive restore's network namespace and tap were made before its clock "
              f"started (p50 {nn['p50']:,.0f} ms, max {nn['max']:,.0f} ms; `netns_ms` in "
              "spawn.csv, not in its total), like its disk copy; a forkvm clone without a pool "
              "makes its namespace and tap inside `prepare`."]
    for key, what in (("pool_leftovers", "the bursts"), ("nat_pool_leftovers", "the next case")):
        if ctx.get(key):
            L += ["", f"**Pool off:** after the pool size was set to 0, {ctx[key]} pooled "
                  "QEMU(s) were still being served (a refill in flight when the size dropped "
                  "parks its process anyway, and `GET /v1/info` no longer lists a size-0 pool); "
                  f"they were claimed and deleted before {what} (not timed)."]
    first = ctx.get("first_spawn")
    if first:
        L += ["", f"The very first clone of the snapshot (not in the table; it also verifies the "
              f"snapshot's files once) took {first['total_ms']:,.0f} ms wall "
              f"(server: prepare {fmt(first['prepare_ms'])}, qemu {fmt(first['qemu_start_ms'])}, "
              f"restore {fmt(first['restore_ms'])}, identity {fmt(first['identity_ms'])})."]
    first = ctx.get("nat_first_spawn")
    if first:
        L += ["", f"Likewise the first clone of the nat snapshot took {first['total_ms']:,.0f} ms "
              f"wall (server: prepare {fmt(first['prepare_ms'])}, qemu "
              f"{fmt(first['qemu_start_ms'])}, network {fmt(first['network_ms'])}, restore "
              f"{fmt(first['restore_ms'])}, identity {fmt(first['identity_ms'])}, network_ready "
              f"{fmt(first['network_ready_ms'])})."]

    # Snapshot and naive save
    st, sz = snap.get("timings") or {}, snap.get("sizes") or {}
    L += ["", "## The snapshot and the naive save", "",
          f"- forkvm snapshot (`{snap.get('kind')}`): client wall {ctx['snapshot_wall_ms']:,.0f} ms; "
          f"source paused {fmt(st.get('pause_ms'))} ms (device state {fmt(st.get('save_state_ms'))}, "
          f"disk freeze {fmt(st.get('freeze_disk_ms'))}, RAM copy {fmt(st.get('copy_memory_ms'))}), "
          f"publish {fmt(st.get('publish_ms'))}, server total {fmt(st.get('total_ms'))} ms",
          f"- snapshot sizes: memory.img {sz.get('memory_bytes', 0) / 2**20:.0f} MiB apparent, "
          f"**{sz.get('memory_allocated_bytes', 0) / 2**20:.1f} MiB allocated**; device state "
          f"{sz.get('device_state_bytes', 0) / 1024:.0f} KiB; disk layer "
          f"{sz.get('disk_bytes', 0) / 2**20:.1f} MiB",
          "- naive save of the naive baseline's source (unjailed"
          + (f", segment {ctx['naive_segment']}" if ctx.get("naive_segment") else "")
          + "; booted, settled and snapshotted like the one above) right after its snapshot "
          f"(`stop` + `migrate` to a file until `completed`): {saved.save_ms:,.0f} ms; state file {saved.state_bytes / 2**20:.1f} MiB; "
          + (f"capabilities turned off first: {', '.join(saved.caps_reset)} (the snapshot had "
             "set them)" if saved.caps_reset else "no capability was on")
          + f"; QEMU's default max-bandwidth {(saved.max_bandwidth or 0) / 2**20:.0f} MiB/s"]
    ns = ctx.get("nat_snapshot")
    if ns:
        nst, nsz = ns.get("timings") or {}, ns.get("sizes") or {}
        L += [f"- the nat source's snapshot (`{ns.get('kind')}`, for `{NAT}`): source paused "
              f"{fmt(nst.get('pause_ms'))} ms, server total {fmt(nst.get('total_ms'))} ms; "
              f"memory.img {nsz.get('memory_allocated_bytes', 0) / 2**20:.1f} MiB allocated"]

    # Memory
    L += ["", "## Memory", "",
          "| K | kind | VMs | Σ PSS | Σ RSS | Σ private dirty | Σ Pss_Shmem | Σ RAM files "
          "(/dev/shm) | **total** | per VM total | theoretical K × RAM | MemAvailable drop | "
          "Shmem Δ | Cached Δ |",
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in mem_rows:
        ext = r["measured"] != "yes"
        tot = r["pss_kib"] if r["kind"] == "forkvm" else r["total_kib"]
        L.append(
            f"| {r['k']} | {r['kind']}{' (extrapolated)' if ext else ''} | {r['vms']} | "
            f"{mib(r['pss_kib'])} | {mib(r['rss_kib'])} | {mib(r['private_dirty_kib'])} | "
            f"{mib(r['pss_shmem_kib'])} | {mib(r['shm_alloc_kib'])} | **{mib(tot)}** | "
            f"{mib(r['per_vm_total_kib'] if r['kind'] == 'naive' else r['per_vm_pss_kib'], 1)} | "
            f"{mib(r['theoretical_kib'])} | "
            + ("–" if ext else mib(r["memavail_drop_kib"])) + " | "
            + ("–" if ext else mib(r["shmem_delta_kib"])) + " | "
            + ("–" if ext else mib(r["cached_delta_kib"])) + " |")
    L += ["", "All figures in MiB. " + ctx["mem_explanation"]]
    notes = [r for r in mem_rows if r.get("note")]
    if notes:
        L += ["", "Notes:"] + [f"- K={r['k']} {r['kind']}: {r['note']}" for r in notes]

    L += ["", "Raw data: `spawn.csv` (one row per timed run, per burst child, plus the snapshot "
          "and the naive save), `memory.csv`. Plot: `spawn.png`.", ""]
    L += ["## Method", ""] + ctx["method"]
    path.write_text("\n".join(L) + "\n")


def method_text(args, burst: str, ctx: dict) -> list[str]:
    nic = ctx.get("naive_nic")
    return [
        "One private daemon (`forkvm serve`, release build) in a temp home whose `guest` and "
        "`images` are symlinks to the installed artefacts; everything in one run. "
        "Percentiles use linear interpolation between closest ranks (numpy's default). "
        "No run is discarded.",
        "",
        f"**Source.** `POST /v1/sandboxes {{\"memory_mib\":{args.memory},\"cpus\":1,"
        "\"use_template\":false,\"network\":\"none\"}` (a cold boot: the sandbox owns its "
        "`share=on` RAM file), "
        f"{args.settle:.0f} s of rest, then `POST /v1/sandboxes/{{id}}/snapshot` (timed; the "
        "source keeps running). **Like for like on the network:** a sandbox without `network` "
        "gets `nat` (its own namespace, a tap NIC, an uplink, and a spawn that waits for a "
        "network probe), which a naive copy of the QEMU command line cannot reproduce, so the "
        "source, every clone of it (each POST says `\"network\":\"none\"`; without it a clone "
        "of this snapshot would get `nat`) and every naive copy run without a network. "
        + ("On this host (networking available) a `none` sandbox still has its virtio-net NIC "
           "on a tap alone in a network namespace of its own, without an uplink; the naive "
           "copies get the same: a namespace per copy with the tap made as the daemon makes it "
           "(`ip netns add`, then lo up, `tap0` with the gateway's MAC and address, up; no "
           "uplink), made before the copy's clock starts, and the copy's QEMU is moved into it "
           "with setns(2) before exec, as the daemon starts QEMU. So both sides have the same "
           "NIC and neither has a way out. " if nic else
           "On this host the source has no NIC, and neither have its clones or the naive "
           "copies. ")
        + "The naive baseline's source is made the same way by an unjailed daemon (see the "
        "Jail line above) and, right after its snapshot, saved the naive way over its QMP "
        "socket: every migration capability turned off (the snapshot leaves `x-ignore-shared` "
        "on, which would keep RAM out of the file), `stop`, `migrate "
        "{\"uri\":\"file:<tmp>/state.bin\"}`, `query-migrate` polled until `completed`. The "
        "disk layers that match the saved RAM are copied (the source's current top layer, and "
        "the snapshot's frozen layer below it, rebased onto the copy, so the baseline does not "
        "read forkvm's store). The source is then DELETEd. One clone is spawned and deleted "
        "before any timing (it verifies the snapshot's files once; reported separately).",
        "",
        "**spawn_cold_pool_off** (N runs, no pool): `total` is the client wall time of "
        "`POST /v1/sandboxes {\"snapshot\":\"<id>\",\"network\":\"none\"}` until the 201, "
        "which the daemon sends once the clone's agent has taken its identity. Stages are the "
        "server's `timings`: `prepare` (sandbox dir, qcow2 overlay"
        + (", the clone's namespace and tap" if nic else "") + "), `qemu_start` (QEMU exec "
        "with `-incoming defer` until QMP answers), `restore` (`migrate-incoming` of the "
        "~95 KB device state + `cont`; RAM is the snapshot's `memory.img` mapped "
        "copy-on-write), `identity` (the agent's socket is connected before `cont`; after it, "
        "the identity request — RNG reseed, clock, hostname, machine-id, instance id — whose "
        "answer also proves the agent alive, then a second clock set), `server_total`. Each "
        "clone is DELETEd after (not timed).",
        "",
        "**naive_restore** (N runs, interleaved with spawn_cold_pool_off: clone 1, restore 1, "
        "clone 2, …, so drift in host load hits both alike): the source's QEMU command line "
        "(from `/proc/<pid>/cmdline`) rewritten for a new instance (new QMP and agent sockets, "
        "console log, a fresh copy of the saved top disk layer — copied before the clock "
        "starts — a new `share=on` RAM file in /dev/shm, a new `-name`) plus `-incoming "
        "defer`" + (", in its own namespace with the tap (see Source)" if nic else "")
        + ". `total` runs from just before the QEMU process is spawned until the guest "
        "agent answers a ping; stages: `qemu_start` (spawn until QMP answers), `load` "
        "(`migrate-incoming {\"uri\":\"file:<state>\"}` until `completed`, polled every 5 ms), "
        "`cont`, `agent` (after `cont` until the pong). The state file is read from the page "
        "cache. The QEMU is SIGKILLed (by pid) and its files (and namespace) removed after each "
        "run. The naive "
        "restore does no identity step (its copies would all share RNG state, hostname and "
        "machine-id); a forkvm spawn does that extra work inside its timing.",
        "",
        f"**spawn_warm_pool** (N runs): `PUT /v1/snapshots/{{id}}/pool {{\"size\":"
        f"{args.pool_size}}}`; before each run `GET /v1/info` is polled until the pool shows "
        f"`ready == size == {args.pool_size}`, then {args.pool_settle:.2f} s of rest (not timed), "
        "then one timed spawn exactly as above; the response must say `from_pool: true` or the "
        "bench fails. The pool refills in the background after each claim, which is why each "
        "run first waits for it. Pool size back to 0 at the end.",
        "",
        f"**{NAT}** (N runs; the default configuration): a second source cold-booted exactly "
        "as above but without `network` (so `nat`: its namespace, tap and uplink), settled "
        f"{args.settle:.0f} s, snapshotted, and DELETEd; one clone spawned and deleted "
        "(untimed, it verifies the files); then a pool of the same size and N runs exactly as "
        "for spawn_warm_pool, but each `POST /v1/sandboxes {\"snapshot\":\"<id>\"}` leaves "
        "`network` and `wait_for_network` at their defaults, so the clone gets `nat` (checked) "
        "and the 201 comes only after the agent's probe of the gateway came back. A pooled "
        "process's namespace and tap exist before the claim; the uplink and its rules are made "
        "at the claim (`network`, before the resume). `network_ready` is the resume until the "
        "probe's answer (so it includes `identity`). The naive restore has no counterpart of "
        "either: its ratio to this case is given for orientation, not as the target. Pool back "
        "to 0 and the snapshot DELETEd (`?force=true`) after the case.",
        "",
        f"**{burst}** ({args.burst_runs} runs, pool 0): the client wall time of one "
        f"`POST /v1/sandboxes {{\"snapshot\":\"<id>\",\"network\":\"none\","
        f"\"count\":{args.burst_size}}}` "
        "(the daemon starts all clones concurrently and answers when every one has taken its "
        f"identity). `{burst}_child` rows are each child's server `total_ms`. All DELETEd after.",
        "",
        f"**Memory.** For each K: one `POST … \"network\":\"none\", \"count\": K`, "
        f"{args.idle:.0f} s idle, then for "
        "each clone `GET /v1/sandboxes/{id}` (its `memory`: `rss_kib`, `pss_kib`, "
        "`private_dirty_kib`, from `/proc/<pid>/smaps_rollup` of its QEMU) summed; the same "
        "file is read directly for the Pss_Anon/Pss_File/Pss_Shmem split. `/proc/meminfo` "
        "(MemAvailable, Shmem, Cached) is read before the spawn and after the idle period as a "
        "cross-check. Then the naive copies: started one after another (each a naive restore "
        "as above, with its own fresh `share=on` RAM file in /dev/shm and its own disk copy"
        + (" and namespace" if nic else "") + "), "
        f"all left running; at each K reached, {args.idle:.0f} s idle, then the same smaps "
        "figures per QEMU plus the blocks allocated to each RAM file. Before each copy the "
        f"bench checks that MemAvailable stays above {args.mem_reserve_mib} MiB "
        "(`--mem-reserve-mib`) after it, and stops adding copies otherwise (the host has no "
        "swap and runs other work); the largest K is then extrapolated linearly from the "
        "per-copy mean, which is exact up to the few MiB of shared QEMU code pages because "
        "nothing else is shared between naive copies. All naive QEMUs are SIGKILLed by pid and "
        "their files removed afterwards.",
    ]


def print_summary(rows, mem_rows, clones_max, jail=()) -> None:
    print("\nSummary (ms)")
    print("\n".join(rp.stats_text(stats_rows(rows), case_width=21, with_n=True)))
    print("\nMemory (MiB)")
    print(f"{'K':>4} {'kind':<22}{'VMs':>5}{'ΣPSS':>9}{'ΣRSS':>9}{'Σdirty':>9}{'RAM files':>10}"
          f"{'total':>9}{'per VM':>8}")
    for r in mem_rows:
        tot = r["pss_kib"] if r["kind"] == "forkvm" else r["total_kib"]
        per = r["per_vm_pss_kib"] if r["kind"] == "forkvm" else r["per_vm_total_kib"]
        kind = r["kind"] + ("" if r["measured"] == "yes" else " (extrapolated)")
        print(f"{r['k']:>4} {kind:<22}{r['vms']:>5}{mib(r['pss_kib']):>9}{mib(r['rss_kib']):>9}"
              f"{mib(r['private_dirty_kib']):>9}{mib(r['shm_alloc_kib']):>10}{mib(tot):>9}"
              f"{mib(per, 1):>8}")
    kf = key_figures(rows, mem_rows, clones_max)
    print(f"\nwarm-pool spawn p50 {kf['warm_p50']:,.0f} ms vs naive restore p50 "
          f"{kf['naive_p50']:,.0f} ms: {kf['speedup']:.2f}× (target ≥ {SPEED_TARGET:.0f}×: "
          f"{'PASS' if kf['speedup'] >= SPEED_TARGET else 'MISS'})")
    if kf["nat_p50"] == kf["nat_p50"]:
        print(f"default configuration (nat, wait_for_network) warm-pool spawn p50 "
              f"{kf['nat_p50']:,.0f} ms: naive restore (no network) / that = "
              f"{kf['nat_speedup']:.2f}×")
    if jail:
        print("\nJail cost (jailed ÷ unjailed, comparison segments; ms)")
        for r in jail:
            j, u = r[rp.JAILED], r[rp.UNJAILED]
            print(f"  {r['label']:<36} jailed {unit_ms(j['p50'])}/{unit_ms(j['p90'])}  unjailed "
                  f"{unit_ms(u['p50'])}/{unit_ms(u['p90'])}  ratio p50 {r['ratio_p50']:.3f}× "
                  f"p90 {r['ratio_p90']:.3f}×  ÷ naive {r['jailed_vs_naive']:.3f}× / "
                  f"{r['unjailed_vs_naive']:.3f}×")
    if kf["fk"] and kf["nv"]:
        print(f"{clones_max} clones Σ PSS {mib(kf['fk']['pss_kib'])} MiB vs {clones_max} naive "
              f"copies {mib(kf['nv']['total_kib'])} MiB"
              + (" (extrapolated)" if kf["nv"]["measured"] != "yes" else "")
              + f": {kf['mem_ratio']:.1%} (target < {MEMORY_TARGET:.0%}: "
              f"{'PASS' if kf['mem_ratio'] < MEMORY_TARGET else 'MISS'})")
    if kf["fk"]:
        print(f"{clones_max} idle clones Σ PSS {mib(kf['fk']['pss_kib'])} MiB (target ≤ "
              f"{DENSITY_TARGET_MIB:,} MiB: {'PASS' if density_ok(kf['fk']) else 'MISS'})")


# --------------------------------------------------------------------------


def swap_total_kib() -> int:
    try:
        return fb.meminfo().get("SwapTotal", 0)
    except OSError:
        return 0


def make_source(d: fb.Daemon, args, label: str) -> tuple[dict, dict, float]:
    """Cold-boot a source with network none, let it settle, snapshot it
    (`shared`). Returns (source, snapshot, snapshot client wall ms); the source
    is still running."""
    src = d.create_cold(memory_mib=args.memory, cpus=1, network="none")
    if (src.get("network") or {}).get("mode", "none") != "none":
        raise fb.BenchError(f"the source asked for network none has {src.get('network')}")
    src["_uid"] = check_jail(d, src)
    print(f"[{label} source] {src['id']} cold-booted in {src['timings']['total_ms']:.0f} ms "
          f"(network none, QEMU uid {src['_uid']}); settling {args.settle:.0f} s", flush=True)
    time.sleep(args.settle)
    t0 = time.perf_counter()
    snap = d.api.request("POST", f"/v1/sandboxes/{src['id']}/snapshot",
                         {"tag": "bench-spawn"}, expect=(201,))
    wall = ms_since(t0)
    if snap.get("kind") != "shared":
        raise fb.BenchError(f"expected a shared snapshot of a cold-booted VM: {snap}")
    print(f"[{label} snapshot] {snap['id']}: {wall:.0f} ms wall, source paused "
          f"{(snap.get('timings') or {}).get('pause_ms', 0):.0f} ms; memory.img "
          f"{snap['sizes']['memory_allocated_bytes'] / 2**20:.1f} MiB allocated", flush=True)
    return src, snap, wall


def naive_source(d: fb.Daemon, src: dict, args, seg, ctx: dict) -> dict:
    """Save `src` (a source of an unjailed daemon, just snapshotted) the naive
    way into <home>/naive (the caller keeps that home until the end) and
    record it in ctx; returns the naive_save row."""
    work = os.path.join(d.home, "naive")
    os.mkdir(work)
    saved = nv.naive_save(d, src["id"], src["pid"], args.memory, work)
    ctx["saved"], ctx["naive_work"], ctx["naive_home"] = saved, work, d.home
    ctx["naive_nic"] = naive_netns(saved, "x") is not None
    ctx["naive_segment"] = seg
    print(f"[naive_save] {saved.save_ms:.0f} ms, state file "
          f"{saved.state_bytes / 2**20:.1f} MiB (capabilities turned off: "
          f"{', '.join(saved.caps_reset) or 'none'}; source left '{saved.status}', "
          "then deleted)", flush=True)
    return {"case": "naive_save", "run": 1, "total_ms": saved.save_ms,
            "state_bytes": saved.state_bytes, "jail": rp.UNJAILED, "segment": seg, "uid": 0}


def jail_segment(seg: int, side: str, runs: int, args, ctx: dict, jrows: list,
                 make_naive: bool) -> None:
    """One segment of the jail comparison: a private daemon (`side`), its own
    source and snapshot, `runs` spawn_cold_pool_off then `runs`
    spawn_warm_pool (each run as in the main measurements). With
    `make_naive`, the source is also saved for the naive baseline (then
    `runs` may be 0: only that)."""
    print(f"==> segment {seg}: {side} daemon"
          + (" (also the naive baseline's source)" if make_naive else ""), flush=True)
    with start_daemon(args, side, keep_home=make_naive) as d:
        now = fb.other_qemu_processes(exclude_substrings=(d.home, ctx.get("shm")))
        ctx["others"].update(now)
        ctx["busy_segments"] += bool(now)
        meter = fb.CpuMeter(roots=[d.proc.pid])
        src, snap, _ = make_source(d, args, f"seg {seg} {side}")
        snap_id = snap["id"]
        try:
            try:
                if make_naive:
                    jrows.append(naive_source(d, src, args, seg, ctx))
            finally:
                d.delete(src["id"])
            sb, wall = spawn_one(d, snap_id)  # verifies the snapshot's files once
            d.delete(sb["id"])

            def measured(fn, *a):
                meter.start()
                row = fn(*a)
                row.update(other_cpu_cores=meter.other_cores(), jail=side, segment=seg)
                jrows.append(row)

            for i in range(1, runs + 1):
                measured(run_spawn_cold, d, snap_id, i, runs)
            if runs:
                d.api.request("PUT", f"/v1/snapshots/{snap_id}/pool", {"size": args.pool_size})
                try:
                    for i in range(1, runs + 1):
                        measured(run_spawn_warm, d, snap_id, args.pool_size, args.pool_settle,
                                 i, runs)
                    wait_pool(d, snap_id, args.pool_size)
                finally:
                    d.api.request("PUT", f"/v1/snapshots/{snap_id}/pool", {"size": 0})
                pool_off(d, snap_id)
        finally:
            if d.proc is not None and d.proc.poll() is None:
                delete_snapshot(d, snap_id)


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


def delete_snapshot(d: fb.Daemon, snap_id: str) -> None:
    """DELETE ?force=true (its clones and pooled processes go too); 404 is fine."""
    try:
        d.api.request("DELETE", f"/v1/snapshots/{snap_id}?force=true", expect=(204, 404))
    except Exception as e:  # noqa: BLE001 - the daemon stop cleans up too
        print(f"cleanup: DELETE snapshot {snap_id}: {e}", flush=True)


def run_nat_case(d: fb.Daemon, args, measured, ctx: dict) -> None:
    """spawn_warm_pool_nat: a second source cold-booted with the default
    networking (nat), settled and snapshotted like the first, then deleted;
    pool of the same size; N pooled spawns with the default request (no
    `network`, so nat and wait_for_network). The snapshot's id is left in
    ctx["nat_snapshot_id"] for the caller to delete."""
    src = d.create_cold(memory_mib=args.memory, cpus=1)
    try:
        if (src.get("network") or {}).get("mode") != "nat":
            raise fb.BenchError(f"the default-network source has no nat network: "
                                f"{src.get('network')}")
        print(f"[{NAT} source] {src['id']} cold-booted in {src['timings']['total_ms']:.0f} ms "
              f"(network nat); settling {args.settle:.0f} s", flush=True)
        time.sleep(args.settle)
        snap = d.api.request("POST", f"/v1/sandboxes/{src['id']}/snapshot",
                             {"tag": "bench-spawn-nat"}, expect=(201,))
    finally:
        d.delete(src["id"])
    snap_id = snap["id"]
    ctx["nat_snapshot_id"] = snap_id
    ctx["nat_snapshot"] = snap
    print(f"[{NAT} snapshot] {snap_id} (source deleted)", flush=True)
    # Warm-up as for the first snapshot: the first clone verifies its files.
    sb, wall = spawn_one(d, snap_id, None, "nat")
    d.delete(sb["id"])
    ctx["nat_first_spawn"] = clone_row("first_spawn", 1, sb, wall)
    print(f"[{NAT} first clone, not counted] {wall:.0f} ms", flush=True)
    d.api.request("PUT", f"/v1/snapshots/{snap_id}/pool", {"size": args.pool_size})
    try:
        for i in range(1, args.runs + 1):
            measured(run_spawn_warm, d, snap_id, args.pool_size, args.pool_settle, i, args.runs,
                     NAT, None, "nat")
        wait_pool(d, snap_id, args.pool_size)
    finally:
        d.api.request("PUT", f"/v1/snapshots/{snap_id}/pool", {"size": 0})
    ctx["nat_pool_leftovers"] = pool_off(d, snap_id, network=None, expect_network="nat")


def speed_reason(rows, kf, accel: str) -> str:
    """Where a pooled spawn's time goes, compared with the naive restore; every
    claim is worded from this run's p50s."""
    warm = kf["warm_p50"]
    ident = p50(rows, "spawn_warm_pool", "identity_ms")
    rest = p50(rows, "spawn_warm_pool", "restore_ms")
    server = p50(rows, "spawn_warm_pool", "server_total_ms")
    agent = p50(rows, "naive_restore", "agent_ms")
    load = p50(rows, "naive_restore", "load_ms")
    qstart = p50(rows, "naive_restore", "qemu_start_ms")
    need = kf["naive_p50"] / SPEED_TARGET
    other = warm - rest - ident
    out = [
        f"A {SPEED_TARGET:.0f}× win needs a pooled spawn of at most {need:,.0f} ms. Of the "
        f"pooled spawn's p50 of {warm:,.0f} ms (server {server:,.0f}), loading the device "
        f"state and resuming takes {rest:,.0f} ms and the identity step {ident:,.0f} ms (the "
        "daemon's `identity_ms`: the identity request — RNG reseed, clock, hostname, "
        "machine-id and instance-id — whose answer also shows the agent alive, then a second "
        "clock set)"
        + (f", leaving {other:,.0f} ms for the rest of the daemon's work and the HTTP round "
           "trip." if other >= 0 else "."),
    ]
    if ident > need:
        out.append(f"The identity step alone is {ident / need:.1f}× the whole {need:,.0f} ms "
                   "budget.")
    else:
        out.append(f"The identity step alone takes {ident / need:.0%} of that budget.")
    if accel == "tcg":
        out.append("It runs inside the guest, and under TCG every guest instruction is "
                   "emulated (and a guest that has just resumed first has to translate the code "
                   "it runs).")
    else:
        out.append("It runs inside the guest.")
    wake = (f"The naive restore's own cont→pong is {agent:,.0f} ms, "
            + ("so the guest's wake-up and one agent round trip alone already cost more than "
               f"the {SPEED_TARGET:.0f}× budget" if agent > need else
               f"{agent / need:.0%} of the {SPEED_TARGET:.0f}× budget")
            + f"; forkvm removes the {load:,.0f} ms load of all RAM from the state file (and, "
            f"with the pool, the {qstart:,.0f} ms QEMU start), but the guest's wake-up is common "
            "to both, and the identity step is extra work the naive restore skips (its copies "
            "would share RNG state, hostname and ids)")
    diff = ident - agent
    wake += (f": it takes {diff:,.0f} ms more than the naive copy's single ping after `cont`."
             if diff > 0 else
             f", yet it takes {-diff:,.0f} ms less than the naive copy's single ping after "
             "`cont`.")
    out.append(wake)
    out.append("These guest-side steps depend on the accelerator; "
               + ("this run could only use TCG." if accel == "tcg" else f"this run used {accel}."))
    return " ".join(out)


def density_ok(fk: dict) -> bool:
    return fk["pss_kib"] / 1024 <= DENSITY_TARGET_MIB


def density_reason(fk: dict, ctx: dict) -> str:
    """Per clone, where the PSS of the largest K goes (smaps classes), against
    the per-clone budget of the density target."""
    k = fk["vms"]
    if f"smaps_{smaps.CLASSES[0]}_pss_kib" not in fk:
        return "no smaps breakdown in this run."
    per = {c: fk[f"smaps_{c}_pss_kib"] / k / 1024 for c in smaps.CLASSES}
    dirty = {c: fk[f"smaps_{c}_dirty_kib"] / k / 1024 for c in smaps.CLASSES}
    budget = DENSITY_TARGET_MIB / k
    parts = smaps.describe(per, dirty)
    out = (f"Per clone, mean of the {k} at K={k} (/proc/<pid>/smaps by mapping, "
           f"bench/common/smaps.py; Σ {sum(per.values()):.1f} MiB): {parts}. "
           f"The target allows {budget:.1f} MiB per clone.")
    if ctx["info"]["accel"]["kind"] == "tcg" and per["tcg_buffer"] > 0:
        rest = sum(per.values()) - per["tcg_buffer"]
        out += (f" Under TCG every QEMU holds its own translated code: without the translation "
                f"buffer a clone would hold {rest:.1f} MiB, "
                + ("within" if rest <= budget else "still above") + " that budget. KVM runs "
                "guest code natively and has no translation buffer; this host can only use TCG.")
    return out


def mem_explanation(mem_rows, ctx, args) -> str:
    nv = [r for r in mem_rows if r["kind"] == "naive" and r["measured"] == "yes"]
    per_file = (nv[-1]["shm_alloc_kib"] / nv[-1]["vms"] / 1024) if nv else math.nan
    snap = ctx.get("snapshot") or {}
    alloc = (snap.get("sizes") or {}).get("memory_allocated_bytes", 0) / 2**20
    fk = [r for r in mem_rows if r["kind"] == "forkvm"]
    cross = ""
    if nv:
        r = nv[-1]
        cross += (f"Cross-check with /proc/meminfo (naive, K={r['k']}, after vs before the first "
                  f"copy): Shmem grew by {mib(r['shmem_delta_kib'])} MiB against Σ RAM files "
                  f"{mib(r['shm_alloc_kib'])} MiB, and MemAvailable fell by "
                  f"{mib(r['memavail_drop_kib'])} MiB against the total {mib(r['total_kib'])} MiB. ")
    if fk:
        r = fk[-1]
        cross += (f"For forkvm at K={r['k']}, MemAvailable fell by {mib(r['memavail_drop_kib'])} "
                  f"MiB against Σ PSS {mib(r['pss_kib'])} MiB (Cached changed by "
                  f"{mib(r['cached_delta_kib'])} MiB, Shmem by {mib(r['shmem_delta_kib'])} MiB); "
                  "meminfo is host-wide, so anything else allocating or freeing memory at the "
                  "same time shows up in these deltas. ")
    shm_fk = max((r["pss_shmem_kib"] for r in fk), default=0)
    return (
        "**What is summed.** *forkvm*: Σ PSS of the clones' QEMU processes (from the API; "
        + ("Pss_Shmem is 0 for them" if shm_fk == 0 else
           f"their Pss_Shmem is at most {mib(shm_fk)} MiB in all")
        + ", and they have no RAM file of their own: each maps the "
        "snapshot's `memory.img` copy-on-write, so pages they only read are shared page cache "
        "that PSS divides among the clones, and pages they write become private anonymous "
        "memory). The snapshot's `memory.img` itself "
        f"({alloc:.0f} MiB allocated, on the disk under the daemon home) is page cache; the "
        "part the clones map is inside their PSS. *naive*: each copy's RAM is a `share=on` file "
        "in /dev/shm; its pages are shmem, counted once in the file's allocated blocks and "
        "again in the QEMU's RSS/PSS (as Pss_Shmem) while mapped. To avoid double counting, "
        "the total is Σ (PSS − Pss_Shmem) + Σ allocated bytes of the RAM files, i.e. QEMU's own "
        "anonymous and file pages plus the guest RAM exactly once. " + cross
        + (f"Each naive copy's RAM file ends up with {per_file:.0f} MiB allocated of "
           f"{args.memory} MiB although the state file holds only "
           f"{ctx['saved'].state_bytes / 2**20:.0f} MiB, and only "
           f"{nv[-1]['per_vm_private_dirty_kib'] / 1024:.0f} MiB per copy are dirty: the "
           "incoming migration checks each zero page of the stream by reading the destination "
           "page (QEMU's `ram_handle_zero` only writes a page that is not already zero), and a "
           "read fault on a shared tmpfs mapping allocates the page, so a naive restore into a "
           "fresh `share=on` file populates the whole guest RAM, mostly with clean zero pages. "
           + (f"That is why {max(args.clones)} naive copies do not fit in this host's RAM next "
              f"to its other work, and the K={max(args.clones)} point is extrapolated."
              if nv[-1]["vms"] < max(args.clones) else "")
           if nv and per_file > 0.9 * args.memory else ""))


if __name__ == "__main__":
    rp.run_main("bench_spawn", main)
