"""Boot-loop mode of the boot bench (``bash bench/boot/run.sh --loop [N]``).

N cold boots in a row against one daemon in a fresh FORKVM_HOME: each boot is
a `POST /v1/sandboxes` with `"use_template": false` (what `forkvm spawn
--no-template` sends), so every one boots the kernel; then one exec of
`echo ok` must answer `ok`, and the sandbox is deleted. A boot counts as ok
only if all three steps succeed; a failure keeps the error message (for a
failed boot the daemon's message carries the guest's last console lines).
No boot is retried: the point is to count the ones that fail.

Outputs, in --out: loop.csv (one row per boot), loop.png (boot time per
attempt), LOOP.md (counts, percentiles, machine, every failure's message).
The exit status is 1 if any boot failed.
"""

from __future__ import annotations

import datetime as dt
import http.client
import time
from pathlib import Path

import forkvm_bench as fb
import report as rp

# The acceptance criterion: this many cold boots in a row without a failure.
# A loop of fewer is a smoke run.
LOOP_MIN = 200
EXEC_ARGV = ["echo", "ok"]

FIELDS = [
    "attempt", "started_at", "ok", "failed_step", "total_ms", "prepare_ms", "qemu_start_ms",
    "boot_ms", "server_total_ms", "exec_ms", "delete_ms", "sandbox", "other_cpu_cores", "error",
]


def one_boot(d: fb.Daemon, memory: int, attempt: int) -> dict:
    """One cold boot, exec and delete. Never raises for a failure of the
    sandbox (it is recorded in the row); Ctrl-C still propagates."""
    row = {"attempt": attempt, "started_at": dt.datetime.now().astimezone().isoformat(
        timespec="seconds"), "ok": 0, "failed_step": "", "error": ""}
    step, sid = "spawn", None
    try:
        t0 = time.perf_counter()
        sb = d.create_cold(memory_mib=memory, cpus=1)
        row["total_ms"] = fb.ms_since(t0)
        sid = row["sandbox"] = sb["id"]
        t = sb.get("timings") or {}
        row.update(prepare_ms=t.get("prepare_ms"), qemu_start_ms=t.get("qemu_start_ms"),
                   boot_ms=t.get("boot_ms"), server_total_ms=t.get("total_ms"))
        step = "exec"
        t1 = time.perf_counter()
        r = d.api.exec(sid, EXEC_ARGV)
        row["exec_ms"] = fb.ms_since(t1)
        if r.get("exit_code") != 0 or (r.get("stdout") or "").strip() != "ok":
            raise fb.BenchError(f"`{' '.join(EXEC_ARGV)}` in {sid} returned {r}")
        step = "delete"
        t2 = time.perf_counter()
        d.delete(sid)
        sid = None
        row["delete_ms"] = fb.ms_since(t2)
        row["ok"] = 1
    except (fb.BenchError, OSError, http.client.HTTPException, KeyError) as e:
        row["failed_step"] = step
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        # A failed attempt must not leave its sandbox to the next one.
        leftover = cleanup(d, sid)
        if leftover:
            if row["ok"]:
                row["ok"], row["failed_step"] = 0, "delete"
            row["error"] = "; ".join(x for x in (row["error"], leftover) if x)
    return row


def cleanup(d: fb.Daemon, sid: str | None) -> str:
    """Delete `sid` (if the attempt did not get to) and any other sandbox the
    daemon still lists (a boot whose POST failed may have left one). Returns
    what could not be deleted, or ''."""
    errors = []
    try:
        ids = {s["id"] for s in d.api.list() if isinstance(s, dict) and "id" in s}
    except (fb.BenchError, OSError, http.client.HTTPException) as e:
        return f"cleanup: cannot list sandboxes: {e}"
    if sid:
        ids.add(sid)
    for i in sorted(ids):
        deadline = time.monotonic() + d.delete_wait
        while True:
            try:
                d.delete(i)
                break
            except fb.ApiError as e:
                if e.status == 404:
                    d.sandboxes.discard(i)
                    break
                if e.status == 409 and time.monotonic() < deadline:
                    time.sleep(0.2)  # still booting: its spawn has not returned yet
                    continue
                errors.append(f"cleanup: DELETE {i}: {e}")
                break
            except (fb.BenchError, OSError, http.client.HTTPException) as e:
                errors.append(f"cleanup: DELETE {i}: {e}")
                break
    return "; ".join(errors)


def progress(row: dict, n: int, ok: int, failed: int) -> str:
    head = f"[boot {row['attempt']}/{n}]"
    if row["ok"]:
        what = (f"ok   {rp.fmt(row['total_ms']):>7} ms (boot {rp.fmt(row.get('boot_ms'))}, "
                f"exec {rp.fmt(row.get('exec_ms'))} ms)")
    else:
        first = row["error"].splitlines()[0] if row["error"] else "?"
        what = f"FAIL at {row['failed_step']}: {first[:140]}"
    return f"{head} {what}   [{ok} ok, {failed} failed]"


def loop_summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["ok"]]
    return {
        "attempted": len(rows),
        "ok": len(ok),
        "failed": len(rows) - len(ok),
        # Boot time of the boots that worked: a failed one has no comparable figure.
        "total": rp.summarize(r.get("total_ms") for r in ok),
        "boot": rp.summarize(r.get("boot_ms") for r in ok),
        "exec": rp.summarize(r.get("exec_ms") for r in ok),
        "noise": rp.summarize(r.get("other_cpu_cores") for r in rows),
    }


def write_loop_plot(path: Path, rows: list[dict], title: str) -> None:
    plt = rp.pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.8))
    ok = [r for r in rows if r["ok"]]
    bad = [r for r in rows if not r["ok"]]
    ax.scatter([r["attempt"] for r in ok], [r["total_ms"] for r in ok], s=12,
               color="tab:blue", label="ok: POST → 201 (client wall)", zorder=3)
    ax.scatter([r["attempt"] for r in ok], [r.get("boot_ms") or 0 for r in ok], s=8,
               color="tab:cyan", label="ok: server boot stage (QMP ready → agent pong)", zorder=2)
    if ok:
        p50 = rp.percentile([r["total_ms"] for r in ok], 50)
        ax.axhline(p50, color="tab:red", lw=1, ls="--", label=f"p50 {p50:,.0f} ms")
    if bad:
        # A failed boot has no boot time; mark where it happened, at the bottom.
        ax.scatter([r["attempt"] for r in bad], [0] * len(bad), marker="x", s=60,
                   color="tab:red", label=f"failed ({len(bad)})", zorder=4)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("attempt")
    ax.set_ylabel("ms")
    # Head room above the points, so that the legend does not hide any.
    top = max((r["total_ms"] for r in ok), default=1.0)
    ax.set_ylim(-0.03 * top, 1.35 * top)
    ax.set_title("Cold boot time per attempt")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    rp.save_figure(fig, path, dpi=110, title=title)


def write_loop_results(path: Path, rows: list[dict], ctx: dict, args) -> None:
    s = loop_summary(rows)
    info, machine = ctx["info"], ctx["machine"]
    L = []
    if args.smoke:
        L += rp.smoke_banner(f"{s['attempted']} boots < {LOOP_MIN}",
                             f"bash bench/boot/run.sh --loop {LOOP_MIN}")
    verdict = "PASS" if s["failed"] == 0 and s["attempted"] >= LOOP_MIN else \
        "FAIL" if s["failed"] else "no verdict (too few boots)"
    L += [
        "# Boot loop: cold boots in a row in a fresh home",
        "",
        f"**{verdict}**: {s['attempted']} attempted, **{s['ok']} ok, {s['failed']} failed** "
        f"(the criterion: {LOOP_MIN} in a row with 0 failures).",
        "",
        rp.date_line(ctx["started"], ctx["elapsed"], minutes=True),
        rp.forkvm_line(info, ctx["revision"], " (when the loop started)"),
        f"- Machine: {rp.machine_text(machine)}, Linux {machine['kernel']}",
        f"- Load average at start: {rp.loadavg_text(machine)}",
        rp.accel_line(info),
        f"- QEMU: {rp.qemu_text(info)}",
        f"- Guest: {args.memory} MiB RAM, 1 vCPU, image `default`; each boot "
        "`POST /v1/sandboxes` with `\"use_template\": false` (as `forkvm spawn --no-template`), "
        f"then `{' '.join(EXEC_ARGV)}` through the exec API, then DELETE",
        f"- Command: `{ctx['command']}`",
        "- Host noise — cores kept busy by processes other than this bench's during each boot "
        f"(`other_cpu_cores` in the CSV): p50 {rp.fmt(s['noise']['p50'], 2)}, max "
        f"{rp.fmt(s['noise']['max'], 2)} (of {machine['cores']})",
        "",
        "## Boot times of the boots that worked",
        "",
        "| figure | n | min | p50 | p90 | max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, key in (("**POST → 201 (client wall)**", "total"),
                       ("server boot stage (QMP ready → agent pong)", "boot"),
                       ("exec `echo ok` (client wall)", "exec")):
        st = s[key]
        L.append(f"| {label} | {st['n']} | {rp.fmt(st['min'])} | {rp.fmt(st['p50'])} | "
                 f"{rp.fmt(st['p90'])} | {rp.fmt(st['max'])} |")
    L += ["", "All times in milliseconds. Raw data: `loop.csv`; plot: `loop.png`.", ""]
    bad = [r for r in rows if not r["ok"]]
    L += ["## Failures", ""]
    if not bad:
        L += ["None."]
    for r in bad:
        L += [f"### Attempt {r['attempt']} ({r['started_at']}), at {r['failed_step']}", "",
              "```", r["error"].strip() or "(no message)", "```", ""]
    L += [
        "",
        "## Method",
        "",
        "One private daemon (`forkvm serve`, release build) in a new temp home whose `guest` "
        "and `images` are symlinks to the installed artefacts (`$FORKVM_ARTIFACTS`, default "
        "/var/lib/forkvm); nothing else runs on it. The boots are sequential. A boot is **ok** "
        "when the POST answers 201 (the daemon answers once the guest agent has answered a "
        "ping), the response shows a cold boot (no restore), the exec prints `ok` with exit "
        "code 0, and the DELETE succeeds. Anything else is a **failure**, recorded with the "
        "step it happened at and the error (the daemon's message for a failed boot includes "
        "the guest's last console lines); whatever sandbox is left is then deleted before the "
        "next attempt. No attempt is retried or discarded.",
        "",
        "Percentiles use linear interpolation between closest ranks (numpy's default).",
    ]
    path.write_text("\n".join(L) + "\n")


def run_loop(args, command: str) -> int:
    """The loop, start to finish; returns the exit status."""
    n = args.loop
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fb.wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    machine = rp.machine_info()
    revision = rp.git_revision()
    rows: list[dict] = []
    ok = failed = 0
    with fb.Daemon(binary=args.binary) as d:
        info = d.api.info()
        print(f"forkvm {info.get('version')} | accel {info['accel']['kind']} | QEMU "
              f"{info['qemu'].get('version')} | fresh home {d.home} | {n} cold boots",
              flush=True)
        meter = fb.CpuMeter(roots=[d.proc.pid])
        for i in range(1, n + 1):
            meter.start()
            row = one_boot(d, args.memory, i)
            row["other_cpu_cores"] = meter.other_cores()
            rows.append(row)
            ok += row["ok"]
            failed += not row["ok"]
            print(progress(row, n, ok, failed), flush=True)
            if d.proc.poll() is not None:
                # Nothing after this could boot: the remaining attempts are
                # not run, and the loop is a failure.
                print(f"the daemon exited ({d.proc.returncode}); its log:\n{d.log_tail()}",
                      flush=True)
                rows[-1]["error"] += f"; the daemon exited ({d.proc.returncode})"
                break
    ctx = {"info": info, "machine": machine, "started": started, "revision": revision,
           "elapsed": time.monotonic() - t_start, "command": command}
    rp.write_csv(out / "loop.csv", rows, FIELDS)
    s = loop_summary(rows)
    title = (f"forkvm boot loop — {info['accel']['kind']}, {args.memory} MiB, "
             f"{s['ok']}/{s['attempted']} ok{' (SMOKE)' if args.smoke else ''}, "
             f"{machine['cpu_model']}, {started:%Y-%m-%d}")
    write_loop_plot(out / "loop.png", rows, title)
    write_loop_results(out / "LOOP.md", rows, ctx, args)
    print(f"\n{s['attempted']} attempted, {s['ok']} ok, {s['failed']} failed; "
          f"POST → 201 p50 {rp.fmt(s['total']['p50'])} ms, p90 {rp.fmt(s['total']['p90'])} ms")
    print(f"wrote {out / 'loop.csv'}, {out / 'LOOP.md'}, {out / 'loop.png'}")
    if s["attempted"] < n:
        print(f"only {s['attempted']} of {n} boots were attempted", flush=True)
    return 0 if s["failed"] == 0 and s["attempted"] == n else 1
