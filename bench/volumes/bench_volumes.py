#!/usr/bin/env python3
"""forkvm volumes benchmark: file I/O on a volume against the host and the guest's root disk.

Run through bench/volumes/run.sh (which builds the release binary first).

One workload script (fsbench.py, next to this file) runs, in one bench run,
against three targets:

* host         -- the baseline: a host process (the host's python3) in a
                  host directory (--host-dir, default a temp dir in /var/tmp);
* guest_root   -- inside a guest, on its root disk (--guest-root-dir,
                  default /root/volbench), run with exec (the script is the
                  exec's stdin: `python3 - ARGS`);
* guest_volume -- inside the same guest, on a volume mounted at
                  --guest-mount (default /mnt/volbench) from a directory
                  next to the host target's, on the same host file system
                  (`forkvm spawn --volume HOST:GUEST[:OPTS]`).

The guest is one sandbox (cold-booted, --memory MiB, --cpus vCPUs,
`--network none`), spawned with the CLI against the bench's private daemon
so that the volume goes through the documented `--volume` flag. A forkvm
without volumes gives the first two targets and says so.

fsbench.py's docstring says what each workload does and what is cached.
The targets run one after the other, --rounds times (interleaved: host,
root, volume, host, ...); each run does --repeats parallel repeats and
--iters iterations per single operation.

Outputs (in --out): volumes.csv (one row per sample), RESULTS.md (p50/p90,
ratios volume/host, volume/root, root/host, the issue's targets met or
missed), volumes.png.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))

import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402

FSBENCH = HERE / "fsbench.py"
TARGETS = ("host", "guest_root", "guest_volume")
TARGET_LABEL = {"host": "host directory", "guest_root": "guest root disk",
                "guest_volume": "guest volume"}
PARALLEL = ("parallel_read", "parallel_write")
OPS = ("getattr", "lookup", "read_4k", "write_4k", "open_close", "readdir", "create_unlink")
FLOOR = "timer_floor"  # the timing loop around an empty op
WORKLOADS = PARALLEL + OPS + (FLOOR,)
FIELDS = ["target", "round", "workload", "sample", "value_us"]
MIN_REPEATS = 5   # parallel repeats per target for a valid result
MIN_ITERS = 200   # iterations per single op for a valid result
NOISY_CORES = 0.25

# The targets (volume / host, p50 of the parallel wall time).
GOALS = {"parallel_read": 5.0, "parallel_write": 1.5}

# fcvm's published figures (seeds/004, "fcvm Performance Guide": AWS
# c7g.metal, 64 Graviton3 cores, btrfs on NVMe, Firecracker/KVM, FUSE over
# vsock; 256 workers over 1,024 files of 4 KB). Times as published; ratios
# are FUSE / host.
FCVM = {
    "parallel_read": {"host_ms": 7.9, "best_ms": 61.0, "best_ratio": 7.7,
                      "best_at": "16 FUSE readers", "default_ratio": 8.2,
                      "default_at": "64 readers (the default)"},
    "parallel_write": {"host_ms": 161.0, "best_ms": 162.0, "best_ratio": 1.01,
                       "best_at": "256 FUSE readers", "default_ratio": 1.02,
                       "default_at": "64 readers (the default)"},
    "ops": {"getattr": 1.05, "lookup": 1.06, "read_4k": 0.93, "write_4k": 119.0,
            "open_close": 68.0, "readdir": 46.0, "create_unlink": 25.0},
}


# --------------------------------------------------------------------------
# Pure parts: samples -> rows -> statistics -> verdicts -> report
# --------------------------------------------------------------------------


def rows_from_result(target: str, rnd: int, res: dict) -> list[dict]:
    """fsbench.py's JSON (ns) as CSV rows (µs): one per sample."""
    rows = []
    for kind, name in (("read", "parallel_read"), ("write", "parallel_write")):
        for i, ns in enumerate(res.get("parallel", {}).get(kind, [])):
            rows.append({"target": target, "round": rnd, "workload": name, "sample": i,
                         "value_us": ns / 1e3})
    for op, xs in res.get("ops", {}).items():
        for i, ns in enumerate(xs):
            rows.append({"target": target, "round": rnd, "workload": op, "sample": i,
                         "value_us": ns / 1e3})
    for i, ns in enumerate(res.get("floor_ns", [])):
        rows.append({"target": target, "round": rnd, "workload": FLOOR, "sample": i,
                     "value_us": ns / 1e3})
    return rows


def aggregate(rows) -> dict:
    """{workload: {target: summary (µs)}} for every pair with samples."""
    out: dict = {}
    for w in WORKLOADS:
        for t in TARGETS:
            s = rp.summarize(r["value_us"] for r in rows
                             if r["workload"] == w and r["target"] == t)
            if s["n"]:
                out.setdefault(w, {})[t] = s
    return out


def ratios(stats: dict, workload: str, p: str = "p50") -> dict:
    """volume/host, volume/root and root/host of one workload's `p`
    (NaN where a target is missing)."""
    st = stats.get(workload, {})

    def v(t):
        return st.get(t, {}).get(p, math.nan)

    return {"vol_host": rp.ratio(v("guest_volume"), v("host")),
            "vol_root": rp.ratio(v("guest_volume"), v("guest_root")),
            "root_host": rp.ratio(v("guest_root"), v("host"))}


def throughput(files: int, wall_us: float) -> float:
    """Files per second of one parallel run."""
    return rp.ratio(files, wall_us / 1e6)


def verdicts(stats: dict) -> list[dict]:
    """The issue's targets, each {workload, goal, ratio, root_host,
    vol_root, status: met | missed | not measured, reason}. The reason
    splits volume/host into root/host (the guest on its own disk: the
    emulated CPU and the guest kernel, no volume involved) times
    volume/root (what the volume path adds)."""
    out = []
    for w, goal in GOALS.items():
        r = ratios(stats, w)
        vh, vr, rh = r["vol_host"], r["vol_root"], r["root_host"]
        if vh != vh:
            status, reason = "not measured", "no guest-volume samples (the Guest line above says why)"
        else:
            status = "met" if vh <= goal else "missed"
            parts = [f"volume/host {vh:.2f}× = root/host {rh:.2f}× (the guest on its own "
                     f"disk, no volume) × volume/root {vr:.2f}× (what the volume adds)"]
            if status == "missed":
                if vr == vr and vr <= goal:
                    parts.append(f"the volume path alone is within {goal}× of the guest's own "
                                 "disk; the miss comes from running the workload in the "
                                 "guest at all")
                elif rh == rh and rh <= goal:
                    parts.append("the guest's own disk is within the target; the volume "
                                 "path is what misses it")
                else:
                    parts.append("both the guest itself and the volume path are beyond "
                                 "the target")
            reason = "; ".join(parts)
        out.append({"workload": w, "goal": goal, "ratio": vh, "root_host": rh,
                    "vol_root": vr, "status": status, "reason": reason})
    return out


def round_trip(stats: dict) -> dict | None:
    """p50 (µs) of `lookup` (a fresh name: never cached, one request) on
    each target, or None without a volume figure."""
    st = stats.get("lookup", {})
    if "guest_volume" not in st:
        return None
    return {"volume": st["guest_volume"]["p50"],
            "root": st.get("guest_root", {}).get("p50", math.nan),
            "host": st.get("host", {}).get("p50", math.nan)}


def fcvm_comparison(stats: dict) -> dict:
    """For parallel reads: whether our volume/host p50 is ahead of
    (below) fcvm's best published ratio (NaN-safe: None when unmeasured)."""
    vh = ratios(stats, "parallel_read")["vol_host"]
    if vh != vh:
        return {"ratio": vh, "ahead": None}
    return {"ratio": vh, "ahead": vh < FCVM["parallel_read"]["best_ratio"]}


def result_lines(stats: dict, ctx: dict, args) -> list[str]:
    """RESULTS.md as lines. ctx: started, elapsed, info, machine, revision,
    volume (None or the reason it is missing), guest (python, fs per
    target), noise ({target: [cores]}), others (other QEMU pids)."""
    info, machine = ctx["info"], ctx["machine"]
    L = []
    smoke = []
    if args.repeats * args.rounds < MIN_REPEATS:
        smoke.append(f"{args.repeats * args.rounds} parallel repeats < {MIN_REPEATS}")
    if 0 < args.iters < MIN_ITERS:
        smoke.append(f"{args.iters} iterations per op < {MIN_ITERS}")
    if smoke:
        L += rp.smoke_banner(", ".join(smoke), "bash bench/volumes/run.sh")
    L += [
        "# Volumes benchmark: file I/O on a volume, the guest's root disk and the host",
        "",
        *rp.header_lines(info, machine, ctx["started"], ctx["elapsed"], ctx.get("revision", "?"),
                         ctx.get("build_note", "")),
        f"- Guest: {args.memory} MiB, {args.cpus} vCPU(s), `network: none`, cold boot of the "
        f"default image; Python {ctx['guest'].get('python', '?')} in the guest, "
        f"{ctx['guest'].get('host_python', '?')} on the host",
    ]
    fs = ctx["guest"].get("fs", {})
    for t in TARGETS:
        if t in fs:
            L.append(f"  - {TARGET_LABEL[t]}: `{fs[t]['dir']}` ({fs[t]['fs']})")
    if ctx.get("volume"):
        L.append(f"  - **guest volume not measured:** {ctx['volume']}")
    elif ctx.get("volume_spec"):
        L.append(f"  - volume: `--volume {ctx['volume_spec']}`")
    L += [
        f"- Workload: {args.workers} threads over {args.files:,} files × {args.size:,} B "
        f"(parallel, {args.repeats} repeat(s) per round); {args.iters:,} iterations per single "
        f"op ({max(1, args.iters // 10):,} for readdir), after 10 untimed ones; "
        f"{args.rounds} round(s), targets interleaved in each.",
    ]
    fl = stats.get(FLOOR, {})
    if fl:
        L.append("- Timing floor (the same timed loop around an empty op, p50): "
                 + ", ".join(f"{TARGET_LABEL[t]} {rp.fmt(fl[t]['p50'], 2)} µs"
                             for t in TARGETS if t in fl)
                 + "; the guest's is what the emulated CPU adds to every timed iteration.")
    noise = ctx.get("noise", {})
    if noise:
        worst = max((c for cs in noise.values() for c in cs), default=0.0)
        flag = " **(busy: timings inflated)**" if worst > NOISY_CORES else ""
        L.append(f"- Other processes on the host used up to {worst:.2f} cores during a "
                 f"measured run{flag}.")
    L += rp.other_qemu_lines(ctx.get("others", {}), ctx.get("others_busy", 0),
                             ctx.get("runs", 0), "target runs")
    L += ["", "## The issue's targets", "",
          "| workload | target (volume/host p50) | volume/host | root/host | volume/root | "
          "result |", "|---|---:|---:|---:|---:|---|"]
    vs = verdicts(stats)
    for v in vs:
        L.append(f"| {v['workload']} | ≤ {v['goal']}× | **{rp.fmt(v['ratio'], 2)}×** | "
                 f"{rp.fmt(v['root_host'], 2)}× | {rp.fmt(v['vol_root'], 2)}× | "
                 f"**{v['status']}** |")
    L.append("")
    for v in vs:
        L.append(f"- {v['workload']}: **{v['status']}**: {v['reason']}.")
    rt = round_trip(stats)
    if rt:
        L.append(f"- One uncached request through the volume (a lookup of a fresh name: one "
                 f"FUSE LOOKUP, guest → relay → port → daemon → host directory and back) takes "
                 f"p50 **{rp.fmt(rt['volume'] / 1e3, 2)} ms**, against "
                 f"{rp.fmt(rt['root'], 0)} µs for the same lookup on the guest's root disk and "
                 f"{rp.fmt(rt['host'], 1)} µs on the host. The parallel workloads overlap such "
                 f"requests ({args.workers} guest threads, the daemon's worker pool), which is why their "
                 "volume/root ratio is far lower than the single ops'.")
    fc = fcvm_comparison(stats)
    best = FCVM["parallel_read"]
    if fc["ahead"] is None:
        L.append(f"- Against fcvm's best parallel-read ratio ({best['best_ratio']}× at "
                 f"{best['best_at']}): not measured.")
    else:
        L.append(f"- Against fcvm's best parallel-read ratio ({best['best_ratio']}× at "
                 f"{best['best_at']}): **{'ahead' if fc['ahead'] else 'behind'}** "
                 f"({fc['ratio']:.2f}×).")
    L += ["", "## Parallel I/O (wall time of one run)", "",
          "| workload | target | n | p50 (ms) | p90 (ms) | files/s at p50 | ÷ host p50 | "
          "÷ root p50 |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for w in PARALLEL:
        for t in TARGETS:
            s = stats.get(w, {}).get(t)
            if not s:
                continue
            hs = stats[w].get("host", {}).get("p50", math.nan)
            rs = stats[w].get("guest_root", {}).get("p50", math.nan)
            L.append(f"| {w} | {TARGET_LABEL[t]} | {s['n']} | {rp.fmt(s['p50'] / 1e3, 1)} | "
                     f"{rp.fmt(s['p90'] / 1e3, 1)} | {rp.fmt(throughput(args.files, s['p50']))} "
                     f"| {rp.fmt(rp.ratio(s['p50'], hs), 2)}× | "
                     f"{rp.fmt(rp.ratio(s['p50'], rs), 2)}× |")
    L += ["", "## Single-operation latency (µs)", "",
          "| op | host p50 | p90 | root p50 | p90 | volume p50 | p90 | volume/host | "
          "volume/root | fcvm FUSE/host |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w in OPS:
        st = stats.get(w)
        if not st:
            continue
        cells = []
        for t in TARGETS:
            s = st.get(t, {})
            cells += [rp.fmt(s.get("p50"), 1), rp.fmt(s.get("p90"), 1)]
        r = ratios(stats, w)
        L.append(f"| {w} | " + " | ".join(cells) + f" | **{rp.fmt(r['vol_host'], 2)}×** | "
                 f"{rp.fmt(r['vol_root'], 2)}× | {FCVM['ops'][w]}× |")
    L += ["", "## What is cached", "",
          "On a volume (docs/volumes.md, crates/forkvm-volume): attributes and directory "
          "entries are cached by the guest's FUSE client for 1 s, a file's pages stay in the "
          "guest's page cache while its mtime does not change, and there is no writeback "
          "cache: every write(2) is a round trip to the daemon.",
          "",
          f"- Parallel reads: the {args.files:,} files are written just before the first repeat and read "
          "whole in every repeat, so all targets read through warm caches (the host's page "
          "cache; in the guest its own page cache, kept on a volume as the files do not "
          "change between repeats, but each open is still a round trip). Nothing is dropped between repeats: dropping the host's "
          "caches would touch every other user of this host.",
          "- Parallel writes: new files in a fresh directory per repeat, each fsync'd, so every "
          "write reaches the host file system (for the root disk: QEMU's disk file) before "
          "its close.",
          "- getattr, read_4k, write_4k (no fsync), open_close: the same file every iteration, "
          "so attributes and data may be served from caches after the first iteration (on a "
          "volume: getattr from the 1 s attribute cache, with one round trip per second; "
          "read_4k from the page cache; write_4k and open_close a round trip each).",
          "- lookup: a fresh name that does not exist, each iteration: no positive or "
          "negative dentry can be cached, so every iteration is a real lookup (on a volume, a "
          "round trip to the daemon unless the FUSE client answers misses itself).",
          f"- readdir: the full {args.files:,}-entry directory each time (dentries cached, the listing "
          "itself is read each time); create_unlink: a fresh name each time.",
          "", "## fcvm's published figures (for scale, not comparable in absolute time)", "",
          "From seeds/004 (fcvm's performance guide: AWS c7g.metal, 64 Graviton3 cores, btrfs on "
          "NVMe, Firecracker with KVM, FUSE over vsock; 256 workers, 1,024 files of 4 KB):",
          "",
          f"- parallel reads: host {best['host_ms']} ms; best {best['best_ms']} ms at "
          f"{best['best_at']} = {best['best_ratio']}× host; {best['default_ratio']}× at "
          f"{best['default_at']}.",
          f"- parallel writes with fsync: host {FCVM['parallel_write']['host_ms']:.0f} ms; "
          f"{FCVM['parallel_write']['default_ratio']}× at "
          f"{FCVM['parallel_write']['default_at']}, {FCVM['parallel_write']['best_ratio']}× "
          f"at {FCVM['parallel_write']['best_at']}.",
          "- single ops: the FUSE/host ratios in the last column of the latency table.",
          "",
          "Their guest runs under KVM; here every guest instruction is emulated (TCG) unless "
          "the accelerator line says otherwise, so root/host shows what the guest costs "
          "before any volume is involved, and volume/root what the volume adds.",
          "", "Raw samples: `volumes.csv` (µs); plot: `volumes.png`."]
    return L


# --------------------------------------------------------------------------
# Running the workload
# --------------------------------------------------------------------------


def fsbench_args(args, workdir: str) -> list[str]:
    return ["--dir", workdir, "--workers", str(args.workers), "--files", str(args.files),
            "--size", str(args.size), "--repeats", str(args.repeats), "--iters", str(args.iters)]


def run_host(args, workdir: str) -> dict:
    os.makedirs(workdir, exist_ok=True)
    p = subprocess.run([args.host_python, str(FSBENCH), *fsbench_args(args, workdir)],
                       stdout=subprocess.PIPE, stderr=None, text=True)
    if p.returncode != 0:
        raise fb.BenchError(f"fsbench.py on the host exited with {p.returncode}")
    return json.loads(p.stdout)


def exec_stream(d: fb.Daemon, sid: str, argv: list[str], stdin: str,
                timeout_s: float) -> tuple[int | None, str]:
    """POST exec with `stream: true`: print the guest's stderr as it comes,
    return (exit code, stdout)."""
    body = json.dumps({"argv": argv, "stdin": stdin, "stream": True,
                       "timeout_ms": int(timeout_s * 1000)}).encode()
    conn = fb.UnixHTTPConnection(d.socket_path, timeout=timeout_s + 60)
    out = bytearray()
    err_buf = b""
    code = None
    try:
        conn.request("POST", f"/v1/sandboxes/{sid}/exec", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raw = resp.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            raise fb.ApiError("POST", f"/v1/sandboxes/{sid}/exec", resp.status, parsed)
        while True:
            line = resp.readline()
            if not line:
                break
            ev = json.loads(line)
            kind = ev.get("type")
            if kind == "stdout":
                out += base64.b64decode(ev["data"])
            elif kind == "stderr":
                err_buf += base64.b64decode(ev["data"])
                *done, err_buf = err_buf.split(b"\n")
                for ln in done:
                    print(ln.decode(errors="replace"), flush=True)
            elif kind == "exit":
                if ev.get("timed_out"):
                    raise fb.BenchError(f"{argv[:2]} in {sid} ran past {timeout_s:.0f} s")
                code = ev.get("exit_code")
                break
            elif kind == "error":
                raise fb.BenchError(f"exec in {sid} failed: {ev.get('error')}")
    finally:
        conn.close()
    if err_buf:
        print(err_buf.decode(errors="replace"), flush=True)
    return code, out.decode(errors="replace")


def run_guest(d: fb.Daemon, sid: str, args, workdir: str) -> dict:
    code, out = exec_stream(d, sid, ["python3", "-", *fsbench_args(args, workdir)],
                            FSBENCH.read_text(), args.exec_timeout)
    if code != 0:
        raise fb.BenchError(f"fsbench.py in the guest ({workdir}) exited with {code}; "
                            f"stdout: {out[-500:]}")
    return json.loads(out)


def volume_support(binary: str) -> str | None:
    """None when `forkvm spawn` has --volume, else why not."""
    p = subprocess.run([binary, "spawn", "--help"], capture_output=True, text=True)
    if "--volume" not in p.stdout:
        return (f"`{binary} spawn` has no `--volume` flag (this forkvm predates volumes); "
                "only the host and the guest's root disk were measured")
    return None


def spawn_guest(d: fb.Daemon, args, volume_spec: str | None) -> dict:
    """Cold-boot the guest with the CLI (so a volume goes through the
    documented `--volume` flag) against the bench's private daemon."""
    argv = [d.binary, "spawn", "--json", "--no-template", "--network", "none",
            "--memory", str(args.memory), "--cpus", str(args.cpus)]
    if volume_spec:
        argv += ["--volume", volume_spec]
    if d.proc is None or d.proc.poll() is not None:
        raise fb.BenchError("the bench's daemon is not running")
    env = dict(os.environ, FORKVM_HOME=d.home)
    env.pop("FORKVM_URL", None)
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise fb.BenchError(f"{' '.join(argv[1:])} failed ({p.returncode}): "
                            f"{p.stderr.strip()}\n{d.log_tail()}")
    sb = json.loads(p.stdout)
    d.sandboxes.add(sb["id"])
    print(f"guest {sb['id']} up in {fb.ms_since(t0) / 1e3:.1f} s", flush=True)
    return sb


def plot(stats: dict, path: Path) -> None:
    plt = rp.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1, 3]})
    colours = {"host": "tab:grey", "guest_root": "tab:blue", "guest_volume": "tab:orange"}
    present = [t for t in TARGETS if any(t in stats.get(w, {}) for w in WORKLOADS)]
    width = 0.8 / max(1, len(present))
    for ax, ws, div, unit in ((a1, PARALLEL, 1e3, "ms"), (a2, OPS, 1.0, "µs")):
        ws = [w for w in ws if w in stats]
        for k, t in enumerate(present):
            xs, p50, err = [], [], []
            for i, w in enumerate(ws):
                s = stats[w].get(t)
                if not s:
                    continue
                xs.append(i + (k - (len(present) - 1) / 2) * width)
                p50.append(s["p50"] / div)
                err.append(max(0.0, (s["p90"] - s["p50"]) / div))
            ax.bar(xs, p50, width, color=colours[t], label=TARGET_LABEL[t],
                   yerr=[[0] * len(err), err], capsize=2)
        ax.set_xticks(range(len(ws)))
        ax.set_xticklabels(ws, rotation=20)
        ax.set_yscale("log")
        ax.set_ylabel(f"p50 ({unit}); whisker to p90")
        ax.grid(axis="y", alpha=0.3)
    a1.set_title("parallel (wall time of one run)")
    a2.set_title("single operation")
    a2.legend()
    rp.save_figure(fig, path, title="forkvm volumes: host vs guest root disk vs guest volume")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=256, help="parallel threads")
    ap.add_argument("--files", type=int, default=1024, help="files in the parallel workloads "
                    "and entries of the lookup/readdir directory")
    ap.add_argument("--size", type=int, default=4096, help="bytes per file, read and write")
    ap.add_argument("--repeats", type=int, default=5, help="parallel runs per target and round")
    ap.add_argument("--iters", type=int, default=300, help="iterations per single op")
    ap.add_argument("--rounds", type=int, default=1,
                    help="times each target runs (interleaved host, root, volume, ...)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="which of " + ", ".join(TARGETS))
    ap.add_argument("--memory", type=int, default=1024, help="guest RAM in MiB")
    ap.add_argument("--cpus", type=int, default=1,
                    help="guest vCPUs (default 1: on a 2-core TCG host a second vCPU made a "
                         "volume request 5-10x slower, likely competing with the daemon)")
    ap.add_argument("--volume-opts", default="",
                    help="OPTS of --volume HOST:GUEST[:OPTS] (e.g. shared); default none")
    ap.add_argument("--host-dir", default=None,
                    help="host directory for the host target and the volume (default: a temp "
                         "dir in /var/tmp, removed after)")
    ap.add_argument("--guest-root-dir", default="/root/volbench")
    ap.add_argument("--guest-mount", default="/mnt/volbench")
    ap.add_argument("--host-python", default=shutil.which("python3") or sys.executable,
                    help="interpreter of the host target")
    ap.add_argument("--exec-timeout", type=float, default=1800, metavar="SECONDS")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="first wait up to this long for a quiet host")
    ap.add_argument("--out", default=str(HERE / "results"), help="results directory")
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "forkvm"))
    args = ap.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    if bad := [t for t in targets if t not in TARGETS]:
        ap.error(f"unknown targets {bad}")
    if "ro" in args.volume_opts.split(","):
        ap.error("--volume-opts ro: the workload writes (its files, and the write workloads)")
    if args.workers < 1 or args.files < 1 or args.size < 1 or args.rounds < 1:
        ap.error("--workers, --files, --size and --rounds must be at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"started": dt.datetime.now().astimezone(), "machine": rp.machine_info(),
           "revision": rp.git_revision(), "noise": {}, "guest": {}, "others": {},
           "others_busy": 0, "runs": 0}
    if "/debug/" in args.binary:
        ctx["build_note"] = " (**debug build**: the daemon's volume server is unoptimised)"
    t_start = time.monotonic()
    if args.wait_quiet:
        fb.wait_for_quiet_host(args.wait_quiet)

    own_host_dir = args.host_dir is None
    base = Path(tempfile.mkdtemp(prefix="volbench-", dir="/var/tmp") if own_host_dir
                else args.host_dir)
    host_dir, vol_dir = base / "host", base / "volume"
    host_dir.mkdir(parents=True, exist_ok=True)
    vol_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    try:
        with fb.Daemon(binary=args.binary) as d:
            ctx["info"] = d.api.info()
            guest_targets = [t for t in targets if t != "host"]
            volume_spec = None
            if "guest_volume" in targets:
                why = volume_support(args.binary)
                if why:
                    ctx["volume"] = why
                    guest_targets.remove("guest_volume")
                    print(f"warning: {why}", flush=True)
                else:
                    volume_spec = f"{vol_dir}:{args.guest_mount}" + \
                        (f":{args.volume_opts}" if args.volume_opts else "")
                    ctx["volume_spec"] = volume_spec
            sid = None
            if guest_targets:
                sid = spawn_guest(d, args, volume_spec)["id"]
                r = d.api.exec(sid, ["python3", "-c", "import sys; print(sys.version.split()[0])"])
                if r.get("exit_code") != 0:
                    raise fb.BenchError(f"the default image has no working python3: {r}")
                ctx["guest"]["python"] = r["stdout"].strip()
                r = d.api.exec(sid, ["mkdir", "-p", args.guest_root_dir])
                if r.get("exit_code") != 0:
                    raise fb.BenchError(f"mkdir {args.guest_root_dir} in the guest: {r}")
            p = subprocess.run([args.host_python, "-c", "import sys; print(sys.version.split()[0])"],
                               capture_output=True, text=True)
            ctx["guest"]["host_python"] = p.stdout.strip()
            ours = [d.home, str(fb.run_dir_for_home(d.home))]
            order = [t for t in TARGETS if t == "host" and t in targets or t in guest_targets]
            where = {"host": str(host_dir), "guest_root": args.guest_root_dir,
                     "guest_volume": args.guest_mount}
            for rnd in range(args.rounds):
                for t in order:
                    print(f"==> round {rnd + 1}/{args.rounds}: {TARGET_LABEL[t]} "
                          f"({where[t]})", flush=True)
                    others = fb.other_qemu_processes(ours)
                    ctx["runs"] += 1
                    if others:
                        ctx["others"].update(others)
                        ctx["others_busy"] += 1
                    roots = [d.proc.pid, *fb.qemu_pids_mentioning(d.home)]
                    meter = fb.CpuMeter(roots=roots)
                    meter.start()
                    t0 = time.perf_counter()
                    if t == "host":
                        res = run_host(args, str(host_dir))
                    else:
                        res = run_guest(d, sid, args, where[t])
                    busy = meter.other_cores()
                    ctx["noise"].setdefault(t, []).append(busy)
                    ctx["guest"].setdefault("fs", {})[t] = {"dir": where[t], "fs": res["fs"]}
                    new = rows_from_result(t, rnd + 1, res)
                    rows += new
                    st = aggregate(new)
                    pr = st.get("parallel_read", {}).get(t, {}).get("p50", math.nan)
                    pw = st.get("parallel_write", {}).get(t, {}).get("p50", math.nan)
                    print(f"    {TARGET_LABEL[t]}: {fb.ms_since(t0) / 1e3:.1f} s; parallel read "
                          f"p50 {rp.fmt(pr / 1e3, 1)} ms, write+fsync p50 "
                          f"{rp.fmt(pw / 1e3, 1)} ms; other processes {busy:.2f} cores",
                          flush=True)
    finally:
        if own_host_dir:
            shutil.rmtree(base, ignore_errors=True)
    ctx["elapsed"] = time.monotonic() - t_start
    stats = aggregate(rows)
    rp.write_csv(out / "volumes.csv", rows, FIELDS)
    plot(stats, out / "volumes.png")
    lines = result_lines(stats, ctx, args)
    (out / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwrote {out / 'volumes.csv'}, {out / 'RESULTS.md'}, {out / 'volumes.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_volumes", main, on_signal=None)
