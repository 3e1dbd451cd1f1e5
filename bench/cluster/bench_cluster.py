#!/usr/bin/env python3
"""forkvm cluster benchmark (issue 32): what the cluster endpoint and
cross-node placement cost, each as a ratio against its baseline measured in
the same run.

Run through bench/cluster/run.sh (which builds the release binary first).

The rig (cluster_rig.py, no Ray): four node daemons on 127.0.0.1 in one temp
dir, `n1`, `n2`, `n3` and `solo`, each `forkvm serve --node NAME` with its own
home, --listen port, --net-pool, --jail-uids and the cluster token; a gateway
`gw3` over n1..n3 and a gateway `gw1` over solo alone (a one-node cluster).
Every node first spawns, execs in and deletes one sandbox, so each has built
its boot template before anything is timed.

* overhead  -- one sandbox on n1; `exec true` N times through gw3 and N times
               straight to n1 over TCP with the cluster token, interleaved
               (gateway first on even i, node first on odd i) so drift hits
               both. One new connection per request on both paths.
* transfer  -- a source on n1. Per round: snapshot it (P), then
               - same_node: spawn from P on n1 and exec `true`;
               - cross_cold: n2, which has never held n1's template, pulls P
                 from n1's /v2/forkvm/snapshots (the pull the gateway's copy
                 makes: crates/forkvm-cluster/src/branch.rs), spawns from it
                 and execs `true`: template + P move;
               - a second snapshot P2 of the source, then cross_warm: n2
                 pulls P2 (its chain is there but for the new link), spawns,
                 execs.
               Round 1's cold copy is `cross_first`: the first time anyone
               pulls from n1, n1 also chunks its template's files (cached
               afterwards). Time to a running child = pull + spawn + first
               exec. Bytes
               moved: the pull's `bytes_fetched`. After each round the child
               sandboxes go, and n2 deletes every snapshot it pulled (newest
               first), so the next round's cold copy is cold again (the
               links_cached column proves it).
* branch    -- a source on n1 and one on solo. Per run, interleaved:
               `POST /v1/sandboxes/{id}/branch {"mode": "diff", "count": C}`
               through gw3 (n1..n3 each cap --max-sandboxes at ceil(C/3)+1,
               so the children spill over all three) and through gw1 (solo
               fits them all), then `true` exec'd in every child at once
               through the gateway. Wall: request until the last exec
               answered. The gateway log gives the copies it made.

Outputs: results/requests.csv, results/transfer.csv, results/branch.csv,
results/RESULTS.md and results/cluster.png.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402
from cluster_report import (  # noqa: E402
    BRANCH_FIELDS, REQUEST_FIELDS, TRANSFER_FIELDS, write_plot, write_results,
)
from cluster_rig import Rig, node_of, parse_copy_lines, per_node  # noqa: E402


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def timed(fn, *a, **kw):
    t = time.perf_counter()
    r = fn(*a, **kw)
    return r, fb.ms_since(t)


def exec_true(api, sid: str) -> float:
    r, ms = timed(api.exec, sid, ["true"])
    if not isinstance(r, dict) or r.get("exit_code") != 0:
        raise fb.BenchError(f"exec true in {sid} failed: {r}")
    return ms


def spawn(api, memory: int | None = None, **extra) -> dict:
    body = dict(extra)
    if memory:
        body["memory_mib"] = memory
    return api.request("POST", "/v1/sandboxes", body, expect=(201,))


# --------------------------------------------------------------------------
# The three measurements
# --------------------------------------------------------------------------


def overhead(rig: Rig, gw, n1, args) -> list[dict]:
    sb = spawn(n1.api, args.memory)
    sid = sb["id"]
    progress(f"overhead: sandbox {sid} on n1; {args.warmup} warm-up execs per path")
    for _ in range(args.warmup):
        exec_true(gw.api, sid)
        exec_true(n1.api, sid)
    rows = []
    for i in range(args.requests):
        order = [("gateway", gw.api), ("direct", n1.api)]
        if i % 2:
            order.reverse()
        for case, api in order:
            rows.append({"case": case, "i": i, "ms": exec_true(api, sid)})
        if (i + 1) % max(1, args.requests // 5) == 0:
            g = [r["ms"] for r in rows if r["case"] == "gateway"]
            d = [r["ms"] for r in rows if r["case"] == "direct"]
            progress(f"overhead: {i + 1}/{args.requests}: p50 gateway "
                     f"{rp.percentile(g, 50):.1f} ms, direct {rp.percentile(d, 50):.1f} ms")
    n1.api.delete(sid)
    return rows


def forget_pulled(node, ids_newest_first) -> None:
    """Delete what `node` pulled, newest first (a parent goes after its
    children)."""
    for sid in ids_newest_first:
        try:
            node.api.request("DELETE", f"/v1/snapshots/{sid}", expect=(200, 204))
        except fb.ApiError as e:
            if e.status != 404:
                raise


def forget_order(chains) -> list[str]:
    """The snapshots of several chains (each newest first, ending at its
    root), in an order that removes every child before its parent:
    farthest from the root first."""
    height: dict[str, int] = {}
    for c in chains:
        for up, sid in enumerate(reversed(c)):
            height[sid] = max(height.get(sid, 0), up)
    return sorted(height, key=lambda s: -height[s])


def chain_on(node, sid: str) -> list[str]:
    """The snapshot `sid` on `node` and its ancestors there, newest first."""
    out = []
    while sid:
        try:
            s = node.api.request("GET", f"/v1/snapshots/{sid}")
        except fb.ApiError as e:
            if e.status == 404:
                break
            raise
        out.append(s["id"])
        parent = s.get("parent")
        sid = parent.get("id") if isinstance(parent, dict) else parent
    return out


def child_on(node, snap: str, row: dict) -> None:
    sb, row["spawn_ms"] = timed(spawn, node.api, None, snapshot=snap)
    row["exec_ms"] = exec_true(node.api, sb["id"])
    node.api.delete(sb["id"])


def pull(dst, src, snap: str, row: dict) -> None:
    body = {"reference": f"127.0.0.1:{src.port}/forkvm/snapshots:{snap}",
            "username": "forkvm", "password": dst.api.token, "insecure": True}
    r, row["pull_ms"] = timed(dst.api.request, "POST", "/v1/snapshots/pull", body,
                              expect=(200, 201))
    row["bytes"] = r.get("bytes_fetched")
    row["links"] = r.get("links")
    row["links_cached"] = r.get("links_cached")
    row["blobs"] = r.get("blobs_fetched")


def transfer(rig: Rig, n1, n2, args) -> list[dict]:
    src = spawn(n1.api, args.memory)["id"]
    exec_true(n1.api, src)
    progress(f"transfer: source {src} on n1, {args.rounds} round(s)")
    rows = []
    for r in range(args.rounds):
        def snap() -> tuple[str, float]:
            s, ms = timed(n1.api.request, "POST", f"/v1/sandboxes/{src}/snapshot", {},
                          expect=(200, 201))
            return s["id"], ms

        p, snap_ms = snap()
        # The first copy out of n1 also makes n1 chunk its template's files
        # (cached afterwards): a case of its own.
        cold = {"case": "cross_first" if r == 0 else "cross_cold", "round": r, "snapshot": p, "snapshot_ms": snap_ms}
        pull(n2, n1, p, cold)
        child_on(n2, p, cold)
        same = {"case": "same_node", "round": r, "snapshot": p, "snapshot_ms": snap_ms,
                "pull_ms": 0.0, "bytes": 0, "links": 0, "links_cached": 0, "blobs": 0}
        child_on(n1, p, same)
        p2, snap2_ms = snap()
        warm = {"case": "cross_warm", "round": r, "snapshot": p2, "snapshot_ms": snap2_ms}
        pull(n2, n1, p2, warm)
        child_on(n2, p2, warm)
        for row in (cold, same, warm):
            row["total_ms"] = row["pull_ms"] + row["spawn_ms"] + row["exec_ms"]
            rows.append(row)
        progress(f"transfer round {r + 1}/{args.rounds}: same node {same['total_ms']:.0f} ms; "
                 f"cross cold {cold['total_ms']:.0f} ms ({cold['bytes'] / 2**20:.1f} MiB, "
                 f"{cold['links']} links, {cold['links_cached']} cached); cross warm "
                 f"{warm['total_ms']:.0f} ms ({warm['bytes'] / 2**20:.1f} MiB, "
                 f"{warm['links']} links, {warm['links_cached']} cached)")
        forget_pulled(n2, forget_order([chain_on(n2, p2), chain_on(n2, p)]))
    n1.api.delete(src)
    return rows


def branch_run(gw, src: str, count: int, case: str, run: int, timeout: float) -> dict:
    before = len(gw.log_text())
    meter = fb.CpuMeter()  # this process's descendants (nodes, gateways, QEMUs) are ours
    meter.start()
    t0 = time.perf_counter()
    res = gw.api.request("POST", f"/v1/sandboxes/{src}/branch",
                         {"mode": "diff", "count": count}, expect=(200, 201), timeout=timeout)
    call_ms = fb.ms_since(t0)
    ids = [c["id"] for c in res.get("children", [])]
    if len(ids) != count:
        raise fb.BenchError(f"branch of {src} gave {len(ids)} children, not {count}")
    answered = {}

    def answer(sid):
        exec_true(gw.api, sid)
        answered[sid] = fb.ms_since(t0)

    with cf.ThreadPoolExecutor(max_workers=len(ids)) as pool:
        for f in [pool.submit(answer, i) for i in ids]:
            f.result()
    last = {}
    for sid, ms in answered.items():
        last[node_of(sid)] = max(last.get(node_of(sid), 0.0), ms)
    other = meter.other_cores()
    copies = parse_copy_lines(gw.log_text()[before:])
    spread = per_node(ids)
    row = {"case": case, "run": run, "count": count, "ok": 1, "call_ms": call_ms,
           "other_cores": other,
           "total_ms": max(answered.values()), "first_ms": min(answered.values()),
           "last_by_node": " ".join(f"{k}:{v / 1000:.1f}s" for k, v in sorted(last.items())),
           "snapshot_ms": res.get("snapshot_ms"), "spawn_ms": res.get("spawn_ms"),
           "nodes": " ".join(f"{k}:{v}" for k, v in spread.items()),
           "copies": len(copies), "copy_bytes": sum(c["bytes"] for c in copies),
           "copy_ms_max": max((c["ms"] for c in copies), default=0),
           "copy_links": sum(c["links"] for c in copies),
           "copy_cached": sum(c["cached"] for c in copies)}
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(gw.api.delete, ids))
    return row


def branches(rig: Rig, gw3, gw1, n1, solo, args) -> list[dict]:
    a = spawn(n1.api, args.memory)["id"]
    b = spawn(solo.api, args.memory)["id"]
    exec_true(n1.api, a)
    exec_true(solo.api, b)
    progress(f"branch: sources {a} (n1, through gw3) and {b} (solo, through gw1); "
             f"{args.runs} run(s) of {args.count} children per case")
    time.sleep(args.rest)
    rows = []
    for run in range(args.runs):
        cases = [("three_nodes", gw3, a), ("one_node", gw1, b)]
        if run % 2:
            cases.reverse()
        for case, gw, src in cases:
            try:
                row = branch_run(gw, src, args.count, case, run, args.call_timeout)
            except fb.BenchError as e:
                progress(f"branch {case} run {run + 1} FAILED: {e}")
                row = {"case": case, "run": run, "count": args.count, "ok": 0,
                       "error": str(e)[:300]}
                for node in rig.nodes.values():  # leave nothing of a failed run
                    for s in node.api.list():
                        if s["id"] not in (a, b):
                            try:
                                node.api.delete(s["id"])
                            except fb.ApiError:
                                pass
            rows.append(row)
            if row["ok"]:
                progress(f"branch {case} run {run + 1}/{args.runs}: {row['total_ms']:.0f} ms "
                         f"(call {row['call_ms']:.0f} ms) on {row['nodes']}; "
                         f"{row['copies']} copies, {row['copy_bytes'] / 2**20:.1f} MiB")
            # Let the nodes report the removals to the gateways (placement
            # counts what they have not reported yet) and the CPUs cool.
            time.sleep(args.rest)
    n1.api.delete(a)
    solo.api.delete(b)
    return rows


# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000,
                    help="exec `true` per path (gateway, direct) for the overhead")
    ap.add_argument("--warmup", type=int, default=10, help="untimed execs per path first")
    ap.add_argument("--rounds", type=int, default=10,
                    help="transfer rounds (the first one's cold copy is `cross_first`)")
    ap.add_argument("--count", type=int, default=64, help="children per branch")
    ap.add_argument("--runs", type=int, default=5, help="branch runs per case")
    # 256: 64 children of 512 MiB would pass one node's default memory
    # commitment (host RAM less a tenth: 21,695 MiB on the 23.5 GiB host),
    # and the gateway places by that figure; 64 x 256 MiB fits.
    ap.add_argument("--memory", type=int, default=256, help="guest RAM of every source, MiB")
    ap.add_argument("--parts", default="overhead,transfer,branch",
                    help="which measurements (comma-separated)")
    ap.add_argument("--rest", type=float, default=5.0, metavar="SECONDS",
                    help="pause after each branch run")
    ap.add_argument("--call-timeout", type=float, default=1800.0, metavar="SECONDS")
    ap.add_argument("--home-parent", default="/tmp",
                    help="where the rig's temp dir (homes, gateway state) is made")
    ap.add_argument("--smoke", action="store_true",
                    help="a quick check: --requests 30 --rounds 2 --count 9 --runs 1")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    if args.smoke:
        args.requests, args.rounds, args.count, args.runs = 30, 2, 9, 1
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"overhead", "transfer", "branch"}
    if unknown:
        ap.error(f"unknown part(s) {sorted(unknown)}: use overhead, transfer, branch")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.monotonic()
    machine = rp.machine_info()
    busy = fb.wait_for_quiet_host(args.wait_quiet)
    others = fb.other_qemu_processes()
    per_node_max = math.ceil(args.count / 3) + 1
    req_rows, tr_rows, br_rows = [], [], []
    with Rig(args.binary, parent=args.home_parent) as rig:
        progress(f"rig: starting nodes n1, n2, n3 (--max-sandboxes {per_node_max}) and solo "
                 f"(--max-sandboxes {args.count + 2}) under {rig.dir}")
        n1, n2, n3 = (rig.add_node(f"n{k}", max(per_node_max, 4)) for k in (1, 2, 3))
        solo = rig.add_node("solo", args.count + 2)
        gw3 = rig.add_gateway("gw3", [n1, n2, n3])
        gw1 = rig.add_gateway("gw1", [solo])
        info = n1.api.info()
        progress("rig: every node builds its boot template (one sandbox each, at once)")
        t = time.perf_counter()
        with cf.ThreadPoolExecutor(max_workers=4) as pool:
            sbs = list(pool.map(lambda n: (n, spawn(n.api, args.memory)), rig.nodes.values()))
        for n, sb in sbs:
            exec_true(n.api, sb["id"])
            n.api.delete(sb["id"])
        progress(f"rig: ready in {fb.ms_since(t) / 1000:.1f} s")
        noise = {}
        meter = fb.CpuMeter()
        if "overhead" in parts:
            meter.start()
            req_rows = overhead(rig, gw3, n1, args)
            noise["overhead"] = meter.other_cores()
        if "transfer" in parts:
            meter.start()
            tr_rows = transfer(rig, n1, n2, args)
            noise["transfer"] = meter.other_cores()
        if "branch" in parts:
            br_rows = branches(rig, gw3, gw1, n1, solo, args)
        capacity = {n.name: n.api.info().get("capacity") for n in rig.nodes.values()}
        rig.stop()
        left = rig.leftovers()
    elapsed = time.monotonic() - t_start
    rp.write_csv(out / "requests.csv", req_rows, REQUEST_FIELDS)
    rp.write_csv(out / "transfer.csv", tr_rows, TRANSFER_FIELDS)
    rp.write_csv(out / "branch.csv", br_rows, BRANCH_FIELDS)
    write_plot(out / "cluster.png", req_rows, tr_rows, br_rows, args)
    text = write_results(out / "RESULTS.md", req_rows, tr_rows, br_rows, args=args,
                         info=info, machine=machine, started=started, elapsed=elapsed,
                         busy=busy, others=others, left=left, noise=noise, per_node_max=per_node_max,
                         capacity=capacity, argv=sys.argv[1:])
    print(text)
    if left:
        print("LEFT BEHIND: " + ", ".join(left), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    rp.run_main("bench_cluster", main, on_signal=None)
