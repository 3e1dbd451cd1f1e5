"""The branch benchmark's jailed / unjailed comparison: the ABBA segments it
runs and its RESULTS.md section.
"""

from __future__ import annotations

import math
import shutil
import tempfile

import forkvm_bench as fb
import report as rp
from branch_modes import BRANCH_MODES, Ctx, branch, delete_snapshot, delete_snapshots, naive_modes
from branch_cases import boot_source, chain_link, clone_source, spawn_chain, take_base
from branch_stats import fmt_ms, p50, pstat, sel


def jail_sizes(c: Ctx, n: int) -> None:
    """Per --jail-sizes M: a booted source, its base, n × (full, live), then
    its clone and n diff branches, exactly as in exp_size (experiment
    `jail_size`; no naive, references or floor)."""
    for size in c.args.jail_sizes:
        label = f"jail {c.side} {size} MiB"
        src = boot_source(c, size, label)
        base = None
        try:
            base = take_base(c, src["id"], label)
            for i in range(1, n + 1):
                for mode in ("full", "live"):
                    c.measured(branch, src["id"], mode, "jail_size", size, None, i, n)
        finally:
            c.d.delete(src["id"])
        try:
            clone = clone_source(c, base, label)
            try:
                for i in range(1, n + 1):
                    c.measured(branch, clone["id"], "diff", "jail_size", size, None, i, n,
                               want_depth=1)
            finally:
                c.d.delete(clone["id"])
        finally:
            delete_snapshot(c, base["id"])


def jail_chain(c: Ctx, n: int) -> None:
    """A chain built as in exp_chain (no flatten), then n rounds of one spawn
    from depth 0 and one from the deepest head, order alternating."""
    a = c.args
    size = a.chain_memory
    src = boot_source(c, size, f"jail {c.side} chain")
    try:
        base = take_base(c, src["id"], f"jail {c.side} chain")
    finally:
        c.d.delete(src["id"])
    head = base
    for k in range(1, a.chain_depth + 1):
        head = chain_link(c, head, k, size)
    targets = [("depth 0", base, 0), (f"depth {a.chain_depth}", head, a.chain_depth)]
    for run in range(1, n + 1):
        order = targets if run % 2 else targets[::-1]
        for pos, (label, snap, depth) in enumerate(order, start=1):
            c.measured(spawn_chain, label, snap, depth, run, n, pos)
    delete_snapshot(c, base["id"])  # force: the links are built on it


def jail_segment(seg: int, side: str, n: int, args, ctx: dict) -> list[dict]:
    """One segment of the jail comparison under a private daemon (`side`);
    returns its rows, experiments renamed `jail_*`."""
    print(f"==> jail comparison, segment {seg}: {side} daemon, {n} per mode and size",
          flush=True)
    shm = tempfile.mkdtemp(prefix="fvb-branch-", dir="/dev/shm")
    with fb.Daemon(binary=args.binary, env=rp.jail_env(side)) as d:
        c = Ctx(d, shm, args, side)
        c.check_others()
        try:
            jail_sizes(c, n)
            if args.jail_chain and args.chain_runs:
                jail_chain(c, n)
        finally:
            delete_snapshots(c)
            ctx["others"].update(c.others)
            ctx["busy_runs"] += c.busy_runs
            ctx.setdefault("jail_uids", {}).setdefault(side, set()).update(c.uids)
            shutil.rmtree(shm, ignore_errors=True)
            for r in c.rows:
                r["experiment"] = r["experiment"].replace("jail_", "")  # chain_link's rows
                r["experiment"] = "jail_" + r["experiment"]
                r["segment"] = seg
                r["jail"] = side
    return c.rows


# (experiment, mode, size or None, key, label, naive (mode, key) of the main run or None)
def jail_metrics(rows, args) -> list[tuple]:
    out = []
    for size in args.jail_sizes:
        for mode in BRANCH_MODES:
            out.append(("jail_size", mode, size, "pause_ms", f"{mode} pause_ms, {size} MiB",
                        naive_modes(mode)[0]))
    depth = f"depth {args.chain_depth}"
    for label in ("depth 0", depth):
        out.append(("jail_chain", label, None, "spawn_total_ms",
                    f"spawn from chain {label}, total_ms", None))
    return out


def jail_ratios(rows, args) -> list[dict]:
    """Per jail metric with data: the jailed and unjailed summaries,
    jailed/unjailed at p50 and p90, and each side's p50 over the naive
    pause (QEMU defaults) of the main run at that size, on the same kind of
    source."""
    out = []
    for exp, mode, size, key, label, nmode in jail_metrics(rows, args):
        sides = {}
        for side in (rp.JAILED, rp.UNJAILED):
            sides[side] = pstat([r for r in sel(rows, exp, mode, size) if r["jail"] == side], key)
        if not (sides[rp.JAILED]["n"] or sides[rp.UNJAILED]["n"]):
            continue
        nv = pstat(sel(rows, "size", nmode, size)) if nmode else rp.summarize([])
        j, u = sides[rp.JAILED], sides[rp.UNJAILED]
        out.append({"label": label, rp.JAILED: j, rp.UNJAILED: u, "naive": nv, "naive_mode": nmode,
                    "ratio_p50": rp.ratio(j["p50"], u["p50"]), "ratio_p90": rp.ratio(j["p90"], u["p90"]),
                    "jailed_vs_naive": rp.ratio(j["p50"], nv["p50"]),
                    "unjailed_vs_naive": rp.ratio(u["p50"], nv["p50"])})
    return out


def times(v, digits: int = 4) -> str:
    return "–" if v is None or v != v else f"{v:.{digits}f}×"


def jail_section(rows, ctx, args, L) -> None:
    ratios = ctx.get("jail") or []
    L += ["", "## Jail cost", ""]
    if not ratios:
        L += ["Not measured (`--no-jail-compare`): every figure here is jailed; there is no "
              "unjailed counterpart in this run."]
        return
    jr = [r for r in rows if str(r["experiment"]).startswith("jail_")]
    segs = sorted({r["segment"] for r in jr})
    side_of = {r["segment"]: r["jail"] for r in jr}
    n = {s: len([r for r in jr if r["experiment"] == "jail_size" and r["mode"] == "live"
                 and r["jail"] == s and r["size_mib"] == args.jail_sizes[0]])
         for s in (rp.JAILED, rp.UNJAILED)}
    uids = ctx.get("jail_uids") or {}
    L += ["After the experiments above, segments of one private daemon each, one at a time, in "
          "this order: " + ", ".join(f"{s} {side_of[s]}" for s in segs)
          + " (`FORKVM_NO_JAIL=0` / `=1`). At each of "
          + ", ".join(f"{s} MiB" for s in args.jail_sizes)
          + ", each segment boots its own source, takes its base, alternates full and live "
          "branches, then spawns the clone and does the diff branches, as in experiment 1"
          + (f"; then it builds its own depth-{args.chain_depth} diff chain as in experiment 4 "
             "and spawns from depth 0 and from the head, alternately" if any(
                 r["experiment"] == "jail_chain" for r in jr) else "")
          + f". {n[rp.JAILED]} runs per metric jailed and {n[rp.UNJAILED]} unjailed in all, split "
          "evenly over the segments of each side. Every QEMU's uid was checked: "
          + "; ".join(f"{s}: {', '.join(str(u) for u in sorted(v)[:4])}"
                      + (", …" if len(v) > 4 else "") for s, v in sorted(uids.items()))
          + ". Milliseconds.", ""]
    L += rp.jail_ratio_table(
        ratios, "naive p50 (main run)",
        lambda r: f"{fmt_ms(r['naive']['p50'])} ({r['naive_mode']})" if r["naive_mode"] else "–",
        fmt_ms, times)
    L += ["", "Ratios above 1 mean the jail costs time. \"÷ naive\" is each side's p50 over the "
          "naive stop + full save + cont (QEMU defaults) measured in experiment 1 of this run "
          "at that size, on the same kind of source (booted for live/full, the clone for diff; "
          "jailed QEMUs, saving into their own directory); a chain spawn has no naive "
          "counterpart here.", "",
          "Per segment (p50, ms):", "",
          "| metric | " + " | ".join(f"seg {s} ({side_of[s]})" for s in segs)
          + " | spread within a side |",
          "|---|" + "---:|" * (len(segs) + 1)]
    for exp, mode, size, key, label, _ in jail_metrics(rows, args):
        cells = [p50([r for r in sel(rows, exp, mode, size) if r["segment"] == s], key)
                 for s in segs]
        spread = max((max(v) / min(v) for v in (
            [c for c, s in zip(cells, segs) if side_of[s] == side and c == c]
            for side in (rp.JAILED, rp.UNJAILED)) if len(v) > 1 and min(v) > 0), default=math.nan)
        if any(v == v for v in cells):
            L.append(f"| {label} | " + " | ".join(fmt_ms(v) for v in cells)
                     + f" | {times(spread, 2)} |")
    oc = [rp.summarize(r.get("other_cpu_cores") for r in jr if r["segment"] == s)["p50"]
          for s in segs]
    L.append("| other processes, cores (p50) | " + " | ".join(f"{v:.2f}" for v in oc) + " | |")
    L += ["", "\"Spread within a side\": the larger, over the two sides, of one side's segment "
          "p50s larger ÷ smaller. A jailed/unjailed ratio within that spread is not a jail cost "
          "this run can resolve from the host's drift."]
