"""The spawn benchmark's key figures and verdicts: p50s, the speed-up over
the naive restore, the memory density target, and why each passed or failed.
"""

from __future__ import annotations

import math

import report as rp
import smaps
from spawn_cases import DENSITY_TARGET_MIB, NAT, SPEED_TARGET, cases_of, fmt


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
