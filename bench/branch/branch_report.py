"""The branch benchmark's RESULTS.md: the per-size and per-dirty tables, the
chain section and the file itself.
"""

from __future__ import annotations

from pathlib import Path

import report as rp
from branch_modes import BRANCH_MODES, MIN_RUNS, MODE_ORDER, NOISY_CORES, naive_modes, source_of
from branch_cases import CHAIN_FILE
from branch_stats import (
    NAIVE_ALL, chain_stats, fmt, fmt_ms, p50, pause_parts, pstat, sel, targets,
)
from branch_jail import jail_section
from branch_text import method_text, reasons


def stats_table(rows, exp, xkey, xs, modes, L, xname):
    L += [f"| {xname} | mode | source | n | min | p50 | p90 | max | naive p50 ÷ this p50 (same "
          "source) | naive cap lifted ÷ this |",
          "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for x in xs:
        cell = [r for r in rows if r["experiment"] == exp and r[xkey] == x]
        base = {m: p50([r for r in cell if r["mode"] == m]) for m in NAIVE_ALL}
        for mode in modes:
            rs = [r for r in cell if r["mode"] == mode]
            if not rs:
                continue
            s = pstat(rs)
            nv_m, nl_m = naive_modes(mode)
            b = "**" if mode in BRANCH_MODES else ""
            L.append(f"| {x} | {b}{mode}{b} | {source_of(mode)} | {s['n']} | {fmt_ms(s['min'])} | "
                     f"{b}{fmt_ms(s['p50'])}{b} | {fmt_ms(s['p90'])} | {fmt_ms(s['max'])} | "
                     f"{fmt(rp.ratio(base[nv_m], s['p50']), 1)}× | "
                     f"{fmt(rp.ratio(base[nl_m], s['p50']), 1)}× |")


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
            p = lambda k: p50(rs, k)  # noqa: E731
            L.append(f"| {x} | {mode} | {fmt_ms(p('save_state_ms'))} | "
                     f"{fmt_ms(p('freeze_disk_ms'))} | {fmt_ms(p('copy_memory_ms'))} | "
                     f"{fmt_ms(p('publish_ms'))} | {fmt_ms(p('snapshot_total_ms'))} | "
                     f"{fmt_ms(p('qemu_downtime_ms'))} | {fmt(p('ram_transferred_mib'))} | "
                     f"{fmt(p('snapshot_alloc_mib'))} | {fmt(p('ram_file_before_mib'))}→"
                     f"{fmt(p('ram_file_after_mib'))} |")


def diff_table(rows, exp, xkey, xs, L, xname):
    L += [f"| {xname} | n | pause | device state | pagemap + read private pages | freeze_disk | "
          "rest | publish (compare, write memory.diff) | snapshot total | clone's private RAM "
          "(MiB) | memory.diff (MiB) | snapshot on disk (MiB) |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in xs:
        rs = [r for r in rows if r["experiment"] == exp and r[xkey] == x and r["mode"] == "diff"]
        if not rs:
            continue
        p = lambda k: p50(rs, k)  # noqa: E731
        rest = list(pause_parts(rs).values())[-1]
        L.append(f"| {x} | {len(rs)} | {fmt_ms(p('pause_ms'))} | {fmt_ms(p('save_state_ms'))} | "
                 f"{fmt_ms(p('copy_memory_ms'))} | {fmt_ms(p('freeze_disk_ms'))} | "
                 f"{fmt_ms(rest)} | {fmt_ms(p('publish_ms'))} | "
                 f"{fmt_ms(p('snapshot_total_ms'))} | {fmt(p('clone_private_mib'), 1)} | "
                 f"{fmt(p('memory_diff_mib'), 1)} | {fmt(p('snapshot_alloc_mib'), 1)} |")


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
            p = lambda k: p50(rs, k)  # noqa: E731
            L.append(f"| {x} | file on {'store disk' if where == 'disk' else '/dev/shm'} | "
                     f"{len(rs)} | {fmt_ms(p('pause_ms'))} | {fmt_ms(p('stop_to_completed_ms'))} | "
                     f"{fmt_ms(p('completed_to_resume_ms'))} | {fmt_ms(p('qemu_downtime_ms'))} | "
                     f"{fmt_ms(p('wall_ms'))} | {fmt(p('state_file_mib'))} |")


def chain_section(rows, ctx, args, L) -> None:
    chain = ctx.get("chain") or {}
    build = [r for r in rows if r["experiment"] == "chain_build"]
    if not chain and not build:
        return
    L += ["", f"## 4. Spawn time vs diff-chain depth ({args.chain_memory} MiB guest)", "",
          f"Depth 0 is the `shared` snapshot of a booted source. Link k: a clone spawned from "
          f"the head fills {args.chain_dirty} MiB (a guest process holding random data) and "
          f"writes `{CHAIN_FILE.format(k='k')}` (+ sync), then branches `diff` (count 0) and is "
          "deleted. `flat` is `POST /v1/snapshots/{depth-%d head}/flatten`: the same content "
          "as the deepest head, standalone." % args.chain_depth, "",
          "How the chain was built (one run each):", "",
          "| link | snapshot | kind | depth | pause | pagemap + read private pages | publish | "
          "clone's private RAM (MiB) | memory.diff (MiB) |",
          "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted((r for r in build if r["mode"] == "diff"), key=lambda r: r["run"]):
        L.append(f"| {r['run']} | {r['snapshot']} | {r['snapshot_kind']} | {r['depth']} | "
                 f"{fmt_ms(r['pause_ms'])} | {fmt_ms(r['copy_memory_ms'])} | "
                 f"{fmt_ms(r['publish_ms'])} | {fmt(r['clone_private_mib'], 1)} | "
                 f"{fmt(r['memory_diff_mib'], 1)} |")
    for r in (r for r in build if r["mode"] == "flatten"):
        L.append(f"| flatten | {r['snapshot']} | {r['snapshot_kind']} | 0 | – | – | "
                 f"{fmt_ms(r['snapshot_total_ms'])} (whole flatten; client "
                 f"{fmt_ms(r['wall_ms'])}) | – | memory.img {fmt(r['snapshot_alloc_mib'])} MiB "
                 "allocated |")
    snaps = chain.get("snapshots", [])
    if not any(r["experiment"] == "chain" for r in rows):
        return
    flat = chain_stats(rows, "flat")["p50"]
    d0 = chain_stats(rows, "depth 0")["p50"]
    L += ["", f"Spawn, `POST /v1/sandboxes {{\"snapshot\": id, \"count\": 1}}`, no warm pool "
          f"(every response has `from_pool: false`), {args.chain_runs} rounds; in each round one "
          "spawn from every snapshot, the order rotated by one each round; the child is deleted "
          "after each (not timed). total_ms is the server's (`timings.total_ms`); client = the "
          "client's time until the 201. Stage columns are p50s (ms).", "",
          "| snapshot | kind | depth | chain's memory.diff (MiB) | n | total min | **total p50** | "
          "total p90 | total max | client p50 | prepare | qemu_start | restore | identity | "
          "÷ flat (p50) | ÷ depth 0 (p50) |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    acc = 0.0
    for s in snaps:
        st = chain_stats(rows, s["label"])
        if not st["n"]:
            continue
        if s["kind"] == "diff":
            acc += s["memory_diff_mib"] or 0.0
        chain_mib = acc if s["kind"] == "diff" else 0.0
        stage = lambda k: fmt_ms(chain_stats(rows, s["label"], k)["p50"])  # noqa: E731
        L.append(f"| {s['label']} | {s['kind']} | {s['depth']} | {fmt(chain_mib, 1)} | "
                 f"{st['n']} | {fmt_ms(st['min'])} | **{fmt_ms(st['p50'])}** | "
                 f"{fmt_ms(st['p90'])} | {fmt_ms(st['max'])} | "
                 f"{fmt_ms(chain_stats(rows, s['label'], 'wall_ms')['p50'])} | "
                 f"{stage('prepare_ms')} | {stage('qemu_start_ms')} | {stage('restore_ms')} | "
                 f"{stage('identity_ms')} | {rp.ratio(st['p50'], flat):.2f}× | "
                 f"{rp.ratio(st['p50'], d0):.2f}× |")
    L += ["", "For a diff snapshot the daemon verifies every link (inside `prepare`); the first "
          "spawn of each (or its flatten) also builds the chain's flattened `memory.head` there "
          "(the depth-3 head's was built by the flatten above, before the spawns), which every "
          "child then maps like a `shared` snapshot's memory image. A run-1 child of every snapshot was checked "
          f"to see exactly the files of links 1..k (`{CHAIN_FILE.format(k='k')}`)."]


def shared_host_lines(timed, machine) -> list[str]:
    """A warning when other work used the CPUs for more than a tenth of the
    measurements (or at their p50)."""
    oc = rp.summarize(r["other_cpu_cores"] for r in timed)
    noisy = sum(r["other_cpu_cores"] > NOISY_CORES for r in timed)
    if not oc["n"] or (oc["p50"] <= NOISY_CORES and noisy * 10 <= len(timed)):
        return []
    exps = sorted({r["experiment"] for r in timed if r["other_cpu_cores"] > NOISY_CORES},
                  key=lambda e: (e.startswith("jail_"), e))
    return [f"- **Shared host:** other work (other people's builds and tests) kept more than "
            f"{NOISY_CORES} of the {machine['cores']} cores busy during {noisy} of {len(timed)} "
            f"measurements (p90 {oc['p90']:.2f} cores; experiments {', '.join(exps)}), so "
            "absolute times there are inflated against a quiet host; the jail comparison's "
            "alternating segments weigh such load on both sides alike."]


def write_results(path: Path, rows, ctx, args, plots: list[str]) -> None:
    info, machine = ctx["info"], ctx["machine"]
    sizes = sorted({r["size_mib"] for r in rows if r["experiment"] == "size"})
    dirties = sorted({r["dirty_mib"] for r in rows if r["experiment"] == "dirty"})
    qd = ctx.get("qemu_defaults") or {}
    L = []
    if args.smoke:
        L += rp.smoke_banner(f"N={args.runs}, chain N={args.chain_runs}; a valid run needs "
                             f"≥ {MIN_RUNS}", "bash bench/branch/run.sh")
    if ctx.get("error"):
        L += [f"> **INCOMPLETE RUN**: {ctx['error']}", ""]
    naive_sizes = {s: len(sel(rows, "size", "naive", s)) for s in sizes}
    L += [
        "# Branch benchmark: how long a branch pauses the source",
        "",
        rp.date_line(ctx["started"], ctx["elapsed"], minutes=True),
        rp.forkvm_line(info, ctx.get("revision"), " (when the bench started, right after the "
                       "build)"),
        f"- Machine: {rp.machine_text(machine)}; kernel Linux {machine['kernel']}; load average "
        "at start " + rp.loadavg_text(machine),
        rp.accel_line(info),
        f"- QEMU: {rp.qemu_text(info)}; its default migration "
        f"parameters (read from a freshly booted source): max-bandwidth "
        f"{(qd.get('max-bandwidth') or 0) / 2**20:.0f} MiB/s, downtime-limit "
        f"{qd.get('downtime-limit')} ms",
        "- Guests: 1 vCPU, image `default`.",
        "- **Sources** (each mode on the kind of source it is made for, the two kept "
        "equivalent):",
        "  - **booted** (modes `live`, `full`, `naive`, `naive_nolimit`, the `qemu_live_*` "
        "references, `stop_cont`): cold-booted (`use_template: false`), so it owns its RAM "
        f"(a `share=on` file in /dev/shm); rests {args.settle:.0f} s before anything is measured.",
        "  - **clone** (modes `diff`, `naive_clone`, `naive_nolimit_clone`): right after the "
        "booted source of the same experiment has rested, and before anything else is done to "
        "it, `POST /v1/sandboxes/{id}/snapshot` takes a `shared` base snapshot of it; when the "
        "booted source's measurements are done it is deleted and the clone is spawned from the "
        "base — its twin at that instant (same size, processes and page cache) whose RAM is a "
        "private copy-on-write mapping of the base's memory image. It rests "
        f"{args.settle:.0f} s too. Whatever the experiment does to the booted source is done "
        "to the clone the same way: in **dirty** the clone fills its own D MiB after its spawn "
        "(so they are pages the diff has to carry), in **consecutive** the base is taken with "
        "the counter loop running, so the clone runs it too. Every diff branch must give a "
        "`diff` snapshot of depth 1 (its parent is the base).",
        "  - The two are run one after the other, never at the same time (2 cores).",
        f"- N per cell: **size** — {args.runs} branches per mode (live, full, diff) per size; "
        "naive on the booted source "
        + ", ".join(f"{s} MiB: {n}" for s, n in naive_sizes.items())
        + f" per variant, on the clone {min(args.naive_runs, args.clone_naive_runs)} per "
        f"variant; {args.ref_runs} per live reference; {args.floor_runs} stop+cont. **dirty** "
        f"({args.dirty_memory} MiB guest) — {args.dirty_runs} branches per mode per D, "
        f"{args.dirty_naive_runs} naive per variant and source, {args.dirty_ref_runs} per live "
        f"reference. **consecutive** — {args.consecutive} live then {args.consecutive} full "
        f"branches of one {args.consecutive_memory} MiB booted source, {args.consecutive} diff "
        f"branches of its clone. **chain** — {args.chain_runs} spawns from each of depth "
        f"0..{args.chain_depth} and the flattened snapshot" + (" (SMOKE)" if args.smoke else ""),
    ]
    main_uids = sorted((ctx.get("jail_uids") or {}).get(rp.JAILED, set()))
    L += ["- **Jail:** every figure of experiments 1–4 is **jailed**: the daemon ran with "
          "`FORKVM_NO_JAIL=0`, and every source and clone QEMU was checked to run as a non-root "
          f"uid ({len(main_uids)} distinct, from {main_uids[0] if main_uids else '–'}). The "
          "naive baseline and the live references are the bench's own QMP saves of those same "
          "jailed QEMUs, written into the source's own directory (the naive state file, the "
          "`qemu_live_disk` file) or its RAM scratch directory under /dev/shm "
          "(`qemu_live_shm`): a jailed QEMU sees and can write nothing else. "
          + ("The jail's cost is under **Jail cost** below (`jail` and `segment` columns in "
             "the CSV)." if ctx.get("jail") else
             "No jail comparison in this run (`--no-jail-compare`).")]
    timed = [r for r in rows if r.get("other_cpu_cores") is not None]
    oc = rp.summarize(r["other_cpu_cores"] for r in timed)
    noisy = sum(r["other_cpu_cores"] > NOISY_CORES for r in timed)
    L += [f"- Host noise — cores kept busy by other processes during each measurement "
          f"(`other_cpu_cores`): p50 {oc['p50']:.2f}, p90 {oc['p90']:.2f}, max {oc['max']:.2f}; "
          f"{noisy} of {len(timed)} measurements above {NOISY_CORES} cores"
          + (f"; at start the bench waited for a quiet host and measured "
             f"{ctx['quiet']:.2f} cores" if ctx.get("quiet") is not None else "")]
    L += shared_host_lines(timed, machine)
    if ctx.get("others"):
        L += [f"- Other QEMU processes (not this bench's) were running during "
              f"{ctx['busy_runs']} measurements: " + "; ".join(
                  f"pid {p}" for p in list(ctx["others"])[:8])]
    if ctx.get("diff_fallback"):
        L += ["- A `diff` branch of a booted source (it owns its RAM: nothing to diff against) "
              f"falls back to a full snapshot; asked once, it gave {ctx['diff_fallback']}."]

    # ---- targets
    L += ["", "## Targets", "",
          "| target | figure | verdict | why (when missed) |", "|---|---|---|---|"]
    for t in targets(rows, ctx, args):
        L.append(f"| {t['target']} | {t['figure']} | **{t['verdict']}** | {t['why'] or ''} |")

    L += ["", "### Observations (read from this run's own measurements)", ""]
    L += reasons(rows, sizes, dirties, ctx, args)

    jail_section(rows, ctx, args, L)

    # ---- tables
    if sizes:
        L += ["", "## 1. Pause vs guest memory size (idle guest)", "",
              "All pauses in ms, STOP→RESUME from QEMU's event timestamps (the daemon's "
              "`pause_ms` for live/full/diff; the bench's own QMP events for the others — "
              "`pause_source` in the CSV). \"naive ÷ this\" = the naive p50 of the same size "
              "measured on the same source (booted for live/full, the clone for diff) ÷ this "
              "row's p50.", ""]
        stats_table(rows, "size", "size_mib", sizes, MODE_ORDER, L, "MiB")
        L += ["", "Stage p50s of the live/full branches (ms; server `timings`, plus QEMU's own "
              "`query-migrate` figures read right after each branch):", ""]
        stages_table(rows, "size", "size_mib", sizes, L, "MiB")
        L += ["", "Stage p50s of the diff branches (ms). Inside the pause: device state, pagemap "
              "scan + reading the clone's private pages, disk freeze, rest (stop/cont, QMP). "
              "After it: publish (keeping only pages that differ from the parent's view, "
              "writing `memory.diff`, hashing):", ""]
        diff_table(rows, "size", "size_mib", sizes, L, "MiB")
        first_full = [r for r in rows if r["experiment"] == "size" and r["mode"] == "full"
                      and r["run"] == 1]
        if first_full:
            L += ["", "Full mode, run 1 (before any live branch of that source) vs runs 2…N "
                  "(after): " + "; ".join(
                      f"{r['size_mib']} MiB: {fmt_ms(r['pause_ms'])} ms with the RAM file at "
                      f"{fmt(r['ram_file_before_mib'])} MiB allocated vs p50 "
                      f"{fmt_ms(p50([x for x in sel(rows, 'size', 'full', r['size_mib']) if x['run'] > 1]))}"
                      f" ms at {fmt(p50([x for x in sel(rows, 'size', 'full', r['size_mib']) if x['run'] > 1], 'ram_file_before_mib'))} MiB"
                      for r in first_full) + "."]
        L += ["", "Live references (the bench runs the same mapped-ram live save itself over QMP "
              "and `cont`s at once — no disk freeze, no publish — once with the file in the "
              "source's own directory in the daemon home, on the store's filesystem, and once "
              "in its RAM scratch directory on /dev/shm):", ""]
        refs_table(rows, "size", "size_mib", sizes, L, "MiB")

    if dirties:
        L += ["", f"## 2. Pause vs memory dirtied before the branch ({args.dirty_memory} MiB "
              "guest)", "",
              "A fresh booted source per D, and its clone. A guest process fills D MiB (a random "
              "1 MiB block repeated, so no page is zero) and sleeps holding it; in the clone it "
              "does so after the spawn. Then the branches.", ""]
        stats_table(rows, "dirty", "dirty_mib", dirties, MODE_ORDER, L, "dirty MiB")
        L += ["", "Stage p50s, live/full (ms):", ""]
        stages_table(rows, "dirty", "dirty_mib", dirties, L, "dirty MiB")
        L += ["", "Stage p50s, diff (ms):", ""]
        diff_table(rows, "dirty", "dirty_mib", dirties, L, "dirty MiB")
        L += ["", "Live references:", ""]
        refs_table(rows, "dirty", "dirty_mib", dirties, L, "dirty MiB")

    checks = ctx.get("counter_checks") or []
    cons = [r for r in rows if r["experiment"] == "consecutive" and r["mode"] in BRANCH_MODES]
    if cons:
        L += ["", f"## 3. {args.consecutive} consecutive branches of one "
              f"{args.consecutive_memory} MiB source (counter loop running)", "",
              "live and full on the booted source; diff on its clone (spawned from a base taken "
              "with the loop running; every diff has the base as parent, so each one reads all "
              "pages the clone wrote since its spawn).", "",
              "| mode | # | pause | save_state | copy_memory | publish | branch total_ms | "
              "client wall | QEMU downtime | memory.diff (MiB) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for mode in BRANCH_MODES:
            for r in sorted(sel(rows, "consecutive", mode), key=lambda r: r["run"]):
                L.append(f"| {mode} | {r['run']} | {fmt_ms(r['pause_ms'])} | "
                         f"{fmt_ms(r['save_state_ms'])} | {fmt_ms(r['copy_memory_ms'])} | "
                         f"{fmt_ms(r['publish_ms'])} | {fmt_ms(r['branch_total_ms'])} | "
                         f"{fmt_ms(r['wall_ms'])} | {fmt_ms(r['qemu_downtime_ms'])} | "
                         f"{fmt(r.get('memory_diff_mib'), 1)} |")
        L += ["", "| mode | source | pause p50 | p90 | min | max | total_ms p50 | counter before "
              f"→ +{args.counter_gap:.0f} s | right after → +{args.counter_gap:.0f} s | rate "
              "before / during / after (per s) | disk chain layers before → after | verdict |",
              "|---|---|---:|---:|---:|---:|---:|---|---|---|---|---|"]
        for ch in checks:
            rs = sel(rows, "consecutive", ch["mode"])
            s, t = pstat(rs), pstat(rs, "branch_total_ms")
            v = ch["values"]
            L.append(f"| {ch['mode']} | {ch['source']} | {fmt_ms(s['p50'])} | "
                     f"{fmt_ms(s['p90'])} | {fmt_ms(s['min'])} | {fmt_ms(s['max'])} | "
                     f"{fmt_ms(t['p50'])} | {v[0]} → {v[1]} | {v[2]} → {v[3]} | "
                     f"{ch['rate_before']:.1f} / {ch['during_rate']:.1f} / "
                     f"{ch['rate_after']:.1f} | {ch['depth_before']} → {ch['depth_after']} | "
                     f"**{'source kept running, counter advancing' if ch['ok'] else 'STUCK'}** |")
        L += ["", "The counter is read through the agent (`cat /tmp/counter`) before the block, "
              f"{args.counter_gap:.0f} s later, right after the last branch, and "
              f"{args.counter_gap:.0f} s after that; \"during\" is the rate between the second "
              "and third readings, i.e. over the whole block of branches. The loop sleeps 50 ms "
              "per step, so ~20/s is the most it can do; under TCG fork+exec of `sleep` and "
              "`mv` slows it. The snapshots of a block are kept until the block ends, then "
              "deleted (force)."]

    chain_section(rows, ctx, args, L)

    if ctx.get("notes"):
        L += ["", "Notes:"] + [f"- {n}" for n in ctx["notes"]]
    L += ["", "Raw data: `branch.csv` (one row per measurement; `counter_*` rows are the counter "
          "readings, `chain_build` rows the chain's links and flatten, `chain` rows the "
          "spawns). Plots: " + ", ".join(f"`{p}`" for p in plots) + ".", ""]
    L += ["## Method", ""] + method_text(args)
    path.write_text("\n".join(L) + "\n")
