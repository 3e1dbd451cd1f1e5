#!/usr/bin/env python3
"""forkvm registry benchmark: snapshot push and pull through an OCI registry.

Run through bench/registry/run.sh (it checks the tools and the .venv, and
builds the release binary unless given --binary).

Each run starts from nothing: a fresh registry (Debian's `docker-registry`
on a free 127.0.0.1 port, filesystem storage in a temp dir) and two fresh
private daemons, A and B, with homes of their own (B with
FORKVM_NET_POOL=10.232.0.0/16; every sandbox has `network: none`). A's
home links `guest` and `images` to the artefacts; B's links `guest` only and
has an empty `images/` of its own, so a pull must fetch the image too.

On A: two 512 MiB sandboxes from the boot template (the first spawn boots
the image and makes the template), each writing --data-mib (64) MiB of
random data to /root/buf (then `sync`), snapshotted (S1, S2: `diff`
snapshots whose parent is the template) and removed. Then, timed (CLI wall;
stages from the NDJSON progress events):

* push_s1      -- `snapshot push S1 REG/bench/s1:v1`: empty registry, empty
                  chunk cache: chunks and sends the image's root disk, the
                  template link and S1's link;
* push_s2      -- `snapshot push S2 REG/bench/s1:v2`: the same repository,
                  so the image and the template link are found and skipped
                  (S2's link is chunked and sent);
* push_s2_repo -- `snapshot push S2 REG/bench/s2:v1`: another repository
                  (chunk lists cached by now);

on B:

* pull_s1      -- `snapshot pull REG/bench/s1:v1`: fetches image, template, S1;
* pull_s2      -- `snapshot pull REG/bench/s2:v1`: only S2's link is missing;
  then B spawns a sandbox from each pulled snapshot and checks the SHA-256 of
  /root/buf against A's (spawn_ms, sha_ok).

The baseline, in the same run, what one does by hand with skopeo: GNU
`tar --sparse` of the same files (the image's rootfs.ext4, the template's
snapshot directory, S1's or S2's), one uncompressed tar layer in an OCI
layout written by this script, `skopeo copy oci:… docker://REG/base/sN:v1`
(skopeo gzips the layer on the way, containers/image's default for a
registry), and back: `skopeo copy docker://… oci:DIR2` into a fresh
directory, then `tar -xzf` of the layer (the files ready to use). The order
of the forkvm block and the baseline block alternates between runs.

Run 1 also replays the chunking offline for chunk sizes 1-16 MiB
(chunk_sizes.py): the bytes and blobs of the cold push of S1, and of S2's
push after it.

Everything is stopped by its pid at the end of each run (also on an error or
SIGTERM): the registry, both daemons (sandboxes removed first); each run's
temp directory goes, and the host nft tables the daemons leave.

Outputs: results/registry.csv, results/chunk_sizes.csv, results/RESULTS.md,
results/registry.png.

This file holds the command line and the run loop (`main`); the rest is in
registry_hosts.py (the registry and the daemons), registry_cases.py
(one run of every case), registry_report.py (RESULTS.md and plot),
chunk_sizes.py; what every bench shares is in bench/common (report.py: the
command line, statistics, CSV, RESULTS.md pieces, plots).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402
from registry_hosts import FIELDS, check_tools  # noqa: E402
from registry_cases import one_run  # noqa: E402
from registry_report import plot, write_results  # noqa: E402


def tool_versions() -> str:
    out = []
    for argv in (["skopeo", "--version"], ["docker-registry", "--version"],
                 ["tar", "--version"], ["zstd", "-V"]):
        try:
            v = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
            out.append(v.strip().splitlines()[0].strip("* ") if v.strip() else argv[0])
        except (OSError, subprocess.TimeoutExpired):
            out.append(argv[0])
    return "; ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="repetitions of every figure")
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    ap.add_argument("--data-mib", type=int, default=64, help="random data each sandbox writes")
    ap.add_argument("--no-chunk-sizes", action="store_true",
                    help="skip the offline chunk-size analysis")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    if args.runs < 1 or args.data_mib < 1:
        ap.error("--runs and --data-mib must be positive")
    check_tools()
    args.binary = str(Path(args.binary).resolve())
    artifacts = Path(os.environ.get("FORKVM_ARTIFACTS") or fb.DEFAULT_ARTIFACTS)
    for need in (artifacts / "guest", artifacts / "images" / "default"):
        if not need.is_dir():
            raise fb.BenchError(f"{need} is missing: run scripts/setup.sh (or set "
                                "FORKVM_ARTIFACTS to where the guest artefacts are)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"machine": rp.machine_info(), "data_mib": args.data_mib, "tools": tool_versions(),
           "others": {}, "busy": 0,
           "stray": [], "stray_spawn": [], "profile": "debug" if "/debug/" in args.binary else "release",
           "command": "bash bench/registry/run.sh " + shlex.join(sys.argv[1:])}
    if args.wait_quiet:
        ctx["quiet"] = fb.wait_for_quiet_host(args.wait_quiet)
        ctx["machine"] = rp.machine_info()  # the load average once the wait is over
    ctx["started"] = dt.datetime.now().astimezone()
    t0 = time.monotonic()
    rows = []
    for run in range(1, args.runs + 1):
        rows += one_run(run, args, ctx, artifacts)
    ctx["elapsed"] = time.monotonic() - t0
    rp.write_csv(out / "registry.csv", rows, FIELDS)
    if ctx.get("chunks"):
        crow = ctx["chunks"]["rows"]
        rp.write_csv(out / "chunk_sizes.csv", crow, list(crow[0].keys()))
    plot(rows, ctx, out / "registry.png")
    lines = write_results(out / "RESULTS.md", rows, ctx, args)
    print("\n".join(lines))
    print(f"\nwrote {out / 'registry.csv'}, {out / 'RESULTS.md'}, {out / 'registry.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_registry", main, on_signal="exit")
