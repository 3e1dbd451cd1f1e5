"""bench/timetravel's figures: statistics and ratios, the plot and
RESULTS.md (the measurements are in bench_timetravel.py and
timetravel_tree.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import report as rp

MIB = 1 << 20
STEP_FIELDS = ["step", "checkpoint", "pause_ms", "bytes", "memory_diff_bytes",
               "device_state_allocated_bytes", "disk_bytes", "on_disk_bytes", "dir_bytes",
               "checkpoint_ms", "work_ms", "step_ms", "loadavg1", "kept"]
OP_FIELDS = ["op", "step", "run", "wall_ms", "engine_ms", "extra_ms", "bytes",
             "memory_diff_bytes", "on_disk_bytes", "dir_bytes", "count", "entries",
             "contents_read", "note", "detail"]
EDGE = 10  # "first" and "last" steps for flatness


def of(ops, op):
    return [r for r in ops if r["op"] == op]


def s(values) -> dict:
    return rp.summarize(values)


def slope(xs, ys) -> float:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    if n < 2:
        return math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else math.nan


def theil_sen(xs, ys) -> float:
    """Median of the slopes between every pair of points: a trend that a few
    outlying pauses (a host hiccup) do not drag, as they drag least squares
    and the ratio of two 10-step medians."""
    pairs = [(ys[j] - ys[i]) / (xs[j] - xs[i])
             for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    if not pairs:
        return math.nan
    pairs.sort()
    m = len(pairs) // 2
    return pairs[m] if len(pairs) % 2 else (pairs[m - 1] + pairs[m]) / 2


def mib(b) -> str:
    return "–" if b is None else f"{b / MIB:,.1f}"


def ms(v) -> str:
    return rp.fmt(v, 1) if v is not None and v == v and v < 100 else rp.fmt(v)


def figures(steps, ops, args) -> dict:
    """Every number the report and the terminal give, in one place."""
    later = [r for r in steps if r["step"] > 1]  # step 1 holds all since the template
    f = {"pause": s(r["pause_ms"] for r in steps),
         "pause_later": s(r["pause_ms"] for r in later),
         "pause_first": s(r["pause_ms"] for r in steps[:EDGE]),
         "pause_last": s(r["pause_ms"] for r in steps[-EDGE:]),
         "pause_slope": slope([r["step"] for r in steps], [r["pause_ms"] for r in steps]),
         "pause_trend": theil_sen([r["step"] for r in steps], [r["pause_ms"] for r in steps]),
         "bytes": s(r["bytes"] for r in later),
         "bytes_first": steps[0]["bytes"],
         "cp_ms": s(r["checkpoint_ms"] for r in steps),
         "step_ms": s(r["step_ms"] for r in steps),
         "snap_pause": s(r["engine_ms"] for r in of(ops, "snapshot")),
         "snap_bytes": s(r["bytes"] for r in of(ops, "snapshot")),
         "snap_wall": s(r["wall_ms"] for r in of(ops, "snapshot")),
         "naive": s(r["engine_ms"] for r in of(ops, "naive_save"))}
    f["pause_flat"] = rp.ratio(f["pause_last"]["p50"], f["pause_first"]["p50"])
    # The pause the trend adds over the whole loop, against the p50 pause.
    f["pause_growth"] = f["pause_trend"] * (len(steps) - 1)
    f["pause_growth_share"] = rp.ratio(f["pause_growth"], f["pause"]["p50"])
    f["pause_vs_snap"] = rp.ratio(f["pause"]["p50"], f["snap_pause"]["p50"])
    f["bytes_vs_snap"] = rp.ratio(f["bytes"]["p50"], f["snap_bytes"]["p50"])
    f["snap_vs_pause"] = rp.ratio(f["snap_pause"]["p50"], f["pause"]["p50"])
    f["naive_vs_pause"] = rp.ratio(f["naive"]["p50"], f["pause"]["p50"])
    for op in ("rewind", "spawn", "diff", "git_status", "merge", "git_apply"):
        f[op] = s(r["wall_ms"] for r in of(ops, op))
        f[op + "_engine"] = s(r.get("engine_ms") for r in of(ops, op))
    f["spawn_rm"] = s(r["wall_ms"] + (r.get("extra_ms") or 0) for r in of(ops, "spawn"))
    f["spawn_vs_rewind"] = rp.ratio(f["spawn"]["p50"], f["rewind"]["p50"])
    f["spawn_rm_vs_rewind"] = rp.ratio(f["spawn_rm"]["p50"], f["rewind"]["p50"])
    f["diff_vs_git"] = rp.ratio(f["diff"]["p50"], f["git_status"]["p50"])
    f["merge_vs_git"] = rp.ratio(f["merge"]["p50"], f["git_apply"]["p50"])
    return f


def written(kept, args) -> list[dict]:
    """What the agent wrote between consecutive kept checkpoints: the
    holder's distinct rewritten slots (all of it before the first) and the
    step files; that is what a kept checkpoint should store."""
    slots = args.hold_mib // args.region_mib
    out, prev = [], 0
    for c in sorted(kept, key=lambda c: c["step"]):
        n = c["step"] - prev
        mem = args.hold_mib if prev == 0 else min(n, slots) * args.region_mib
        files = n * args.step_files * 64 / 1024
        out.append({**c, "since": prev, "written_mib": mem + files, "mem_mib": mem,
                    "files_mib": files})
        prev = c["step"]
    return out


def plot(steps, ops, path: Path) -> None:
    plt = rp.pyplot()
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.5))
    xs = [r["step"] for r in steps]
    a1.plot(xs, [r["pause_ms"] for r in steps], ".-", color="tab:blue", linewidth=0.8,
            label="checkpoint pause")
    sn = of(ops, "snapshot")
    a1.plot([r["step"] for r in sn], [r["engine_ms"] for r in sn], "s", color="tab:red",
            label="full snapshot pause")
    nv = of(ops, "naive_save")
    if nv:
        a1.axhline(s(r["engine_ms"] for r in nv)["p50"], color="grey", linestyle="--",
                   label="naive QEMU save (p50)")
    a1.set_yscale("log")
    a1.set_xlabel("agent step")
    a1.set_ylabel("source pause (ms)")
    a1.set_title("Pause per step")
    a1.legend(fontsize=8)
    a2.plot(xs, [r["bytes"] / MIB for r in steps], ".-", color="tab:blue", linewidth=0.8,
            label="checkpoint bytes")
    a2.plot([r["step"] for r in sn], [r["bytes"] / MIB for r in sn], "s", color="tab:red",
            label="full snapshot bytes")
    kept = [r for r in steps if r["kept"]]
    a2.plot([r["step"] for r in kept], [(r["dir_bytes"] or 0) / MIB for r in kept], "x",
            color="tab:green", label="kept at the end: dir on host")
    a2.set_yscale("log")
    a2.set_xlabel("agent step")
    a2.set_ylabel("MiB stored")
    a2.set_title("Bytes per step")
    a2.legend(fontsize=8)
    pairs = [("rewind", "spawn"), ("diff", "git_status"), ("merge", "git_apply")]
    labels, p50, p90, colours = [], [], [], []
    for a, b in pairs:
        for op, c in ((a, "tab:blue"), (b, "tab:grey")):
            st = s(r["wall_ms"] for r in of(ops, op))
            labels.append(op.replace("_", " "))
            p50.append(st["p50"])
            p90.append(st["p90"] - st["p50"] if st["n"] else 0)
            colours.append(c)
    a3.bar(range(len(labels)), p50, yerr=[[0] * len(p90), p90], color=colours, capsize=3)
    a3.set_xticks(range(len(labels)), labels, rotation=30, fontsize=8)
    a3.set_yscale("log")
    a3.set_ylabel("wall, p50 (bar to p90), ms")
    a3.set_title("forkvm (blue) vs baseline (grey)")
    rp.save_figure(fig, path, title="forkvm time travel: checkpoints, rewind, diff, merge")


def write_results(path: Path, steps, ops, ctx, args) -> list[str]:
    f = figures(steps, ops, args)
    info, machine, tree = ctx["info"], ctx["machine"], ctx.get("tree", {})
    L = []
    if args.steps < 50 or args.files < 10000:
        L += rp.smoke_banner(f"{args.steps} steps, {args.files} files",
                             "bash bench/timetravel/run.sh")
    L += ["# Time-travel benchmark (issue 34): checkpoints, rewind, diff, merge", "",
          *rp.header_lines(info, machine, ctx["started"], ctx["elapsed"], rp.git_revision(),
                           minutes=True),
          *others_lines(ctx),
          f"- One private daemon (jailed, {ctx['build']} build), every call through its REST API "
          "(the CLI commands named below are thin clients of the same routes). "
          f"Guest: {args.memory} MiB, 1 vCPU, spawned from the boot template, `network: none`. "
          f"The daemon's store (home under `{ctx.get('home_parent')}`) is on "
          f"{ctx.get('store_fs', '?')}.",
          "",
          "## 1. Agent loop: checkpoint per step against a full snapshot", "",
          f"{args.steps} steps. A Python process holds {args.hold_mib} MiB filled from "
          "/dev/urandom before step 1 (so ≥ "
          f"{args.hold_mib} MiB changed since the template); each step writes "
          f"{args.step_files} files of 64 KiB, has it rewrite {args.region_mib} MiB of what it "
          "holds in place (slot = step mod "
          f"{args.hold_mib // args.region_mib}), then `forkvm checkpoint` "
          f"(retention `--keep-last {args.keep_last} --keep-every {args.keep_every}` set "
          "before step 1). Baseline: `forkvm snapshot` of the same sandbox right after the "
          f"checkpoints of steps {', '.join(map(str, args.snapshot_at))} (then deleted), "
          f"and QEMU's own stop + full save + cont of the same QEMU after the loop "
          f"({args.naive_runs} runs).", "",
          "| figure | n | p50 | p90 | max |", "|---|---:|---:|---:|---:|"]
    for label, st, fmtv in (
            ("checkpoint pause, all steps (ms)", f["pause"], ms),
            ("checkpoint pause, steps 2– (ms)", f["pause_later"], ms),
            (f"checkpoint pause, steps 1–{EDGE} (ms)", f["pause_first"], ms),
            (f"checkpoint pause, last {EDGE} steps (ms)", f["pause_last"], ms),
            ("checkpoint bytes, steps 2– (MiB)", f["bytes"], mib),
            ("checkpoint call wall (ms)", f["cp_ms"], ms),
            ("whole step: work + checkpoint (ms)", f["step_ms"], ms),
            ("**full snapshot pause (ms)**", f["snap_pause"], ms),
            ("**full snapshot bytes (MiB)**", f["snap_bytes"], mib),
            ("full snapshot call wall (ms)", f["snap_wall"], ms),
            ("naive QEMU save pause (ms)", f["naive"], ms)):
        L.append(f"| {label} | {st['n']} | {fmtv(st['p50'])} | {fmtv(st['p90'])} | "
                 f"{fmtv(st['max'])} |")
    L += ["",
          f"- **Ratios:** checkpoint pause ÷ full snapshot pause **{f['pause_vs_snap']:.3f}×** "
          f"(the snapshot pauses **{f['snap_vs_pause']:.1f}×** longer); checkpoint bytes ÷ "
          f"full snapshot bytes **{f['bytes_vs_snap']:.3f}×** (p50s, steps 2–); naive QEMU "
          f"save ÷ checkpoint pause {f['naive_vs_pause']:.0f}×.",
          f"- **Flat over the steps:** last {EDGE} ÷ first {EDGE} pause p50 "
          f"{f['pause_flat']:.2f}× (medians of {EDGE}: noisy at a few ms); trend "
          f"(Theil–Sen slope, the median of pairwise slopes) **{f['pause_trend']:+.3f} ms per "
          f"step**, so **{f['pause_growth']:+.2f} ms over the loop, "
          f"{f['pause_growth_share'] * 100:+.0f} % of the p50 pause**; least-squares slope "
          f"{f['pause_slope']:+.3f} ms per step. Step 1's checkpoint (the first, whose parent is the boot template) paused "
          f"{ms(steps[0]['pause_ms'])} ms and stores {mib(f['bytes_first'])} MiB (all that "
          "changed since the template); later ones store what changed since the previous one.",
          "- Steps whose checkpoint paused over 10 ms: "
          + (", ".join(f"{r['step']} ({ms(r['pause_ms'])} ms)" for r in steps
                       if r["pause_ms"] > 10) or "none") + ".",
          *disk_growth_lines(steps, args),
          f"- Issue 34's target (pause under 5 ms p50 with {args.hold_mib} MiB changed, flat): "
          f"**{'met' if f['pause']['p50'] < 5 and f['pause_growth_share'] <= 0.2 else 'NOT met'}** "
          f"(p50 {f['pause']['p50']:.2f} ms; flat taken as a trend that adds at most 20 % of "
          "the p50 pause over the loop).",
          "", "Each full snapshot against the checkpoint of the same step:", "",
          "| step | checkpoint pause (ms) | snapshot pause (ms) | ratio | checkpoint MiB | "
          "snapshot MiB | ratio |", "|---:|---:|---:|---:|---:|---:|---:|"]
    by_step = {r["step"]: r for r in steps}
    for r in of(ops, "snapshot"):
        c = by_step[r["step"]]
        L.append(f"| {r['step']} | {ms(c['pause_ms'])} | {ms(r['engine_ms'])} | "
                 f"{rp.ratio(r['engine_ms'], c['pause_ms']):.1f}× | {mib(c['bytes'])} | "
                 f"{mib(r['bytes'])} | {rp.ratio(r['bytes'], c['bytes']):.1f}× |")
    L += retention_lines(ctx, args)
    L += rewind_lines(f, ops, ctx, args)
    L += tree_lines(f, ops, tree, args)
    L += ["", "Raw rows: `steps.csv` (one per agent step), `ops.csv` (snapshots, naive saves, "
          "rewinds, spawns, diffs, git statuses, merges, git applies); plot: `timetravel.png`."]
    path.write_text("\n".join(L) + "\n")
    return L


def others_lines(ctx) -> list[str]:
    """The QEMU processes this bench did not start, seen before its parts."""
    if not ctx["others"]:
        return ["- No other QEMU process was running on the host (checked before each of "
                "the 3 parts)."]
    return ([f"- **Host not quiet:** QEMU processes not started by this bench were alive "
             f"when {ctx.get('busy_phases', 0)} of the 3 parts started (checked before each; "
             "`loadavg1` in steps.csv is the host's load during the loop):"]
            + [f"  - pid {p}: `{c[:110]}`" for p, c in sorted(ctx["others"].items())])


def disk_growth_lines(steps, args) -> list[str]:
    """What a checkpoint stores besides memory pages (its disk layer and
    device state), first against last, and the disk layer's trend: each
    step writes the same amount to the disk, so it should stay flat."""
    later = [r for r in steps if r["step"] > 1]
    if len(later) < 2:
        return []
    a, b = later[0], later[-1]
    other = [((r["bytes"] - (r.get("memory_diff_bytes") or 0)) / MIB) for r in (a, b)]
    disk_slope = slope([r["step"] for r in later], [(r.get("disk_bytes") or 0) / MIB for r in later])
    mem = s((r.get("memory_diff_bytes") or 0) / MIB for r in later)
    return [f"- **What a checkpoint stores, by part:** memory pages (`memory.diff`) p50 "
            f"{mem['p50']:.1f} MiB (max {mem['max']:.1f}) for the {args.region_mib} MiB the "
            f"holder rewrote; the rest (disk layer, device state) {other[0]:.1f} MiB at step "
            f"{a['step']} and {other[1]:.1f} MiB at step {b['step']}, the disk layer "
            f"{(a['disk_bytes'] or 0) / MIB:.1f} → {(b['disk_bytes'] or 0) / MIB:.1f} MiB "
            f"(slope {disk_slope:+.2f} MiB per step) while every step writes "
            f"{args.step_files * 64 / 1024:.2f} MiB of files."]


def retention_lines(ctx, args) -> list[str]:
    kept = written(ctx["kept"], args)
    tl = ctx["timeline"]
    L = ["", f"### Storage of the kept checkpoints (retention keep last {args.keep_last}, "
         f"every {args.keep_every})", "",
         "What the agent wrote since the previous kept checkpoint: the holder's distinct "
         f"rewritten {args.region_mib} MiB slots (all {args.hold_mib} MiB before the first) "
         "plus the step files. `bytes` is the API's (memory pages, device state, disk "
         "layer); the directory is its snapshot directory's allocated bytes on the host "
         "(`du`-like, extents shared by reflink counted in each).", "",
         "| step | since step | agent wrote (MiB) | `bytes` (MiB) | memory.diff (MiB) | "
         "API on_disk (MiB) | dir on host (MiB) | bytes ÷ wrote |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in kept:
        sz = c["sizes"]
        L.append(f"| {c['step']} | {c['since']} | {c['written_mib']:,.1f} | {mib(c['bytes'])} | "
                 f"{mib(sz.get('memory_diff_bytes'))} | {mib(sz.get('on_disk_bytes'))} | "
                 f"{mib(c['dir_bytes'])} | {c['bytes'] / MIB / c['written_mib']:.2f}× |")
    tot_b = sum(c["bytes"] for c in kept)
    tot_w = sum(c["written_mib"] for c in kept)
    tot_d = sum(c["dir_bytes"] or 0 for c in kept)
    tot_m = sum(c["sizes"].get("memory_diff_bytes") or 0 for c in kept)
    L += ["", f"- {len(kept)} kept of {args.steps}; Σ `bytes` {mib(tot_b)} MiB (the timeline "
          f"says {mib(tl['bytes'])} MiB), Σ directories {mib(tot_d)} MiB, against "
          f"{tot_w:,.1f} MiB the agent wrote in those intervals: **{tot_b / MIB / tot_w:.2f}×** "
          f"(directories {tot_d / MIB / tot_w:.2f}×).",
          f"- By part: Σ memory pages (`memory.diff`) {mib(tot_m)} MiB against the "
          f"{sum(c['mem_mib'] for c in kept):,.1f} MiB the holder rewrote "
          f"(**{tot_m / MIB / sum(c['mem_mib'] for c in kept):.2f}×**); Σ the rest (disk "
          f"layers, device state) {mib(tot_b - tot_m)} MiB against "
          f"{sum(c['files_mib'] for c in kept):,.1f} MiB of files written "
          f"(**{(tot_b - tot_m) / MIB / sum(c['files_mib'] for c in kept):.2f}×**).",
          f"- Guest memory at the start (`free -m`: total used free shared buff/cache "
          f"available): {' '.join(ctx.get('guest_free', [])[1:])} MiB."]
    return L


def breakdown(rows) -> str:
    """p50 of each part of the sandboxes' `timings` the API returned with
    the rows (JSON in `detail`), largest first."""
    parts: dict[str, list[float]] = {}
    for r in rows:
        for k, v in (json.loads(r.get("detail") or "null") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and not k.endswith("_unix_ms"):
                parts.setdefault(k, []).append(v)
    p50 = sorted(((s(v)["p50"], k) for k, v in parts.items()), reverse=True)
    return ", ".join(f"{k} {ms(v)}" for v, k in p50) or "none given"


def rewind_lines(f, ops, ctx, args) -> list[str]:
    t = ctx["rewind_target"]
    return ["", "## 2. Rewind against a fresh spawn of the same checkpoint", "",
            f"The loop's sandbox rewound to its kept checkpoint of step {t['step']} (`forkvm "
            f"rewind`), and a fresh spawn of that checkpoint (`forkvm spawn --snapshot`, "
            f"`network: none`) removed after it answered; {args.runs} of each, interleaved; "
            "every one checked to be at that step (its files and the holder's last step).", "",
            "| figure | n | p50 | p90 | max |", "|---|---:|---:|---:|---:|",
            *[f"| {label} | {st['n']} | {ms(st['p50'])} | {ms(st['p90'])} | {ms(st['max'])} |"
              for label, st in (("**rewind, wall (ms)**", f["rewind"]),
                                ("rewind, `rewind_ms` (ms)", f["rewind_engine"]),
                                ("**spawn, wall (ms)**", f["spawn"]),
                                ("spawn, `timings.total_ms` (ms)", f["spawn_engine"]),
                                ("spawn + remove, wall (ms)", f["spawn_rm"]))],
            "", "- In run order (wall ms): rewinds "
            f"{', '.join(ms(r['wall_ms']) for r in of(ops, 'rewind'))}; spawns "
            f"{', '.join(ms(r['wall_ms']) for r in of(ops, 'spawn'))}.",
            f"- **Ratio:** spawn ÷ rewind **{f['spawn_vs_rewind']:.2f}×** (p50 walls); "
            f"spawn + remove ÷ rewind {f['spawn_rm_vs_rewind']:.2f}×.",
            "- Where the time went, p50 of the `timings` (ms) the API returned: the rewound "
            f"sandbox's (its resume): {breakdown(of(ops, 'rewind'))}; the spawn's: "
            f"{breakdown(of(ops, 'spawn'))}."]


def per_run_lines(ops, args) -> list[str]:
    """p50 walls of the diffs and git statuses by round: the first round
    meets every guest's caches cold after the branch, the later ones warm."""
    L = ["| round | forkvm diff p50 (ms) | git status p50 (ms) | diff ÷ git |",
         "|---:|---:|---:|---:|"]
    for run in range(1, args.diff_runs + 1):
        d = s(r["wall_ms"] for r in of(ops, "diff") if r.get("run") == run)["p50"]
        g = s(r["wall_ms"] for r in of(ops, "git_status") if r.get("run") == run)["p50"]
        L.append(f"| {run} | {ms(d)} | {ms(g)} | {rp.ratio(d, g):.2f}× |")
    return L


def tree_lines(f, ops, tree, args) -> list[str]:
    half = args.children // 2
    return ["", "## 3. Diff against `git status`; 4. merge against `git apply`", "",
            f"A sandbox wrote {tree.get('count')} files of ~1 KiB in 100 directories "
            f"({tree.get('make_ms', 0) / 1000:.1f} s), committed them with the guest image's "
            f"own {tree.get('git')} ({tree.get('commit_ms', 0) / 1000:.1f} s; the git directory "
            "beside the tree, `GIT_DIR=/root/tree.git`, so that git's own writes are not "
            "differences of the tree; automatic gc off, as a detached `git gc --auto` from "
            "the commit would be copied into every child by the branch and repack in each "
            "while they are measured), and branched "
            f"into {args.children} children ({tree.get('branch_ms', 0):.0f} ms); each child "
            f"appended a line to {args.changed} files of its own, spread over the directories. "
            f"Per child, {args.diff_runs} × `forkvm diff SOURCE CHILD --path /root/tree` "
            "(REST, wall and the engine's `diff_ms`) and "
            f"{args.diff_runs} × `git status --porcelain` in the child (exec wall, and the "
            "guest's clock around git alone), alternating which runs first. Both must find "
            f"exactly {args.changed} changes. forkvm's diff reads both sandboxes' trees (source "
            "and child); git compares one tree with its index. Merge: "
            f"{half} children by `forkvm merge CHILD --into SOURCE --path /root/tree`, the "
            f"other {half} by hand with git (`git diff --binary` in the child, the patch "
            "carried through exec, `git apply` in the source), alternating; after each, the "
            "child's files are byte-identical in the source and git there lists the changes "
            "of every child merged so far.", "",
            "| figure | n | p50 | p90 | max |", "|---|---:|---:|---:|---:|",
            *[f"| {label} | {st['n']} | {ms(st['p50'])} | {ms(st['p90'])} | {ms(st['max'])} |"
              for label, st in (("**forkvm diff, wall (ms)**", f["diff"]),
                                ("forkvm diff, `diff_ms` (ms)", f["diff_engine"]),
                                ("**git status, exec wall (ms)**", f["git_status"]),
                                ("git status, in the guest (ms)", f["git_status_engine"]),
                                ("**forkvm merge, wall (ms)**", f["merge"]),
                                ("forkvm merge, `merge_ms` (ms)", f["merge_engine"]),
                                ("**git diff + git apply, wall (ms)**", f["git_apply"]))],
            "", *per_run_lines(ops, args),
            "", f"- **Ratios:** diff ÷ git status **{f['diff_vs_git']:.2f}×**; merge ÷ "
            f"git diff + apply **{f['merge_vs_git']:.2f}×** (p50 walls)."]


def summary(steps, ops, args) -> list[str]:
    f = figures(steps, ops, args)
    return [f"checkpoint pause p50 {f['pause']['p50']:.2f} ms (snapshot {f['snap_pause']['p50']:.1f})",
            f"rewind p50 {f['rewind']['p50']:.0f} ms, spawn {f['spawn']['p50']:.0f} ms",
            f"diff p50 {f['diff']['p50']:.0f} ms, git status {f['git_status']['p50']:.0f} ms",
            f"merge p50 {f['merge']['p50']:.0f} ms, git apply {f['git_apply']['p50']:.0f} ms"]
