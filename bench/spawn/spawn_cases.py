"""The spawn benchmark's cases: the CSV columns and case names, the jailed /
unjailed daemons, and one run each of a cold spawn, a warm-pool spawn (none
and nat network), a burst and the naive QEMU restore, the sources they start
from and one jail segment.
"""

from __future__ import annotations

import os
import time

import forkvm_bench as fb
import naive as nv
import report as rp
import smaps


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


def run_naive(saved, work, shm, run, n) -> dict:
    vm = nv.naive_restore(saved, os.path.join(work, f"r{run}"), os.path.join(shm, f"r{run}.mem"),
                          f"fvb-restore-{run}", netns=nv.copy_netns(saved, f"r{run}"))
    try:
        row = {"case": "naive_restore", "run": run, **vm.timings}
    finally:
        vm.stop()
    print(f"[naive_restore {run}/{n}] {row['total_ms']:.0f} ms  (qemu {row['qemu_start_ms']:.0f}, "
          f"load {row['load_ms']:.0f}, cont {row['cont_ms']:.0f}, agent {row['agent_ms']:.0f})",
          flush=True)
    return row


fmt = rp.fmt


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
    ctx["naive_nic"] = nv.copy_netns(saved, "x") is not None
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
