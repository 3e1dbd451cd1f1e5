#!/usr/bin/env python3
"""forkvm cold-boot benchmark, with the naive QEMU save/restore baseline.

Run through bench/boot/run.sh (which builds the release binary first).

Cases, all measured in one run against one private daemon:

* forkvm_boot   -- N sequential POST /v1/sandboxes (cold boot until the guest
                   agent answers), then one exec of `python3 -c 'print(1)'`,
                   then DELETE.
* naive_restore -- the baseline: one sandbox is booted, paused and saved with a
                   plain QMP `migrate` to a file (plus a copy of its disk
                   overlay); then N times a fresh QEMU is started from the
                   source's command line with `-incoming defer`, the state is
                   loaded with `migrate-incoming`, the VM continued, and timed
                   until its guest agent answers a ping.

Outputs: results/boot.csv (raw, one row per run), results/RESULTS.md,
results/boot.png.

With --loop [N] it runs the boot-loop mode instead (boot_loop.py): N cold
boots in a row in a fresh home, each checked with an exec; results in
loop.csv, loop.png and LOOP.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
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

sys.path.insert(0, str(HERE))
import boot_loop  # noqa: E402

EXEC_ARGV = ["python3", "-c", "print(1)"]
MIN_RUNS = 10
NOISY_CORES = 0.25  # a run during which other processes used more than this is flagged

# CSV columns: the stages of each case (empty where they do not apply).
FIELDS = [
    "case", "run", "total_ms",
    # forkvm_boot: the server's own stage timings and the first exec.
    "prepare_ms", "qemu_start_ms", "boot_ms", "server_total_ms", "first_exec_ms",
    # naive_restore: QEMU start -> QMP, load, cont, agent pong; disk copy (not in total).
    "load_ms", "cont_ms", "agent_ms", "disk_copy_ms",
    # naive_save: the one save of the run.
    "state_bytes",
    # Average cores other processes on the host kept busy during the run.
    "other_cpu_cores",
]
BOOT_STAGES = ["prepare_ms", "qemu_start_ms", "boot_ms", "server_total_ms", "first_exec_ms"]
RESTORE_STAGES = ["qemu_start_ms", "load_ms", "cont_ms", "agent_ms"]


ms_since = fb.ms_since
tail = fb.tail


# --------------------------------------------------------------------------
# forkvm cold boot
# --------------------------------------------------------------------------


def run_forkvm_boot(d: fb.Daemon, memory: int, run: int, n: int) -> dict:
    t0 = time.perf_counter()
    sb = d.create_cold(memory_mib=memory, cpus=1)
    total = ms_since(t0)
    try:
        uid = nv.qemu_uid(sb["pid"])  # not 0: jailed (the daemon's default)
        t = sb.get("timings") or {}
        t1 = time.perf_counter()
        r = d.api.exec(sb["id"], EXEC_ARGV)
        exec_ms = ms_since(t1)
        if r.get("exit_code") != 0 or r.get("stdout", "").strip() != "1":
            raise fb.BenchError(f"first exec in {sb['id']} returned {r}")
    finally:
        d.delete(sb["id"])
    row = {
        "case": "forkvm_boot", "run": run, "total_ms": total,
        "prepare_ms": t.get("prepare_ms"), "qemu_start_ms": t.get("qemu_start_ms"),
        "boot_ms": t.get("boot_ms"), "server_total_ms": t.get("total_ms"),
        "first_exec_ms": exec_ms, "uid": uid,
    }
    print(f"[forkvm_boot {run}/{n}] {total:.0f} ms  (server: prepare {row['prepare_ms']:.0f}, "
          f"qemu {row['qemu_start_ms']:.0f}, boot {row['boot_ms']:.0f}; first exec {exec_ms:.0f} ms)",
          flush=True)
    return row


# --------------------------------------------------------------------------
# naive QEMU full save / restore
# --------------------------------------------------------------------------


SavedVm = nv.SavedVm


def save_source(binary: str, memory: int) -> tuple[nv.SavedVm, str]:
    """The naive baseline's source: a VM booted as forkvm_boot's (same image,
    size and default network) by a private *unjailed* daemon, so that it is
    a plain QEMU, paused and saved (RAM + device state) to a file with a
    plain full migration, its disk overlay copied; the source is deleted
    and that daemon stopped before returning. (nv.save_unjailed_source;
    the save itself is nv.naive_save.) Returns (saved, the kept home that
    holds the state; nv.remove_home it)."""
    # 1 s lets the guest settle after the agent's first pong.
    saved, home, _ = nv.save_unjailed_source(binary, memory, settle=1.0)
    print(f"[naive_save] {saved.save_ms:.0f} ms, state file {saved.state_bytes / 2**20:.1f} MiB "
          f"(unjailed daemon; source left in state '{saved.status}'; "
          + ("a NIC: each copy runs in a network namespace of its own with its tap"
             if nv.copy_netns(saved, "x") else "no NIC") + ")", flush=True)
    return saved, home


def run_naive_restore(saved: nv.SavedVm, work: str, shm: str, run: int, n: int) -> dict:
    vm = nv.naive_restore(saved, os.path.join(work, f"r{run}"), os.path.join(shm, f"r{run}.mem"),
                          f"fvb-restore-{run}", netns=nv.copy_netns(saved, f"r{run}"))
    try:
        row = {"case": "naive_restore", "run": run, **vm.timings}
        print(f"[naive_restore {run}/{n}] {row['total_ms']:.0f} ms  (qemu {row['qemu_start_ms']:.0f}, "
              f"load {row['load_ms']:.0f}, cont {row['cont_ms']:.0f}, agent {row['agent_ms']:.0f}; "
              f"guest uptime {vm.pong.get('uptime_ms', 0) / 1000:.1f} s)", flush=True)
        return row
    finally:
        vm.stop()


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def stats_rows(rows: list[dict]):
    """(case, stage, summary) for every case total and stage."""
    return rp.case_stats(rows, (("forkvm_boot", BOOT_STAGES), ("naive_restore", RESTORE_STAGES)))


def write_plot(path: Path, rows: list[dict], title: str) -> None:
    plt = rp.pyplot()
    cases = ["forkvm_boot", "naive_restore"]
    labels = ["forkvm cold boot\n(POST → 201)", "naive QEMU restore\n(start → agent pong)"]
    data = [[r["total_ms"] for r in rows if r["case"] == c] for c in cases]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    ax.boxplot(data, widths=0.5, showfliers=False,
               medianprops={"color": "tab:red", "linewidth": 2})
    ax.set_xticks([1, 2], labels)
    noisy_any = False
    for i, c in enumerate(cases, start=1):
        rs = [r for r in rows if r["case"] == c]
        ys = [r["total_ms"] for r in rs]
        xs = [i + (j - (len(ys) - 1) / 2) * (0.3 / max(len(ys), 1)) for j in range(len(ys))]
        noisy = [(r.get("other_cpu_cores") or 0) > NOISY_CORES for r in rs]
        noisy_any |= any(noisy)
        ax.scatter(xs, ys, s=18, alpha=0.8, zorder=3,
                   color=["tab:orange" if n else "tab:blue" for n in noisy])
        p50 = rp.percentile(ys, 50)
        ax.annotate(f"p50 {p50:,.0f} ms", (i + 0.27, p50), va="center", color="tab:red")
    if noisy_any:
        from matplotlib.lines import Line2D
        ax.legend(handles=[
            Line2D([], [], marker="o", ls="", color="tab:blue", label="quiet host"),
            Line2D([], [], marker="o", ls="", color="tab:orange",
                   label=f"other processes > {NOISY_CORES} cores busy"),
        ], fontsize=8, loc="upper right")
    ax.set_ylabel("wall time (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("Time until the guest agent answers (one point per run)")
    ax.grid(axis="y", alpha=0.3)

    # p50 of each stage, stacked.
    boot = [r for r in rows if r["case"] == "forkvm_boot"]
    rest = [r for r in rows if r["case"] == "naive_restore"]
    p = lambda rs, k: rp.percentile([r[k] for r in rs], 50)  # noqa: E731
    stacks = [
        ("forkvm_boot", [("prepare", p(boot, "prepare_ms")), ("QEMU start→QMP", p(boot, "qemu_start_ms")),
                         ("guest boot→agent pong", p(boot, "boot_ms"))]),
        ("naive_restore", [("QEMU start→QMP", p(rest, "qemu_start_ms")), ("load state", p(rest, "load_ms")),
                           ("cont", p(rest, "cont_ms")), ("cont→agent pong", p(rest, "agent_ms"))]),
    ]
    colors = {"prepare": "tab:gray", "QEMU start→QMP": "tab:orange", "guest boot→agent pong": "tab:blue",
              "load state": "tab:green", "cont": "tab:purple", "cont→agent pong": "tab:cyan"}
    seen = set()
    for i, (_, parts) in enumerate(stacks):
        bottom = 0.0
        for name, v in parts:
            ax2.bar(i, v, bottom=bottom, color=colors[name], width=0.6,
                    label=name if name not in seen else None)
            seen.add(name)
            bottom += v
    ax2.set_xticks([0, 1], ["forkvm_boot", "naive_restore"])
    ax2.set_ylabel("p50 per stage (ms)")
    ax2.set_title("Where the time goes (stage p50s, stacked)")
    ax2.legend(fontsize=8)
    ax2.grid(axis="y", alpha=0.3)
    rp.save_figure(fig, path, dpi=110, title=title)


def jail_text(rows: list[dict]) -> str:
    """Who ran jailed: forkvm_boot's QEMUs (by the uids they ran as) and the
    naive baseline (plain QEMU, root)."""
    uids = sorted({r["uid"] for r in rows if r["case"] == "forkvm_boot"})
    jailed = all(uids)
    who = f"uid {uids[0]}" if len(uids) == 1 else f"uids {uids[0]}–{uids[-1]}"
    return ((f"every forkvm_boot QEMU ran **jailed** ({who}, the daemon's default)" if jailed else
             f"forkvm_boot's QEMUs ran as uids {uids}: **not all jailed** (FORKVM_NO_JAIL set?)")
            + ". The naive baseline is plain QEMU as one runs it by hand: started by the bench "
            "as root, and its saved source was booted by a second, unjailed daemon "
            "(`FORKVM_NO_JAIL=1`), since a jailed QEMU can write only its own directory and its "
            "command line names a tap descriptor it inherited, so it cannot be replayed")


def write_results(path: Path, rows, saved: SavedVm, info: dict, machine: dict, args,
                  started: dt.datetime, elapsed_s: float, others: dict[int, str],
                  busy_runs: int, has_templates: bool, snapshots_after) -> None:
    st = stats_rows(rows)
    boot_p50 = next(s["p50"] for c, k, s in st if c == "forkvm_boot" and k == "total_ms")
    rest_p50 = next(s["p50"] for c, k, s in st if c == "naive_restore" and k == "total_ms")
    ratio = boot_p50 / rest_p50
    L = []
    if args.smoke:
        L += rp.smoke_banner(f"N={args.runs} < {MIN_RUNS}", "bash bench/boot/run.sh")
    L += [
        "# Boot benchmark: forkvm cold boot vs naive QEMU save/restore",
        "",
        rp.date_line(started, elapsed_s),
        rp.forkvm_line(info, rp.git_revision()),
        f"- Machine: {rp.machine_text(machine)}, Linux {machine['kernel']}",
        f"- Load average at start: {rp.loadavg_text(machine)}",
        rp.accel_line(info),
        f"- QEMU: {rp.qemu_text(info)}",
        f"- Guest: {args.memory} MiB RAM, 1 vCPU, image `default`, the default network",
        "- Jail: " + jail_text(rows),
        f"- Runs: N = {args.runs} per case" + (" (SMOKE)" if args.smoke else ""),
    ]
    oc = {c: rp.summarize(r["other_cpu_cores"] for r in rows if r["case"] == c)
          for c in ("forkvm_boot", "naive_restore")}
    L += ["- Host noise — average cores kept busy by processes other than this bench's, per "
          "run (`other_cpu_cores` in the CSV): "
          + "; ".join(f"{c} p50 {s['p50']:.2f}, max {s['max']:.2f}" for c, s in oc.items())
          + f" (of {machine['cores']}); "
          + f"{sum((r.get('other_cpu_cores') or 0) > NOISY_CORES for r in rows if r['case'] != 'naive_save')}"
          + f" of {2 * args.runs} runs had more than {NOISY_CORES} (orange in the plot)"]
    L += rp.other_qemu_lines(others, busy_runs, 2 * args.runs)
    L += ["", "## Results", ""] + rp.stats_table(st)
    L += ["", "All times in milliseconds.", ""]
    faster = ("naive restore is faster" if ratio > 1 else "forkvm cold boot is faster")
    L += [
        f"**forkvm_boot p50 / naive_restore p50 = {boot_p50:,.0f} / {rest_p50:,.0f} = "
        f"{ratio:.2f}×** — {faster}"
        + (f" (a forkvm cold boot takes {ratio:.1f}× as long as restoring a saved VM)." if ratio > 1
           else f" (a saved-VM restore takes {1 / ratio:.1f}× as long as a forkvm cold boot)."),
        "",
        "This bench measures a *cold boot* (kernel + initramfs + agent start, every time). "
        "Under TCG every guest instruction is emulated, so booting a kernel is expensive "
        "while loading a saved VM is mostly a file read; a cold boot is expected to lose "
        "to even a naive restore here. "
        + ("The daemon's default spawn path (restore from the image's boot template, with a "
           "warm pool) was bypassed with `\"use_template\": false` on every POST"
           + (f"; the daemon held {snapshots_after} snapshots after the run, so no template "
              "or warm pool ran in the background" if snapshots_after == 0 else
              f"; NOTE: the daemon held {snapshots_after} snapshots after the run")
           + ". Restore-based spawn needs its own benchmark against this same baseline."
           if has_templates else
           "This daemon has no boot templates (it rejected `use_template`), so every POST is a "
           "cold boot. Restore-based spawn is a later forkvm feature and gets its own "
           "benchmark against this same baseline."),
        "",
        "Naive save (once per run, of one source VM):",
        "",
        f"- save wall time (`stop` + `migrate` to file until `completed`): "
        f"{saved.save_ms:,.0f} ms, with QEMU's default migration parameters (max-bandwidth "
        f"{(saved.max_bandwidth or 0) / 2**20:.0f} MiB/s applies to the save) and "
        + (f"capabilities {', '.join(saved.caps_reset)} turned off first (the daemon had "
           "set them)" if saved.caps_reset else "no capability on (QEMU's default)"),
        f"- state file: {saved.state_bytes:,} bytes ({saved.state_bytes / 2**20:.1f} MiB) "
        f"for {args.memory} MiB of guest RAM (zero pages are written as flags, not data)",
        "",
        "Raw data: `boot.csv` (one row per run; `naive_save` is the single save). "
        "Plot: `boot.png`.",
        "",
        "## Method",
        "",
        "Two private daemons (`forkvm serve`, release build), one after the other, each in a "
        "temp home whose `guest` and `images` are symlinks to the installed artefacts; "
        "everything below in one run. First an unjailed one (`FORKVM_NO_JAIL=1`) boots and "
        "saves the naive baseline's source and stops (its boot also warms the page cache for "
        "kernel, initramfs and root image); then the main daemon, jailed as by default and "
        "otherwise idle, runs forkvm_boot, with the two cases interleaved — "
        "forkvm_boot 1, naive_restore 1, forkvm_boot 2, … — so that drift in host load hits "
        "both alike. No run is discarded.",
        "",
        "**forkvm_boot** (N sequential runs): `total` is the client wall time from sending "
        f"`POST /v1/sandboxes {{\"memory_mib\":{args.memory},\"cpus\":1"
        + (',\"use_template\":false' if has_templates else "")
        + "}` until the 201 arrives "
        "(the API answers only once the guest agent has answered a ping). The stage columns "
        "are the server's own `timings` from that response: `prepare` (sandbox dir, disk "
        "overlay), `qemu_start` (QEMU exec until QMP answers), `boot` (QMP ready until the "
        "agent's pong), `server_total`. `first_exec` is the client wall time of one "
        "`POST /v1/sandboxes/{id}/exec` of `python3 -c 'print(1)'` right after the 201 "
        "(not part of `total`). Each sandbox is then DELETEd (not timed).",
        "",
        "**naive_restore** (the baseline every VM benchmark includes): one sandbox of the "
        "same image, size and network is cold-booted through the unjailed daemon's API (not "
        "timed) and left 1 s; over its QMP socket it is "
        "`stop`ped and saved with `migrate {\"uri\":\"file:<home>/naive/state.bin\"}` (default "
        "capabilities: a plain full migration writing all of RAM plus device state), "
        "polling `query-migrate` until `completed`; its `disk.qcow2` overlay is copied "
        "next to the state file and the source is DELETEd. Then, N times: the source's QEMU "
        "command line (from `/proc/<pid>/cmdline`) is rewritten for a new instance (new QMP "
        "socket, agent socket, console log, a fresh copy of the saved disk overlay — copied "
        "before the clock starts — a new `share=on` RAM file in /dev/shm, a new `-name`) with "
        "`-incoming defer` appended; with a NIC, each copy runs in a network namespace of "
        "its own holding the tap the command line names (made before the clock starts, no "
        "uplink). `total` runs from just before the QEMU process is "
        "spawned until the guest agent answers a ping on the new agent socket; stages: "
        "`qemu_start` (spawn until QMP `qmp_capabilities` answered), `load` "
        "(`migrate-incoming {\"uri\":\"file:<state>\"}` until `query-status` leaves "
        "`inmigrate` and `query-migrate` says `completed`, polled every 5 ms), `cont` (the "
        "`cont` command; the source was paused when saved, so the loaded VM stays paused "
        "until then), `agent` (after `cont` until the pong; the agent protocol's ping on a "
        "new connection). The state file is read from the page cache (it was just written). "
        "The restored QEMU is then SIGKILLed and its files removed.",
        "",
        "Percentiles use linear interpolation between closest ranks (numpy's default).",
    ]
    path.write_text("\n".join(L) + "\n")


def print_summary(rows) -> None:
    print("\nSummary (ms)")
    print("\n".join(rp.stats_text(stats_rows(rows))))


# --------------------------------------------------------------------------


def wait_for_quiet_host(max_wait: float, threshold: float = 0.2, window: float = 5.0) -> None:
    fb.wait_for_quiet_host(max_wait, threshold, window)


def command_line() -> str:
    """How this run was asked for, as the user typed it to run.sh (without
    the --binary that run_bench.sh adds)."""
    argv, out, skip = sys.argv[1:], [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--binary":
            skip = True
        elif not a.startswith("--binary="):
            out.append(a)
    return " ".join(["bash bench/boot/run.sh", *out])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=None,
                    help=f"runs per case (default and minimum {MIN_RUNS})")
    ap.add_argument("--loop", type=int, nargs="?", const=boot_loop.LOOP_MIN, metavar="N",
                    help="boot-loop mode: N cold boots in a row in a fresh home, each checked "
                         f"with an exec (default N {boot_loop.LOOP_MIN}); writes loop.csv, "
                         "loop.png, LOOP.md; exits 1 if any boot failed")
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --runs < {MIN_RUNS} (or --loop < {boot_loop.LOOP_MIN}); "
                         "results are marked SMOKE")
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    if args.loop is not None:
        if args.runs is not None:
            ap.error("--runs does not apply to --loop (the loop's N is --loop N)")
        if args.loop < 1:
            ap.error("--loop must be >= 1")
        if args.loop < boot_loop.LOOP_MIN and not args.smoke:
            ap.error(f"--loop {args.loop} is below the {boot_loop.LOOP_MIN} boots of the "
                     "acceptance criterion; add --smoke for a quick smoke test")
        return boot_loop.run_loop(args, command_line())
    if args.runs is None:
        args.runs = MIN_RUNS
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.runs < MIN_RUNS and not args.smoke:
        ap.error(f"--runs {args.runs} is below the minimum of {MIN_RUNS} for a valid result; "
                 "add --smoke for a quick smoke test")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    machine = rp.machine_info()
    rows: list[dict] = []
    shm = tempfile.mkdtemp(prefix="fvb-", dir="/dev/shm")
    others: dict[int, str] = {}      # foreign QEMU pid -> command line
    busy_runs = 0                    # runs that started while one was running

    def check_others(home: str) -> None:
        nonlocal busy_runs
        busy_runs += fb.warn_other_qemus(others, exclude_substrings=(home, shm))

    naive_home = None
    try:
        # The naive source first, on its own unjailed daemon (stopped before
        # the main one starts). Its boot also warms the page cache for
        # kernel/initrd/rootfs, so the first forkvm_boot is not an outlier
        # for cold-cache reasons.
        saved, naive_home = save_source(args.binary, args.memory)
        work = os.path.dirname(saved.state)
        rows.append({"case": "naive_save", "run": 1, "total_ms": saved.save_ms,
                     "state_bytes": saved.state_bytes})
        with fb.Daemon(binary=args.binary) as d:
            info = d.api.info()
            print(f"forkvm {info.get('version')} | accel {info['accel']['kind']} "
                  f"({info['accel'].get('reason', '')}) | QEMU {info['qemu'].get('version')} | "
                  f"home {d.home}", flush=True)
            check_others(d.home)
            busy_runs = 0  # count only the measured runs
            # Interleave the cases so that drift in host load hits both alike.
            meter = fb.CpuMeter(roots=[d.proc.pid])

            def measured(fn, *a):
                meter.start()
                row = fn(*a)
                row["other_cpu_cores"] = meter.other_cores()
                if row["other_cpu_cores"] > NOISY_CORES:
                    print(f"    (other processes kept {row['other_cpu_cores']:.2f} cores busy "
                          "during this run)", flush=True)
                rows.append(row)

            for i in range(1, args.runs + 1):
                check_others(d.home)
                measured(run_forkvm_boot, d, args.memory, i, args.runs)
                check_others(d.home)
                measured(run_naive_restore, saved, work, shm, i, args.runs)
            has_templates = d.has_templates
            snapshots_after = d.api.info().get("snapshots")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        if naive_home:
            nv.remove_home(naive_home)
    elapsed = time.monotonic() - t_start

    rp.write_csv(out / "boot.csv", rows, FIELDS)
    title = (f"forkvm boot bench — {info['accel']['kind']}, {args.memory} MiB, N={args.runs}"
             f"{' (SMOKE)' if args.smoke else ''}, {machine['cpu_model']}, {started:%Y-%m-%d}")
    write_plot(out / "boot.png", rows, title)
    write_results(out / "RESULTS.md", rows, saved, info, machine, args, started, elapsed, others,
                  busy_runs, has_templates, snapshots_after)
    print_summary(rows)
    print(f"\nwrote {out / 'boot.csv'}, {out / 'RESULTS.md'}, {out / 'boot.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_boot", main)
