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
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import hashlib
import http.client
import json
import math
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))

import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402

MIN_DURATION = 120  # seconds; below this a run is only a smoke test
MODES = ("live", "diff", "full")
# Relative weights of the operations a client picks from (among those that
# are possible at that moment: e.g. no exec without a sandbox).
WEIGHTS = {
    "spawn": 15,
    "exec": 25,
    "files": 20,
    "branch": 15,
    "rm_snapshot": 10,
    "rm_sandbox": 15,
}
SPAWN_FROM_SNAPSHOT = 0.4  # share of spawns from an own snapshot, when the client has one
OPS = ["spawn_image", "spawn_snapshot", "exec", "file_write", "file_read",
       "branch_live", "branch_diff", "branch_full", "rm_snapshot", "rm_sandbox"]
OUTCOMES = ("ok", "conflict", "limit", "failure")
OUTCOME_LABEL = {"ok": "2xx", "conflict": "409", "limit": "429", "failure": "failure"}
OUTCOME_COLOR = {"ok": "tab:blue", "conflict": "tab:orange", "limit": "tab:purple",
                 "failure": "tab:red"}
FIELDS = ["client", "phase", "op", "method", "path", "t_start_s", "latency_ms", "status",
          "outcome", "error_code", "detail", "message"]
EXCLUDED_HOME_FILES = {"daemon.log", "state.db-wal", "state.db-shm", "state.db-journal"}


fmt = rp.fmt


# --------------------------------------------------------------------------
# Daemon
# --------------------------------------------------------------------------


class LoadDaemon(fb.Daemon):
    """fb.Daemon started as `forkvm serve --home <home> [extra args]`."""

    def __init__(self, *a, extra_args=(), **kw):
        super().__init__(*a, **kw)
        self.extra_args = list(extra_args)

    def start(self) -> None:
        for sub in ("guest", "images"):
            src = Path(self.artifacts) / sub
            if not src.is_dir():
                raise fb.BenchError(f"{src} is missing: run scripts/setup.sh "
                                    "(or set FORKVM_ARTIFACTS to where the guest artefacts are)")
        if not os.access(self.binary, os.X_OK):
            raise fb.BenchError(f"{self.binary} is not an executable")
        self.home = tempfile.mkdtemp(prefix="fvl-", dir="/tmp")
        for sub in ("guest", "images"):
            os.symlink(Path(self.artifacts) / sub, os.path.join(self.home, sub))
        env = {k: v for k, v in os.environ.items() if k != "FORKVM_HOME"}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([self.binary, "serve", "--home", self.home, *self.extra_args],
                                     env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.api = fb.Api(self.socket_path)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise fb.BenchError(f"forkvm serve exited with {self.proc.returncode}:\n"
                                    + self.log_tail())
            if os.path.exists(self.socket_path):
                try:
                    self.api.info()
                    return
                except (OSError, http.client.HTTPException):
                    pass
            if time.monotonic() > deadline:
                raise fb.BenchError("forkvm serve did not answer on its socket within "
                                    f"{self.startup_timeout:.0f}s:\n" + self.log_tail())
            time.sleep(0.05)


# --------------------------------------------------------------------------
# Resource census (baseline / end)
# --------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, comm) for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.find("(") + 1:s.rfind(")")]
        rest = s.rsplit(")", 1)[1].split()
        out[int(d)] = (int(rest[1]), rest[0], comm)
    return out


def descendants(root: int) -> dict[int, tuple[str, str]]:
    """pid -> (state, comm) of every descendant of `root`."""
    table = _proc_table()
    children = collections.defaultdict(list)
    for pid, (ppid, _, _) in table.items():
        children[ppid].append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in out or pid not in table:
            continue
        out[pid] = (table[pid][1], table[pid][2])
        todo.extend(children.get(pid, []))
    return out


def _count_lines(cmd: list[str]) -> int | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return len([ln for ln in r.stdout.splitlines() if ln.strip()])


def list_files(root: Path, exclude=()) -> list[str]:
    """Relative paths of every non-directory entry under `root` (symlinks are
    listed, not followed), less the names in `exclude` at the top level."""
    if not root.exists():
        return []
    out = []
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in list(dirs):
            if os.path.islink(os.path.join(dirpath, name)):
                dirs.remove(name)
                files.append(name)
        for name in files:
            p = name if rel == "." else os.path.join(rel, name)
            if p not in exclude:
                out.append(p)
    return sorted(out)


def census(d: LoadDaemon) -> dict:
    """Everything the leak check compares, plus a few figures for information."""
    pid = d.proc.pid
    run_dir = fb.run_dir_for_home(d.home)
    desc = descendants(pid)
    qemu = set(fb.qemu_pids_mentioning(d.home)) | set(fb.qemu_pids_mentioning(str(run_dir)))
    qemu |= {p for p, (_, comm) in desc.items() if comm.startswith("qemu")}
    fd_targets = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                fd_targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    except OSError:
        pass
    status = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                status[k] = v.strip()
    except OSError:
        pass
    api_sb, api_sn = None, None
    try:
        api_sb = sorted(s["id"] for s in d.api.request("GET", "/v1/sandboxes")["sandboxes"])
        api_sn = sorted(s["id"] for s in d.api.request("GET", "/v1/snapshots")["snapshots"])
    except Exception as e:  # noqa: BLE001 - reported as a difference
        print(f"census: API listing failed: {e}", flush=True)
    return {
        "time": time.time(),
        "qemu_pids": sorted(qemu),
        "descendants": {p: f"{comm} ({st})" for p, (st, comm) in sorted(desc.items())},
        "zombies": sorted(p for p, (st, _) in desc.items() if st == "Z"),
        "fds": len(fd_targets),
        "fd_targets": sorted(fd_targets),
        "taps": _count_lines(["ip", "-o", "link", "show", "type", "tun"]),
        "netns": _count_lines(["ip", "netns", "list"]),
        "home_files": list_files(Path(d.home), EXCLUDED_HOME_FILES),
        "run_dir_files": list_files(run_dir),
        "run_dir_exists": run_dir.exists(),
        "api_sandboxes": api_sb,
        "api_snapshots": api_sn,
        "threads": int(status.get("Threads", "0") or 0),
        "rss_kib": int((status.get("VmRSS", "0 kB").split() or ["0"])[0]),
    }


def normalize_fds(targets: list[str]) -> list[str]:
    """fd link targets without inode numbers (socket:[123] -> socket), so two
    censuses compare by kind and path."""
    return sorted(t.split(":[", 1)[0] if t.endswith("]") and ":[" in t else t for t in targets)


def multiset_diff(a: list, b: list) -> tuple[list, list]:
    """(in b not a, in a not b), counting duplicates."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    return sorted((cb - ca).elements()), sorted((ca - cb).elements())


def compare(base: dict, end: dict, orphans: list[str]) -> list[dict]:
    """The leak table: one row per metric, `leak` True where end differs."""
    rows = []

    def row(metric, start, stop, leak, detail="", note=""):
        rows.append({"metric": metric, "start": start, "end": stop, "leak": bool(leak),
                     "detail": detail, "note": note})

    added = sorted(set(end["qemu_pids"]) - set(base["qemu_pids"]))
    row("QEMU processes of this daemon", len(base["qemu_pids"]), len(end["qemu_pids"]),
        len(end["qemu_pids"]) != len(base["qemu_pids"]) or added,
        f"new pids {added}" if added else "",
        "command line names the home or the run dir, or a descendant of the daemon")
    dd = len(end["descendants"]) - len(base["descendants"])
    new_desc = {p: c for p, c in end["descendants"].items() if p not in base["descendants"]}
    row("daemon's descendant processes", len(base["descendants"]), len(end["descendants"]),
        dd != 0 or new_desc, ", ".join(f"{p} {c}" for p, c in new_desc.items())[:400])
    row("zombie descendants", len(base["zombies"]), len(end["zombies"]),
        len(end["zombies"]) > len(base["zombies"]), ", ".join(map(str, end["zombies"])))
    more, fewer = multiset_diff(normalize_fds(base["fd_targets"]),
                                normalize_fds(end["fd_targets"]))
    row("daemon open fds", base["fds"], end["fds"], end["fds"] != base["fds"] or more or fewer,
        ("extra: " + ", ".join(more[:20]) if more else "")
        + (("; gone: " + ", ".join(fewer[:20])) if fewer else ""))
    row("tap devices (host-wide)", base["taps"], end["taps"],
        (end["taps"] or 0) > (base["taps"] or 0), "", "`ip -o link show type tun`")
    row("network namespaces (host-wide)", base["netns"], end["netns"],
        (end["netns"] or 0) > (base["netns"] or 0), "", "`ip netns list`")
    more, fewer = multiset_diff(base["home_files"], end["home_files"])
    row("files under the home", len(base["home_files"]), len(end["home_files"]),
        more or fewer,
        ("extra: " + ", ".join(more[:20]) if more else "")
        + (("; missing: " + ", ".join(fewer[:20])) if fewer else ""),
        "less daemon.log and state.db-wal/-shm")
    more, fewer = multiset_diff(base["run_dir_files"], end["run_dir_files"])
    row("files under the /dev/shm run dir", len(base["run_dir_files"]),
        len(end["run_dir_files"]), more or fewer,
        ("extra: " + ", ".join(more[:20]) if more else "")
        + (("; missing: " + ", ".join(fewer[:20])) if fewer else ""),
        "the (empty) directory itself may appear once a live save has run")
    for key, label in (("api_sandboxes", "sandboxes the API lists"),
                       ("api_snapshots", "snapshots the API lists")):
        b, e = base[key], end[key]
        if b is None or e is None:
            row(label, "?" if b is None else len(b), "?" if e is None else len(e), True,
                "the API listing failed")
            continue
        more, fewer = multiset_diff(b, e)
        row(label, len(b), len(e), more or fewer,
            ("extra: " + ", ".join(more[:20]) if more else "")
            + (("; missing: " + ", ".join(fewer[:20])) if fewer else ""))
    row("orphans after the clients' cleanup", 0, len(orphans), orphans,
        ", ".join(orphans[:20]),
        "objects the API listed that no client knew of (made by a failed request); removed "
        "before the checks above")
    return rows


def leak_keys(base: dict, cur: dict) -> bool:
    """True when `cur` matches `base` on everything the leak check compares."""
    return not any(r["leak"] for r in compare(base, cur, []))


# --------------------------------------------------------------------------
# The clients
# --------------------------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection on the unix socket. A connection the
    server closed while idle is noticed (readable at EOF) and reopened before
    the next request is sent; a request is never re-sent."""

    def __init__(self, path: str, timeout: float):
        self.path = path
        self.timeout = timeout
        self.c: fb.UnixHTTPConnection | None = None
        self.opened = 0

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None

    def request(self, method: str, path: str, body: bytes | None, ctype: str | None):
        if self.c is not None and self.c.sock is not None:
            r, _, _ = select.select([self.c.sock], [], [], 0)
            if r:  # EOF (or stray bytes): the server closed it
                self.close()
        if self.c is None:
            self.c = fb.UnixHTTPConnection(self.path, self.timeout)
        if self.c.sock is None:
            self.opened += 1
        headers = {"Content-Type": ctype} if body is not None else {}
        try:
            self.c.request(method, path, body=body, headers=headers)
            resp = self.c.getresponse()
            data = resp.read()
        except BaseException:
            self.close()
            raise
        return resp.status, resp.getheader("Content-Type") or "", data


class Stats:
    """Counters shared by the clients, for the progress line."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows: list[dict] = []
        self.by_outcome = collections.Counter()
        self.failures: list[dict] = []
        self.printed_failures = 0


class Client(threading.Thread):
    def __init__(self, idx: int, args, socket_path: str, t0: float, end_at: float,
                 stop: threading.Event, stats: Stats, template_id: str | None):
        super().__init__(name=f"client-{idx}", daemon=True)
        self.idx = idx
        self.args = args
        self.conn = Conn(socket_path, args.request_timeout)
        self.t0 = t0
        self.end_at = end_at
        self.stop_ev = stop
        self.stats = stats
        self.template_id = template_id
        self.rng = random.Random(args.seed * 1000 + idx)
        self.sandboxes: list[dict] = []   # {"id", "snapshot"}
        self.snapshots: list[dict] = []   # {"id", "mode", "kind"}, oldest first
        self.phase = "load"
        self.current: tuple[str, float] | None = None
        self.seq = 0
        self.error: str | None = None

    # -- one request --
    def call(self, op: str, method: str, path: str, body=None, raw: bytes | None = None,
             check=None, detail: str = ""):
        """Send one request and record it. Returns (outcome, status, value):
        value is the parsed JSON (or the raw bytes for non-JSON answers)."""
        data, ctype = None, None
        if body is not None:
            data, ctype = json.dumps(body).encode(), "application/json"
        elif raw is not None:
            data, ctype = raw, "application/octet-stream"
        t_start = time.perf_counter()
        self.current = (op, t_start)
        code, message, value = "", "", None
        try:
            status, rtype, payload = self.conn.request(method, path, data, ctype)
        except Exception as e:  # noqa: BLE001 - a connection-level failure
            status, rtype, payload = 0, "", b""
            code, message = "connection_error", f"{type(e).__name__}: {e}"
        latency = (time.perf_counter() - t_start) * 1000.0
        self.current = None
        if payload and rtype.startswith("application/json"):
            try:
                value = json.loads(payload)
            except ValueError:
                value = payload
        else:
            value = payload
        if 200 <= status < 300:
            outcome = "ok"
            if check is not None:
                try:
                    err = check(value)
                except Exception as e:  # noqa: BLE001 - a malformed answer
                    err = f"{type(e).__name__}: {e}"
                if err:
                    outcome, code, message = "failure", "check_failed", err
        else:
            if isinstance(value, dict) and isinstance(value.get("error"), dict):
                code = value["error"].get("code", "")
                message = value["error"].get("message", "")
            elif status:
                code = code or "non_json_error"
                message = message or repr(payload[:300])
            outcome = {409: "conflict", 429: "limit"}.get(status, "failure")
        row = {"client": self.idx, "phase": self.phase, "op": op, "method": method,
               "path": path, "t_start_s": t_start - self.t0, "latency_ms": latency,
               "status": status, "outcome": outcome, "error_code": code,
               "detail": detail, "message": message[:500]}
        with self.stats.lock:
            self.stats.rows.append(row)
            self.stats.by_outcome[outcome] += 1
            if outcome == "failure":
                self.stats.failures.append({
                    **row, "request_body": (body if body is not None
                                            else (f"<{len(raw)} bytes>" if raw else None)),
                    "response_body": (value if isinstance(value, (dict, list))
                                      else repr(value[:1000]) if isinstance(value, bytes)
                                      else value),
                    "wall_time": dt.datetime.now().astimezone().isoformat(timespec="milliseconds"),
                })
                if self.stats.printed_failures < 20:
                    self.stats.printed_failures += 1
                    print(f"  FAILURE client {self.idx} {op}: {method} {path} -> {status} "
                          f"[{code}] {message[:300]}", flush=True)
        return outcome, status, value

    # -- operations --
    def op_spawn(self) -> None:
        snap = None
        ready = self.snapshots
        if ready and self.rng.random() < SPAWN_FROM_SNAPSHOT:
            snap = self.rng.choice(ready)
        if snap is not None:
            body, op = {"snapshot": snap["id"]}, "spawn_snapshot"
        else:
            body, op = {"memory_mib": self.args.memory, "cpus": 1}, "spawn_image"

        def check(v):
            if not isinstance(v, dict) or not v.get("id"):
                return f"no sandbox in the answer: {v!r:.200}"
            if v.get("state") != "running":
                return f"sandbox {v['id']} is {v.get('state')}, not running"
            want = snap["id"] if snap else self.template_id
            if want and v.get("snapshot") != want:
                return (f"sandbox {v['id']} came from {v.get('snapshot')}, expected {want}"
                        + (" (the boot template)" if not snap else ""))
            return None

        _, status, v = self.call(op, "POST", "/v1/sandboxes", body, check=check,
                                 detail=f"from {snap['id']} ({snap['mode']})" if snap else "")
        # Track whatever the daemon made, even if the check failed, so it is removed.
        if 200 <= status < 300 and isinstance(v, dict) and v.get("id"):
            self.sandboxes.append({"id": v["id"], "snapshot": v.get("snapshot")})

    def op_exec(self) -> None:
        sb = self.rng.choice(self.sandboxes)
        self.seq += 1
        token = f"c{self.idx}-{self.seq}-{self.rng.getrandbits(32):08x}"
        want = hashlib.sha256(token.encode()).hexdigest()
        argv = ["python3", "-c",
                "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())",
                token]

        def check(v):
            if not isinstance(v, dict):
                return f"not an ExecResult: {v!r:.200}"
            if v.get("exit_code") != 0 or v.get("timed_out"):
                return (f"exit_code {v.get('exit_code')} signal {v.get('signal')} timed_out "
                        f"{v.get('timed_out')} stderr {v.get('stderr', '')[-300:]!r}")
            if v.get("stdout", "").strip() != want:
                return f"stdout {v.get('stdout', '')[:200]!r}, expected {want}"
            return None

        self.call("exec", "POST", f"/v1/sandboxes/{sb['id']}/exec",
                  {"argv": argv, "timeout_ms": self.args.exec_timeout_ms}, check=check,
                  detail=sb["id"])

    def op_files(self) -> None:
        sb = self.rng.choice(self.sandboxes)
        self.seq += 1
        size = self.rng.choice([16, 1024, 16 * 1024, 200 * 1024])
        content = self.rng.randbytes(size)
        gpath = f"/tmp/fvload-c{self.idx}-{self.seq}.bin"
        q = urllib.parse.urlencode({"path": gpath, "mode": "644"})

        def check_w(v):
            if not isinstance(v, dict) or v.get("size") != size:
                return f"wrote {size} bytes, the answer says {v!r:.200}"
            return None

        outcome, _, _ = self.call("file_write", "PUT", f"/v1/sandboxes/{sb['id']}/files?{q}",
                                  raw=content, check=check_w, detail=f"{sb['id']} {size} B")
        if outcome != "ok":
            return
        q = urllib.parse.urlencode({"path": gpath})

        def check_r(v):
            if not isinstance(v, bytes):
                return f"not raw bytes: {v!r:.200}"
            if v != content:
                return (f"read {len(v)} bytes (sha256 {hashlib.sha256(v).hexdigest()[:16]}), "
                        f"wrote {size} (sha256 {hashlib.sha256(content).hexdigest()[:16]})")
            return None

        self.call("file_read", "GET", f"/v1/sandboxes/{sb['id']}/files?{q}", check=check_r,
                  detail=f"{sb['id']} {size} B")

    def op_branch(self) -> None:
        sb = self.rng.choice(self.sandboxes)
        mode = self.rng.choice(MODES)
        room = len(self.sandboxes) < self.args.client_sandboxes
        count = self.rng.choice([0, 1]) if room else 0

        def check(v):
            if not isinstance(v, dict) or not isinstance(v.get("snapshot"), dict):
                return f"no BranchResult: {v!r:.200}"
            s = v["snapshot"]
            if s.get("state") != "ready":
                return f"snapshot {s.get('id')} is {s.get('state')} ({s.get('failure')})"
            if v.get("mode") != mode:
                return f"asked mode {mode}, got {v.get('mode')}"
            ch = v.get("children") or []
            if len(ch) != count:
                return f"asked {count} children, got {len(ch)}"
            for c in ch:
                if c.get("state") != "running" or c.get("snapshot") != s.get("id"):
                    return f"child {c.get('id')} is {c.get('state')} from {c.get('snapshot')}"
            return None

        outcome, status, v = self.call(f"branch_{mode}", "POST",
                                       f"/v1/sandboxes/{sb['id']}/branch",
                                       {"mode": mode, "count": count}, check=check,
                                       detail=f"{sb['id']} count={count}")
        if 200 <= status < 300 and isinstance(v, dict):
            s = v.get("snapshot") or {}
            if s.get("id"):
                self.snapshots.append({"id": s["id"], "mode": mode, "kind": s.get("kind")})
            for c in v.get("children") or []:
                if c.get("id"):
                    self.sandboxes.append({"id": c["id"], "snapshot": c.get("snapshot")})

    def rm_snapshot(self, snap: dict) -> str:
        outcome, status, _ = self.call("rm_snapshot", "DELETE", f"/v1/snapshots/{snap['id']}",
                                       detail=f"{snap['id']} ({snap['mode']}/{snap['kind']})")
        if status in (204, 404):  # a 404 is a failure, but the snapshot is gone either way
            self.snapshots.remove(snap)
        return outcome

    def rm_sandbox(self, sb: dict) -> str:
        outcome, status, _ = self.call("rm_sandbox", "DELETE", f"/v1/sandboxes/{sb['id']}",
                                       detail=sb["id"])
        if status in (204, 404):
            self.sandboxes.remove(sb)
        return outcome

    def pick(self) -> str:
        n_sb, n_sn = len(self.sandboxes), len(self.snapshots)
        w = {}
        if n_sb < self.args.client_sandboxes:
            w["spawn"] = WEIGHTS["spawn"]
        if n_sb:
            w["exec"] = WEIGHTS["exec"]
            w["files"] = WEIGHTS["files"]
            w["rm_sandbox"] = WEIGHTS["rm_sandbox"]
            if n_sn < self.args.client_snapshots:
                w["branch"] = WEIGHTS["branch"]
        if n_sn:
            w["rm_snapshot"] = WEIGHTS["rm_snapshot"]
        ops, weights = zip(*w.items())
        return self.rng.choices(ops, weights)[0]

    def run(self) -> None:
        try:
            while time.monotonic() < self.end_at and not self.stop_ev.is_set():
                op = self.pick()
                if op == "spawn":
                    self.op_spawn()
                elif op == "exec":
                    self.op_exec()
                elif op == "files":
                    self.op_files()
                elif op == "branch":
                    self.op_branch()
                elif op == "rm_snapshot":
                    self.rm_snapshot(self.rng.choice(self.snapshots))
                elif op == "rm_sandbox":
                    self.rm_sandbox(self.rng.choice(self.sandboxes))
        except Exception as e:  # noqa: BLE001 - a bench bug: reported, cleanup still runs
            self.error = f"{type(e).__name__}: {e}"
            print(f"client {self.idx}: internal error {self.error}", flush=True)
        finally:
            self.cleanup()
            self.conn.close()

    def cleanup(self) -> None:
        """Remove every sandbox, then every snapshot newest first. A 409
        (still starting, or a dependent left) is retried a few times."""
        self.phase = "cleanup"
        for attempt in range(20):
            for sb in list(self.sandboxes):
                self.rm_sandbox(sb)
            for sn in reversed(list(self.snapshots)):
                self.rm_snapshot(sn)
            if not self.sandboxes and not self.snapshots:
                return
            time.sleep(min(5.0, 0.25 * (attempt + 1)))
        print(f"client {self.idx}: could not remove {[s['id'] for s in self.sandboxes]} "
              f"{[s['id'] for s in self.snapshots]}", flush=True)


# --------------------------------------------------------------------------
# Statistics, plots, report
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------


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
