"""The branch benchmark's cases: booting and cloning sources, the guest
helpers (memory holder, counter, chain files), and the experiments that
sweep RAM size, dirty memory, consecutive branches and diff chains.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import forkvm_bench as fb
import naive as nv
from branch_modes import (
    Ctx, branch, check_jail, delete_snapshot, fb_fmt, mib, ms_since, naive, qemu_live,
    source_of, stop_cont,
)


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
    check_jail(c, src)
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


def take_base(c: Ctx, sid: str, label: str) -> dict:
    """The base of a clone source: `POST /v1/sandboxes/{sid}/snapshot` of a
    booted source, which must give a `shared` snapshot (the endpoint saves as
    a diff branch does, and a sandbox that owns its RAM falls back to a full
    `shared` save). Kept in c.snaps until the experiment deletes it."""
    t0 = time.perf_counter()
    s = c.d.api.request("POST", f"/v1/sandboxes/{sid}/snapshot", {}, expect=(201,), timeout=900)
    wall = ms_since(t0)
    c.snaps.add(s["id"])
    if s.get("kind") != "shared" or s.get("depth", 0) != 0 or s.get("state") != "ready":
        raise fb.BenchError(f"the base snapshot of {sid} is {s.get('kind')} at depth "
                            f"{s.get('depth')} ({s.get('state')}), expected a ready `shared` one")
    if s.get("pool_size"):
        raise fb.BenchError(f"the base snapshot {s['id']} has a warm pool of {s['pool_size']}")
    t = s.get("timings") or {}
    print(f"[{label}] base snapshot {s['id']} of {sid}: kind shared, pause "
          f"{fb_fmt(t.get('pause_ms'), 1)} ms, total {wall:.0f} ms (memory.img "
          f"{fb_fmt(mib((s.get('sizes') or {}).get('memory_allocated_bytes')))} MiB allocated)  "
          f"{c.elapsed()}", flush=True)
    return s


def spawn_from(c: Ctx, snap_id: str) -> tuple[dict, float]:
    """`POST /v1/sandboxes {"snapshot": snap_id, "count": 1}`: (the clone, client ms)."""
    t0 = time.perf_counter()
    r = c.d.api.request("POST", "/v1/sandboxes", {"snapshot": snap_id, "count": 1},
                        expect=(201,), timeout=900)
    wall = ms_since(t0)
    sbs = r.get("sandboxes") or []
    for sb in sbs:
        c.d.sandboxes.add(sb["id"])
    if len(sbs) != 1:
        raise fb.BenchError(f"asked for one clone of {snap_id}, got {len(sbs)}: {r}")
    sb = sbs[0]
    t = sb.get("timings") or {}
    if sb.get("snapshot") != snap_id or t.get("restore_ms") is None \
            or sb.get("state") != "running":
        raise fb.BenchError(f"sandbox {sb.get('id')} is not a running clone of {snap_id}: {sb}")
    check_jail(c, sb)
    return sb, wall


def clone_source(c: Ctx, base: dict, label: str, settle: bool = True) -> dict:
    """Spawn the clone source from `base`, check its RAM is a private mapping
    of a memory image, and let it rest like a booted source."""
    size = base["memory_mib"]
    need_memory(size)
    sb, wall = spawn_from(c, base["id"])
    private = c.clone_private_mib(sb["id"])
    if private is None:
        raise fb.BenchError(f"clone {sb['id']} has no private mapping of the base's memory image")
    rest = c.args.settle if settle else 0.0
    print(f"[{label}] clone source {sb['id']}: spawned from {base['id']} in {wall:.0f} ms "
          f"(server {sb['timings']['total_ms']:.0f} ms; {private:.1f} MiB private); settling "
          f"{rest:.0f} s  {c.elapsed()}", flush=True)
    time.sleep(rest)
    return sb


def probe_diff_fallback(c: Ctx, sid: str) -> None:
    """Once, on a booted source: `"mode": "diff"` must fall back to a full
    `shared` snapshot (a sandbox that owns its RAM has no parent to diff
    against). Recorded for RESULTS.md; the snapshot is deleted."""
    if c.diff_fallback is not None:
        return
    r = c.d.api.request("POST", f"/v1/sandboxes/{sid}/branch", {"mode": "diff", "count": 0},
                        expect=(201,), timeout=900)
    snap = r["snapshot"]
    c.snaps.add(snap["id"])
    delete_snapshot(c, snap["id"])
    c.diff_fallback = (f"kind `{snap.get('kind')}`, depth {snap.get('depth')}, pause "
                       f"{r['pause_ms']:.1f} ms (copy_memory "
                       f"{fb_fmt((snap.get('timings') or {}).get('copy_memory_ms'))} ms)")
    print(f"[diff fallback] diff branch of booted source {sid}: {c.diff_fallback}", flush=True)
    if snap.get("kind") != "shared":
        raise fb.BenchError(f"a diff branch of a booted source gave kind {snap.get('kind')}, "
                            "expected the `shared` fallback")


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
    return len(nv._qemu_img_chain(str(tops[-1])))


def exp_size(c: Ctx, size: int) -> None:
    a = c.args
    label = f"size {size} MiB"
    src = boot_source(c, size, label)
    sid = src["id"]
    base = None
    try:
        base = take_base(c, sid, label)
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
        probe_diff_fallback(c, sid)
    finally:
        c.d.delete(sid)
    try:
        clone = clone_source(c, base, label)
        cid = clone["id"]
        try:
            for i in range(1, a.runs + 1):
                c.measured(branch, cid, "diff", "size", size, None, i, a.runs, want_depth=1)
            nn = min(a.naive_runs, a.clone_naive_runs)
            for i in range(1, nn + 1):
                for v in ("naive_clone", "naive_nolimit_clone"):
                    c.measured(naive, cid, v, "size", size, None, i, nn)
        finally:
            c.d.delete(cid)
    finally:
        delete_snapshot(c, base["id"])


def hold(c: Ctx, sid: str, dirty: int, label: str, who: str) -> None:
    """Fill and hold `dirty` MiB in the guest, note it, and let it settle."""
    h = start_holder(c, sid, dirty)
    print(f"[{label}] {who}: guest pid {h['pid']} holds {h['rss_mib']:.0f} MiB resident "
          f"(filled in {h['fill_s']:.1f} s guest time); settling {c.args.settle:.0f} s  "
          f"{c.elapsed()}", flush=True)
    c.notes.append(f"{label}, {who}: holder filled {dirty} MiB in {h['fill_s']:.1f} s, "
                   f"VmRSS {h['rss_mib']:.0f} MiB")
    time.sleep(c.args.settle)


def exp_dirty(c: Ctx, dirty: int) -> None:
    a = c.args
    size = a.dirty_memory
    label = f"dirty {dirty} MiB"
    src = boot_source(c, size, label)
    sid = src["id"]
    base = None
    try:
        base = take_base(c, sid, label)  # before the fill: the clone fills its own
        if dirty:
            hold(c, sid, dirty, label, "booted source")
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
    try:
        clone = clone_source(c, base, label, settle=not dirty)
        cid = clone["id"]
        try:
            if dirty:
                hold(c, cid, dirty, label, "clone")
            for i in range(1, a.dirty_runs + 1):
                c.measured(branch, cid, "diff", "dirty", size, dirty, i, a.dirty_runs,
                           want_depth=1)
            for i in range(1, a.dirty_naive_runs + 1):
                for v in ("naive_clone", "naive_nolimit_clone"):
                    c.measured(naive, cid, v, "dirty", size, dirty, i, a.dirty_naive_runs)
        finally:
            c.d.delete(cid)
    finally:
        delete_snapshot(c, base["id"])


def consecutive_block(c: Ctx, sid: str, mode: str, size: int, k: int) -> dict:
    """K back-to-back branches of `sid` in `mode`, with the guest counter read
    before and after; every snapshot of the block is kept until it ends."""
    a = c.args
    depth0 = disk_chain_depth(c, sid)
    readings = []

    def reading(label):
        v = read_counter(c, sid)
        readings.append((label, time.monotonic(), v))
        c.rows.append({"experiment": "consecutive", "mode": f"counter_{mode}",
                       "source": source_of(mode), "size_mib": size, "run": len(readings),
                       "counter": v, "note": label})
        return v

    reading("before")
    time.sleep(a.counter_gap)
    reading(f"before + {a.counter_gap:.0f} s")
    t0 = time.perf_counter()
    kept = []
    try:
        for i in range(1, k + 1):
            kept.append(c.measured(branch, sid, mode, "consecutive", size, None, i, k, keep=True,
                                   want_depth=1 if mode == "diff" else None))
        block_ms = ms_since(t0)
        reading(f"right after the {k} branches")
        time.sleep(a.counter_gap)
        reading(f"after + {a.counter_gap:.0f} s")
    finally:
        for r in kept:
            delete_snapshot(c, r["snapshot"])
    depth1 = disk_chain_depth(c, sid)
    (_, tb0, v0), (_, tb1, v1), (_, ta0, v2), (_, ta1, v3) = readings
    ok = None not in (v0, v1, v2, v3) and v0 <= v1 <= v2 < v3
    rate_b = (v1 - v0) / (tb1 - tb0) if ok else math.nan
    rate_a = (v3 - v2) / (ta1 - ta0) if ok else math.nan
    pauses = sum(r["pause_ms"] for r in kept)
    check = {"mode": mode, "source": source_of(mode), "k": k, "values": [v0, v1, v2, v3],
             "ok": ok, "rate_before": rate_b, "rate_after": rate_a, "block_ms": block_ms,
             "during_rate": (v2 - v1) / (ta0 - tb1) if ok else math.nan,
             "pauses_ms": pauses, "depth_before": depth0, "depth_after": depth1}
    print(f"[consecutive {mode}] {k} branches in {block_ms / 1000:.1f} s (sum of pauses "
          f"{pauses:.0f} ms); counter {v0} -> {v1} (+{a.counter_gap:.0f} s) | {v2} after "
          f"-> {v3} (+{a.counter_gap:.0f} s): {'advancing' if ok else 'NOT ADVANCING'}; "
          f"rate {rate_b:.1f}/s before, {rate_a:.1f}/s after; disk chain {depth0} -> "
          f"{depth1} layers  {c.elapsed()}", flush=True)
    if not ok:
        raise fb.BenchError(f"the {source_of(mode)} source's counter did not keep advancing: "
                            f"{readings}")
    return check


def exp_consecutive(c: Ctx, ctx: dict) -> None:
    a = c.args
    size, k = a.consecutive_memory, a.consecutive
    checks = ctx.setdefault("counter_checks", [])
    src = boot_source(c, size, "consecutive")
    sid = src["id"]
    base = None
    try:
        cpid = start_counter(c, sid)
        print(f"[consecutive] counter loop running in the guest (pid {cpid})", flush=True)
        base = take_base(c, sid, "consecutive")  # with the loop running: the clone runs it too
        for mode in ("live", "full"):
            checks.append(consecutive_block(c, sid, mode, size, k))
    finally:
        c.d.delete(sid)
    try:
        clone = clone_source(c, base, "consecutive")
        try:
            if read_counter(c, clone["id"]) is None:
                raise fb.BenchError("the clone source has no counter: the loop did not survive "
                                    "the base snapshot")
            checks.append(consecutive_block(c, clone["id"], "diff", size, k))
        finally:
            c.d.delete(clone["id"])
    finally:
        delete_snapshot(c, base["id"])


CHAIN_FILE = "/root/chain-{k}.txt"


def chain_link(c: Ctx, head: dict, k: int, size: int) -> dict:
    """Link k of the chain: spawn from `head`, fill --chain-dirty MiB (held by
    a guest process) and write a file, branch diff (count 0, kept)."""
    a = c.args
    x = clone_source(c, head, f"chain link {k}", settle=False)
    xid = x["id"]
    try:
        if a.chain_dirty:
            start_holder(c, xid, a.chain_dirty)
        r = guest_sh(c, xid, 'echo "link $0 $(date +%s%N)" > "$1" && sync', str(k),
                     CHAIN_FILE.format(k=k))
        if r["exit_code"] != 0:
            raise fb.BenchError(f"chain link {k}: cannot write {CHAIN_FILE.format(k=k)}: {r}")
        row = c.measured(branch, xid, "diff", "chain_build", size, a.chain_dirty, k,
                         a.chain_depth, keep=True, want_depth=k)
    finally:
        c.d.delete(xid)
    return c.d.api.request("GET", f"/v1/snapshots/{row['snapshot']}")


def check_chain_child(c: Ctx, sid: str, depth: int, label: str) -> None:
    """A clone of depth k must see the files of links 1..k (and nothing newer)."""
    want = [CHAIN_FILE.format(k=k) for k in range(1, c.args.chain_depth + 1)]
    # sh -c binds the first argument after the script to $0, the rest to "$@"
    r = guest_sh(c, sid, 'for f in "$@"; do if [ -e "$f" ]; then echo 1; else echo 0; fi; done',
                 "check", *want)
    seen = r["stdout"].split()
    expect = ["1" if k <= depth else "0" for k in range(1, c.args.chain_depth + 1)]
    if r["exit_code"] != 0 or seen != expect:
        raise fb.BenchError(f"a clone of {label} sees the chain files {seen}, expected {expect}")


def spawn_chain(c: Ctx, label: str, snap: dict, depth: int, run: int, n: int,
                position: int) -> dict:
    """One timed spawn from a chain snapshot; the child is deleted after."""
    sb, wall = spawn_from(c, snap["id"])
    try:
        t = sb.get("timings") or {}
        if t.get("from_pool"):
            raise fb.BenchError(f"spawn from {label} came from a warm pool; pools must be off")
        if run == 1:
            check_chain_child(c, sb["id"], depth, label)  # not timed
    finally:
        c.d.delete(sb["id"])
    row = {"experiment": "chain", "mode": label, "source": "snapshot",
           "size_mib": snap["memory_mib"], "dirty_mib": c.args.chain_dirty, "run": run,
           "position": position, "snapshot": snap["id"], "snapshot_kind": snap["kind"],
           "depth": snap.get("depth"), "wall_ms": wall, "spawn_total_ms": t.get("total_ms"),
           "prepare_ms": t.get("prepare_ms"), "qemu_start_ms": t.get("qemu_start_ms"),
           "restore_ms": t.get("restore_ms"), "identity_ms": t.get("identity_ms"),
           "from_pool": t.get("from_pool")}
    print(f"[chain spawn {label} {run}/{n}] total {fb_fmt(row['spawn_total_ms'])} ms (prepare "
          f"{fb_fmt(row['prepare_ms'])}, qemu_start {fb_fmt(row['qemu_start_ms'])}, restore "
          f"{fb_fmt(row['restore_ms'])}, identity {fb_fmt(row['identity_ms'])}; client "
          f"{wall:.0f})  {c.elapsed()}", flush=True)
    return row


def exp_chain(c: Ctx, ctx: dict) -> None:
    a = c.args
    size, depth_max = a.chain_memory, a.chain_depth
    src = boot_source(c, size, "chain")
    try:
        base = take_base(c, src["id"], "chain")
    finally:
        c.d.delete(src["id"])
    targets = [("depth 0", base, 0)]
    head = base
    for k in range(1, depth_max + 1):
        head = chain_link(c, head, k, size)
        targets.append((f"depth {k}", head, k))
    t0 = time.perf_counter()
    flat = c.d.api.request("POST", f"/v1/snapshots/{head['id']}/flatten", {}, expect=(201,),
                           timeout=900)
    flat_wall = ms_since(t0)
    c.snaps.add(flat["id"])
    if flat.get("kind") != "shared" or flat.get("depth", 0) != 0 or flat.get("parent"):
        raise fb.BenchError(f"flatten gave kind {flat.get('kind')}, depth {flat.get('depth')}, "
                            f"parent {flat.get('parent')}: expected a standalone shared snapshot")
    ft = flat.get("timings") or {}
    fsz = flat.get("sizes") or {}
    c.rows.append({"experiment": "chain_build", "mode": "flatten", "source": "snapshot",
                   "size_mib": size, "dirty_mib": a.chain_dirty, "run": 1,
                   "snapshot": flat["id"], "snapshot_kind": flat["kind"], "depth": 0,
                   "snapshot_total_ms": ft.get("total_ms"), "wall_ms": flat_wall,
                   "snapshot_alloc_mib": mib(fsz.get("memory_allocated_bytes"))})
    print(f"[chain] flatten of {head['id']} (depth {depth_max}) -> {flat['id']}: "
          f"{flat_wall:.0f} ms, memory.img {fb_fmt(mib(fsz.get('memory_allocated_bytes')))} MiB "
          f"allocated  {c.elapsed()}", flush=True)
    targets.append(("flat", flat, depth_max))  # the content of the deepest head
    for label, snap, _ in targets:
        pool = c.d.api.request("GET", f"/v1/snapshots/{snap['id']}").get("pool_size")
        if pool:
            raise fb.BenchError(f"{label} ({snap['id']}) has a warm pool of {pool}")
    ctx["chain"] = {
        "base": base["id"], "flat": flat["id"], "flatten_ms": flat_wall,
        "snapshots": [{"label": label, "id": snap["id"], "kind": snap["kind"],
                       "depth": snap.get("depth", 0),
                       "memory_diff_mib": mib((snap.get("sizes") or {}).get("memory_diff_bytes")),
                       "memory_alloc_mib": mib((snap.get("sizes") or {})
                                               .get("memory_allocated_bytes"))}
                      for label, snap, _ in targets],
    }
    n = a.chain_runs
    print(f"[chain] {n} rounds of one spawn from each of {', '.join(t[0] for t in targets)} "
          "(order rotated each round; pools off)", flush=True)
    for run in range(1, n + 1):
        shift = (run - 1) % len(targets)
        for pos, (label, snap, depth) in enumerate(targets[shift:] + targets[:shift], start=1):
            c.measured(spawn_chain, label, snap, depth, run, n, pos)
    delete_snapshot(c, flat["id"])
    delete_snapshot(c, base["id"])  # force: the links are built on it
