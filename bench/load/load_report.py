"""The load benchmark's statistics per operation, its PNG plots (matplotlib)
and RESULTS.md.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path

import report as rp
from load_census import (
    OPS, OUTCOMES, OUTCOME_COLOR, OUTCOME_LABEL, SPAWN_FROM_SNAPSHOT, WEIGHTS, fmt,
)


def op_stats(rows, window_s: float) -> list[dict]:
    out = []
    load = [r for r in rows if r["phase"] == "load"]
    for op in OPS + ["all"]:
        rs = [r for r in load if op == "all" or r["op"] == op]
        if not rs and op != "all":
            continue
        ok = [r["latency_ms"] for r in rs if r["outcome"] == "ok"]
        c = collections.Counter(r["outcome"] for r in rs)
        out.append({
            "op": op, "n": len(rs), "rps": len(rs) / window_s if window_s > 0 else math.nan,
            "ok_rps": c["ok"] / window_s if window_s > 0 else math.nan,
            "ok": c["ok"], "conflict": c["conflict"], "limit": c["limit"],
            "failure": c["failure"],
            "p50": rp.percentile(ok, 50), "p90": rp.percentile(ok, 90),
            "p99": rp.percentile(ok, 99), "max": max(ok) if ok else math.nan,
        })
    return out


def write_plots(out: Path, rows, title: str, window_s: float) -> None:
    plt = rp.pyplot()
    from matplotlib.lines import Line2D

    load = [r for r in rows if r["phase"] == "load"]
    ops = [op for op in OPS if any(r["op"] == op for r in load)]

    # 1. Latency over time, one panel per op, plus throughput.
    ncols = 2
    nrows = 1 + math.ceil(len(ops) / ncols)
    fig = plt.figure(figsize=(14, 2.6 * nrows + 0.6))
    gs = fig.add_gridspec(nrows, ncols)
    ax = fig.add_subplot(gs[0, :])
    bin_s = 5.0 if window_s <= 120 else 10.0
    nb = max(1, math.ceil(window_s / bin_s))
    bottoms = [0.0] * nb
    for oc in OUTCOMES:
        counts = [0] * nb
        for r in load:
            if r["outcome"] == oc:
                b = min(nb - 1, max(0, int((r["t_start_s"]) // bin_s)))
                counts[b] += 1
        if not any(counts):
            continue
        rates = [c / bin_s for c in counts]
        ax.bar([i * bin_s for i in range(nb)], rates, width=bin_s, align="edge",
               bottom=bottoms, color=OUTCOME_COLOR[oc], label=OUTCOME_LABEL[oc],
               edgecolor="white", linewidth=0.3)
        bottoms = [b + x for b, x in zip(bottoms, rates)]
    ax.set_ylabel("requests/s")
    ax.set_xlim(0, nb * bin_s)
    ax.set_title(f"throughput ({bin_s:.0f} s bins, by request start), all ops", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    shared = None
    for i, op in enumerate(ops):
        ax = fig.add_subplot(gs[1 + i // ncols, i % ncols], sharex=shared)
        shared = shared or ax
        rs = [r for r in load if r["op"] == op]
        for oc in OUTCOMES:
            pts = [(r["t_start_s"], max(r["latency_ms"], 0.1)) for r in rs if r["outcome"] == oc]
            if pts:
                ax.scatter(*zip(*pts), s=10 if oc == "ok" else 22, alpha=0.6,
                           marker="o" if oc == "ok" else "x", color=OUTCOME_COLOR[oc])
        ok = [r["latency_ms"] for r in rs if r["outcome"] == "ok"]
        if ok:
            ax.axhline(rp.percentile(ok, 50), color="k", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_title(f"{op} (n={len(rs)}, p50 {fmt(rp.percentile(ok, 50))} ms)", fontsize=9)
        ax.set_ylabel("latency (ms)", fontsize=8)
        ax.grid(alpha=0.3, which="both", lw=0.4)
        ax.set_xlim(0, nb * bin_s)
        if i // ncols == nrows - 2:
            ax.set_xlabel("request start (s since the load began)", fontsize=8)
    fig.legend(handles=[Line2D([], [], marker="o" if oc == "ok" else "x", ls="",
                               color=OUTCOME_COLOR[oc], label=OUTCOME_LABEL[oc])
                        for oc in OUTCOMES]
               + [Line2D([], [], color="k", ls=":", label="p50 of 2xx")],
               loc="upper right", fontsize=8, ncol=5)
    rp.save_figure(fig, out / "latency_over_time.png", dpi=110,
                   title=title, rect=(0, 0, 1, 0.97), x=0.01, ha="left")

    # 2. Per-op latency box plot and outcome counts.
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    data = [[r["latency_ms"] for r in load if r["op"] == op and r["outcome"] == "ok"] or [math.nan]
            for op in ops]
    a1.boxplot(data, whis=(1, 99), showfliers=True, flierprops={"markersize": 2, "alpha": 0.4},
               medianprops={"color": "tab:red", "linewidth": 2})
    a1.set_xticks(range(1, len(ops) + 1), ops, rotation=30, ha="right", fontsize=8)
    a1.set_yscale("log")
    a1.set_ylabel("latency of 2xx answers (ms)")
    a1.set_title("latency per op (box: p25–p75, whiskers: p1–p99, red: p50)", fontsize=9)
    a1.grid(axis="y", alpha=0.3, which="both", lw=0.4)
    for i, d in enumerate(data, start=1):
        good = [x for x in d if x == x]
        if good:
            a1.annotate(f"p99 {rp.percentile(good, 99):,.0f}", (i, rp.percentile(good, 99)),
                        textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7)
    bottom = [0] * len(ops)
    for oc in OUTCOMES:
        counts = [sum(1 for r in load if r["op"] == op and r["outcome"] == oc) for op in ops]
        if not any(counts):
            continue
        a2.barh(ops, counts, left=bottom, color=OUTCOME_COLOR[oc], label=OUTCOME_LABEL[oc])
        bottom = [b + c for b, c in zip(bottom, counts)]
    a2.invert_yaxis()
    a2.tick_params(axis="y", labelsize=8)
    a2.set_xlabel("requests")
    a2.set_title("requests per op by outcome", fontsize=9)
    a2.legend(fontsize=8)
    a2.grid(axis="x", alpha=0.3)
    rp.save_figure(fig, out / "latency_by_op.png", dpi=110,
                   title=title, rect=(0, 0, 1, 0.95), x=0.01, ha="left")


def write_results(path: Path, ctx: dict, stats_rows, leak_rows, rows, failures) -> None:
    m, info, args = ctx["machine"], ctx["info"], ctx["args"]
    smoke = " — SMOKE (not a valid result)" if args.smoke else ""
    n_fail = sum(1 for r in rows if r["outcome"] == "failure")
    leaks = [r for r in leak_rows if r["leak"]]
    verdict = "PASS" if not n_fail and not leaks and not ctx.get("fatal") else "FAIL"
    L = [f"# forkvm API load test{smoke}", "",
         f"**{verdict}**: {n_fail} failed requests, {len(leaks)} leak(s)"
         + (f", {ctx['fatal']}" if ctx.get("fatal") else "") + ".", "",
         f"- command: `{ctx['command']}`",
         f"- date: {ctx['started']:%Y-%m-%d %H:%M %Z}; forkvm {info.get('version')} "
         f"(git {ctx['git']}); binary `{ctx['binary']}` ({ctx['binary_mtime']})",
         f"- machine: {rp.machine_text(m)}, kernel {m['kernel']}; load average at start "
         + rp.loadavg_text(m, ", "),
         f"- accelerator: **{info['accel']['kind']}** ({info['accel'].get('reason', '')})",
         f"- QEMU: {info['qemu'].get('version')}",
         f"- conditions: **{args.clients} clients** for **{args.duration:.0f} s** "
         f"(load window {ctx['window_s']:.1f} s, from the first request until the last load "
         f"request ended); guest RAM {args.memory} MiB, 1 vCPU; at most {args.client_sandboxes} "
         f"sandboxes and {args.client_snapshots} snapshots alive per client; seed {args.seed}; "
         "daemon: `" + " ".join(["forkvm serve --home <tmp>", *ctx["daemon_args"]]) + "`",
         f"- daemon limits: max_concurrent_requests "
         f"{info['limits'].get('max_concurrent_requests')}, max_sandboxes "
         f"{info['limits'].get('max_sandboxes')}",
         f"- other QEMU processes on the host at start (not ours; they compete for the CPUs): "
         f"{ctx['other_qemus_start']}; at the end: {ctx['other_qemus_end']}",
         f"- warm-up (not counted): first spawn from the image {fmt(ctx['warmup_spawn_ms'])} ms "
         f"(makes the boot template {ctx['template_id']}), exec {fmt(ctx['warmup_exec_ms'])} ms",
         ""]
    tot = stats_rows[-1]
    L += ["## Throughput and latency", "",
          f"{tot['n']:,} requests in {ctx['window_s']:.1f} s: **{tot['rps']:.2f} requests/s** "
          f"({tot['ok_rps']:.2f} 2xx/s); 2xx {tot['ok']:,}, 409 {tot['conflict']:,}, "
          f"429 {tot['limit']:,}, **failures {tot['failure']:,}**. "
          f"Peak alive: {ctx['peak_sandboxes']} sandboxes, {ctx['peak_snapshots']} snapshots "
          "(the clients' own, sampled every second).", "",
          "| op | requests | req/s | 2xx | 409 | 429 | failures | p50 ms | p90 ms | p99 ms | "
          "max ms |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in stats_rows:
        name = "**all**" if s["op"] == "all" else f"`{s['op']}`"
        L.append(f"| {name} | {s['n']:,} | {s['rps']:.3f} | {s['ok']:,} | {s['conflict']:,} | "
                 f"{s['limit']:,} | {s['failure']:,} | {fmt(s['p50'])} | {fmt(s['p90'])} | "
                 f"{fmt(s['p99'])} | {fmt(s['max'])} |")
    L += ["", "Latency percentiles are over the 2xx answers (client wall time: send until the "
          "whole response is read, on a kept-alive connection), linear interpolation between "
          "closest ranks. `spawn_image` is a clone of the boot template; `spawn_snapshot` a clone "
          "of one of the client's own snapshots; `branch_<mode>` snapshots the sandbox and "
          "spawns 0 or 1 child. Cleanup requests (after the load window) are in the CSV with "
          "`phase=cleanup` and not in this table: "
          f"{ctx['cleanup_n']} requests, {ctx['cleanup_fail']} failures.", ""]
    codes = collections.Counter((r["op"], r["status"], r["error_code"]) for r in rows
                                if r["outcome"] != "ok")
    if codes:
        L += ["Non-2xx answers and failures by op, status and code:", "",
              "| op | status | code | count |", "|---|---:|---|---:|"]
        for (op, st, code), n in sorted(codes.items(), key=lambda x: -x[1]):
            L.append(f"| `{op}` | {st} | `{code}` | {n} |")
        L.append("")
    L += ["![latency over time](latency_over_time.png)", "",
          "![latency per op](latency_by_op.png)", ""]
    L += ["## Leak check", "",
          f"After the clients' cleanup the bench waited up to {args.settle_timeout:.0f} s for the "
          f"daemon to settle (settled after {ctx['settle_s']:.1f} s"
          + ("" if ctx["settled"] else ", **did not settle**") + "). Baseline taken after the "
          "warm-up, with the boot template in place.", "",
          "| check | start | end | verdict | detail |", "|---|---:|---:|---|---|"]
    for r in leak_rows:
        detail = "; ".join(x for x in (r["detail"], r["note"]) if x)
        L.append(f"| {r['metric']} | {r['start']} | {r['end']} | "
                 f"{'**LEAK**' if r['leak'] else 'ok'} | {detail.replace('|', '/')} |")
    L += ["", f"For information: daemon threads {ctx['base']['threads']} → {ctx['end']['threads']}, "
          f"RSS {ctx['base']['rss_kib'] / 1024:.1f} → {ctx['end']['rss_kib'] / 1024:.1f} MiB; "
          f"/dev/shm run dir {'exists' if ctx['end']['run_dir_exists'] else 'absent'} at the end "
          f"({'exists' if ctx['base']['run_dir_exists'] else 'absent'} at the start).", ""]
    if failures:
        L += ["## Failures", "", f"{len(failures)} failed requests; the first "
              f"{min(len(failures), 20)} (all in `failures.json`; the daemon's log is "
              "`daemon.log`):", ""]
        for f in failures[:20]:
            L.append(f"- {f['wall_time']} client {f['client']} `{f['op']}` ({f['phase']}): "
                     f"`{f['method']} {f['path']}` → {f['status']} `{f['error_code']}` "
                     f"after {f['latency_ms']:,.0f} ms: {f['message'][:300]}")
        L.append("")
    L += ["## Method", "",
          "One private daemon (`forkvm serve --home <temp home>`, `guest` and `images` "
          "symlinked from the installed artefacts), run from a private copy of the binary. "
          f"Warm-up: one `POST /v1/sandboxes {{\"memory_mib\":{args.memory},\"cpus\":1}}` (it "
          "cold-boots once and makes the image's boot template), one exec, DELETE. Then the "
          "baseline census, then the load.", "",
          f"Each of the {args.clients} clients is a thread with its own HTTP/1.1 keep-alive "
          "connection on the unix socket; it loops until the duration is over, picking an "
          "operation by weight among those possible at that moment (weights: "
          + ", ".join(f"{k} {v}" for k, v in WEIGHTS.items())
          + f"; no spawn when it has {args.client_sandboxes} sandboxes, no branch when it has "
          f"{args.client_snapshots} snapshots, a branch asks for a child only when there is room):",
          "",
          f"- **spawn**: `POST /v1/sandboxes` with `{{\"memory_mib\":{args.memory},\"cpus\":1}}` "
          "(must come back running and a clone of the boot template), or, "
          f"{SPAWN_FROM_SNAPSHOT:.0%} of the time when the client has a snapshot, "
          "`{\"snapshot\":\"<own snapshot>\"}` (must be a clone of it);",
          "- **exec**: `POST …/exec` of `python3 -c` printing the SHA-256 of a unique token "
          f"(timeout {args.exec_timeout_ms} ms); exit code 0 and the exact digest are required;",
          "- **files**: `PUT …/files?path=/tmp/…&mode=644` of 16 B, 1 KiB, 16 KiB or 200 KiB of "
          "random bytes (the answer's `size` must match), then `GET …/files` (the bytes must "
          "be identical);",
          "- **branch**: `POST …/branch {\"mode\": live|diff|full, \"count\": 0|1}` on one of its "
          "sandboxes; the snapshot must be `ready`, the children running clones of it;",
          "- **rm_snapshot**: `DELETE /v1/snapshots/{id}` of one of its snapshots: 409 while "
          "sandboxes or snapshots depend on it (documented; kept and retried later);",
          "- **rm_sandbox**: `DELETE /v1/sandboxes/{id}` of one of its sandboxes.", "",
          "Clients work only on their own objects, so every 409 comes from removing a snapshot "
          "that still has dependents, and every 429 from the daemon's limits. At the end each "
          "client deletes its sandboxes, then its snapshots newest first (409s retried). Then "
          "`GET /v1/sandboxes` and `GET /v1/snapshots` must show only what the baseline had; "
          "anything else is an orphan (a leak; removed before the census). The census is "
          "repeated every second until it equals the baseline or the settle timeout passes:",
          "QEMU processes whose command line names the home or the run dir, plus the daemon's "
          "descendants (and zombies among them); `/proc/<daemon>/fd` (with the link targets, "
          "for the diff); `ip -o link show type tun` and `ip netns list` (host-wide, zero "
          "today; networking is coming); every file under the home except `daemon.log` and the "
          "state DB's `-wal`/`-shm` (the template's files stay, every sandbox's and snapshot's "
          "must go); every file under `/dev/shm/forkvm-<hash of home>`; the API's lists.", "",
          "Raw data: `requests.csv` (one row per request: client, phase, op, method, path, "
          "start in s since the load began, latency, status, outcome, error code, detail, "
          "message), `leaks.csv`, `failures.json`, `daemon.log`.", ""]
    path.write_text("\n".join(L) + "\n")
