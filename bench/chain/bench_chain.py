#!/usr/bin/env python3
"""forkvm disk-chain benchmark: the pause of a source's 1st to Nth branch.

Run through bench/chain/run.sh (which builds the release binary first).

Every snapshot or branch freezes the source's top disk layer. forkvm then
streams the frozen layers into the new top in the background
(`serve --disk-chain-max`, docs/disk-chain.md), so the chain, and with it
the pause, should not grow with the number of branches. This bench measures
that, in one run, against one source per case:

* stream     -- the default daemon (`--disk-chain-max 1`);
* no_stream  -- the same with `--disk-chain-max 0` (the behaviour before
                streaming: one more layer per branch);
* stream_growing -- as `stream`, but each round writes a *new* file, so the
                guest's page cache (its RAM in use) grows 1 MiB per round.
                This separates a second effect from the chain's: a live
                snapshot's pause also grows as the guest uses more RAM.
* naive      -- the baseline: the naive way to save a running VM (QEMU
                `stop`, full migration to a file, `cont`), timed as a pause
                on the `stream` source before its first and after its last
                branch. It is the same (jailed) QEMU, so the file is written
                into the source's own directory.

Each case cold-boots a source (512 MiB, no network), writes --data-mib MiB of
random data to its disk, and then runs N rounds of: overwrite one 1 MiB file
(a new file per round in `stream_growing`), branch with no children (live mode, the default), read the chain depth from
`GET /v1/sandboxes/{id}`, remove the branch point. The pause is the daemon's
(QEMU's STOP to RESUME event timestamps).

Outputs: results/chain.csv, results/RESULTS.md, results/chain.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))

import forkvm_bench as fb  # noqa: E402
import naive as nv  # noqa: E402
import report as rp  # noqa: E402

MIN_ROUNDS = 20
TARGET = 1.2  # the last branches' pause p50 within this factor of the first ones'
EDGE = 10  # "first" and "last" are this many rounds each
FIELDS = ["case", "round", "pause_ms", "layers_after", "branch_ms", "streaming_after"]


def sh(d: fb.Daemon, sid: str, script: str) -> str:
    r = d.api.exec(sid, ["sh", "-c", script])
    if r.get("exit_code") != 0:
        raise fb.BenchError(f"`{script}` failed in {sid}: {r}")
    return r.get("stdout", "")


def disk(d: fb.Daemon, sid: str) -> dict:
    v = d.api.request("GET", f"/v1/sandboxes/{sid}")
    if "disk" not in v:
        raise fb.BenchError(f"GET /v1/sandboxes/{sid} has no disk chain: is the daemon current?")
    return v["disk"]


CASES = (("stream", 1, False), ("no_stream", 0, False), ("stream_growing", 1, True))


def run_case(case: str, chain_max: int, grow: bool, args, ctx: dict) -> list[dict]:
    os.environ["FORKVM_DISK_CHAIN_MAX"] = str(chain_max)
    rows = []
    with fb.Daemon(binary=args.binary) as d:
        ctx.setdefault("info", d.api.info())
        sid = d.create_cold(memory_mib=args.memory, network="none")["id"]
        print(f"[{case}] source {sid}: writing {args.data_mib} MiB", flush=True)
        sh(d, sid, f"head -c {args.data_mib}M /dev/urandom > /root/data && sync")
        time.sleep(args.settle)
        if case == "stream":
            ctx["naive_first"] = naive(d, sid, args.naive_runs)
        for i in range(args.rounds):
            name = f"/root/round-{i}" if grow else "/root/round"
            sh(d, sid, f"(echo {i}; head -c 1M /dev/urandom) > {name} && sync")
            t0 = time.perf_counter()
            r = d.api.request("POST", f"/v1/sandboxes/{sid}/branch", {"count": 0})
            branch_ms = fb.ms_since(t0)
            dk = disk(d, sid)
            rows.append({"case": case, "round": i + 1, "pause_ms": r["pause_ms"],
                         "layers_after": dk["layers"], "branch_ms": branch_ms,
                         "streaming_after": dk["streaming"]})
            d.api.request("DELETE", f"/v1/snapshots/{r['snapshot']['id']}", expect=(204,))
            if (i + 1) % 10 == 0 or i + 1 == args.rounds:
                print(f"[{case}] {i + 1}/{args.rounds} branches: pause {r['pause_ms']:.1f} ms, "
                      f"{dk['layers']} layers", flush=True)
        if case == "stream":
            ctx["naive_last"] = naive(d, sid, args.naive_runs)
        # The data the source wrote before and between branches is intact
        # (read from the disk, not the guest's page cache).
        sh(d, sid, "echo 3 > /proc/sys/vm/drop_caches")
        if grow:
            last = args.rounds - 1
            got = sh(d, sid, f"ls /root | grep -c '^round-'; head -1 /root/round-{last}").split()
            want = [str(args.rounds), str(last)]
        else:
            got, want = sh(d, sid, "head -1 /root/round").strip(), str(args.rounds - 1)
        if got != want:
            raise fb.BenchError(f"[{case}] the source's round files read {got!r}, not {want!r}")
    return rows


def naive(d: fb.Daemon, sid: str, runs: int) -> list[float]:
    """The naive save's pause on the source itself (`runs` times): the same
    QEMU the branches pause, jailed as the daemon runs it. Its state file
    goes into the source's own directory, the one place a jailed QEMU can
    write (on the same filesystem as the daemon's store); naive_pause
    removes it after each run."""
    sbdir = d.sandbox_dir(sid)
    qmp, state = os.path.join(sbdir, "qmp.sock"), os.path.join(sbdir, "naive-state.bin")
    return [nv.naive_pause(qmp, state)["pause_ms"] for _ in range(runs)]


def plot(rows, ctx, path: Path) -> None:
    plt = rp.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for case, colour in (("stream", "tab:blue"), ("no_stream", "tab:red"),
                         ("stream_growing", "tab:green")):
        rs = [r for r in rows if r["case"] == case]
        ax.plot([r["round"] for r in rs], [r["pause_ms"] for r in rs], ".-", color=colour,
                label=f"forkvm, {case}", linewidth=0.8)
    nv = ctx["naive_first"] + ctx["naive_last"]
    ax.axhline(rp.summarize(nv)["p50"], color="grey", linestyle="--",
               label="naive QEMU save (p50)")
    ax.set_xlabel("branch of the same source")
    ax.set_ylabel("source pause (ms)")
    ax.set_yscale("log")
    ax.set_title("Pause of each branch of one source")
    ax.legend()
    rp.save_figure(fig, path)


def write_results(path: Path, rows, ctx, args) -> list[str]:
    info, machine = ctx["info"], ctx["machine"]
    L = []
    if args.rounds < MIN_ROUNDS:
        L += rp.smoke_banner(f"{args.rounds} rounds < {MIN_ROUNDS}", "bash bench/chain/run.sh")
    L += [
        "# Disk-chain benchmark: the pause of a source's 1st to Nth branch",
        "",
        *rp.header_lines(info, machine, ctx["started"], ctx["elapsed"], rp.git_revision()),
        f"- Source: {args.memory} MiB, 1 vCPU, `network: none`, {args.data_mib} MiB of random "
        f"data written to its disk; each round overwrites one 1 MiB file (writes a new one in "
        f"`stream_growing`), then branches with no children (live mode) and removes the branch point. {args.rounds} rounds per case.",
        "",
        "| case | pause p50, first 10 (ms) | p90 | pause p50, last 10 (ms) | p90 | last/first | "
        "max layers after a branch | layers at the end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdict = []
    for case, _, _ in CASES:
        rs = [r for r in rows if r["case"] == case]
        first = rp.summarize(r["pause_ms"] for r in rs[:EDGE])
        last = rp.summarize(r["pause_ms"] for r in rs[-EDGE:])
        ratio = last["p50"] / first["p50"]
        L.append(f"| {case} | {first['p50']:.1f} | {first['p90']:.1f} | {last['p50']:.1f} | "
                 f"{last['p90']:.1f} | **{ratio:.2f}×** | {max(r['layers_after'] for r in rs)} | "
                 f"{rs[-1]['layers_after']} |")
        if case == "stream":
            verdict.append((ratio, first["p50"]))
    nf, nl = rp.summarize(ctx["naive_first"]), rp.summarize(ctx["naive_last"])
    ratio, first_p50 = verdict[0]
    L += [
        "",
        "In `stream_growing` the guest's page cache grows 1 MiB per round; its chain "
        "stays at one layer like `stream`'s, so the growth of its pause beyond `stream`'s "
        "follows the guest's growing RAM use, not the disk chain. (Measured here, not "
        "explained in detail: with the same workload minus the growth, the pause stays flat.)",
        "",
        "Baseline, naive QEMU save (stop, full migration to a file in the source's own "
        "directory, cont) of the `stream` source, the QEMU its branches pause: "
        f"p50 {nf['p50']:.0f} ms / p90 {nf['p90']:.0f} ms before its first branch, "
        f"p50 {nl['p50']:.0f} ms / p90 {nl['p90']:.0f} ms after its last "
        f"({args.naive_runs} runs each). forkvm's first-branch pause is "
        f"**{nf['p50'] / first_p50:.1f}×** shorter.",
        "",
        f"**Target:** the last {EDGE} branches' pause p50 within {TARGET}× of the first "
        f"{EDGE}'s with streaming: **{'met' if ratio <= TARGET else 'NOT met'}** "
        f"({ratio:.2f}×).",
        "",
        "Raw rows: `chain.csv`; plot: `chain.png`.",
    ]
    path.write_text("\n".join(L) + "\n")
    return L


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=100, help="branches per case")
    ap.add_argument("--data-mib", type=int, default=64, help="random data written first")
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    ap.add_argument("--naive-runs", type=int, default=10, help="baseline saves, before and after")
    ap.add_argument("--settle", type=float, default=2.0, metavar="SECONDS")
    ap.add_argument("--out", default=str(HERE / "results"), help="results directory")
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "forkvm"))
    args = ap.parse_args()
    if args.rounds < 2 * EDGE:
        ap.error(f"--rounds must be at least {2 * EDGE}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"started": dt.datetime.now().astimezone(), "machine": rp.machine_info()}
    t0 = time.monotonic()
    rows = [r for c in CASES for r in run_case(*c, args, ctx)]
    ctx["elapsed"] = time.monotonic() - t0
    rp.write_csv(out / "chain.csv", rows, FIELDS)
    plot(rows, ctx, out / "chain.png")
    lines = write_results(out / "RESULTS.md", rows, ctx, args)
    print("\n".join(lines))
    print(f"\nwrote {out / 'chain.csv'}, {out / 'RESULTS.md'}, {out / 'chain.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_chain", main, on_signal=None)
