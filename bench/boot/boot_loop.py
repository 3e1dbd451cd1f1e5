"""Boot-loop mode of the boot benchmark: N cold boots in a row in a fresh
home, counting failures (`bash bench/boot/run.sh --loop 200`).

A cold boot that dies in early boot (docs/boot.md) is a matter of timing, so
one good boot proves little; this mode boots the same way a user's
`forkvm spawn --no-template` does, N times, one after the other, in a daemon
whose home is new (no template, no cache of ours). Each attempt must spawn,
answer an exec and be removed. A failed spawn's error carries the guest's last
console lines; it is written to the CSV and RESULTS, and the run goes on so
that the count is complete. The exit status is 1 if any attempt failed.

Outputs (next to the boot bench's own): results/loop.csv, results/LOOP.md,
results/loop.png.
"""

from __future__ import annotations

import datetime as dt
import http.client
import time
from pathlib import Path

import forkvm_bench as fb
import report

FIELDS = ["attempt", "ok", "boot_ms", "total_ms", "exec_ms", "error"]


def attempt(d: fb.Daemon, n: int, memory: int) -> dict:
    row = {"attempt": n, "ok": False, "boot_ms": None, "total_ms": None, "exec_ms": None,
           "error": ""}
    t0 = time.perf_counter()
    sid = None
    try:
        sb = d.create_cold(memory_mib=memory)
        sid = sb["id"]
        row["boot_ms"] = (sb.get("timings") or {}).get("total_ms")
        t1 = time.perf_counter()
        r = d.api.exec(sid, ["sh", "-c", "echo ok"])
        row["exec_ms"] = fb.ms_since(t1)
        if r.get("exit_code") != 0 or r.get("stdout") != "ok\n":
            raise fb.BenchError(f"exec in {sid} answered {r}")
        row["ok"] = True
    except (fb.BenchError, OSError, http.client.HTTPException) as e:
        row["error"] = str(e).replace("\n", " | ")
    finally:
        row["total_ms"] = fb.ms_since(t0)
        if sid is not None:
            try:
                d.delete(sid)
            except (fb.BenchError, OSError, http.client.HTTPException) as e:
                row["ok"] = False
                row["error"] += f" (and removing it failed: {e})"
    return row


def plot(rows, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4))
    ok = [r for r in rows if r["ok"]]
    bad = [r for r in rows if not r["ok"]]
    ax.plot([r["attempt"] for r in ok], [r["boot_ms"] for r in ok], ".", color="tab:blue",
            label=f"booted ({len(ok)})")
    if bad:
        ax.plot([r["attempt"] for r in bad], [r["total_ms"] for r in bad], "x", color="tab:red",
                label=f"failed ({len(bad)})")
    ax.set_xlabel("attempt")
    ax.set_ylabel("spawn until the agent answers (ms)")
    ax.legend()
    report.save_figure(fig, path, title)


def run(args, out: Path) -> int:
    started = dt.datetime.now().astimezone()
    t0 = time.monotonic()
    machine = fb.machine_info()
    rows = []
    with fb.Daemon(binary=args.binary) as d:
        info = d.api.info()
        print(f"boot loop: {args.loop} cold boots in the fresh home {d.home} | accel "
              f"{info['accel']['kind']} | QEMU {info['qemu'].get('version')}", flush=True)
        for n in range(1, args.loop + 1):
            row = attempt(d, n, args.memory)
            rows.append(row)
            fails = sum(not r["ok"] for r in rows)
            status = (f"ok, {row['boot_ms']:.0f} ms" if row["ok"]
                      else f"FAILED: {row['error'][:300]}")
            print(f"[{n}/{args.loop}] {status} ({fails} failed so far)", flush=True)
    elapsed = time.monotonic() - t0
    fb.write_csv(out / "loop.csv", rows, FIELDS)
    failed = [r for r in rows if not r["ok"]]
    boots = fb.summarize(r["boot_ms"] for r in rows if r["ok"])
    title = (f"forkvm boot loop — {len(rows) - len(failed)}/{len(rows)} booted, "
             f"{info['accel']['kind']}, {machine['cpu_model']}, {started:%Y-%m-%d}")
    plot(rows, out / "loop.png", title)
    L = report.smoke_banner(args.smoke, f"{args.loop} boots", "bash bench/boot/run.sh --loop 200")
    L += [
        "# Boot loop: cold boots in a row in a fresh home",
        "",
        *report.environment_lines(started, elapsed, info, machine),
        f"- Guest: {args.memory} MiB RAM, 1 vCPU, image `default`, default network; each "
        "attempt is `POST /v1/sandboxes` with `use_template: false` (what `forkvm spawn "
        "--no-template` sends), one exec of `echo ok`, and `DELETE`, one after the other",
        "",
        f"**{len(rows) - len(failed)} of {len(rows)} cold boots succeeded; {len(failed)} failed.**",
        "",
    ]
    if boots["n"]:
        L += [f"Spawn until the guest agent answers: p50 {boots['p50']:.0f} ms, "
              f"p90 {boots['p90']:.0f} ms, max {boots['max']:.0f} ms.", ""]
    if failed:
        L += ["| attempt | error |", "|---|---|"]
        L += [f"| {r['attempt']} | {r['error'][:400]} |" for r in failed]
        L += [""]
    L += ["Raw rows: `loop.csv`; plot: `loop.png`."]
    report.write_markdown(out / "LOOP.md", L)
    print("\n".join(L))
    return 1 if failed else 0
