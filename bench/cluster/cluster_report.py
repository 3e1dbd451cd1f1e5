"""RESULTS.md and cluster.png of the cluster benchmark (bench_cluster.py).

Every result is a ratio against a baseline measured in the same run:
gateway / direct for a request, cross-node / same-node for a child,
three nodes / one node for a 64-way branch. ``summary`` and ``ratios`` are
pure (unit-tested in bench/common/test_cluster.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import report as rp  # noqa: E402

REQUEST_FIELDS = ["case", "i", "ms"]
TRANSFER_FIELDS = ["case", "round", "snapshot", "snapshot_ms", "pull_ms", "spawn_ms", "exec_ms",
                   "total_ms", "bytes", "links", "links_cached", "blobs"]
BRANCH_FIELDS = ["case", "run", "count", "ok", "total_ms", "call_ms", "first_ms", "snapshot_ms",
                 "spawn_ms", "other_cores", "nodes", "last_by_node", "copies", "copy_bytes", "copy_ms_max", "copy_links",
                 "copy_cached", "error"]

TRANSFER_CASES = ("same_node", "cross_warm", "cross_cold", "cross_first")
BRANCH_CASES = ("one_node", "three_nodes")


def summary(values) -> dict:
    """rp.summarize plus p99."""
    s = rp.summarize(values)
    xs = [float(v) for v in values if v is not None and v == v]
    s["p99"] = rp.percentile(xs, 99)
    return s


def ratios(rows, key: str, case: str, base: str, field: str = "total_ms") -> dict:
    """p50 and p90 of `field` for `case` divided by those of `base`
    (rows with ok == 0 left out)."""
    def vals(c):
        return [r[field] for r in rows if r.get("case") == c and r.get("ok", 1) and
                r.get(field) is not None]
    a, b = summary(vals(case)), summary(vals(base))
    return {f"{key}_p50": rp.ratio(a["p50"], b["p50"]),
            f"{key}_p90": rp.ratio(a["p90"], b["p90"]),
            f"{key}_p99": rp.ratio(a["p99"], b["p99"])}


def command_args(argv) -> list[str]:
    """The harness's arguments as run.sh was given them: without the
    `--binary PATH` run.sh adds."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--binary":
            skip = True
        elif not a.startswith("--binary="):
            out.append(a)
    return out


def mib(b) -> str:
    return "–" if b is None or b != b else f"{b / 2**20:,.1f} MiB"


def x(v) -> str:
    return "–" if v is None or v != v else f"{v:.2f}×"


def _case_vals(rows, case, field):
    return [r[field] for r in rows if r.get("case") == case and r.get("ok", 1) and
            r.get(field) not in (None, "")]


def write_plot(path, req, tr, br, args) -> None:
    plt = rp.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    if req:
        for case, color in (("direct", "tab:blue"), ("gateway", "tab:orange")):
            xs = sorted(_case_vals(req, case, "ms"))
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=case, color=color)
        ax.set_xscale("log")
        ax.legend()
    ax.set_xlabel("exec `true` latency, ms (log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("1. request through the gateway vs straight to the node", fontsize=9)
    ax = axes[1]
    if tr:
        labels, p50, p90, bytes_ = [], [], [], []
        for case in TRANSFER_CASES:
            s = summary(_case_vals(tr, case, "total_ms"))
            labels.append(case)
            p50.append(s["p50"] / 1000)
            p90.append(s["p90"] / 1000)
            bv = _case_vals(tr, case, "bytes")
            bytes_.append(rp.percentile(bv, 50) if bv else math.nan)
        xs = range(len(labels))
        ax.bar([i - 0.2 for i in xs], p50, 0.4, label="p50")
        ax.bar([i + 0.2 for i in xs], p90, 0.4, label="p90")
        for i, b in zip(xs, bytes_):
            ax.annotate(mib(b), (i, max(p90[i], p50[i])), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), labels)
        ax.set_yscale("log")
        ax.legend()
    ax.set_ylabel("pull + spawn + first exec, s (log)")
    ax.set_title("2. child on the source's node vs on another node\n"
                 "(label: bytes moved, p50)", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax = axes[2]
    if br:
        labels, p50, p90 = [], [], []
        for case in BRANCH_CASES:
            s = summary(_case_vals(br, case, "total_ms"))
            labels.append(case)
            p50.append(s["p50"] / 1000)
            p90.append(s["p90"] / 1000)
        xs = range(len(labels))
        ax.bar([i - 0.2 for i in xs], p50, 0.4, label="p50")
        ax.bar([i + 0.2 for i in xs], p90, 0.4, label="p90")
        ax.set_xticks(list(xs), labels)
        ax.legend()
    ax.set_ylabel("request until every child answered an exec, s")
    ax.set_title(f"3. {args.count}-way branch: one node vs three", fontsize=9)
    rp.save_figure(fig, path, title="forkvm cluster benchmark" + (" (SMOKE)" if args.smoke else ""))


def write_results(path, req, tr, br, *, args, info, machine, started, elapsed, busy, others,
                  left, per_node_max, capacity, argv, noise=None) -> str:
    L = ["# Cluster benchmark: the endpoint, cross-node children, a branch over nodes", ""]
    if args.smoke:
        L += rp.smoke_banner("few requests, two rounds, a small branch, one run per case",
                             "bash bench/cluster/run.sh")
    L += [rp.date_line(started, elapsed, minutes=True),
          rp.forkvm_line(info, rp.git_revision()),
          f"- Machine: {rp.machine_text(machine)}",
          f"- Kernel: {machine['kernel']}; load average at start: {rp.loadavg_text(machine)}; "
          f"other processes kept {busy:.2f} cores busy just before the start",
          rp.accel_line(info),
          f"- QEMU: {rp.qemu_text(info)}",
          f"- Command: `bash bench/cluster/run.sh {' '.join(command_args(argv))}`".rstrip(),
          "- Rig (no Ray; bench/cluster/cluster_rig.py): four `forkvm serve --node NAME` on "
          "127.0.0.1, each with its own home, `--listen` port, `--net-pool` and `--jail-uids`, "
          f"run with the cluster token: `n1`, `n2`, `n3` (`--max-sandboxes {max(per_node_max, 4)}`)"
          f" and `solo` (`--max-sandboxes {args.count + 2}`); gateway `gw3` "
          "(`forkvm cluster gateway`) over n1..n3 and `gw1` over solo alone. Every QEMU jailed "
          "(the default). Guests: image `default`, "
          f"{args.memory} MiB, 1 vCPU, network `nat` (the defaults).",
          "- Memory commitment per node (`GET /v1/info` capacity at the end): "
          + ", ".join(f"{k} {(v or {}).get('memory_commit_mib', '?')} MiB"
                      for k, v in capacity.items()),
          ]
    noise = noise or {}
    oc = summary(_case_vals(br, "three_nodes", "other_cores")
                 + _case_vals(br, "one_node", "other_cores"))
    parts = [f"{k} phase {v:.2f}" for k, v in noise.items()]
    if oc["n"]:
        parts.append(f"branch runs p50 {oc['p50']:.2f}, max {oc['max']:.2f}")
    if parts:
        L.append("- Host noise — average cores kept busy by processes other than the rig's "
                 f"(of {machine['cores']}): " + "; ".join(parts) + ".")
    L += rp.other_qemu_lines(others, 1 if others else 0, 1, "runs")
    L.append("- Leak check after the rig stopped: "
             + ("**left behind: " + ", ".join(left) + "**" if left else
                "no QEMU naming the rig's dir, no process of the rig, the dir is gone."))
    L.append("")

    L += ["## Ratios (each against its baseline in this run)", "",
          "| result | baseline | p50 | p90 | p99 |", "|---|---|---:|---:|---:|"]
    if req:
        r = ratios(req, "r", "gateway", "direct", "ms")
        L.append(f"| exec `true` through the gateway | straight to the node | **{x(r['r_p50'])}**"
                 f" | {x(r['r_p90'])} | {x(r['r_p99'])} |")
    if tr:
        for case, what in (("cross_first", "child on another node, the first copy out of the "
                                           "source node (it chunks its template)"),
                           ("cross_cold", "child on another node, template not there"),
                           ("cross_warm", "child on another node, template there")):
            r = ratios(tr, "r", case, "same_node")
            L.append(f"| {what} | child on the source's node | **{x(r['r_p50'])}** | "
                     f"{x(r['r_p90'])} | – |")
    if br:
        r = ratios(br, "r", "three_nodes", "one_node")
        L.append(f"| {args.count}-way branch over 3 nodes | {args.count} on one node | "
                 f"**{x(r['r_p50'])}** | {x(r['r_p90'])} | – |")
    L.append("")

    if req:
        L += ["## 1. The endpoint's cost per request", "",
              f"`exec true` in one sandbox on n1, {args.requests} times through gw3 and "
              f"{args.requests} times straight to n1 (TCP, cluster token), interleaved "
              "(gateway first on even requests, node first on odd ones), after "
              f"{args.warmup} untimed ones per path. A new TCP connection per request on both "
              "paths. Milliseconds.", "",
              "| path | n | min | p50 | p90 | p99 | max |", "|---|---:|---:|---:|---:|---:|---:|"]
        for case in ("direct", "gateway"):
            s = summary(_case_vals(req, case, "ms"))
            L.append(f"| {case} | {s['n']} | {rp.fmt(s['min'], 2)} | **{rp.fmt(s['p50'], 2)}** |"
                     f" {rp.fmt(s['p90'], 2)} | **{rp.fmt(s['p99'], 2)}** | "
                     f"{rp.fmt(s['max'], 2)} |")
        g = summary(_case_vals(req, "gateway", "ms"))
        d = summary(_case_vals(req, "direct", "ms"))
        L += ["", f"Added by the gateway: p50 {rp.fmt(g['p50'] - d['p50'], 2)} ms, "
              f"p99 {rp.fmt(g['p99'] - d['p99'], 2)} ms.", ""]

    if tr:
        L += ["## 2. A child on another node against one on the source's node", "",
              f"Source on n1; {args.rounds} round(s). Per round a snapshot P of the source; "
              "`same_node`: spawn from P on n1; `cross_cold`: n2, holding nothing of n1's, pulls "
              "P from n1's `/v2/forkvm/snapshots` (`POST /v1/snapshots/pull`, the pull the "
              "gateway's copy makes) and spawns from it; then a second snapshot P2 and "
              "`cross_warm`: n2 pulls P2 (only its new link is missing) and spawns. Each child "
              "then answers `exec true`. Total = pull + spawn + first exec (milliseconds); "
              "bytes moved = the pull's `bytes_fetched` (compressed chunks, plus manifests and "
              "configs). After each round n2 deletes everything it pulled, so every cold copy "
              "is cold (`links_cached` 0).", "",
              "| case | n | total p50 | total p90 | pull p50 | spawn p50 | first exec p50 | "
              "bytes moved p50 | links (cached) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for case in TRANSFER_CASES:
            s = summary(_case_vals(tr, case, "total_ms"))
            pl = summary(_case_vals(tr, case, "pull_ms"))
            sp = summary(_case_vals(tr, case, "spawn_ms"))
            ex = summary(_case_vals(tr, case, "exec_ms"))
            bv = _case_vals(tr, case, "bytes")
            links = sorted({(r.get("links"), r.get("links_cached")) for r in tr
                            if r.get("case") == case})
            L.append(f"| {case} | {s['n']} | **{rp.fmt(s['p50'])}** | {rp.fmt(s['p90'])} | "
                     f"{rp.fmt(pl['p50'])} | {rp.fmt(sp['p50'])} | {rp.fmt(ex['p50'])} | "
                     f"{mib(rp.percentile(bv, 50) if bv else math.nan)} | "
                     + ", ".join(f"{a} ({b})" for a, b in links) + " |")
        snap = summary([r["snapshot_ms"] for r in tr if r.get("case") != "same_node"])
        L += ["", f"Snapshot of the source on n1 (not in the totals): p50 "
              f"{rp.fmt(snap['p50'])} ms. Round 1's cold copy is `cross_first`: it also pays "
              "for n1 building the chunk lists of its boot template's files, the first time "
              "any puller asks for them (cached in n1's `cache/artifact/` afterwards; "
              "docs/registry.md); the later rounds' cold copies (`cross_cold`) do not.", "",
              "Per round (total ms, bytes moved):", "",
              "| round | " + " | ".join(TRANSFER_CASES) + " |",
              "|---:|" + "---:|" * len(TRANSFER_CASES)]
        for rnd in sorted({r["round"] for r in tr}):
            cells = []
            for case in TRANSFER_CASES:
                r = next((r for r in tr if r["round"] == rnd and r["case"] == case), None)
                cells.append("–" if r is None else
                             f"{rp.fmt(r['total_ms'])} ({mib(r.get('bytes'))})")
            L.append(f"| {rnd + 1} | " + " | ".join(cells) + " |")
        L.append("")

    if br:
        L += [f"## 3. A {args.count}-way branch over 3 nodes against {args.count} on one node", "",
              f"`POST /v1/sandboxes/{{id}}/branch {{\"mode\": \"diff\", \"count\": {args.count}}}` "
              f"through the gateway, then `exec true` in every child at once (one thread each, "
              f"through the gateway). `three_nodes`: source on n1 behind gw3; n1..n3 cap "
              f"`--max-sandboxes` at {max(per_node_max, 4)}, so the gateway puts what fits on n1 "
              "(one branch there, which takes the branch point) and copies the branch point to "
              "n2 and n3, which spawn the rest. `one_node`: source on solo behind gw1, all "
              f"children there. {args.runs} run(s) per case, interleaved (order alternating), "
              f"{args.rest:.0f} s apart, children deleted after each run. Milliseconds.", "",
              "| case | run | wall (request → last exec) | branch call | first child answered | "
              "children per node | last child answered, per node | copies | bytes copied | "
              "links copied (cached) |",
              "|---|---:|---:|---:|---:|---|---|---:|---:|---|"]
        for r in sorted(br, key=lambda r: (r["case"], r["run"])):
            if not r.get("ok"):
                L.append(f"| {r['case']} | {r['run'] + 1} | failed: {r.get('error', '')} "
                         "| | | | | | | |")
                continue
            L.append(f"| {r['case']} | {r['run'] + 1} | **{rp.fmt(r['total_ms'])}** | "
                     f"{rp.fmt(r['call_ms'])} | {rp.fmt(r['first_ms'])} | {r['nodes']} | "
                     f"{r.get('last_by_node', '')} | "
                     f"{r['copies']} | {mib(r['copy_bytes'])} | "
                     f"{r['copy_links']} ({r['copy_cached']}) |")
        L += ["", "| case | n | wall p50 | wall p90 | call p50 | other cores p50 |",
              "|---|---:|---:|---:|---:|---:|"]
        for case in BRANCH_CASES:
            s = summary(_case_vals(br, case, "total_ms"))
            c = summary(_case_vals(br, case, "call_ms"))
            o = summary(_case_vals(br, case, "other_cores"))
            L.append(f"| {case} | {s['n']} | **{rp.fmt(s['p50'])}** | {rp.fmt(s['p90'])} | "
                     f"{rp.fmt(c['p50'])} | {rp.fmt(o['p50'], 2)} |")
        L.append("")
    L += ["Raw figures: requests.csv, transfer.csv, branch.csv; plot: cluster.png.", ""]
    text = "\n".join(L)
    Path(path).write_text(text)
    return text
