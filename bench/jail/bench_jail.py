#!/usr/bin/env python3
"""forkvm jail benchmark: what the QEMU jail costs, jailed / unjailed.

Run through bench/jail/run.sh (which builds the release binary first).

One run starts a private daemon per *segment*, one at a time (never two at
once): jailed (the default, FORKVM_NO_JAIL=0) or unjailed (FORKVM_NO_JAIL=1).
The segments alternate ABBA-style (jailed, unjailed, unjailed, jailed for two
rounds), and each gets its share of the runs, so a slow drift of the host
weighs on both sides alike. Every segment does, in this order:

* warm-up      -- one spawn of the default image creates its boot template,
                  and one more clone warms the caches (neither timed);
* spawn        -- POST /v1/sandboxes {"network": "none"} of the default image:
                  a clone of the boot template, no warm pool (pool size 0);
                  client wall time and the response's timings.total_ms;
* cold         -- the same with "use_template": false (a full kernel boot);
* branch_diff, branch_live -- a fresh clone (as in spawn) rests --settle s,
                  then POST /v1/sandboxes/{id}/branch {"mode": m, "count": 1};
                  the response's pause_ms and total_ms, and the client wall;
                  child, source and snapshot are deleted after each;
* memory       -- a fresh clone idles --idle s; PSS etc. of its QEMU from
                  /proc/<pid>/smaps_rollup;
* naive (unjailed segments only; the naive baseline is plain QEMU, root, no
  jail) -- one cold-booted source is saved by a full QEMU migration to a
  file; naive_restore: a fresh QEMU loads it, `cont`, until the agent answers;
  naive_pause: `stop` + a full migration to a file + `cont` of a fresh clone
  (the branch baseline); naive_memory: one restored copy's PSS after --idle s.

Every QEMU of a jailed segment must run as a non-root uid and every one of an
unjailed segment as root (checked on each clone), so a mislabelled run fails.

Outputs: results/jail.csv, results/RESULTS.md, results/jail.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))

import forkvm_bench as fb  # noqa: E402
import naive as nv  # noqa: E402
import report as rp  # noqa: E402

MIN_RUNS = 10
NOISY_CORES = 0.25
JAILED, UNJAILED, NAIVE = "jailed", "unjailed", "naive"

FIELDS = ["case", "side", "segment", "run", "total_ms", "server_total_ms", "pause_ms",
          "snapshot_ms", "spawn_ms", "qemu_start_ms", "restore_ms", "boot_ms", "identity_ms",
          "load_ms", "agent_ms", "pss_kib", "rss_kib", "private_dirty_kib", "pss_anon_kib",
          "pss_file_kib", "pss_shmem_kib", "uid", "other_cpu_cores"]

# (case, metric, label, unit, the naive (case, metric) it is compared with)
METRICS = [
    ("spawn", "total_ms", "clone spawn, client wall", "ms", ("naive_restore", "total_ms")),
    ("spawn", "server_total_ms", "clone spawn, timings.total_ms", "ms",
     ("naive_restore", "total_ms")),
    ("cold", "total_ms", "cold boot, client wall", "ms", ("naive_restore", "total_ms")),
    ("cold", "server_total_ms", "cold boot, timings.total_ms", "ms",
     ("naive_restore", "total_ms")),
    ("branch_diff", "pause_ms", "branch diff, pause_ms", "ms", ("naive_pause", "pause_ms")),
    ("branch_diff", "server_total_ms", "branch diff, total_ms", "ms",
     ("naive_pause", "pause_ms")),
    ("branch_live", "pause_ms", "branch live, pause_ms", "ms", ("naive_pause", "pause_ms")),
    ("branch_live", "server_total_ms", "branch live, total_ms", "ms",
     ("naive_pause", "pause_ms")),
    ("memory", "pss_kib", "idle clone QEMU PSS", "KiB", ("naive_memory", "pss_kib")),
]
NAIVE_METRICS = [("naive_restore", "total_ms", "naive restore (QEMU start → agent pong)", "ms"),
                 ("naive_pause", "pause_ms", "naive pause (stop + full save + cont)", "ms"),
                 ("naive_memory", "pss_kib", "naive restored copy PSS", "KiB")]


# --------------------------------------------------------------------------
# Pure logic (unit-tested in test_bench_jail.py)
# --------------------------------------------------------------------------


def segment_order(rounds: int) -> list[str]:
    """ABBA: jailed, unjailed | unjailed, jailed | jailed, unjailed ..."""
    out: list[str] = []
    for i in range(rounds):
        out += [JAILED, UNJAILED] if i % 2 == 0 else [UNJAILED, JAILED]
    return out


def values(rows, case: str, side: str, metric: str) -> list[float]:
    return [r[metric] for r in rows if r.get("case") == case and r.get("side") == side
            and r.get(metric) is not None]


def jail_ratios(rows) -> list[dict]:
    """One dict per METRICS entry with data: the jailed and unjailed
    summaries, jailed/unjailed at p50 and p90, the naive baseline's summary
    and each side's p50 / naive p50."""
    out = []
    for case, metric, label, unit, (ncase, nmetric) in METRICS:
        j = rp.summarize(values(rows, case, JAILED, metric))
        u = rp.summarize(values(rows, case, UNJAILED, metric))
        if not (j["n"] or u["n"]):
            continue
        n = rp.summarize(values(rows, ncase, NAIVE, nmetric))
        out.append({
            "case": case, "metric": metric, "label": label, "unit": unit,
            "jailed": j, "unjailed": u, "naive": n, "naive_case": ncase,
            "ratio_p50": rp.ratio(j["p50"], u["p50"]), "ratio_p90": rp.ratio(j["p90"], u["p90"]),
            "jailed_vs_naive": rp.ratio(j["p50"], n["p50"]),
            "unjailed_vs_naive": rp.ratio(u["p50"], n["p50"]),
        })
    return out


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------


@contextmanager
def daemon(side: str, binary: str):
    """A private daemon, jailed or not, with no warm pool. The variables are
    set explicitly (an inherited FORKVM_NO_JAIL=1 must not unjail the jailed
    side) and put back after the start."""
    saved = {k: os.environ.get(k) for k in ("FORKVM_NO_JAIL", "FORKVM_POOL_SIZE")}
    os.environ["FORKVM_NO_JAIL"] = "1" if side == UNJAILED else "0"
    os.environ["FORKVM_POOL_SIZE"] = "0"
    try:
        d = fb.Daemon(binary=binary)
        d.__enter__()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield d
    finally:
        d.stop()


def check_side(sb: dict, side: str) -> int:
    """The sandbox's QEMU runs as the uid its side implies; returns that uid."""
    pid = sb.get("pid")
    if not pid:
        raise fb.BenchError(f"sandbox {sb.get('id')} has no pid: {sb}")
    uid = nv.qemu_uid(pid)
    if (uid == 0) != (side == UNJAILED):
        raise fb.BenchError(f"sandbox {sb['id']} of the {side} daemon runs QEMU pid {pid} as "
                            f"uid {uid}: the daemon's jail setting is not what was asked")
    return uid


def spawn_clone(d: fb.Daemon, side: str, memory: int) -> tuple[dict, float]:
    t0 = time.perf_counter()
    sb = d.create(memory_mib=memory, cpus=1, network="none")
    wall = fb.ms_since(t0)
    t = sb.get("timings") or {}
    if t.get("restore_ms") is None or t.get("from_pool") or sb.get("state") != "running":
        raise fb.BenchError(f"sandbox {sb['id']} is not a running clone of the boot template "
                            f"from no pool: {sb}")
    check_side(sb, side)
    return sb, wall


def timing_row(case, side, seg, run, sb, wall) -> dict:
    t = sb.get("timings") or {}
    return {"case": case, "side": side, "segment": seg, "run": run, "total_ms": wall,
            "server_total_ms": t.get("total_ms"), "qemu_start_ms": t.get("qemu_start_ms"),
            "restore_ms": t.get("restore_ms"), "boot_ms": t.get("boot_ms"),
            "identity_ms": t.get("identity_ms"), "uid": nv.qemu_uid(sb["pid"])}


def run_spawn(d, side, seg, run, a) -> dict:
    sb, wall = spawn_clone(d, side, a.memory)
    try:
        return timing_row("spawn", side, seg, run, sb, wall)
    finally:
        d.delete(sb["id"])


def run_cold(d, side, seg, run, a) -> dict:
    t0 = time.perf_counter()
    sb = d.create_cold(memory_mib=a.memory, cpus=1, network="none")
    wall = fb.ms_since(t0)
    try:
        check_side(sb, side)
        return timing_row("cold", side, seg, run, sb, wall)
    finally:
        d.delete(sb["id"])


def run_branch(d, side, seg, run, a, mode: str) -> dict:
    src, _ = spawn_clone(d, side, a.memory)
    snap_id, kids = None, []
    try:
        time.sleep(a.settle)
        t0 = time.perf_counter()
        r = d.api.request("POST", f"/v1/sandboxes/{src['id']}/branch",
                          {"mode": mode, "count": 1}, expect=(201,), timeout=900)
        wall = fb.ms_since(t0)
        snap = r.get("snapshot") or {}
        snap_id = snap.get("id")
        kids = [k["id"] for k in r.get("children") or []]
        d.sandboxes.update(kids)
        # The source is a clone: since 09e7537 a live branch point of a
        # clone keeps only the pages it changed, a snapshot of kind diff.
        if r.get("mode") != mode or len(kids) != 1 or snap.get("kind") != "diff":
            raise fb.BenchError(f"branch {mode} of {src['id']}: expected a diff snapshot and "
                                f"one child, got mode {r.get('mode')}, kind {snap.get('kind')}, "
                                f"{len(kids)} children")
        check_side(r["children"][0], side)
        return {"case": f"branch_{mode}", "side": side, "segment": seg, "run": run,
                "total_ms": wall, "server_total_ms": r["total_ms"], "pause_ms": r["pause_ms"],
                "snapshot_ms": r.get("snapshot_ms"), "spawn_ms": r.get("spawn_ms"),
                "uid": nv.qemu_uid(src["pid"])}
    finally:
        for sid in [*kids, src["id"]]:
            d.delete(sid)
        if snap_id:
            d.api.request("DELETE", f"/v1/snapshots/{snap_id}", expect=(204, 404))


def mem_row(case, side, seg, run, pid) -> dict:
    s = fb.smaps_rollup(pid)
    if not s:
        raise fb.BenchError(f"cannot read /proc/{pid}/smaps_rollup (QEMU gone?)")
    return {"case": case, "side": side, "segment": seg, "run": run, "pss_kib": s.get("Pss"),
            "rss_kib": s.get("Rss"), "private_dirty_kib": s.get("Private_Dirty"),
            "pss_anon_kib": s.get("Pss_Anon"), "pss_file_kib": s.get("Pss_File"),
            "pss_shmem_kib": s.get("Pss_Shmem"), "uid": nv.qemu_uid(pid)}


def run_memory(d, side, seg, run, a) -> dict:
    sb, _ = spawn_clone(d, side, a.memory)
    try:
        time.sleep(a.idle)
        return mem_row("memory", side, seg, run, sb["pid"])
    finally:
        d.delete(sb["id"])


def naive_vm(saved, work, shm, tag):
    return nv.naive_restore(saved, os.path.join(work, tag), os.path.join(shm, f"{tag}.mem"),
                            f"fvb-jail-{tag}", netns=nv.copy_netns(saved, tag))


def run_naive_restore(saved, work, shm, seg, run) -> dict:
    vm = naive_vm(saved, work, shm, f"s{seg}r{run}")
    try:
        return {"case": "naive_restore", "side": NAIVE, "segment": seg, "run": run,
                **{k: vm.timings.get(k) for k in ("total_ms", "qemu_start_ms", "load_ms",
                                                  "agent_ms")}, "uid": nv.qemu_uid(vm.pid)}
    finally:
        vm.stop()


def run_naive_pause(d, seg, run, a, work) -> dict:
    src, _ = spawn_clone(d, UNJAILED, a.memory)
    try:
        time.sleep(a.settle)
        r = nv.naive_pause(os.path.join(d.sandbox_dir(src["id"]), "qmp.sock"),
                           os.path.join(work, "pause.bin"))
        return {"case": "naive_pause", "side": NAIVE, "segment": seg, "run": run,
                "pause_ms": r["pause_ms"], "total_ms": r["clock_ms"], "uid": 0}
    finally:
        d.delete(src["id"])


def run_naive_memory(saved, work, shm, seg, run, a) -> dict:
    vm = naive_vm(saved, work, shm, f"s{seg}m{run}")
    try:
        time.sleep(a.idle)
        return mem_row("naive_memory", NAIVE, seg, run, vm.pid)
    finally:
        vm.stop()


def show(row: dict, n: int, t0: float) -> None:
    c, s = row["case"], row["side"]
    if row.get("pss_kib") is not None:
        what = f"PSS {row['pss_kib'] / 1024:.1f} MiB (RSS {row['rss_kib'] / 1024:.1f})"
    elif row.get("pause_ms") is not None:
        what = f"pause {row['pause_ms']:.1f} ms, total {fmt(row.get('server_total_ms'))} ms"
    else:
        what = f"{row['total_ms']:.0f} ms (server {fmt(row.get('server_total_ms'))})"
    noisy = row.get("other_cpu_cores") or 0
    print(f"[seg {row['segment']} {s:<8} {c:<13} {row['run']}/{n}] {what}"
          + (f"  (others busy {noisy:.2f} cores)" if noisy > NOISY_CORES else "")
          + f"  +{time.monotonic() - t0:.0f}s", flush=True)


def fmt(v) -> str:
    return rp.fmt(v)


def run_segment(seg: int, side: str, share: dict, a, ctx: dict, rows: list) -> None:
    t0 = ctx["t0"]
    print(f"==> segment {seg}: {side} daemon", flush=True)
    with daemon(side, a.binary) as d:
        info = d.api.info()
        ctx.setdefault("info", info)
        now = fb.other_qemu_processes(exclude_substrings=(d.home, ctx["shm"]))
        ctx["others"].update(now)
        ctx["busy_segments"] += bool(now)
        meter = fb.CpuMeter(roots=[d.proc.pid])

        def measured(fn, n, *args):
            meter.start()
            row = fn(*args)
            row["other_cpu_cores"] = meter.other_cores()
            rows.append(row)
            show(row, n, t0)

        t = time.perf_counter()
        first = d.create(memory_mib=a.memory, cpus=1, network="none")
        d.delete(first["id"])
        warm, _ = spawn_clone(d, side, a.memory)
        d.delete(warm["id"])
        ctx.setdefault("template_ms", {})[seg] = (first.get("timings") or {}).get("template_ms")
        print(f"    boot template made and warmed in {fb.ms_since(t) / 1000:.1f} s", flush=True)

        n = share["spawn"]
        for i in range(1, n + 1):
            measured(run_spawn, n, d, side, seg, i, a)
        n = share["cold"]
        for i in range(1, n + 1):
            measured(run_cold, n, d, side, seg, i, a)
        n = share["branch"]
        for i in range(1, n + 1):  # the two modes alternate
            measured(run_branch, n, d, side, seg, i, a, "diff")
            measured(run_branch, n, d, side, seg, i, a, "live")
        n = share["memory"]
        for i in range(1, n + 1):
            measured(run_memory, n, d, side, seg, i, a)
        if side != UNJAILED:
            return
        work = tempfile.mkdtemp(prefix=f"s{seg}-", dir=ctx["work"])
        src = d.create_cold(memory_mib=a.memory, cpus=1, network="none")
        time.sleep(a.settle)
        saved = nv.naive_save(d, src["id"], src["pid"], a.memory, work)
        d.delete(src["id"])
        ctx["naive_state_bytes"] = saved.state_bytes
        print(f"    naive source saved: {saved.state_bytes / 2**20:.0f} MiB state in "
              f"{saved.save_ms:.0f} ms", flush=True)
        n = share["naive"]
        for i in range(1, n + 1):
            measured(run_naive_restore, n, saved, work, ctx["shm"], seg, i)
            measured(run_naive_pause, n, d, seg, i, a, work)
        n = share["memory"]
        for i in range(1, n + 1):
            measured(run_naive_memory, n, saved, work, ctx["shm"], seg, i, a)


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def unit_fmt(v, unit: str) -> str:
    return rp.fmt(v / 1024, 1) if unit == "KiB" else rp.fmt(v, 1 if v == v and v < 100 else 0)


def plot(ratios, path) -> None:
    plt = rp.pyplot()
    fig, (ax, axm) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 1]})
    lat = [r for r in ratios if r["unit"] == "ms"]
    ys = list(range(len(lat)))
    for off, side, color in ((-0.2, JAILED, "tab:red"), (0.2, UNJAILED, "tab:blue")):
        p50 = [r[side]["p50"] for r in lat]
        p90 = [r[side]["p90"] for r in lat]
        ax.barh([y + off for y in ys], p50, height=0.38, color=color, label=f"{side} p50")
        ax.scatter(p90, [y + off for y in ys], marker="|", s=120, color="black",
                   label="p90" if side == JAILED else None, zorder=3)
    for y, r in zip(ys, lat):
        ax.text(max(r[JAILED]["p90"], r[UNJAILED]["p90"]) * 1.15, y,
                f"×{r['ratio_p50']:.2f}", va="center", fontsize=8)
    for name, metric, label, _unit in NAIVE_METRICS[:2]:
        nvs = [r["naive"]["p50"] for r in lat if r["naive_case"] == name]
        if nvs and nvs[0] == nvs[0]:
            ax.axvline(nvs[0], ls="--", color="gray" if name == "naive_restore" else "green",
                       label=f"{label} p50")
    ax.set_xscale("log")
    ax.set_yticks(ys, [r["label"] for r in lat], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms (log); ×N = jailed p50 / unjailed p50")
    top = max([max(r[JAILED]["p90"], r[UNJAILED]["p90"], r["naive"]["p50"]) for r in lat
               if r["naive"]["n"]] + [max(r[JAILED]["p90"], r[UNJAILED]["p90"]) for r in lat]
              + [1])
    ax.set_xlim(right=top * 2.5)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    mem = [r for r in ratios if r["unit"] == "KiB"]
    if mem:
        r = mem[0]
        names = [JAILED, UNJAILED, "naive copy"]
        vals = [r[JAILED]["p50"] / 1024, r[UNJAILED]["p50"] / 1024, r["naive"]["p50"] / 1024]
        axm.bar(names, vals, color=["tab:red", "tab:blue", "gray"])
        for i, v in enumerate(vals):
            if v == v:
                axm.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        axm.set_ylabel("PSS of one idle QEMU, MiB (p50)")
    fig.set_figheight(6)
    rp.save_figure(fig, path, title="forkvm jail cost: jailed vs unjailed QEMU (and naive QEMU)")


def read_previous(csv_path: Path, md_path: Path) -> dict | None:
    """The rows of an earlier run's jail.csv (numbers parsed) and the date and
    revision lines of its RESULTS.md, to compare this run with; None when
    there is no earlier run."""
    import csv
    if not csv_path.is_file():
        return None
    rows = []
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if v in ("", None):
                    row[k] = None
                elif k in ("case", "side"):
                    row[k] = v
                else:
                    try:
                        row[k] = float(v)
                    except ValueError:
                        row[k] = v
            rows.append(row)
    head = []
    if md_path.is_file():
        head = [x for x in md_path.read_text().splitlines()
                if x.startswith(("- Date:", "- forkvm:"))]
    return {"rows": rows, "head": head}


def previous_lines(prev: dict | None, ratios) -> list[str]:
    """A section comparing this run's p50s with the previous run's: each
    side's p50 now / before, and the jail ratio then and now."""
    if not prev:
        return []
    before = {(r["case"], r["metric"]): r for r in jail_ratios(prev["rows"])}
    L = ["", "## Against the previous run", ""]
    L += [x.replace("- Date:", "- Previous run's date:").replace("- forkvm:",
                                                                  "- Previous run's forkvm:")
          for x in prev["head"]]
    L += ["", "| metric | jailed p50 before | jailed p50 now | **now ÷ before** | "
          "unjailed p50 before | unjailed p50 now | now ÷ before | jail ratio before | "
          "jail ratio now |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ratios:
        b = before.get((r["case"], r["metric"]))
        if not b:
            continue
        unit = r["unit"]
        u = unit if unit == "ms" else "MiB"
        L.append(f"| {r['label']} ({u}) | {unit_fmt(b[JAILED]['p50'], unit)} | "
                 f"{unit_fmt(r[JAILED]['p50'], unit)} | "
                 f"**{rp.ratio(r[JAILED]['p50'], b[JAILED]['p50']):.3f}×** | "
                 f"{unit_fmt(b[UNJAILED]['p50'], unit)} | {unit_fmt(r[UNJAILED]['p50'], unit)} | "
                 f"{rp.ratio(r[UNJAILED]['p50'], b[UNJAILED]['p50']):.3f}× | "
                 f"{b['ratio_p50']:.3f}× | {r['ratio_p50']:.3f}× |")
    L += ["", "\"now ÷ before\" compares the same side across the two runs (host load "
          "differs between them); the jail's own cost is the jail ratio of each run, "
          "measured against unjailed segments that ran alongside."]
    return L


def write_results(path, rows, ratios, ctx, a) -> None:
    info, m = ctx["info"], ctx["machine"]
    order = ", ".join(ctx["order"])
    L = ["# Jail benchmark: the cost of the QEMU jail (jailed / unjailed)", ""]
    if a.smoke:
        L += rp.smoke_banner(f"--runs {a.runs} < {MIN_RUNS}", "bash bench/jail/run.sh")
    noise = [r.get("other_cpu_cores") or 0 for r in rows]
    noisy = sum(x > NOISY_CORES for x in noise)
    L += [
        rp.date_line(ctx["started"], ctx["elapsed"]),
        rp.forkvm_line(info, ctx["revision"]),
        f"- Machine: {rp.machine_text(m)}",
        f"- Kernel: Linux {m['kernel']}; load average at start: {rp.loadavg_text(m)}",
        rp.accel_line(info),
        f"- QEMU: {rp.qemu_text(info)}",
        f"- Guest: {a.memory} MiB RAM, 1 vCPU, image `default`, `network: none` everywhere "
        "(each sandbox still has its NIC, a tap alone in its own namespace, so the jail's "
        "tap hand-over is exercised); no warm pool (`FORKVM_POOL_SIZE=0`)",
        f"- Segments (one daemon each, never two at once, in this order): {order}; runs per "
        f"side: spawn {a.runs}, cold {a.cold_runs}, branch {a.runs} per mode, memory "
        f"{a.mem_runs}; naive (in the unjailed segments): restore and pause {a.runs} each, "
        f"memory {a.mem_runs}" + (" (SMOKE)" if a.smoke else ""),
        f"- Host noise: other processes kept p50 {rp.percentile(noise, 50):.2f}, max "
        f"{max(noise):.2f} cores busy per timed run (`other_cpu_cores`, of {m['cores']}); "
        f"{noisy} of {len(rows)} runs above {NOISY_CORES}"
        + (f"; the start waited for a quiet host and saw {ctx['quiet']:.2f} cores in use"
           if ctx.get("quiet") is not None else ""),
    ]
    if noisy or ctx["others"]:
        L.append("- **Shared host:** another developer used the CPUs during this run; both sides "
                 "are affected alike (segments alternate), but absolute times are inflated.")
    L += [x.replace("checked before each run", "checked at the start of each segment")
          .replace("sampled before each run", "sampled at the start of each segment")
          for x in rp.other_qemu_lines(ctx["others"], ctx["busy_segments"], len(ctx["order"]),
                                       "segments")]
    L += ["", "## Jailed / unjailed", "",
          "| metric | jailed p50 | jailed p90 | unjailed p50 | unjailed p90 | **ratio p50** | "
          "ratio p90 | naive p50 | jailed ÷ naive | unjailed ÷ naive |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ratios:
        u = r["unit"] if r["unit"] == "ms" else "MiB"
        L.append(f"| {r['label']} ({u}) | {unit_fmt(r[JAILED]['p50'], r['unit'])} | "
                 f"{unit_fmt(r[JAILED]['p90'], r['unit'])} | "
                 f"{unit_fmt(r[UNJAILED]['p50'], r['unit'])} | "
                 f"{unit_fmt(r[UNJAILED]['p90'], r['unit'])} | **{r['ratio_p50']:.3f}×** | "
                 f"{r['ratio_p90']:.3f}× | {unit_fmt(r['naive']['p50'], r['unit'])} "
                 f"({r['naive_case']}) | {r['jailed_vs_naive']:.3f}× | "
                 f"{r['unjailed_vs_naive']:.3f}× |")
    L += ["", "Ratios above 1 mean the jail costs time (or memory); \"÷ naive\" is each side's "
          "p50 over the naive baseline's p50 measured in this run (below 1: forkvm is faster "
          "or smaller than plain QEMU save/restore)."]
    L += previous_lines(ctx.get("previous"), ratios)
    L += ["", "## Naive baseline", "",
          "| baseline | n | min | p50 | p90 | max |", "|---|---:|---:|---:|---:|---:|"]
    for case, metric, label, unit in NAIVE_METRICS:
        s = rp.summarize(values(rows, case, NAIVE, metric))
        u = "MiB" if unit == "KiB" else unit
        L.append(f"| {label} ({u}) | {s['n']} | {unit_fmt(s['min'], unit)} | "
                 f"{unit_fmt(s['p50'], unit)} | {unit_fmt(s['p90'], unit)} | "
                 f"{unit_fmt(s['max'], unit)} |")
    L += ["", "## Every stage", "", "Milliseconds; server stages are the response's `timings`.",
          ""]
    stats = []
    for side in (JAILED, UNJAILED):
        for case, stages in (("spawn", ["server_total_ms", "qemu_start_ms", "restore_ms",
                                        "identity_ms"]),
                             ("cold", ["server_total_ms", "qemu_start_ms", "boot_ms"]),
                             ("branch_diff", ["pause_ms", "snapshot_ms", "spawn_ms",
                                              "server_total_ms"]),
                             ("branch_live", ["pause_ms", "snapshot_ms", "spawn_ms",
                                              "server_total_ms"])):
            rs = [dict(r, case=f"{case} {side}") for r in rows
                  if r["case"] == case and r["side"] == side]
            stats += rp.case_stats(rs, [(f"{case} {side}", stages)])
    L += rp.stats_table(stats, with_n=True)
    L += ["", "## Method", "",
          "- Each segment starts a private `forkvm serve` in a fresh temp home (guest artefacts "
          "linked from /var/lib/forkvm) with `FORKVM_NO_JAIL=0` (jailed) or `=1` (unjailed); "
          "its first spawn makes the boot template and a second warms the caches (not timed). "
          "Every clone's QEMU uid is checked: non-root when jailed, root when not.",
          "- **spawn**: `POST /v1/sandboxes {\"memory_mib\", \"cpus\": 1, \"network\": "
          "\"none\"}`, a clone of the boot template (no pool); total = client wall until the "
          "201 (the agent has answered), `server_total` = `timings.total_ms`; DELETE after.",
          "- **cold**: the same with `\"use_template\": false` (kernel boot to the agent).",
          f"- **branch**: a fresh clone rests {a.settle:g} s, then `POST "
          "/v1/sandboxes/{id}/branch {\"mode\": diff|live, \"count\": 1}` (the two modes "
          "alternate); `pause_ms` (QEMU STOP→RESUME events) and `total_ms` from the response; "
          "then the child, the source and the snapshot are deleted.",
          f"- **memory**: a fresh clone idles {a.idle:g} s; `Pss` of its QEMU from "
          "`/proc/<pid>/smaps_rollup` (RSS, private dirty and the anon/file/shmem split are in "
          "the CSV).",
          "- **naive** (unjailed segments, plain QEMU as root): a cold-booted source is stopped "
          "and saved with a full `migrate` to a file; `naive_restore` starts a fresh QEMU from "
          "its command line, `migrate-incoming`, `cont`, until the agent answers a ping "
          "(bench/common/naive.py, as bench/spawn); `naive_pause` is `stop` + a full migration "
          "to a file + `cont` of a fresh clone (QEMU defaults; STOP→RESUME events), the branch "
          "baseline; `naive_memory` is one restored copy's PSS after the same idle time.",
          "", "Files: `jail.csv` (one row per measurement, `side` = jailed/unjailed/naive, "
          "`segment` in the order above), `jail.png`."]
    Path(path).write_text("\n".join(L) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "forkvm"))
    ap.add_argument("--runs", type=int, default=20,
                    help=f"spawns, branches per mode and naive runs per side (>= {MIN_RUNS})")
    ap.add_argument("--cold-runs", type=int, default=5, help="cold boots per side")
    ap.add_argument("--mem-runs", type=int, default=4, help="idle clones measured per side")
    ap.add_argument("--rounds", type=int, default=2,
                    help="jailed/unjailed pairs of segments, alternating (ABBA)")
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --runs < {MIN_RUNS}; results are marked SMOKE")
    ap.add_argument("--memory", type=int, default=512, help="guest RAM, MiB")
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds a branch source rests after its spawn")
    ap.add_argument("--idle", type=float, default=3.0,
                    help="seconds a clone idles before its memory is read")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="first wait up to this long for the host to be quiet; 0: only warn")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    if min(a.runs, a.cold_runs, a.mem_runs, a.rounds) < 1:
        ap.error("--runs, --cold-runs, --mem-runs and --rounds must be >= 1")
    if a.runs < MIN_RUNS and not a.smoke:
        ap.error(f"--runs {a.runs} is below {MIN_RUNS} for a valid result; add --smoke")
    if os.geteuid() != 0:
        ap.error("the jail needs root (uids, mount namespaces, cgroups): run as root")

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    previous = read_previous(out / "jail.csv", out / "RESULTS.md")
    order = segment_order(a.rounds)
    quiet = fb.wait_for_quiet_host(a.wait_quiet) if a.wait_quiet else None
    ctx = {"order": order, "machine": rp.machine_info(), "revision": rp.git_revision(),
           "started": dt.datetime.now().astimezone(), "t0": time.monotonic(), "others": {},
           "busy_segments": 0, "quiet": quiet, "previous": previous,
           "shm": tempfile.mkdtemp(prefix="fvb-jail-", dir="/dev/shm"),
           "work": tempfile.mkdtemp(prefix="fvb-jail-", dir="/tmp")}
    per_side = len(order) // 2
    shares = {}
    for side in (JAILED, UNJAILED):
        segs = [i for i, s in enumerate(order) if s == side]
        split = {k: rp.split_runs(n, per_side) for k, n in (
            ("spawn", a.runs), ("cold", a.cold_runs), ("branch", a.runs), ("naive", a.runs),
            ("memory", a.mem_runs))}
        for j, seg in enumerate(segs):
            shares[seg] = {k: v[j] for k, v in split.items()}
    rows: list[dict] = []
    print(f"segments: {', '.join(order)}; {a.runs} runs per side", flush=True)
    try:
        for seg, side in enumerate(order):
            run_segment(seg, side, shares[seg], a, ctx, rows)
    except (fb.BenchError, OSError) as e:
        print(f"bench_jail: FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("bench_jail: interrupted", file=sys.stderr, flush=True)
        return 130
    finally:
        shutil.rmtree(ctx["shm"], ignore_errors=True)
        shutil.rmtree(ctx["work"], ignore_errors=True)
    ctx["elapsed"] = time.monotonic() - ctx["t0"]
    ratios = jail_ratios(rows)
    rp.write_csv(out / "jail.csv", rows, FIELDS)
    plot(ratios, out / "jail.png")
    write_results(out / "RESULTS.md", rows, ratios, ctx, a)
    print("\nmetric                              jailed p50/p90     unjailed p50/p90   ratio p50 "
          "ratio p90")
    for r in ratios:
        u = r["unit"]
        print(f"{r['label']:<36}{unit_fmt(r[JAILED]['p50'], u):>8}/{unit_fmt(r[JAILED]['p90'], u):<9}"
              f"{unit_fmt(r[UNJAILED]['p50'], u):>8}/{unit_fmt(r[UNJAILED]['p90'], u):<9}"
              f"{r['ratio_p50']:>8.3f}×{r['ratio_p90']:>9.3f}×")
    print(f"\nwrote {out}/jail.csv, jail.png, RESULTS.md ({ctx['elapsed']:.0f} s)")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_jail", main, on_signal=None)
