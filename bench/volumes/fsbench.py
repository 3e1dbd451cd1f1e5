#!/usr/bin/env python3
"""The file-system workload of the volumes benchmark, run in one directory.

The same script runs on the host (the baseline, in a host directory) and in a
guest (sent with the exec request's stdin, run as `python3 - ARGS`), on the
guest's root disk or on a volume. Standard library only, Python >= 3.9 (the
default image has Debian bookworm's 3.11). Prints one JSON object on stdout;
progress goes to stderr.

Workloads (fcvm's published ones, seeds/004):

* parallel_read  -- W threads over F files of S bytes (written before the
  first repeat, so every repeat reads warm): each file is opened, read whole
  and closed once per repeat. One sample per repeat: the wall time in ns
  from the release of the threads (already started, waiting on an event) to
  the join of the last one.
* parallel_write -- the same threads create F new files (a fresh directory
  per repeat, made and removed outside the timing): open(O_CREAT|O_TRUNC),
  write S bytes, fsync, close.
* single-operation latency, each timed per iteration (perf_counter_ns) after
  a few untimed warm-up iterations, in one thread:
  getattr       stat() of one existing file (the same each time);
  lookup        stat() of a fresh, never-used name in the F-entry directory
                (a miss: no dentry, positive or negative, can be cached);
  read_4k       pread() of S bytes at offset 0 of a file open for the whole op;
  write_4k      pwrite() of S bytes at offset 0, no fsync;
  open_close    open(O_RDONLY) + close() of one existing file;
  readdir       os.listdir() of the F-entry directory;
  create_unlink open(O_CREAT|O_EXCL) of a fresh name + close() + unlink().

Also the timing floor: the same loop around an empty op (Python's own cost
per timed iteration, which an emulated CPU inflates like everything else).

Output: {"python": ..., "dir": ..., "fs": ..., "params": {...}, "floor_ns": [...],
"parallel": {"read": [ns, ...], "write": [ns, ...]},
"ops": {"getattr": [ns, ...], ...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time

OPS = ("getattr", "lookup", "read_4k", "write_4k", "open_close", "readdir", "create_unlink")
WARMUP = 10


def log(msg: str) -> None:
    print(f"  fsbench: {msg}", file=sys.stderr, flush=True)


def write_file(path: str, data: bytes, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str, size: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        n = len(os.read(fd, size))
    finally:
        os.close(fd)
    return n


def run_threads(workers: int, paths: list[str], job) -> int:
    """Run job(path) for every path on `workers` threads (thread i takes
    paths i, i+W, ...); return the ns from releasing the started threads
    to the join of the last. An error in any thread is raised here."""
    go = threading.Event()
    errors: list[BaseException] = []

    def work(mine: list[str]) -> None:
        go.wait()
        try:
            for p in mine:
                job(p)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=work, args=(paths[i::workers],), daemon=True)
               for i in range(min(workers, len(paths)))]
    for t in threads:
        t.start()
    t0 = time.perf_counter_ns()
    go.set()
    for t in threads:
        t.join()
    dt = time.perf_counter_ns() - t0
    if errors:
        raise errors[0]
    return dt


def parallel(root: str, args) -> dict[str, list[int]]:
    data = os.urandom(args.size)
    rdir = os.path.join(root, "par-read")
    os.makedirs(rdir, exist_ok=True)
    names = [os.path.join(rdir, f"f{i:05d}") for i in range(args.files)]
    for p in names:
        write_file(p, data, fsync=False)
    out: dict[str, list[int]] = {"read": [], "write": []}

    def reader(p: str) -> None:
        if read_file(p, args.size) != args.size:
            raise OSError(f"short read of {p}")

    for r in range(args.repeats):
        out["read"].append(run_threads(args.workers, names, reader))
        wdir = os.path.join(root, f"par-write-{r}")
        os.makedirs(wdir)
        wnames = [os.path.join(wdir, f"f{i:05d}") for i in range(args.files)]
        out["write"].append(run_threads(args.workers, wnames,
                                        lambda p: write_file(p, data, fsync=True)))
        shutil.rmtree(wdir)
        log(f"parallel repeat {r + 1}/{args.repeats}: read {out['read'][-1] / 1e6:.1f} ms, "
            f"write+fsync {out['write'][-1] / 1e6:.1f} ms")
    return out


def timed(n: int, op) -> list[int]:
    """op(i) for i in -WARMUP..n-1; the ns of each of the last n."""
    clock = time.perf_counter_ns
    for i in range(-WARMUP, 0):
        op(i)
    out = []
    for i in range(n):
        t0 = clock()
        op(i)
        out.append(clock() - t0)
    return out


def single_ops(root: str, args, wanted: list[str]) -> dict[str, list[int]]:
    data = os.urandom(args.size)
    ddir = os.path.join(root, "ops-dir")
    os.makedirs(ddir, exist_ok=True)
    for i in range(args.files):
        write_file(os.path.join(ddir, f"e{i:05d}"), data, fsync=False)
    one = os.path.join(root, "ops-file")
    write_file(one, data, fsync=False)
    tag = f"{os.getpid()}-{time.monotonic_ns()}"  # fresh names, even on a reused dir
    n = args.iters

    def lookup(i: int) -> None:
        try:
            os.stat(os.path.join(ddir, f"miss-{tag}-{i}"))
        except FileNotFoundError:
            return
        raise OSError("a fresh name exists")

    def create_unlink(i: int) -> None:
        p = os.path.join(ddir, f"new-{tag}-{i}")
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.unlink(p)

    out: dict[str, list[int]] = {}
    fd = os.open(one, os.O_RDWR)
    try:
        ops = {
            "getattr": lambda i: os.stat(one),
            "lookup": lookup,
            "read_4k": lambda i: os.pread(fd, args.size, 0),
            "write_4k": lambda i: os.pwrite(fd, data, 0),
            "open_close": lambda i: os.close(os.open(one, os.O_RDONLY)),
            "readdir": lambda i: os.listdir(ddir),
            "create_unlink": create_unlink,
        }
        for name in wanted:
            # readdir of a big directory is the slow one: fewer iterations.
            k = max(1, n // 10) if name == "readdir" else n
            out[name] = timed(k, ops[name])
            xs = sorted(out[name])
            log(f"{name}: {k} iterations, p50 {xs[len(xs) // 2] / 1e3:.1f} µs")
    finally:
        os.close(fd)
    return out


def fs_type(path: str) -> str:
    """The file system `path` is on, from /proc/self/mountinfo (longest
    mount point that is a prefix)."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                mnt = left.split()[4]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, right.split()[0]
    except OSError:
        pass
    return f"{kind} on {best}" if best else kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="directory to work in (created; emptied after)")
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--files", type=int, default=1024)
    ap.add_argument("--size", type=int, default=4096, help="bytes per file and per read/write")
    ap.add_argument("--repeats", type=int, default=5, help="parallel runs (0: none)")
    ap.add_argument("--iters", type=int, default=1000, help="iterations per single op (0: none)")
    ap.add_argument("--ops", default=",".join(OPS), help="single ops to time")
    ap.add_argument("--keep", action="store_true", help="leave the files in --dir")
    args = ap.parse_args()
    wanted = [o for o in args.ops.split(",") if o]
    bad = [o for o in wanted if o not in OPS]
    if bad:
        ap.error(f"unknown ops {bad}; known: {', '.join(OPS)}")
    root = os.path.join(args.dir, f"fsbench-{os.getpid()}")
    os.makedirs(root)
    try:
        res = {
            "python": sys.version.split()[0],
            "dir": args.dir,
            "fs": fs_type(args.dir),
            "params": {"workers": args.workers, "files": args.files, "size": args.size,
                       "repeats": args.repeats, "iters": args.iters},
            "parallel": parallel(root, args) if args.repeats > 0 else {"read": [], "write": []},
            "ops": single_ops(root, args, wanted) if args.iters > 0 else {},
            "floor_ns": timed(max(args.iters, 100), lambda i: None),
        }
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    json.dump(res, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
