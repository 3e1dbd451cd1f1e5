"""The network benchmark's RESULTS.md (tables, method) and the terminal
summary.
"""

from __future__ import annotations

import math
from pathlib import Path

import report as rp
from network_host import Internet, NAIVE, NOISY_CORES, SERIES
from network_iperf import IPERF_CASES
from network_plots import p, vals


def f0(v) -> str:
    return rp.fmt(v, 0)


def branch_point_table(rows, series_list, pp) -> list[str]:
    """The branch point's own cost per series (p50 / p90): a clone's branch
    point holds every page the clone changed since its spawn, and publishing
    writes and fsyncs them, so `snapshot_ms` follows the diff's size."""
    have = [s for s in series_list if vals(rows, s, "snapshot_publish_ms")]
    if not have:
        return []
    L = ["", "Branch point (p50 / p90):", "",
         "| series | snapshot_ms | copy_memory_ms | publish_ms | memory.diff (MiB) |",
         "|---|---|---|---|---|"]
    for s in have:
        mib = [v / 2**20 for v in vals(rows, s, "memory_diff_bytes")]
        size = (f"{rp.fmt(rp.percentile(mib, 50), 1)} / {rp.fmt(rp.percentile(mib, 90), 1)}"
                if mib else "–")
        L.append(f"| {s} | {pp(s, 'snapshot_ms')} | {pp(s, 'snapshot_copy_memory_ms')} | "
                 f"{pp(s, 'snapshot_publish_ms')} | {size} |")
    L.append("")
    return L


def write_results(path: Path, rows, ctx, args, series_list) -> None:
    m = ctx["machine"]
    info = ctx["info"]
    smoke = " (SMOKE — not a valid result)" if args.smoke else ""
    naive50 = p(rows, NAIVE, "resume_to_egress_ms", 50)
    naive_req50 = p(rows, NAIVE, "request_to_egress_ms", 50)
    cores = [r.get("other_cpu_cores") or 0 for r in rows]
    noisy = sum(1 for c in cores if c > NOISY_CORES)
    L = []
    L.append("# Network benchmark: resume → first egress of a forked child, and throughput"
             + smoke)
    L.append("")
    L.append(rp.date_line(ctx["started"], ctx["elapsed"], minutes=True))
    L.append(rp.forkvm_line(info, ctx["git"], " (when the bench started)"))
    L.append(f"- Machine: {rp.machine_text(m)}; kernel Linux {m['kernel']}; load average at "
             "start " + rp.loadavg_text(m))
    L.append(rp.accel_line(info))
    L.append(f"- QEMU: {rp.qemu_text(info)}")
    L.append("- Jail: **off** (`FORKVM_NO_JAIL=1`) for every sandbox of this bench: the naive "
             "baseline replays a sandbox QEMU's command line and saves it into the bench's "
             "files, which a jailed QEMU cannot do (bench/jail measures the jail's cost).")
    L.append(f"- Guests: {args.memory} MiB RAM, 1 vCPU, image `default`; network `nat` "
             "(the default)")
    L.append(f"- Runs: {args.forks} forks per series ({', '.join(series_list)}) and "
             f"{args.forks} naive forks, interleaved (one of each per iteration, the order "
             "rotated every iteration; one warm-up of each kind first, not counted); iperf3 "
             f"{args.iperf_runs} × {args.iperf_time} s per direction")
    L.append(f"- Host noise — cores kept busy by processes other than this bench's and its "
             f"daemon's during each measurement (`other_cpu_cores`): p50 "
             f"{rp.percentile(cores, 50):.2f}, max {max(cores, default=0):.2f}; {noisy} of "
             f"{len(rows)} measurements above {NOISY_CORES} (orange in the plot)")
    others = ctx.get("others") or {}
    L.append("- Other QEMU processes (not this bench's) seen during the run: "
             + (f"{len(others)} (integration tests running in parallel; they compete for the "
                "2 cores)" if others else "none"))
    L.append("")
    L += summary_lines(rows, series_list)
    L.append("## Resume → first successful egress")
    L.append("")
    L.append("| series | n | p50 (ms) | p90 (ms) | min | max | ratio to naive p50 | "
             "request → egress p50 | p90 |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in series_list + [NAIVE]:
        v = vals(rows, s, "resume_to_egress_ms")
        if not v:
            continue
        st = rp.summarize(v)
        ratio = st["p50"] / naive50 if naive50 and not math.isnan(naive50) else math.nan
        L.append(f"| {'**' + s + '**' if s != NAIVE else 'naive (baseline)'} | {st['n']} | "
                 f"**{f0(st['p50'])}** | **{f0(st['p90'])}** | {f0(st['min'])} | "
                 f"{f0(st['max'])} | {rp.fmt(ratio, 2)}× | "
                 f"{f0(p(rows, s, 'request_to_egress_ms', 50))} | "
                 f"{f0(p(rows, s, 'request_to_egress_ms', 90))} |")
    L.append("")
    L.append("*Ratio* = the series' resume → egress p50 divided by the naive baseline's p50 "
             "(below 1: forkvm's child reaches the network sooner after its resume). "
             "*request → egress* starts earlier: for forkvm when the bench sent "
             "`POST .../branch` "
             "(so it includes the source's pause, the snapshot, the child's QEMU start, network "
             "setup and restore); for naive when the bench stopped the running baseline source "
             "to save it (so it includes the full save, the disk copies, the namespace setup, "
             "the QEMU start and loading the whole state file).")
    L.append("")
    if not math.isnan(naive_req50):
        parts = []
        for s in series_list:
            v = p(rows, s, "request_to_egress_ms", 50)
            if not math.isnan(v):
                parts.append(f"{s} {f0(v)} ms ({naive_req50 / v:.2f}×)")
        L.append(f"From the request, naive p50 ÷ forkvm p50 (naive {f0(naive_req50)} ms): "
                 + "; ".join(parts) + ".")
        L.append("")
    L.append("### Where the time goes (p50 / p90, ms)")
    L.append("")
    L.append("| series | restore | identity | network setup (before resume) | network_ready | "
             "resume → hostname seen (est.) | first connect (guest) | second connect (guest) | "
             "QEMU start | load (naive) | source pause | snapshot kind |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def pp(s, k):
        v = vals(rows, s, k)
        if not v:
            return "–"
        return f"{rp.fmt(rp.percentile(v, 50), 1)} / {rp.fmt(rp.percentile(v, 90), 1)}"

    for s in series_list + [NAIVE]:
        if not vals(rows, s, "resume_to_egress_ms"):
            continue
        kinds = sorted({f"{r.get('snapshot_kind')} (depth {r.get('snapshot_depth')})"
                        for r in rows if r.get("series") == s and r.get("snapshot_kind")})
        L.append(f"| {s} | {pp(s, 'restore_ms')} | {pp(s, 'identity_ms')} | "
                 f"{pp(s, 'network_ms')} | {pp(s, 'network_ready_ms')} | "
                 f"{pp(s, 'resume_to_hostname_ms')} | {pp(s, 'guest_connect_ms')} | "
                 f"{pp(s, 'guest_connect2_ms')} | {pp(s, 'qemu_start_ms')} | "
                 f"{pp(s, 'load_ms')} | {pp(s, 'pause_ms')} | {', '.join(kinds) or '–'} |")
    L.append("")
    L += branch_point_table(rows, series_list, pp)
    L.append("- *source pause*: how long the running source was stopped — forkvm the branch's "
             "`pause_ms`; naive `stop` → full migration to the file → disk copy → `cont` "
             "(p50 of its parts: migration "
             f"{rp.fmt(p(rows, NAIVE, 'naive_save_ms', 50), 1)} ms, disk copy "
             f"{rp.fmt(p(rows, NAIVE, 'save_disk_copy_ms', 50), 1)} ms; state file "
             f"{rp.fmt(p(rows, NAIVE, 'state_bytes', 50) / 2**20, 0)} MiB).")
    L.append("- *restore*: forkvm `timings.restore_ms` (loading the device state and `cont`); "
             "naive: `cont` only (the state load is the *load* column, done before).")
    L.append("- *identity*: forkvm `timings.identity_ms` (the identity request — RNG reseed, "
             "clock, hostname, machine-id, instance-id — and the clock set that follows); naive: "
             "the same two agent messages sent by the bench, timed the same way.")
    L.append("- *network setup*: forkvm `timings.network_ms` (uplink, rules, host table, ports; "
             "the namespace and tap were made before QEMU started); naive: the bench's whole "
             "namespace setup (namespace, tap, forwarding, veth, routes, nft), before QEMU "
             "starts. Both are done before the guest resumes, so neither is inside "
             "resume → egress (both are inside request → egress).")
    L.append("- *network_ready*: forkvm `timings.network_ready_ms`, resume until the agent's "
             "probe of the gateway came back (only with `wait_for_network`).")
    L.append("- *resume → hostname seen (est.)*: resume → egress minus what the loop itself "
             "measured (guest monotonic clock) from seeing the new hostname until its request "
             "was written (wait + connect + send): roughly when the identity step's "
             "`sethostname` took effect and the 2 ms poll saw it.")
    L.append("- *first connect (guest)*: the loop's own time for the TCP connect of the request "
             "that arrived (`HTTPConnection.connect()`; handshake with the internet server "
             "through both NATs). *second connect*: a second request the loop makes right after "
             "the first succeeded (not part of the figure): the same connect once the guest has "
             "run that code path once in this QEMU process.")
    L.append("")
    L.append("## Throughput (iperf3, TCP, one stream)")
    L.append("")
    L.append(f"Accelerator **{info['accel']['kind']}**; {args.iperf_runs} runs × "
             f"{args.iperf_time} s each; the figure is iperf3's `end.sum_received` "
             "(what the receiver got).")
    L.append("")
    L.append("| direction | runs (Mbit/s) | mean | min | max |")
    L.append("|---|---|---:|---:|---:|")
    for series, direction, _ in IPERF_CASES:
        v = vals(rows, series, "mbit_s", "iperf")
        if not v:
            continue
        L.append(f"| {direction} | {', '.join(rp.fmt(x, 1) for x in v)} | "
                 f"**{rp.fmt(sum(v) / len(v), 1)}** | {rp.fmt(min(v), 1)} | "
                 f"{rp.fmt(max(v), 1)} |")
    L.append("")
    for series, direction, how in IPERF_CASES:
        L.append(f"- *{direction}*: {how}.")
    L.append("")
    if ctx.get("notes"):
        L.append("## Observations")
        L.append("")
        for n in ctx["notes"]:
            L.append(f"- {n}")
        L.append("")
    L.append("## How it was measured")
    L.append("")
    L.append(ctx["method"])
    L.append("")
    L.append("## Reproduce")
    L.append("")
    L.append("```sh")
    L.append(f"bash bench/network/run.sh{ctx['cmd']}")
    L.append("```")
    L.append("")
    L.append("Raw rows: `network.csv` (one per measurement: `kind` egress or iperf). "
             "Plot: `network.png`.")
    L.append("")
    path.write_text("\n".join(L))


def summary_lines(rows, series_list) -> list[str]:
    """'In short': the figures that answer the questions, from this run."""
    out = ["## In short", ""]
    naive50 = p(rows, NAIVE, "resume_to_egress_ms", 50)
    fk = [s for s in series_list if vals(rows, s, "resume_to_egress_ms")]
    if fk and not math.isnan(naive50):
        r50 = {s: p(rows, s, "resume_to_egress_ms", 50) for s in fk}
        ratios = [r50[s] / naive50 for s in fk]
        fk_rows = [r for r in rows if r.get("kind") == "egress" and r.get("series") in fk]
        host = rp.percentile([r["resume_to_hostname_ms"] for r in fk_rows
                              if r.get("resume_to_hostname_ms") is not None], 50)
        c1 = rp.percentile([r["guest_connect_ms"] for r in fk_rows
                            if r.get("guest_connect_ms") is not None], 50)
        c2 = rp.percentile([r["guest_connect2_ms"] for r in fk_rows
                            if r.get("guest_connect2_ms") is not None], 50)
        retried = sum(1 for r in rows if r.get("kind") == "egress" and (r.get("attempt") or 1) > 1)
        if 0.8 <= min(ratios) and max(ratios) <= 1.25:
            head = "about the same for a forkvm child and a naive copy"
        elif max(ratios) < 1:
            head = "shorter for a forkvm child than for a naive copy"
        elif min(ratios) > 1:
            head = "longer for a forkvm child than for a naive copy"
        else:
            head = "mixed between forkvm's series and a naive copy"
        out.append(
            f"- **Resume → first egress is {head}**: p50 "
            + ", ".join(f"{s} {f0(r50[s])} ms" for s in fk)
            + f" against naive {f0(naive50)} ms ({min(ratios):.2f}–{max(ratios):.2f}× the "
            "naive p50). Both resume with a working network (their namespace, tap, uplink and "
            "NAT exist before `cont`; "
            + ("no first request was retried" if not retried else
               f"{retried} first requests were retried")
            + "), so what is left is inside the guest, under TCG: in forkvm's children the new "
            f"hostname is seen about {f0(host)} ms after the resume (identity step), and the "
            f"first TCP connect takes {f0(c1)} ms where a second one takes {f0(c2)} ms (code "
            "the new QEMU process runs for the first time is translated first).")
    req_naive = p(rows, NAIVE, "request_to_egress_ms", 50)
    if not math.isnan(req_naive):
        parts = []
        for s in fk:
            v = p(rows, s, "request_to_egress_ms", 50)
            if v < req_naive:
                parts.append(f"{s} {f0(v)} ms ({req_naive / v:.2f}× sooner)")
            else:
                parts.append(f"{s} {f0(v)} ms ({v / req_naive:.2f}× later)")
        out.append(
            "- **From the fork request** to the child's first egress (p50), against naive's "
            f"stop + full save + restore {f0(req_naive)} ms: " + "; ".join(parts) + ". A live "
            "branch copies the source's RAM while it runs before the child can start "
            "(`snapshot_ms` p50 "
            f"{f0(p(rows, 'live', 'snapshot_ms', 50))} ms), but pauses the source only "
            f"{rp.fmt(p(rows, 'live', 'pause_ms', 50), 1)} ms (naive "
            f"{f0(p(rows, NAIVE, 'pause_ms', 50))} ms).")
    pairs = [(a, b) for a, b in (("diff", "diff_nowait"), ("live", "live_nowait"))
             if a in fk and b in fk]
    if pairs:
        out.append(
            "- `wait_for_network: false` vs the default (resume → egress p50): "
            + "; ".join(f"{b} {f0(p(rows, b, 'resume_to_egress_ms', 50))} vs {a} "
                        f"{f0(p(rows, a, 'resume_to_egress_ms', 50))} ms" for a, b in pairs)
            + ". With the default the agent's own probe of the gateway runs in the guest at "
            "the same time as the program's first connect; the child's response then comes "
            f"after `network_ready_ms` (p50 {f0(p(rows, pairs[0][0], 'network_ready_ms', 50))} "
            f"ms for {pairs[0][0]}).")
    thr = {c[0]: vals(rows, c[0], "mbit_s", "iperf") for c in IPERF_CASES}
    if all(thr.values()):
        m = {k: sum(v) / len(v) for k, v in thr.items()}
        ceil = max(m["ceiling_host_to_inet"], m["ceiling_inet_to_host"])
        out.append(
            f"- **Throughput under TCG** (one TCP stream): guest → outside "
            f"{rp.fmt(m['vm_to_inet'], 0)} Mbit/s, host → guest through the port relay "
            f"{rp.fmt(m['host_to_vm_relay'], 0)}, guest → host through it "
            f"{rp.fmt(m['vm_to_host_relay'], 0)}; the same path without a VM carries "
            f"{rp.fmt(m['ceiling_inet_to_host'], 0)}–{rp.fmt(m['ceiling_host_to_inet'], 0)} "
            f"Mbit/s, so the VM side (virtio-net and the guest's TCP stack under TCG) is what "
            "limits it, at "
            f"{100 * max(m['vm_to_inet'], m['host_to_vm_relay'], m['vm_to_host_relay']) / ceil:.0f}"
            "% of it at most.")
    out.append("")
    return out


def method_text(args, inet: Internet) -> str:
    return "\n".join([
        f"**The internet.** A network namespace `{inet.ns}` joined to the host by a veth pair "
        f"(`{inet.addr}/24` inside, `{inet.host_addr}` on the host's `{inet.host_if}`), holding "
        "a Python `ThreadingHTTPServer` on port 8080 that writes `time.time()` when a "
        "request's handler thread starts and at the start of `do_GET` (the receipt time used "
        "below), plus the path, for every request, and an "
        "`iperf3 -s` on port 5201. Its interface name does not start with `fvh`, so forkvm's "
        "host table treats it as the outside world and masquerades sandbox egress to "
        f"`{inet.host_addr}`.",
        "",
        "**The guest loop** (`/root/loop.py`, started detached with "
        "`sh -c 'setsid python3 /root/loop.py <server> >/root/loop.log 2>&1 </dev/null &'` after "
        "writing the file through an exec's stdin): it imports `http.client`, records "
        "`socket.gethostname()`, and first does Python's lazy one-time work without sending "
        "anything on the network: `getaddrinfo` of the server address (which imports the "
        "`idna` codec on first use) and one HTTP round trip over loopback to a socket of its "
        "own, through the same `http.client` code (a smoke run without this warm-up spent "
        "~300 ms more in the child's first `connect()`, mostly importing that codec from "
        "disk; a long-running agent would have paid it long before the fork). Then it checks "
        "the hostname every 2 ms (`time.sleep(0.002)`). Once it differs, it sends "
        "`GET /first/<hostname>/<n>` (`http.client`, timeout 0.2 s) and retries at once on "
        "any failure until one answers 200, then makes one more request (`/second/...`, "
        "not timed by the bench) and writes its own timings (guest monotonic clock: detect → "
        "attempt, connect, send, response, the second connect, the source port) to "
        "`/tmp/loop.state`, which the bench reads back (exec for forkvm, the agent's "
        "`read_file` for naive). The source itself never sends on the network.",
        "",
        "**forkvm series.** Each iteration spawns a fresh source with `POST /v1/sandboxes "
        f"{{\"memory_mib\": {args.memory}}}` (default image, from its boot template, network "
        f"`nat`); it starts the loop and rests {args.settle:.0f} s. Then, in that iteration's "
        "order, one `POST /v1/sandboxes/{id}/branch` per series with "
        "`{\"mode\": \"diff\"|\"live\", \"count\": 1}`, plus "
        "`\"wait_for_network\": false` for the `_nowait` series (the naive fork takes its "
        "turn in the same order; diff and live series alternate, and the order rotates by "
        "one every iteration); the "
        "source is deleted at the end of the iteration. A first source makes one branch of "
        "each mode that is not counted (warm-up). The daemon gives the child its id as "
        "hostname in the identity step right after `cont`, which fires the child's copy of "
        "the loop. "
        "**resume → egress** = the server's `do_GET` time of the first request whose path "
        "names the child minus the child's `timings.resumed_unix_ms` (the daemon reads the "
        "host clock right after QEMU's `cont` returned). **Both times come from the same "
        "host clock** (CLOCK_REALTIME, read by the daemon and by the server process; a network "
        "namespace does not have a clock of its own). Then the child is deleted "
        "(`DELETE /v1/sandboxes/{child}`) and then the branch snapshot "
        "(`DELETE /v1/snapshots/{id}`).",
        "",
        "**Why a fresh source per iteration.** Every branch leaves one more qcow2 layer under "
        "the source's disk, also after its snapshot and child are deleted (a sandbox spawned "
        "from the template starts with a 3-deep chain; in a separate check, after 30 branches "
        "it was 33 deep). An earlier full run of this bench that branched one source 82 "
        "times saw the children "
        "get slower as the chain grew, from the first five to the last five iterations "
        "(medians): diff prepare 32 → 127 ms, QEMU start 113 → 242 ms, restore 25 → 119 ms, "
        "snapshot 178 → 432 ms, request → egress 924 → 1,462 ms, resume → egress "
        "393 → 518 ms; "
        "live pause 17 → 117 ms; the naive baseline stayed flat. A source branched at most "
        f"{len(SERIES) - 1} times keeps this out of the figures.",
        "",
        "**Why diff and live alternate.** In the same earlier runs, a live branch that "
        "directly followed another live branch of the same source was about twice as fast as "
        "one that followed a diff branch or came first (this bench's second full run, which "
        "ran the two live series back to back: `snapshot_ms` median 878 ms, 814–976, over 16 "
        "such branches against 2,001 ms, 1,756–2,498, over 24 others; request → egress 1,536 "
        "against 2,751 ms). Run back to back, the second live series would look faster "
        "because of its place in the order; alternating puts a diff branch between them, so "
        "every live branch here is of the slower kind.",
        "",
        "**The figure includes the identity step.** The loop can only tell it is in a child "
        "once the hostname has changed, and the daemon changes it inside the identity request "
        "it sends right after the resume (the `identity_ms` column); so resume → egress is "
        "*resume → hostname set → the loop's next 2 ms poll → TCP connect → request "
        "received*. "
        "A program that does not wait for its identity could send earlier: the child's "
        "network (namespace, tap, uplink, NAT rules) is complete before `cont`.",
        "",
        "**naive baseline.** A second sandbox is cold-booted (`use_template: false`, so it "
        "owns its RAM as a plain `share=on` file, like any QEMU VM), runs the same loop, rests, "
        "and is checked and saved once with `bench/common`'s `naive_save` (every migration "
        "capability off), then resumed; it keeps running next to the forkvm source. Each "
        "naive fork (interleaved with the forkvm series) is what forking a running VM with "
        "plain QEMU takes: `stop` the source, `migrate` to `file:` (all RAM and device state), "
        "copy its disk overlay (flushed by the migration, so it matches), `cont` the source; "
        "the state file is on /dev/shm (tmpfs), the naive baseline's best case. "
        "Then copy that disk for the copy (and fsync it, so the guest's first flush — "
        "the identity step fsyncs `/etc/machine-id` — does not have to write the fresh "
        "copy back), make a fresh namespace with forkvm's topology "
        "(`tap0` 172.16.0.1/30 with MAC 02:fc:00:00:00:01, forwarding on, a veth `uplink` "
        f"with its own /30 from `{inet.naive_net}`, default route, forkvm's own sandbox nft "
        "ruleset; the host side is masqueraded by a bench-owned nft table "
        f"`inet {inet.table}`), and start a plain `qemu-system-x86_64` with the source's "
        "command line (its own QMP, agent, console, disk and RAM file; `-incoming defer`) in "
        "it with `nsenter --net`. The bench connects to the agent socket, `migrate-incoming` "
        "loads the file, `cont`, the host clock is read (**the reference point, as the "
        "daemon's `resumed_unix_ms`**), and the bench at once sends the guest agent the "
        "daemon's identity message (`{\"type\": \"identity\", hostname, unix_time_ns, "
        "machine_id, instance_id}` + 64 random bytes) and then `set_clock`, as the daemon "
        "does for a child. The new hostname fires the loop, so both paths include the same "
        "identity step. Then the QEMU is killed (by its pid) and the namespace deleted.",
        "",
        "**Throughput.** A sandbox spawned with `\"ports\": [{\"guest\": 5201, \"host\": 0}]` "
        "runs `iperf3 -s` (started detached through exec). Each direction in the table is "
        "run in turn, then the next round. The guest's client is run with "
        "`POST /v1/sandboxes/{id}/exec`; the host's clients with the host's iperf3. The "
        "ceiling rows run the same iperf3 between the host and the internet namespace, with "
        "no VM on the path.",
        "",
        "**Cleanup.** Every sandbox and snapshot is deleted, the daemon stopped and its temp "
        "home removed; the internet namespace, its veth and servers, every baseline namespace "
        "and veth, and the bench's nft table are removed in `finally` blocks, also after a "
        "failure or Ctrl-C. Only processes this bench started are killed, by pid.",
    ])
