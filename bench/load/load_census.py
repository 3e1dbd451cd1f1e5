"""The load benchmark's fixed parts, its daemon and the resource census: the
operation mix and CSV columns, `LoadDaemon` (a private daemon whose process
tree and home are counted), and the census taken before and after the load
(processes, fds, taps, namespaces, cgroups, files) with what differs between
the two.
"""

from __future__ import annotations

import collections
import http.client
import os
import subprocess
import tempfile
import time
from pathlib import Path

import forkvm_bench as fb
import report as rp


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
