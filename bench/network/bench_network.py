#!/usr/bin/env python3
"""forkvm network benchmark: a forked child's resume to its first egress, and throughput.

Run through bench/network/run.sh (which builds the release binary first).

Everything is measured in one run against one private daemon, with an
"internet" this bench makes itself: a network namespace joined to the host by
a veth pair (10.249.X.2/24 inside, 10.249.X.1 on the host), holding a Python
HTTP server that logs `time.time()` for every request it receives, and an
`iperf3 -s`.

1. egress     -- per iteration a fresh source sandbox (default image and
                 template, 512 MiB) runs a guest loop that remembers its
                 hostname and checks `socket.gethostname()` every 2 ms; once it
                 differs (the daemon gives each child its id as hostname in the
                 identity step) it GETs `/first/<hostname>/<n>` from the server
                 (0.2 s timeout, retried at once) until one succeeds. The
                 source never sends. Per series, `POST /v1/sandboxes/{id}/branch
                 {"mode": diff|live, "count": 1[, "wait_for_network": false]}`;
                 the figure is the server's receipt time of the child's first
                 request minus the child's `timings.resumed_unix_ms` (both the
                 host's CLOCK_REALTIME). The child and the branch snapshot are
                 deleted after each, the source after the iteration.
2. naive      -- the baseline, interleaved with the series above: a second,
                 cold-booted sandbox runs the same loop. Each naive fork saves it
                 the plain way (`stop`, `migrate` of all RAM and device state to
                 a `file:`, disk copy, `cont`), builds a fresh namespace with
                 forkvm's topology (tap0 172.16.0.1/30 with the same MAC, a veth
                 uplink from 10.248.X.0/24, the same nft ruleset, masquerade on
                 the host in a bench-owned nft table), starts a plain QEMU with
                 the source's command line (own sockets, RAM file and disk copy)
                 inside it with `-incoming defer`, `migrate-incoming` from the
                 file, `cont`, and at once sends the guest agent the same
                 identity message (new hostname) and clock the daemon sends a
                 child. Same figure: receipt minus the host time right after
                 `cont` returned.
3. throughput -- iperf3 under the accelerator in use, 3 runs each: guest ->
                 internet namespace (the guest's client, through tap, the
                 sandbox's NAT and the host's NAT); host -> guest and guest ->
                 host (`-R`) through the daemon's port relay on 127.0.0.1
                 (guest port 5201 published with host port 0); and the
                 ceiling: host <-> internet namespace directly, no VM.

Outputs (in --out): network.csv, RESULTS.md, network.png.

This file holds the command line and the run loop (`main`); the rest is in
network_host.py (host plumbing and the programs), network_forks.py
(forkvm children and the naive baseline), network_iperf.py, network_plots.py,
network_report.py (RESULTS.md); what every bench shares is in bench/common (report.py: the
command line, statistics, CSV, RESULTS.md pieces, plots).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import naive as nv  # noqa: E402
import report as rp  # noqa: E402
from network_host import (  # noqa: E402
    EgressLog, FIELDS, HTTP_PORT, IPERF_PORT, Internet, MAX_FORKS, MIN_FORKS, NAIVE, SERIES,
)
from network_forks import (  # noqa: E402
    fork_forkvm, fork_naive, loop_state, naive_disk_top, start_loop,
)
from network_iperf import IPERF_CASES, run_iperf  # noqa: E402
from network_plots import p, vals, write_plot  # noqa: E402
from network_report import method_text, write_results  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forks", type=int, default=20,
                    help=f"forks per series and naive restores (>= {MIN_FORKS}, <= {MAX_FORKS})")
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --forks < {MIN_FORKS}; results are marked SMOKE")
    ap.add_argument("--series", default=",".join(SERIES),
                    help="forkvm series, comma-separated, from " + ", ".join(SERIES))
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    ap.add_argument("--settle", type=float, default=3.0, metavar="SECONDS",
                    help="rest after the loop has started in a source")
    ap.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                    help="longest wait for a child's first request")
    ap.add_argument("--iperf-time", type=int, default=10, metavar="SECONDS",
                    help="iperf3 -t (default 10)")
    ap.add_argument("--iperf-runs", type=int, default=3, help="iperf3 runs per direction "
                    "(0: skip the throughput part)")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    series_list = [s.strip() for s in args.series.split(",") if s.strip()]
    bad = [s for s in series_list if s not in SERIES]
    if bad:
        ap.error(f"unknown series {bad}; choose from {', '.join(SERIES)}")
    if args.forks < 1 or args.forks > MAX_FORKS:
        ap.error(f"--forks must be between 1 and {MAX_FORKS}")
    if args.forks < MIN_FORKS and not args.smoke:
        ap.error(f"--forks {args.forks} is below the minimum of {MIN_FORKS} for a valid result; "
                 "add --smoke for a quick smoke test")
    if os.geteuid() != 0:
        ap.error("network namespaces and nft need root")
    for tool in ("ip", "nft", "nsenter", "iperf3", "sysctl", "qemu-img"):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not installed")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fb.wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    ctx: dict = {"machine": rp.machine_info(), "started": started, "git": rp.git_revision(),
                 "notes": []}
    cmd = []
    if args.forks != 20:
        cmd.append(f"--forks {args.forks}")
    if args.smoke:
        cmd.append("--smoke")
    if series_list != list(SERIES):
        cmd.append(f"--series {','.join(series_list)}")
    for flag, val, default in (("--memory", args.memory, 512),
                               ("--iperf-time", args.iperf_time, 10),
                               ("--iperf-runs", args.iperf_runs, 3)):
        if val != default:
            cmd.append(f"{flag} {val}")
    ctx["cmd"] = (" " + " ".join(cmd)) if cmd else ""
    rows: list[dict] = []
    tag = os.getpid() % 100_000
    x = os.getpid() % 200 + 20
    workdir = tempfile.mkdtemp(prefix="fvb-net-", dir="/tmp")
    shm = tempfile.mkdtemp(prefix="fvb-net-", dir="/dev/shm")
    inet = Internet(tag, x, workdir)
    others: dict[int, str] = {}
    home = None
    try:
        if open("/proc/sys/net/ipv4/ip_forward").read().strip() != "1":
            print("note: IPv4 forwarding is off on the host; the daemon turns it on at start",
                  flush=True)
        # Unjailed: the naive baseline replays a sandbox QEMU's command line
        # and saves it into the bench's own files, which a jailed QEMU (own
        # mount namespace, inherited tap fd) cannot do. RESULTS.md says so.
        with fb.Daemon(binary=args.binary, env={"FORKVM_NO_JAIL": "1"}) as d:
            home = d.home
            info = d.api.info()
            ctx["info"] = info
            print(f"forkvm {info.get('version')} | accel {info['accel']['kind']} | QEMU "
                  f"{info['qemu'].get('version')} | home {d.home}", flush=True)
            if not (info.get("network") or {}).get("available"):
                raise fb.BenchError(f"the daemon has no networking: {info.get('network')}")
            inet.create()
            print(f"[internet] namespace {inet.ns}: http://{inet.addr}:{HTTP_PORT}, "
                  f"iperf3 {inet.addr}:{IPERF_PORT}; host side {inet.host_if} {inet.host_addr}",
                  flush=True)
            log = EgressLog(inet.log_path)
            meter = fb.CpuMeter(roots=[d.proc.pid])

            def check_others():
                now = fb.other_qemu_processes(exclude_substrings=(home, shm, workdir))
                new = {q: c for q, c in now.items() if q not in others}
                if new:
                    print(f"    note: {len(new)} QEMU process(es) not started by this bench "
                          "are running (they compete for CPU)", flush=True)
                others.update(now)

            # The naive baseline's source: cold-booted, loop running. `naive_save`
            # checks it is a plain VM, turns migration capabilities off and saves
            # it once (a check that the plain save works); it is then resumed and
            # kept running: every naive fork saves it afresh.
            nsrc = d.create_cold(memory_mib=args.memory, cpus=1)
            nid = nsrc["id"]
            if (nsrc.get("network") or {}).get("mode") != "nat":
                raise fb.BenchError(f"the baseline source has no nat network: {nsrc}")
            start_loop(d, nid, inet.addr)
            time.sleep(args.settle)
            nwork = os.path.join(d.home, "naive")
            os.mkdir(nwork)
            saved = nv.naive_save(d, nid, nsrc["pid"], args.memory, nwork)
            with fb.Qmp(os.path.join(saved.sbdir, "qmp.sock"), timeout=60) as qmp:
                qmp.execute("cont")
            ntop = naive_disk_top(saved)
            # Every later save writes its state to tmpfs (the naive baseline's best case:
            # no disk writeback competes with the next restore's read).
            os.unlink(saved.state)
            saved.state = os.path.join(shm, "state.bin")
            ctx["first_save_ms"] = saved.save_ms
            print(f"[naive source] {nid} cold-booted, loop running; a plain full save takes "
                  f"{saved.save_ms:.0f} ms ({saved.state_bytes / 2**20:.0f} MiB state file; "
                  f"capabilities turned off: {', '.join(saved.caps_reset) or 'none'}); resumed",
                  flush=True)

            # forkvm sources. Every branch of a source adds a layer to its disk
            # chain (see the notes in RESULTS.md), so each iteration gets a fresh
            # source: every child comes from a source branched at most
            # len(series) - 1 times before, as in a steady state.
            source_ids: list[str] = []

            def new_source(label: str) -> str:
                src = d.create(memory_mib=args.memory, cpus=1)
                x = src["id"]
                source_ids.append(x)
                start_loop(d, x, inet.addr)
                print(f"[source {label}] {x} spawned ({src['timings']['total_ms']:.0f} ms, "
                      f"snapshot {src.get('snapshot')}), loop running; resting "
                      f"{args.settle:.0f} s", flush=True)
                time.sleep(args.settle)
                return x

            def retire_source(x: str) -> None:
                st = loop_state(d, x)
                if not st.startswith(f"waiting {x}"):
                    ctx["notes"].append(f"source {x}'s loop ended up {st!r}: it should still "
                                        "be waiting (a source must never send)")
                d.delete(x)

            # Warm-up (not counted): one fork of each kind.
            sid = new_source("warm-up")
            for s in dict.fromkeys(SERIES[n][0] for n in series_list):
                name = next(n for n in series_list if SERIES[n][0] == s)
                w = fork_forkvm(d, sid, name, 0, log, args.timeout)
                print(f"[warm-up {s}] resume→egress {w['resume_to_egress_ms']:.0f} ms (not "
                      "counted)", flush=True)
            retire_source(sid)
            w = fork_naive(saved, ntop, nwork, shm, inet, 0, 63, log, args.timeout)
            print(f"[warm-up naive] resume→egress {w['resume_to_egress_ms']:.0f} ms (not "
                  "counted)", flush=True)

            # diff and live series alternate: a live branch that directly follows
            # another live branch of the same source is about twice as fast as
            # one that follows a diff branch (see RESULTS.md), which would make
            # the two live series differ by their position, not their settings.
            diffs = [x for x in series_list if SERIES[x][0] == "diff"]
            lives = [x for x in series_list if SERIES[x][0] == "live"]
            order = [x for pair in itertools.zip_longest(diffs, lives) for x in pair
                     if x is not None] + [NAIVE]
            for i in range(1, args.forks + 1):
                sid = new_source(f"{i}/{args.forks}")
                # Rotate the order each iteration, so no series always follows another.
                k = (i - 1) % len(order)
                branches = 0
                for s in order[k:] + order[:k]:
                    check_others()
                    meter.start()
                    if s == NAIVE:
                        r = fork_naive(saved, ntop, nwork, shm, inet, i, i - 1, log,
                                       args.timeout)
                    else:
                        r = fork_forkvm(d, sid, s, i, log, args.timeout)
                        r["source"] = sid
                        r["source_branches_before"] = branches
                        branches += 1
                    r["other_cpu_cores"] = meter.other_cores()
                    rows.append(r)
                    extra = (f"restore {rp.fmt(r.get('restore_ms'), 0)}, identity "
                             f"{rp.fmt(r.get('identity_ms'), 0)}, network "
                             f"{rp.fmt(r.get('network_ms'), 0)}, ready "
                             f"{rp.fmt(r.get('network_ready_ms'), 0)}")
                    if s == NAIVE:
                        extra += f", load {rp.fmt(r.get('load_ms'), 0)}"
                    print(f"[{s} {i}/{args.forks}] {r['child']}: resume→egress "
                          f"{r['resume_to_egress_ms']:6.0f} ms, request→egress "
                          f"{r['request_to_egress_ms']:6.0f} ms (attempt {r['attempt']}; "
                          f"{extra}; others {r['other_cpu_cores']:.2f} cores)", flush=True)
                retire_source(sid)
            log.poll()
            st = loop_state(d, nid)
            if not st.startswith(f"waiting {nid}"):
                ctx["notes"].append(f"the baseline source's loop ended up {st!r}: it should "
                                    "still be waiting (a source must never send)")
            sent = {x: log.count[x] for x in source_ids + [nid] if log.count.get(x)}
            if sent:
                ctx["notes"].append(f"sources sent requests (they must not): {sent}")
            d.delete(nid)

            if args.iperf_runs > 0:
                run_iperf(d, inet, args, rows, meter)
            ctx["method"] = method_text(args, inet)
    finally:
        for e in inet.close():
            print(f"cleanup: {e}", flush=True)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
        left = [n for n in os.listdir("/run/netns") if n.startswith(f"fvb-nv-{tag}-")
                or n == inet.ns] if os.path.isdir("/run/netns") else []
        left += [n for n in os.listdir("/sys/class/net")
                 if n.startswith(f"fvbn{tag}-") or n == inet.host_if]
        if left:
            print(f"cleanup: still present: {left}", flush=True)
        if home:
            q = fb.qemu_pids_mentioning(home) + fb.qemu_pids_mentioning(shm)
            if q:
                print(f"cleanup: QEMU processes still name our files: {q}", flush=True)
    ctx["elapsed"] = time.monotonic() - t_start
    ctx["others"] = others
    multi = {s: sum(1 for r in rows if r.get("series") == s and (r.get("attempt") or 1) > 1)
             for s in series_list + [NAIVE]}
    if any(multi.values()):
        ctx["notes"].append("children whose first request to arrive was not their first attempt "
                            "(an earlier one failed or timed out after 0.2 s): "
                            + ", ".join(f"{s} {n}" for s, n in multi.items() if n))

    for s_ in series_list + [NAIVE]:
        ports = [r.get("guest_source_port") for r in rows
                 if r.get("series") == s_ and r.get("guest_source_port")]
        if len(ports) > 3 and len(set(ports)) <= len(ports) // 2:
            ctx["notes"].append(
                f"{s_}: the first connections of {len(ports)} children used only "
                f"{len(set(ports))} distinct guest source ports (e.g. {ports[0]}): children "
                "inherit the guest kernel's ephemeral-port state and hash secrets from the "
                "snapshot, which the identity step's RNG reseed does not change, so siblings "
                "pick the same port (and the naive copies, all restored from the same kind of "
                "state, do too). Their traffic still leaves under distinct uplink addresses, "
                "and the host's NAT remaps ports that collide.")
    c1 = [r["guest_connect_ms"] for r in rows if r.get("guest_connect_ms") is not None]
    c2 = [r["guest_connect2_ms"] for r in rows if r.get("guest_connect2_ms") is not None]
    if c1 and c2:
        ctx["notes"].append(
            f"The child's first TCP connect takes p50 {rp.percentile(c1, 50):,.0f} ms (all "
            f"series, naive included) and the second, right after, p50 "
            f"{rp.percentile(c2, 50):,.0f} ms: the first time a new QEMU process runs a code "
            "path, TCG translates it (the translation cache is per process and starts empty "
            "after every restore, forkvm's or naive), which dominates resume → egress here "
            "together with the identity step."
            + (" The network path itself was ready: no child's first request had to be "
               "retried." if not any(multi.values()) else ""))
    rp.write_csv(out / "network.csv", rows, FIELDS)
    m = ctx["machine"]
    title = (f"forkvm network bench — {ctx['info']['accel']['kind']}, {args.memory} MiB, "
             f"{args.forks} forks per series{' (SMOKE)' if args.smoke else ''}, "
             f"{m['cpu_model']}, {m['cores']} cores, {started:%Y-%m-%d}")
    write_plot(out / "network.png", rows, series_list, title)
    write_results(out / "RESULTS.md", rows, ctx, args, series_list)
    print()
    naive50 = p(rows, NAIVE, "resume_to_egress_ms", 50)
    for s in series_list + [NAIVE]:
        v = vals(rows, s, "resume_to_egress_ms")
        if v:
            st = rp.summarize(v)
            print(f"{s:12s} resume→egress p50 {st['p50']:7.0f} ms  p90 {st['p90']:7.0f} ms  "
                  f"({st['p50'] / naive50:.2f}× naive p50)  request→egress p50 "
                  f"{p(rows, s, 'request_to_egress_ms', 50):7.0f} ms")
    for series, direction, _ in IPERF_CASES:
        v = vals(rows, series, "mbit_s", "iperf")
        if v:
            print(f"{direction:40s} {sum(v) / len(v):9,.1f} Mbit/s (mean of {len(v)})")
    print(f"\nwrote {out / 'network.csv'}, {out / 'RESULTS.md'}, {out / 'network.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_network", main)
