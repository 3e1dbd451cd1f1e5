"""Report half of the fan-out benchmark (bench_fanout.py): the key figures,
RESULTS.md, and the plots fanout.png and cpu.png, from the rows that
bench_fanout.py measured (fanout.csv and children.csv rows)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))

import report as rp  # noqa: E402


MIN_RUNS = 10
NOISY_CORES = 0.25  # a run during which other processes used more than this is flagged
SPEED_TARGET = 10.0  # fan-out at least this many times faster than the naive baseline
WALL_TARGET_MS = 3000.0  # 100 children answering within this
TARGET_COUNT = 100  # the wall target is stated for this many children
SPAWN_CASE = "spawn_count"
NAIVE_CASE = "naive"
# The children's SpawnTimings stages, in the order they happen.
STAGES = ["prepare_ms", "qemu_start_ms", "network_ms", "restore_ms", "identity_ms",
          "network_ready_ms"]
NAIVE_STAGES = ["disk_copy_ms", "netns_ms", "qemu_start_ms", "load_ms", "cont_ms", "agent_ms"]
CPU_PARTS = [("qemu_cpu_ms", "QEMU (guest + device emulation)"),
             ("daemon_cpu_ms", "daemon (own threads)"),
             ("helper_cpu_ms", "helper processes (reaped by the daemon)")]


# --------------------------------------------------------------------------
# Summaries (unit-tested in bench/common/test_fanout.py)
# --------------------------------------------------------------------------


def case_names(modes) -> list[str]:
    return [f"branch_{m}" for m in modes] + [SPAWN_CASE]


def ok_runs(runs: list[dict], case: str) -> list[dict]:
    return [r for r in runs if r["case"] == case and r.get("ok")]


def key_figures(runs: list[dict], modes, count: int) -> dict:
    """Per forkvm case: p50/p90 of the run wall, and the ratio of the naive
    batch's wall (p50 over its batches) to that p50, with the verdicts on
    the two targets."""
    naive = rp.summarize(r["total_ms"] for r in ok_runs(runs, NAIVE_CASE))
    out = {"naive": naive, "cases": {}}
    for c in case_names(modes):
        s = rp.summarize(r["total_ms"] for r in ok_runs(runs, c))
        speedup = rp.ratio(naive["p50"], s["p50"])
        out["cases"][c] = {
            "wall": s, "speedup": speedup,
            "speed_met": None if speedup != speedup else speedup >= SPEED_TARGET,
            "wall_met": None if s["n"] == 0 or count != TARGET_COUNT
            else s["p50"] <= WALL_TARGET_MS,
            "failed": sum(1 for r in runs if r["case"] == c and not r.get("ok")),
        }
    return out


def verdict(met) -> str:
    return {True: "**met**", False: "**missed**", None: "not assessed"}[met]


def cpu_summary(children: list[dict], case: str) -> dict:
    """Mean and p50/p90 per child of each CPU part and wall stage of a case."""
    rs = [r for r in children if r["case"] == case]
    keys = [k for k, _ in CPU_PARTS] + ["cpu_total_ms"] + STAGES + NAIVE_STAGES + \
        ["server_total_ms", "answered_ms", "exec_ms", "total_ms"]
    return {k: rp.summarize(r.get(k) for r in rs) for k in keys}

# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def ms(v, digits: int = 0) -> str:
    return rp.fmt(v, digits)


def write_plots(out: Path, runs, children, modes, title: str) -> None:
    plt = rp.pyplot()
    cases = case_names(modes) + [NAIVE_CASE]
    # 1. Walls: each run's wall (request -> last answer), per case.
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, c in enumerate(cases):
        rs = ok_runs(runs, c)
        ys = [r["total_ms"] / 1000 for r in rs]
        a1.scatter([i] * len(ys), ys, s=18, alpha=0.7,
                   c=["tab:orange" if (r.get("other_cpu_cores") or 0) > NOISY_CORES else "tab:blue"
                      for r in rs])
        if ys:
            a1.hlines(rp.percentile(ys, 50), i - 0.3, i + 0.3, colors="k")
        calls = [r["call_ms"] / 1000 for r in rs if r.get("call_ms") is not None]
        if calls:
            a1.scatter([i + 0.15] * len(calls), calls, s=12, marker="x", c="tab:gray")
    a1.axhline(WALL_TARGET_MS / 1000, ls="--", c="tab:red", lw=1)
    a1.set_xticks(range(len(cases)), [c.replace("_", "\n") for c in cases], fontsize=8)
    a1.set_ylabel("s (request → last child answered)")
    a1.set_title("wall per run (line: p50; x: the call alone; orange: noisy host;\n"
                 f"dashed: the {WALL_TARGET_MS / 1000:.0f} s target)", fontsize=9)
    a1.set_ylim(bottom=0)
    # When each child answered, all runs of a case pooled (CDF).
    for c in cases:
        xs = sorted(k["answered_ms"] / 1000 for k in children if k["case"] == c
                    and k.get("answered_ms") is not None)
        if xs:
            a2.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=c)
    a2.set_xlabel("s since the request (naive: since the first restore started)")
    a2.set_ylabel("fraction of children answered")
    a2.set_title("when the children answered (all runs pooled)", fontsize=9)
    a2.legend(fontsize=8)
    rp.save_figure(fig, out / "fanout.png", title=title)

    # 2. CPU per child (stacked) and wall per stage (stacked), per case.
    fig, (b1, b2) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for i, c in enumerate(cases):
        s = cpu_summary(children, c)
        bottom = 0.0
        for (k, label), col in zip(CPU_PARTS, colors):
            v = s[k]["mean"]
            if v == v:
                b1.bar(i, v, bottom=bottom, color=col, label=label if i == 0 else None)
                bottom += v
        if bottom:
            b1.text(i, bottom, f"{bottom:,.0f}", ha="center", va="bottom", fontsize=8)
    b1.set_xticks(range(len(cases)), [c.replace("_", "\n") for c in cases], fontsize=8)
    b1.set_ylabel("mean CPU ms per child")
    b1.set_title("CPU per child (naive: its QEMU and the bench process)", fontsize=9)
    b1.legend(fontsize=7)
    stage_sets = [(c, STAGES) for c in case_names(modes)] + [(NAIVE_CASE, NAIVE_STAGES)]
    cmap = plt.get_cmap("tab20")
    labels_done: set = set()
    for i, (c, stages) in enumerate(stage_sets):
        s = cpu_summary(children, c)
        bottom = 0.0
        for j, k in enumerate(stages):
            v = s[k]["mean"]
            if v != v:
                continue
            lab = k.removesuffix("_ms")
            key = (lab, stages is NAIVE_STAGES)
            col = cmap(j + (10 if stages is NAIVE_STAGES else 0))
            b2.bar(i, v / 1000, bottom=bottom, color=col,
                   label=(lab + (" (naive)" if stages is NAIVE_STAGES else ""))
                   if key not in labels_done else None)
            labels_done.add(key)
            bottom += v / 1000
    b2.set_xticks(range(len(stage_sets)), [c.replace("_", "\n") for c, _ in stage_sets],
                  fontsize=8)
    b2.set_ylabel("mean s per child")
    b2.set_title("wall per stage per child (the daemon's timings; naive: the bench's)",
                 fontsize=9)
    b2.legend(fontsize=7)
    rp.save_figure(fig, out / "cpu.png", title=title)


def cpu_section(children, runs, modes) -> list[str]:
    L = ["## CPU and wall per child", "",
         "Milliseconds per child. CPU: `qemu` is the child's QEMU (utime+stime from "
         "/proc/<pid>/stat right after its exec answered, so it counts everything from its "
         "start); `daemon` is the daemon's own CPU over the run (request until the last "
         "answer) and `helpers` the CPU of the processes it started and reaped in that window "
         "(its cutime+cstime), both divided by the number of children. Wall: the children's "
         "`timings`.", "",
         "| case | what | n | p50 | p90 | mean |", "|---|---|---:|---:|---:|---:|"]
    for c in case_names(modes) + [NAIVE_CASE]:
        s = cpu_summary(children, c)
        stages = NAIVE_STAGES if c == NAIVE_CASE else STAGES
        for k, label in [*CPU_PARTS, ("cpu_total_ms", "total")]:
            st = s[k]
            if st["n"]:
                name = label.split(" (")[0]
                if c == NAIVE_CASE and k == "daemon_cpu_ms":
                    name = "bench process (QMP, copies, pings)"
                L.append(f"| {c} | CPU: {name} | {st['n']} | {ms(st['p50'])} | "
                         f"{ms(st['p90'])} | {ms(st['mean'])} |")
        for k in stages + (["server_total_ms"] if c != NAIVE_CASE else ["total_ms"]):
            st = s[k]
            if st["n"]:
                L.append(f"| {c} | wall: {k.removesuffix('_ms')} | {st['n']} | {ms(st['p50'])} | "
                         f"{ms(st['p90'])} | {ms(st['mean'])} |")
        st = s["answered_ms"]
        if st["n"]:
            since = "the batch started" if c == NAIVE_CASE else "the request"
            L.append(f"| {c} | wall: answered (since {since}) | {st['n']} | "
                     f"{ms(st['p50'])} | {ms(st['p90'])} | {ms(st['mean'])} |")
    return L


def cores_busy(run: dict) -> float:
    """The CPU a run used (children's QEMUs, the daemon, its helpers) over
    its wall: how many cores it kept busy on average."""
    parts = [run.get(k) for k in ("qemu_cpu_ms", "daemon_cpu_ms", "helper_cpu_ms")]
    parts = [p for p in parts if p is not None and p == p]
    return rp.ratio(sum(parts), run.get("total_ms")) if parts else math.nan


def where_cpu_goes(children, modes, runs=()) -> list[str]:
    L = []
    for c in case_names(modes) + [NAIVE_CASE]:
        rs = ok_runs(list(runs), c)
        if rs:
            b = rp.summarize(cores_busy(r) for r in rs)
            o = rp.summarize(r.get("other_cpu_cores") for r in rs)
            L.append(f"- **{c}** kept p50 {b['p50']:.2f} cores busy over its wall (all the CPU "
                     f"it used ÷ wall), while other processes took p50 {o['p50']:.2f}: the "
                     "run is CPU-bound when the two add up to the host's cores.")
    for c in case_names(modes):
        s = cpu_summary(children, c)
        q, d, h = (s[k]["mean"] for k, _ in CPU_PARTS)
        tot = q + d + h
        if not tot == tot or tot == 0:
            continue
        stages = {k: s[k]["p50"] for k in STAGES}
        top = max((k for k in stages if stages[k] == stages[k]), key=lambda k: stages[k],
                  default=None)
        L.append(f"- **{c}**: {tot:,.0f} ms of CPU per child on average: QEMU "
                 f"{q:,.0f} ms ({q / tot:.0%}), the daemon {d:,.1f} ms ({d / tot:.0%}), helper "
                 f"processes {h:,.1f} ms ({h / tot:.0%}). The longest stage of a child is "
                 f"`{top.removesuffix('_ms') if top else '?'}` (p50 {ms(stages.get(top))} ms)"
                 f"; server total p50 {ms(s['server_total_ms']['p50'])} ms.")
    s = cpu_summary(children, NAIVE_CASE)
    if s["qemu_cpu_ms"]["n"]:
        L.append(f"- **naive**: its QEMU used {s['qemu_cpu_ms']['mean']:,.0f} ms of CPU per "
                 f"restore on average (p50 {ms(s['qemu_cpu_ms']['p50'])}), the bench process "
                 f"{s['daemon_cpu_ms']['mean']:,.1f} ms.")
    return L


def write_results(path: Path, runs, children, ctx: dict, args) -> None:
    info, machine = ctx["info"], ctx["machine"]
    modes = args.modes
    kf = key_figures(runs, modes, args.count)
    L = ["# Fan-out benchmark: 100 children of one running clone vs 100 naive QEMU restores",
         ""]
    if args.smoke:
        L += rp.smoke_banner(f"{args.runs} run(s) of {args.count} children",
                             "bash bench/fanout/run.sh")
    elif args.runs < MIN_RUNS:
        L += [f"> **Reduced run**: {args.runs} runs per case instead of {MIN_RUNS}.", ""]
    oc = rp.summarize(r.get("other_cpu_cores") for r in runs)
    L += [rp.date_line(ctx["started"], ctx["elapsed"], minutes=True),
          rp.forkvm_line(info, ctx["revision"]),
          f"- Machine: {rp.machine_text(machine)}",
          f"- Kernel: Linux {machine['kernel']}; load average at start: "
          f"{rp.loadavg_text(machine)}",
          rp.accel_line(info),
          f"- QEMU: {rp.qemu_text(info)}",
          f"- Command: `{ctx['command']}`",
          f"- Guest: {args.memory} MiB RAM, 1 vCPU, image `default`. The source is "
          f"`POST /v1/sandboxes {{\"memory_mib\": {args.memory}}}` (the defaults: a clone of the "
          f"image's boot template, snapshot `{ctx.get('source_snapshot')}`, restore "
          f"{ms(ctx.get('source_restore_ms'))} ms; network `{ctx.get('source_network')}`), idle "
          f"{args.settle:.0f} s before the first run; every child keeps its network mode. "
          + ("`wait_for_network` left out of the requests (the default: true), so each call "
             "returns once every child's agent proved its route to the gateway."
             if getattr(args, "wait_for_network", None) is None else
             f"**`wait_for_network: {str(args.wait_for_network).lower()}`** sent with every "
             "branch and spawn (`--wait-for-network`/`--no-wait-for-network`)"
             + (": the call returns after each child's identity step, without the network "
                "probe; the network is set up either way." if args.wait_for_network is False
                else ".")),
          f"- Runs: {args.runs} per case ({', '.join(case_names(modes))}), {args.count} children "
          f"each, interleaved (run i of every case, then run i+1); naive: {args.naive_runs} "
          f"batch(es) of {args.count} restores by {ctx.get('naive_workers')} workers "
          f"(os.cpu_count()), before the forkvm runs, with the source idle.",
          f"- Daemon: private, jailed (`FORKVM_NO_JAIL=0`; every child's QEMU checked to run as "
          f"a non-root uid), default limits: max_sandboxes 1000, memory commitment "
          f"{ms(ctx.get('memory_commit_mib'))} MiB (`GET /v1/info` capacity) — nothing had to "
          f"be raised for {args.count} children.",
          f"- Host noise — average cores kept busy by processes other than this bench's per "
          f"timed run (`other_cpu_cores` in fanout.csv): p50 {oc['p50']:.2f}, max "
          f"{oc['max']:.2f} of {machine['cores']}; "
          f"{sum((r.get('other_cpu_cores') or 0) > NOISY_CORES for r in runs)} of {len(runs)} "
          f"runs (failed ones included) above {NOISY_CORES}.",
          *rp.other_qemu_lines(ctx.get("others") or {}, ctx.get("busy_runs", 0), len(runs)),
          f"- Leak check: QEMU processes naming the daemon's home after the runs and the "
          f"cleanup: {ctx.get('leaked', '?')}.",
          ""]
    L += ["## Targets", "",
          f"Naive baseline: {args.count} naive restores by {ctx.get('naive_workers')} "
          f"concurrent workers, first start to last pong: p50 "
          f"**{ms(kf['naive']['p50'])} ms** over {kf['naive']['n']} batch(es).", "",
          f"| case | wall p50 | wall p90 | naive ÷ p50 | ≥ {SPEED_TARGET:.0f}× faster | "
          f"≤ {WALL_TARGET_MS / 1000:.0f} s for {TARGET_COUNT} | failed runs |",
          "|---|---:|---:|---:|---|---|---:|"]
    for c, f in kf["cases"].items():
        L.append(f"| {c} | {ms(f['wall']['p50'])} ms | {ms(f['wall']['p90'])} ms | "
                 f"**{rp.fmt(f['speedup'], 2)}×** | {verdict(f['speed_met'])} | "
                 f"{verdict(f['wall_met'])} | {f['failed']} |")
    L += ["", "Wall: from the request until the last child answered its exec (`true`).", ""]
    L += ctx.get("verdict_text", [])
    # Run table
    L += ["", "## Runs", "", "Milliseconds; p50 / p90 over the runs that succeeded.", "",
          "| case | n | wall (request → last exec) | call (branch / spawn) | pause | snapshot "
          "| spawn (server) | execs after the call | first child answered |",
          "|---|---:|---|---|---|---|---|---|---|"]
    for c in case_names(modes) + [NAIVE_CASE]:
        rs = ok_runs(runs, c)
        if not rs:
            continue

        def pp(k):
            s = rp.summarize(r.get(k) for r in rs)
            return f"{ms(s['p50'])} / {ms(s['p90'])}" if s["n"] else "–"
        L.append(f"| {c} | {len(rs)} | **{pp('total_ms')}** | {pp('call_ms')} | {pp('pause_ms')} "
                 f"| {pp('snapshot_ms')} | {pp('spawn_ms')} | {pp('exec_phase_ms')} | "
                 f"{pp('first_answer_ms')} |")
    fails = [r for r in runs if not r.get("ok")]
    if fails:
        L += ["", "### Failed runs", ""]
        L += [f"- {r['case']} run {r['run']}: `{r.get('error')}`" for r in fails]
    L += [""] + cpu_section(children, runs, modes)
    L += ["", "### Where the CPU goes", ""] + where_cpu_goes(children, modes, runs)
    L += ctx.get("cpu_text", [])
    L += ["", "## Method", "", *method_text(args, ctx), "",
          "Files: `fanout.csv` (one row per run), `children.csv` (one row per child and per "
          "naive restore). Plots: `fanout.png` (walls), `cpu.png` (CPU and wall per child).", ""]
    path.write_text("\n".join(L))


def method_text(args, ctx: dict) -> list[str]:
    return [
        "- **branch_<mode>**: `POST /v1/sandboxes/{source}/branch {\"mode\": mode, \"count\": "
        f"{args.count}}}`; when it returns, one thread per child sends `POST "
        "/v1/sandboxes/{child}/exec {\"argv\": [\"true\"]}` at once (a barrier releases them "
        "together); the run ends when the last one answered. `pause_ms`, `snapshot_ms`, "
        "`spawn_ms` are the branch result's.",
        f"- **spawn_count**: `POST /v1/sandboxes {{\"snapshot\": id, \"count\": {args.count}}}` "
        "from one snapshot of the same source (`POST /v1/sandboxes/{source}/snapshot`, taken "
        "before the runs; a warm-up clone of it was spawned and deleted first), then the same "
        "execs.",
        "- **naive**: the naive baseline of every bench (bench/common/naive.py): a VM of the "
        "same image and size, cold-booted (network none) by a separate unjailed daemon, settled "
        f"{args.settle:.0f} s and saved with a plain full QEMU migration to a file (all "
        "capabilities off); each restore is a fresh QEMU from its command line (new sockets, "
        "a copy of its disk, a new share=on RAM file in /dev/shm)"
        + (", in a network namespace of its own holding the tap its NIC names (no uplink)"
           if ctx.get("naive_nic") else "")
        + ", `migrate-incoming` from the file, `cont`, until its agent answers a ping. "
        f"{ctx.get('naive_workers')} workers run them. Each copy is stopped once it answered "
        "and its CPU was read: {0} copies of ~0.5 GiB each do not fit in RAM together, so "
        "unlike the forkvm children they do not all stay up (and do not compete with each "
        "other while idle). The naive copies have no network and no identity step; the forkvm "
        "children have both (nat, `wait_for_network`).".format(args.count),
        "- Between runs every child is deleted (not timed), the bench waits until their "
        "QEMUs are gone and the daemon's reaped-children CPU has stopped growing, then rests "
        f"{args.rest:.0f} s. Branch snapshots are deleted after each run (`?force=true`).",
        "- `other_cpu_cores`: the host's busy time (/proc/stat) less this process's, the "
        "daemon's and their descendants', over the run, in cores (bench/common CpuMeter)"
        + (f"; the children's QEMUs are {ctx.get('qemu_parent')}" if ctx.get("qemu_parent")
           else "") + ".",
    ]
