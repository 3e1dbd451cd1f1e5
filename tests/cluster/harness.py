"""The cluster the acceptance test runs on, started and stopped the way a
user does (``python -m forkvm.ray up`` / ``down``), plus what the test needs
to reach into it: node PIDs to kill, the gateway's PID, node homes.

Every process is found and stopped by PID, from the records ``up`` writes
(``DIR/up.json``, ``DIR/nodes/NAME/serve.pid``); nothing is ended by name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import forkvm

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("FORKVM_BIN") or str(REPO / "target" / "debug" / "forkvm")
E2B_PYTHON = str(REPO / ".venv-compat" / "bin" / "python")

# The unmodified e2b SDK: create, run, fork, kill (E2B_* point at the endpoint).
E2B_SCRIPT = r"""
from e2b import Sandbox
sb = Sandbox.create(template="default", timeout=600)
r = sb.commands.run("echo e2b-$((6*7))")
assert r.stdout.strip() == "e2b-42", r
sb.files.write("/root/e2b.txt", "forked")
kids = sb.fork(count=2, timeout=600)
assert len(kids) == 2, kids
for k in kids:
    assert k.files.read("/root/e2b.txt") == "forked"
    assert k.commands.run("hostname").stdout.strip() == k.sandbox_id
    k.kill()
sb.kill()
ids = [s.sandbox_id for s in Sandbox.list().next_items()]
assert sb.sandbox_id not in ids, ids
print("E2B OK", sb.sandbox_id, [k.sandbox_id for k in kids])
"""


def node_of(sandbox_id: str) -> str:
    """The node an id names: ``sb-NODE-HEX``."""
    parts = sandbox_id.split("-")
    assert len(parts) == 3, sandbox_id
    return parts[1]


def _started(pid: int) -> str:
    """A process's start time (clock ticks since boot, field 22 of
    ``/proc/PID/stat``; "" when it is gone, a zombie included): with the
    pid, what tells a process this harness saw from a later one that reuses
    its pid. A zombie has ended and waits only for its parent to reap it
    (a Ray node this harness started and killed is one until it is waited
    for), so it counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return "" if fields[0] == "Z" else fields[19]
    except (OSError, ValueError, IndexError):
        return ""


def _name(pid: int) -> str:
    """A process's name (``comm``), for messages."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _cwd_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _stderr_of(pid: int) -> str:
    """Where a process's standard error goes ("" when it cannot be read)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return ""


def _pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def qemus_of(home: str, ids: Optional[List[str]] = None) -> List[int]:
    """QEMUs of ``home`` (of one of ``ids``, when given).

    The daemon opens each QEMU's standard error as ``qemu.log`` in the
    sandbox's directory, ``<home>/sandboxes/<id>/``, before QEMU starts: a
    process writing there is that sandbox's QEMU, found without parsing a
    command line. Reading other users' fds needs root, which these tests have.
    """
    assert os.geteuid() == 0, "finding QEMUs by their open files needs root"
    prefix = os.path.join(home, "sandboxes") + "/"
    out = []
    for pid in _pids():
        err = _stderr_of(pid)
        if err.startswith(prefix) and (ids is None or any(f"/{i}/" in err for i in ids)):
            out.append(pid)
    return out


def wait_output(sb: "forkvm.Sandbox", cmd: str, timeout: float) -> str:
    """The stdout of ``cmd`` once it prints something."""
    deadline = time.monotonic() + timeout
    while True:
        out = sb.exec(cmd).stdout.strip()
        if out or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _free_ports(n: int) -> int:
    """A base B such that B+1..B+n are free on 127.0.0.1 (node k listens on B+k)."""
    import socket

    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1] - 1
        try:
            for k in range(2, n + 1):
                socket.create_server(("127.0.0.1", base + k)).close()
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} free ports in a row on 127.0.0.1")


def _forkvm_ray(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, FORKVM_BIN=BIN)
    for k in ("FORKVM_URL", "FORKVM_TOKEN"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-m", "forkvm.ray", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@dataclass
class Cluster:
    dir: Path
    url: str
    token: str
    cluster_token: str
    started: Dict[int, str] = field(default_factory=dict)  # extra Ray nodes the test started: pid -> name
    up_seconds: float = 0.0
    everything: Dict[int, str] = field(default_factory=dict)  # every process seen: pid -> start time
    ids: List[str] = field(default_factory=list)  # every sandbox the test made

    @classmethod
    def up(cls, nodes: int, max_sandboxes: int) -> "Cluster":
        for tool, hint in ((BIN, "cargo build -p forkvm-cli, or set FORKVM_BIN"),
                           (E2B_PYTHON, "scripts/setup.sh creates .venv-compat with the e2b SDK")):
            if not os.access(tool, os.X_OK):
                raise RuntimeError(f"{tool} is missing: {hint}")
        # Short: a daemon's home and Ray's socket paths must stay short.
        d = Path(tempfile.mkdtemp(prefix="fvc-", dir="/tmp")) / "c"
        t = time.monotonic()
        r = _forkvm_ray("up", "--nodes", str(nodes), "--dir", str(d), "--base-port", str(_free_ports(nodes)),
                        f"--serve-arg=--max-sandboxes={max_sandboxes}")
        if r.returncode != 0:
            _forkvm_ray("down", "--dir", str(d))
            shutil.rmtree(d.parent, ignore_errors=True)
            raise RuntimeError(f"`forkvm.ray up` failed:\n{r.stdout}\n{r.stderr}")
        c = json.loads((d / "cluster.json").read_text())
        cl = cls(d, c["url"], c["token"], c["cluster_token"])
        cl.up_seconds = time.monotonic() - t
        print(f"cluster up in {cl.up_seconds:.1f} s at {cl.url}")
        cl.everything = cl._tree_now()
        return cl

    # -- reaching the cluster ---------------------------------------------

    def client(self) -> forkvm.Client:
        return forkvm.Client(self.url, self.token)

    def env(self) -> Dict[str, str]:
        env = dict(os.environ, FORKVM_URL=self.url, FORKVM_TOKEN=self.token)
        env.pop("FORKVM_HOME", None)
        return env

    def nodes(self) -> Dict[str, dict]:
        return {n["name"]: n for n in json.loads((self.dir / "nodes.json").read_text())["nodes"]}

    def home(self, name: str) -> str:
        return str(self.dir / "nodes" / name / "home")

    def room(self, name: str) -> int:
        """How many more sandboxes node ``name`` takes, from its daemon directly."""
        with forkvm.Client(self.nodes()[name]["url"], self.cluster_token) as c:
            info = c.info()
        return info.limits.max_sandboxes - info.sandboxes

    def copy_snapshot(self, snap: str, frm: str, to: str) -> None:
        """Node ``to`` pulls ``snap`` from node ``frm``'s read-only /v2, with the cluster token."""
        src = self.nodes()[frm]["url"].removeprefix("http://")
        with forkvm.Client(self.nodes()[to]["url"], self.cluster_token) as c:
            c.pull_snapshot(f"{src}/forkvm/snapshots:{snap}", username="forkvm",
                            password=self.cluster_token, insecure=True)

    # -- processes ----------------------------------------------------------

    def _up_state(self) -> dict:
        return json.loads((self.dir / "up.json").read_text())

    def _serve_pid(self, name: str) -> int:
        return int(json.loads((self.dir / "nodes" / name / "serve.pid").read_text())["pid"])

    def _tree_now(self) -> Dict[int, str]:
        """Every process of the cluster now: Ray nodes and their children, daemons, QEMUs, gateway."""
        roots = [n["pid"] for n in self._up_state()["ray_nodes"]] + list(self.started)
        kids: Dict[int, List[int]] = {}
        for pid in _pids():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(pid)
        out: Dict[int, str] = {}
        todo = list(roots)
        while todo:
            p = todo.pop()
            if p in out:
                continue
            t = _started(p)
            if t:
                out[p] = t
                todo.extend(kids.get(p, []))
        # Whatever else works in the cluster's directory: its standard error
        # goes to a log there (daemons, QEMUs, the gateway), or it runs there.
        inside = str(self.dir) + "/"
        for pid in _pids():
            if _stderr_of(pid).startswith(inside) or (_cwd_of(pid) + "/").startswith(inside):
                t = _started(pid)
                if t:
                    out[pid] = t
        return out

    def gateway_pid(self) -> int:
        # The supervisor starts the gateway writing to DIR/gateway.log.
        log = str(self.dir / "gateway.log")
        for pid in _pids():
            if _stderr_of(pid) == log:
                return pid
        raise AssertionError("no gateway process for this cluster")

    def wait_gateway(self, other_than: int, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pid = self.gateway_pid()
                if pid != other_than:
                    with forkvm.Client(self.url, self.token) as c:
                        c.health()
                    return pid
            except Exception:
                pass
            time.sleep(0.5)
        raise AssertionError(f"the gateway did not come back within {timeout} s")

    def kill_node(self, name: str) -> float:
        """SIGKILL node ``name``'s raylet and its daemon; the time it was done."""
        ray_node = next(n for n in self._up_state()["ray_nodes"] if n["name"] == name)
        tree = [p for p in self._tree_now() if _name(p) == "raylet"]
        raylets = [p for p in tree if _is_descendant(p, ray_node["pid"])]
        assert len(raylets) == 1, f"raylets of node {name}: {raylets}"
        serve = self._serve_pid(name)
        self.everything.update(self._tree_now())
        os.kill(raylets[0], signal.SIGKILL)
        os.kill(serve, signal.SIGKILL)
        return time.monotonic()

    def restart_node(self, name: str) -> None:
        """Start a Ray node named ``name`` again in this cluster (same home)."""
        st = self._up_state()
        tmp = os.path.join(st["ray_tmp"], f"{name}-again")
        argv = [sys.executable, "-m", "forkvm.ray._raynode", "--name", name, "--temp-dir", tmp,
                "--address", st["ray_address"]]
        with open(self.dir / f"ray-{name}-again.log", "ab") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True)
        self.started[p.pid] = name
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            n = self.nodes().get(name)
            if n and n["alive"]:
                try:
                    with forkvm.Client(n["url"], self.cluster_token) as c:
                        c.health()
                    return
                except Exception:
                    pass
            time.sleep(1)
        raise AssertionError(f"node {name} did not come back within 120 s")

    def down(self) -> None:
        self.everything.update(self._tree_now())
        ids = set(self.ids)
        try:
            ids |= {s.id for s in self.client().list_sandboxes().sandboxes}
        except Exception:
            pass
        r = _forkvm_ray("down", "--dir", str(self.dir))
        # The Ray node the test started again: its launcher, then whatever is
        # left in its process group (it ran in a session of its own).
        for pid in self.started:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        stop_by = time.monotonic() + 30
        while time.monotonic() < stop_by and any(_started(p) for p in self.started):
            time.sleep(0.5)
        for pid in self.started:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(_started(p) == t for p, t in self.everything.items()):
            time.sleep(0.5)
        left = {p: _name(p) for p, t in self.everything.items() if _started(p) == t}
        home_left = self.dir.exists()
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        shutil.rmtree(self.dir.parent, ignore_errors=True)
        assert r.returncode == 0, r.stderr
        assert not left, f"left running after down: {left}"
        assert not home_left, f"{self.dir} is still there after down"
        assert not qemus_of(str(self.dir)), "QEMUs of the cluster left"
        assert not [l for l in netns.splitlines() if any(i in l for i in ids)], netns


def _is_descendant(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return pid == root


def run_e2b(cluster: Cluster, script: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "FORKVM_"))}
    env.update(E2B_API_URL=cluster.url, E2B_SANDBOX_URL=cluster.url, E2B_API_KEY=cluster.token)
    r = subprocess.run([E2B_PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"e2b script failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout
