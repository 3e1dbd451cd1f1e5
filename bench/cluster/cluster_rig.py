"""The cluster the benchmark runs on: forkvm node daemons and gateways on
127.0.0.1, started and stopped by this process (no Ray: the bench measures
the endpoint and the nodes, not Ray's supervision).

* ``TcpApi``: the REST API over TCP with a bearer token (a node with the
  cluster token, or a gateway with the client token);
* ``Rig``: a temp directory holding one home per node (``guest/`` and
  ``images/<each>`` linked from $FORKVM_ARTIFACTS, as the Ray node service
  does), each ``forkvm serve --node NAME`` with its own ``--listen`` port,
  ``--net-pool`` and ``--jail-uids``, and gateways (``forkvm cluster
  gateway``) over any subset of the nodes, each with its own state dir and
  ``nodes.json``. ``stop()`` deletes every sandbox, SIGTERMs every process it
  started by its pid (SIGKILL after a grace period), kills any QEMU that
  still names the temp dir, and removes the dir.

Pure helpers (unit-tested in bench/common/test_cluster.py): ``node_of``,
``per_node`` and ``parse_copy_lines`` (the gateway's log of snapshot copies).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import forkvm_bench as fb  # noqa: E402

# The gateway logs every copy it makes (crates/forkvm-cluster/src/branch.rs).
COPY_RE = re.compile(
    r"snapshot (?P<id>\S+) copied from node (?P<src>\S+) to node (?P<dst>\S+): "
    r"(?P<links>\d+) link\(s\), (?P<cached>\d+) already there, (?P<bytes>\d+) bytes in "
    r"(?P<ms>\d+) ms")


def node_of(sid: str) -> str | None:
    """The node a cluster id names (`sb-NODE-hex`, `sn-NODE-hex`), or None
    for an id without one (`sb-hex`)."""
    parts = sid.split("-")
    return parts[1] if len(parts) == 3 else None


def per_node(ids) -> dict[str, int]:
    """How many of the ids each node holds, by node name (sorted)."""
    c = Counter(node_of(i) or "?" for i in ids)
    return dict(sorted(c.items()))


def parse_copy_lines(text: str) -> list[dict]:
    """The snapshot copies a gateway log reports, in order: id, src, dst,
    links, cached, bytes, ms (numbers as int)."""
    out = []
    for m in COPY_RE.finditer(text):
        d = m.groupdict()
        out.append({k: (int(v) if k in ("links", "cached", "bytes", "ms") else v)
                    for k, v in d.items()})
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TcpApi(fb.Api):
    """fb.Api over TCP to 127.0.0.1:`port` with `Authorization: Bearer`.
    One connection per request, as fb.Api does over the unix socket, so
    the daemon and the gateway are timed the same way."""

    def __init__(self, port: int, token: str, timeout: float = 600.0):
        super().__init__("", timeout)
        self.port = port
        self.token = token

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}


class Node:
    def __init__(self, name: str, k: int, home: str, port: int):
        self.name, self.k, self.home, self.port = name, k, home, port
        self.proc: subprocess.Popen | None = None
        self.api: TcpApi | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Gateway:
    def __init__(self, name: str, state_dir: str, port: int, nodes: list[Node]):
        self.name, self.state_dir, self.port, self.nodes = name, state_dir, port, nodes
        self.proc: subprocess.Popen | None = None
        self.api: TcpApi | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.state_dir, "gateway.log")

    def log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""


class Rig:
    """Nodes and gateways in one temp dir (see the module doc)."""

    def __init__(self, binary: str, parent: str = "/tmp", artifacts: str | None = None,
                 uid_base: int = 3_500_000, net_base: int = 236):
        self.binary = binary
        self.parent = parent
        self.artifacts = artifacts or os.environ.get("FORKVM_ARTIFACTS") or fb.DEFAULT_ARTIFACTS
        self.uid_base = uid_base
        self.net_base = net_base
        self.dir: str | None = None
        self.cluster_token = secrets.token_hex(16)
        self.client_token = secrets.token_hex(16)
        self.nodes: dict[str, Node] = {}
        self.gateways: list[Gateway] = []
        self.logs = []

    def __enter__(self) -> "Rig":
        for sub in ("guest", "images"):
            if not (Path(self.artifacts) / sub).is_dir():
                raise fb.BenchError(f"{self.artifacts}/{sub} is missing: run scripts/setup.sh "
                                    "(or set FORKVM_ARTIFACTS)")
        if not os.access(self.binary, os.X_OK):
            raise fb.BenchError(f"{self.binary} not found: cargo build --release -p forkvm-cli")
        self.dir = tempfile.mkdtemp(prefix="fvcb-", dir=self.parent)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, argv, env, log_path) -> subprocess.Popen:
        log = open(log_path, "wb")
        self.logs.append(log)
        return subprocess.Popen(argv, env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_up(self, proc, api: TcpApi, what: str, log: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise fb.BenchError(f"{what} exited with {proc.returncode}:\n{fb.tail(log)}")
            try:
                api.info()
                return
            except (OSError, http.client.HTTPException, fb.ApiError):
                pass
            if time.monotonic() > deadline:
                raise fb.BenchError(f"{what} did not answer within {timeout:.0f} s:\n"
                                    f"{fb.tail(log)}")
            time.sleep(0.1)

    def add_node(self, name: str, max_sandboxes: int, extra_args=()) -> Node:
        k = len(self.nodes)
        home = os.path.join(self.dir, name, "home")
        os.makedirs(os.path.join(home, "images"))
        os.symlink(Path(self.artifacts) / "guest", os.path.join(home, "guest"))
        for img in sorted((Path(self.artifacts) / "images").iterdir()):
            if img.is_dir():
                os.symlink(img, os.path.join(home, "images", img.name))
        node = Node(name, k, home, free_port())
        first = self.uid_base + k * 100_000
        argv = [self.binary, "serve", "--home", home, "--node", name,
                "--listen", f"127.0.0.1:{node.port}",
                "--net-pool", f"10.{self.net_base + k}.0.0/16",
                "--jail-uids", f"{first}-{first + 99_999}",
                "--max-sandboxes", str(max_sandboxes), *extra_args]
        log = os.path.join(self.dir, name, "daemon.log")
        node.proc = self._spawn(argv, {"FORKVM_TOKEN": self.cluster_token,
                                       "FORKVM_HOME": home}, log)
        node.api = TcpApi(node.port, self.cluster_token)
        self.nodes[name] = node
        self._wait_up(node.proc, node.api, f"node {name} (forkvm serve)", log)
        return node

    def add_gateway(self, name: str, nodes: list[Node]) -> Gateway:
        state = os.path.join(self.dir, name)
        os.makedirs(state)
        doc = {"nodes": [{"name": n.name, "url": n.url, "alive": True, "reason": None}
                         for n in nodes]}
        tmp = os.path.join(state, ".nodes.json.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.rename(tmp, os.path.join(state, "nodes.json"))
        gw = Gateway(name, state, free_port(), nodes)
        gw.proc = self._spawn([self.binary, "cluster", "gateway", "--listen",
                               f"127.0.0.1:{gw.port}", "--state-dir", state],
                              {"FORKVM_TOKEN": self.client_token,
                               "FORKVM_CLUSTER_TOKEN": self.cluster_token,
                               # Copies are logged at info (the default level).
                               "FORKVM_LOG": "info"}, gw.log_path)
        gw.api = TcpApi(gw.port, self.client_token)
        self.gateways.append(gw)
        self._wait_up(gw.proc, gw.api, f"gateway {name}", gw.log_path)
        # Wait until it has polled every node (placement needs their figures).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            c = gw.api.request("GET", "/v1/cluster")
            if all(n.get("state") == "alive" for n in c.get("nodes", [])) and \
                    len(c.get("nodes", [])) == len(nodes):
                return gw
            time.sleep(0.2)
        raise fb.BenchError(f"gateway {name} does not see every node alive: {c}")

    def stop(self) -> None:
        errors = []
        for node in self.nodes.values():
            if node.proc is None or node.proc.poll() is not None:
                continue
            try:
                ids = [s["id"] for s in node.api.list()]
            except Exception as e:  # noqa: BLE001 - best-effort cleanup
                errors.append(f"node {node.name}: list: {e}")
                ids = []
            for sid in ids:
                deadline = time.monotonic() + 120
                while True:
                    try:
                        node.api.delete(sid)
                        break
                    except fb.ApiError as e:
                        if e.status == 409 and time.monotonic() < deadline:
                            time.sleep(0.2)
                            continue
                        if e.status != 404:
                            errors.append(str(e))
                        break
                    except Exception as e:  # noqa: BLE001
                        errors.append(f"DELETE {sid}: {e}")
                        break
        procs = [g.proc for g in self.gateways] + [n.proc for n in self.nodes.values()]
        for p in procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            if p is None:
                continue
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                errors.append(f"pid {p.pid} ignored SIGTERM for 30 s; sent SIGKILL")
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()
        self.logs = []
        if self.dir:
            for pid in fb.qemu_pids_mentioning(self.dir):
                errors.append(f"killed leftover QEMU pid {pid}")
                fb.kill_pid_and_wait(pid)
            for node in self.nodes.values():
                shutil.rmtree(fb.run_dir_for_home(node.home), ignore_errors=True)
            shutil.rmtree(self.dir, ignore_errors=True)
        if errors:
            print("cleanup:\n  " + "\n  ".join(errors), flush=True)

    def leftovers(self) -> list[str]:
        """What of this rig is still there after stop(): QEMUs naming the
        dir, processes started, the dir itself."""
        out = []
        if self.dir:
            out += [f"QEMU pid {p}" for p in fb.qemu_pids_mentioning(self.dir)]
            if os.path.exists(self.dir):
                out.append(f"directory {self.dir}")
        for p in [g.proc for g in self.gateways] + [n.proc for n in self.nodes.values()]:
            if p is not None and p.poll() is None:
                out.append(f"process {p.pid}")
        return out
