"""The spawn benchmark's memory cases: PSS, RSS and dirty pages of k idle
forkvm clones and of k naive restored copies.
"""

from __future__ import annotations

import os
import time

import forkvm_bench as fb
import naive as nv
import smaps
from spawn_cases import delete_all, ms_since, spawn_batch


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
                                  netns=nv.copy_netns(saved, f"c{i}"))
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
