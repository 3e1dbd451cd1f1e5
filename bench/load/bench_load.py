#!/usr/bin/env python3
"""forkvm API load test: N concurrent clients on one daemon for D seconds, then a leak check.

Run through bench/load/run.sh (which builds the release binary first, unless
FORKVM_BIN names a binary to use as it is).

One private daemon (`forkvm serve --home <temp home>`, guest/ and images/
symlinked from $FORKVM_ARTIFACTS) runs from a private copy of the binary.

* warm-up   -- one spawn from the image (it makes the image's boot template,
               so every later image spawn is a clone of it), one exec, DELETE.
* baseline  -- QEMU processes of this daemon (by command line and by process
               tree, zombies too), the daemon's open fds, tap devices and
               network namespaces (host-wide), the files under the home (less
               the daemon log and the state DB's WAL/SHM files) and under the
               daemon's /dev/shm run dir, the sandboxes and snapshots the API
               lists.
* load      -- N client threads, each with its own keep-alive connection on
               the unix socket, loop for D seconds over a weighted random mix:
               spawn (from the image, i.e. the boot template, or from one of
               its own snapshots), exec of a short python3 command (output
               checked), write then read back a guest file (content checked),
               branch one of its sandboxes (mode live/diff/full, count 0 or 1
               at random), remove one of its snapshots (409 while something
               depends on it: documented, kept for later), remove one of its
               sandboxes. Each client keeps at most --client-sandboxes
               sandboxes and --client-snapshots snapshots alive. Every request
               is recorded (client, op, start, latency, status, error code).
* cleanup   -- each client removes everything it made (sandboxes, then its
               snapshots newest first); anything the API still lists that the
               baseline did not have is an orphan (reported as a leak, then
               removed); the bench waits for the daemon to settle and compares
               everything against the baseline.

2xx is success; 409 `conflict` and 429 `limit_exceeded` are documented
non-failure answers under load and are counted apart; every other status, a
connection error, or a 2xx whose content is wrong is a failure. The exit code
is non-zero on any failure or leak.

Outputs (in --out): requests.csv (every request), leaks.csv, RESULTS.md,
latency_over_time.png, latency_by_op.png, failures.json (when there are
failures), daemon.log (a copy of the daemon's log).

This file holds the command line and the run loop (`main`); the rest is in
load_census.py (the daemon and the leak census), load_clients.py,
load_report.py (statistics, plots, RESULTS.md); what every bench shares is in bench/common (report.py: the
command line, statistics, CSV, RESULTS.md pieces, plots).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402
from load_census import (  # noqa: E402
    FIELDS, LoadDaemon, MIN_DURATION, census, compare, fmt, leak_keys,
)
from load_clients import Client, Stats  # noqa: E402
from load_report import op_stats, write_plots, write_results  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients")
    ap.add_argument("--duration", type=float, default=300.0, metavar="S",
                    help="seconds of load (clients start no new operation after it)")
    ap.add_argument("--out", default=str(HERE / "results"), help="results directory")
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --duration below {MIN_DURATION} s; results say SMOKE")
    ap.add_argument("--memory", type=int, default=256, help="guest RAM per sandbox (MiB)")
    ap.add_argument("--client-sandboxes", type=int, default=2,
                    help="most sandboxes alive per client")
    ap.add_argument("--client-snapshots", type=int, default=2,
                    help="most snapshots alive per client")
    ap.add_argument("--exec-timeout-ms", type=int, default=120_000)
    ap.add_argument("--request-timeout", type=float, default=900.0, metavar="S",
                    help="client-side timeout of one request")
    ap.add_argument("--settle-timeout", type=float, default=120.0, metavar="S",
                    help="how long to wait for the daemon to return to the baseline")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--daemon-max-requests", type=int, default=None,
                    help="pass --max-requests N to the daemon (429 testing)")
    ap.add_argument("--daemon-max-sandboxes", type=int, default=None,
                    help="pass --max-sandboxes N to the daemon (429 testing)")
    ap.add_argument("--keep-home", action="store_true", help="keep the daemon home afterwards")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="first wait up to this long for other processes to leave the CPUs idle")
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "forkvm"))
    args = ap.parse_args()
    if args.clients < 1 or args.duration <= 0:
        ap.error("--clients must be >= 1 and --duration > 0")
    if args.client_sandboxes < 1 or args.client_snapshots < 0:
        ap.error("--client-sandboxes must be >= 1 and --client-snapshots >= 0")
    if args.duration < MIN_DURATION and not args.smoke:
        ap.error(f"--duration {args.duration:.0f} is below {MIN_DURATION} s for a valid result; "
                 "add --smoke for a quick check")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("failures.json",):
        (out / stale).unlink(missing_ok=True)
    worst_mib = args.clients * args.client_sandboxes * args.memory
    avail_mib = fb.meminfo().get("MemAvailable", 0) / 1024 if hasattr(fb, "meminfo") else 0
    print(f"load test: {args.clients} clients x {args.duration:.0f} s, guest RAM {args.memory} "
          f"MiB, up to {args.clients * args.client_sandboxes} sandboxes (<= {worst_mib} MiB of "
          f"guest RAM if none were shared; MemAvailable {avail_mib:.0f} MiB)"
          + (" [SMOKE]" if args.smoke else ""), flush=True)
    fb.wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    machine = rp.machine_info()

    # A private copy of the binary, so a rebuild does not change it under us.
    bindir = tempfile.mkdtemp(prefix="fvl-bin-", dir="/tmp")
    binary = os.path.join(bindir, "forkvm")
    src = os.path.realpath(args.binary)
    if not os.access(src, os.X_OK):
        raise fb.BenchError(f"{args.binary} is not an executable (build it, or set FORKVM_BIN)")
    shutil.copy2(src, binary)
    ctx: dict = {"args": args, "machine": machine, "started": started,
                 "command": "bash bench/load/run.sh " + " ".join(
                     a for i, a in enumerate(sys.argv[1:])
                     if a != "--binary" and (i == 0 or sys.argv[i] != "--binary")),
                 "git": rp.git_revision(), "binary": src,
                 "binary_mtime": dt.datetime.fromtimestamp(os.path.getmtime(src))
                 .astimezone().strftime("%Y-%m-%d %H:%M %Z")}
    daemon_args = []
    if args.daemon_max_requests is not None:
        daemon_args += ["--max-requests", str(args.daemon_max_requests)]
    if args.daemon_max_sandboxes is not None:
        daemon_args += ["--max-sandboxes", str(args.daemon_max_sandboxes)]
    ctx["daemon_args"] = daemon_args
    stats = Stats()
    stop = threading.Event()
    clients: list[Client] = []
    leak_rows: list[dict] = []
    orphans: list[str] = []
    home = None
    try:
        with LoadDaemon(binary=binary, extra_args=daemon_args, keep_home=args.keep_home) as d:
            home = d.home
            try:
                info = d.api.info()
                ctx["info"] = info
                print(f"forkvm {info.get('version')} | accel {info['accel']['kind']} | "
                      f"{info['qemu'].get('version')} | home {d.home} | daemon pid {d.proc.pid}",
                      flush=True)
                ctx["other_qemus_start"] = len(fb.other_qemu_processes(
                    exclude_substrings=(d.home, str(fb.run_dir_for_home(d.home)))))

                # Warm-up: the boot template.
                print("warm-up: first spawn from the image (cold boot + boot template)...",
                      flush=True)
                t = time.perf_counter()
                sb = d.create(memory_mib=args.memory, cpus=1)
                ctx["warmup_spawn_ms"] = fb.ms_since(t)
                ctx["template_id"] = sb.get("snapshot")
                t = time.perf_counter()
                r = d.api.exec(sb["id"], ["python3", "-c", "print(6*7)"])
                ctx["warmup_exec_ms"] = fb.ms_since(t)
                if r.get("stdout", "").strip() != "42":
                    raise fb.BenchError(f"warm-up exec returned {r}")
                d.delete(sb["id"])
                print(f"warm-up: spawn {ctx['warmup_spawn_ms']:,.0f} ms (template "
                      f"{ctx['template_id']}), exec {ctx['warmup_exec_ms']:,.0f} ms", flush=True)
                time.sleep(2.0)
                base = census(d)
                ctx["base"] = base
                print(f"baseline: {len(base['qemu_pids'])} QEMU, {base['fds']} fds, "
                      f"{len(base['descendants'])} descendants, taps {base['taps']}, netns "
                      f"{base['netns']}, {len(base['home_files'])} files in the home, "
                      f"{len(base['run_dir_files'])} in the run dir, API: "
                      f"{len(base['api_sandboxes'] or [])} sandboxes, "
                      f"{len(base['api_snapshots'] or [])} snapshots", flush=True)

                # Load.
                t0 = time.perf_counter()
                end_at = time.monotonic() + args.duration
                for i in range(args.clients):
                    c = Client(i, args, d.socket_path, t0, end_at, stop, stats,
                               ctx["template_id"])
                    clients.append(c)
                    c.start()
                print(f"load: {args.clients} clients started", flush=True)
                period = 5.0 if args.duration <= 120 else 10.0
                next_print = time.monotonic() + period
                peak_sb = peak_sn = 0
                while any(c.is_alive() for c in clients):
                    time.sleep(1.0)
                    alive_sb = sum(len(c.sandboxes) for c in clients)
                    alive_sn = sum(len(c.snapshots) for c in clients)
                    peak_sb, peak_sn = max(peak_sb, alive_sb), max(peak_sn, alive_sn)
                    if d.proc.poll() is not None:
                        ctx["fatal"] = f"the daemon exited with {d.proc.returncode}"
                        print(f"FATAL: {ctx['fatal']}; log tail:\n{d.log_tail()}", flush=True)
                        stop.set()
                        break
                    if time.monotonic() >= next_print:
                        next_print += period
                        el = time.perf_counter() - t0
                        with stats.lock:
                            n = len(stats.rows)
                            oc = dict(stats.by_outcome)
                        busy = collections.Counter(c.current[0] for c in clients if c.current)
                        slow = max(((time.perf_counter() - c.current[1], c.current[0])
                                    for c in clients if c.current), default=None)
                        phase = "load" if time.monotonic() < end_at else "cleanup"
                        print(f"[{el:6.0f}/{args.duration:.0f} s {phase}] {n} req "
                              f"({n / el:.1f}/s) ok {oc.get('ok', 0)} 409 "
                              f"{oc.get('conflict', 0)} 429 {oc.get('limit', 0)} FAIL "
                              f"{oc.get('failure', 0)} | alive {alive_sb} sb {alive_sn} sn | "
                              f"in flight: "
                              + (", ".join(f"{k} {v}" for k, v in busy.most_common()) or "-")
                              + (f" (oldest {slow[1]} {slow[0]:.0f} s)" if slow else ""),
                              flush=True)
                for c in clients:
                    c.join()
                ctx["peak_sandboxes"], ctx["peak_snapshots"] = peak_sb, peak_sn
                errs = [f"client {c.idx}: {c.error}" for c in clients if c.error]
                if errs:
                    ctx["fatal"] = "bench client errors: " + "; ".join(errs)

                if d.proc.poll() is None:
                    # Orphans: objects the API lists that no client knew of.
                    cur = census(d)
                    for key, kind in (("api_sandboxes", "sandboxes"),
                                      ("api_snapshots", "snapshots")):
                        extra = sorted(set(cur[key] or []) - set(base[key] or []))
                        for oid in extra:
                            orphans.append(oid)
                    if orphans:
                        print(f"LEAK: the API still lists {orphans} after the clients' "
                              "cleanup; removing them", flush=True)
                        for oid in orphans:
                            p = (f"/v1/sandboxes/{oid}" if oid.startswith("sb-")
                                 else f"/v1/snapshots/{oid}?force=true")
                            try:
                                d.api.request("DELETE", p, expect=(204, 404))
                            except Exception as e:  # noqa: BLE001
                                print(f"  DELETE {p}: {e}", flush=True)
                    # Settle.
                    t_settle = time.monotonic()
                    while True:
                        end = census(d)
                        if leak_keys(base, end):
                            ctx["settled"] = True
                            break
                        if time.monotonic() - t_settle > args.settle_timeout:
                            ctx["settled"] = False
                            break
                        time.sleep(1.0)
                    ctx["settle_s"] = time.monotonic() - t_settle
                    ctx["end"] = end
                    leak_rows = compare(base, end, orphans)
                    ctx["other_qemus_end"] = len(fb.other_qemu_processes(
                        exclude_substrings=(d.home, str(fb.run_dir_for_home(d.home)))))
                else:
                    ctx.setdefault("fatal", f"the daemon exited with {d.proc.returncode}")
            finally:
                if not stop.is_set() and any(c.is_alive() for c in clients):
                    print("stopping: the clients finish their request in flight and remove "
                          "what they made...", flush=True)
                stop.set()
                for c in clients:
                    c.join(timeout=600)
                try:
                    shutil.copyfile(d.log_path, out / "daemon.log")
                except OSError:
                    pass
    finally:
        shutil.rmtree(bindir, ignore_errors=True)
        if home and not args.keep_home:
            for p in (home, str(fb.run_dir_for_home(home))):
                if os.path.exists(p):
                    print(f"cleanup: {p} still exists", flush=True)
        if home and args.keep_home:
            print(f"home kept: {home}", flush=True)

    rows = sorted(stats.rows, key=lambda r: r["t_start_s"])
    load = [r for r in rows if r["phase"] == "load"]
    window = max((r["t_start_s"] + r["latency_ms"] / 1000 for r in load), default=0.0)
    ctx["window_s"] = window
    cl = [r for r in rows if r["phase"] == "cleanup"]
    ctx["cleanup_n"] = len(cl)
    ctx["cleanup_fail"] = sum(1 for r in cl if r["outcome"] == "failure")
    ctx.setdefault("other_qemus_end", "?")
    ctx.setdefault("end", ctx.get("base", {}))
    ctx.setdefault("settle_s", math.nan)
    ctx.setdefault("settled", False)
    ctx.setdefault("peak_sandboxes", "?")
    ctx.setdefault("peak_snapshots", "?")
    if "base" not in ctx:
        raise fb.BenchError("the bench stopped before the baseline")
    stats_rows = op_stats(rows, window)

    rp.write_csv(out / "requests.csv", rows, FIELDS)
    rp.write_csv(out / "leaks.csv", leak_rows, ["metric", "start", "end", "leak", "detail", "note"])
    failures = sorted(stats.failures, key=lambda f: f["t_start_s"])
    if failures:
        (out / "failures.json").write_text(json.dumps(failures, indent=1, default=str) + "\n")
    title = (f"forkvm API load — {args.clients} clients × {args.duration:.0f} s"
             f"{' (SMOKE)' if args.smoke else ''}, {ctx['info']['accel']['kind']}, "
             f"{args.memory} MiB guests, {machine['cpu_model']}, {machine['cores']} cores, "
             f"{started:%Y-%m-%d}")
    write_plots(out, rows, title, window)
    write_results(out / "RESULTS.md", ctx, stats_rows, leak_rows, rows, failures)

    # Terminal summary.
    print(f"\n{'op':<16}{'n':>7}{'req/s':>8}{'2xx':>7}{'409':>6}{'429':>6}{'fail':>6}"
          f"{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    for s in stats_rows:
        print(f"{s['op']:<16}{s['n']:>7}{s['rps']:>8.2f}{s['ok']:>7}{s['conflict']:>6}"
              f"{s['limit']:>6}{s['failure']:>6}{fmt(s['p50']):>9}{fmt(s['p90']):>9}"
              f"{fmt(s['p99']):>9}{fmt(s['max']):>9}")
    print(f"cleanup: {ctx['cleanup_n']} requests, {ctx['cleanup_fail']} failures")
    print("\nleak check (start -> end):")
    for r in leak_rows:
        print(f"  {'LEAK' if r['leak'] else 'ok  '} {r['metric']}: {r['start']} -> {r['end']}"
              + (f"  ({r['detail']})" if r["detail"] else ""))
    n_fail = sum(1 for r in rows if r["outcome"] == "failure")
    leaks = [r for r in leak_rows if r["leak"]]
    print(f"\nwrote {out / 'requests.csv'}, {out / 'RESULTS.md'}, "
          f"{out / 'latency_over_time.png'}, {out / 'latency_by_op.png'}, {out / 'daemon.log'}")
    if ctx.get("fatal"):
        print(f"FAIL: {ctx['fatal']}")
    if n_fail or leaks or ctx.get("fatal") or not leak_rows:
        print(f"FAIL: {n_fail} failed requests, {len(leaks)} leak(s)"
              + (f" ({', '.join(r['metric'] for r in leaks)})" if leaks else ""))
        return 1
    print("PASS: no failed request, no leak")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_load", main)
