"""A real local Ray cluster under forkvm.ray: two Ray nodes on 127.0.0.1
(``python -m forkvm.ray up``), a node service and a real ``forkvm serve``
on each, the supervisor and its gateway. It checks that both daemons come
up and report capacity, that every server listens on loopback only, that a
daemon that dies is started again and that a restarted node service adopts
the daemon it finds running, that a sandbox spawns through the endpoint, that
``examples/ray_rollout.py`` runs (with 4 children), that
killing one node's raylet (by PID) shows in nodes.json as ``alive: false``
with a reason within 30 s, that the node coming back (a new Ray node of the
same name) gets a new node service that adopts its daemon, and that
``down`` leaves nothing behind: no Ray,
daemon or QEMU process, no home, no Ray temp dir.

Needs Ray (``pip install forkvm[ray]``, done by scripts/setup.sh), root, the
guest artefacts in /var/lib/forkvm and a forkvm binary with ``serve --node``
and ``cluster gateway`` (``$FORKVM_BIN``, default ``<repo>/target/debug/forkvm``).
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
from pathlib import Path
from typing import Dict, Set

import pytest

import forkvm
from forkvm import Client
from forkvm.ray import _procs
from forkvm.ray._plan import free_port

REPO = Path(__file__).resolve().parents[3]
BIN = os.environ.get("FORKVM_BIN") or str(REPO / "target" / "debug" / "forkvm")
FIRST = 20  # node indices 20 and 21: off the ones a trial cluster on this host may use

pytestmark = pytest.mark.ray


def _children() -> Dict[int, Set[int]]:
    kids: Dict[int, Set[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            kids.setdefault(ppid, set()).add(int(entry))
    return kids


def _tree(roots) -> Dict[int, int]:
    """Every live descendant of ``roots`` (and the roots), as pid -> start time."""
    kids, out, todo = _children(), {}, list(roots)
    while todo:
        pid = todo.pop()
        started = _procs.start_time(pid)
        if started is not None and pid not in out:
            out[pid] = started
            todo.extend(kids.get(pid, ()))
    return out


def _name(pid: int) -> str:
    """A process's name (``comm``, at most 15 characters: Ray names an
    actor's worker ``ray::<Class>``)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _forkvm_ray(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, FORKVM_BIN=BIN)
    return subprocess.run(
        [sys.executable, "-m", "forkvm.ray", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _node(d: Path, name: str) -> dict:
    """One node as `status --json` shows it (empty when status fails)."""
    status = _forkvm_ray("status", "--json", "--dir", str(d), timeout=60)
    if status.returncode != 0:
        return {}
    return next((n for n in json.loads(status.stdout)["nodes"] if n["name"] == name), {})


def test_two_node_cluster_on_loopback():
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.fail("Ray is not installed: run scripts/setup.sh (it installs forkvm[ray] into .venv)")
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"no forkvm binary at {BIN}: run `cargo build -p forkvm-cli` or set FORKVM_BIN")
    help_text = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True).stdout
    if "--node" not in help_text:
        pytest.fail(f"{BIN} has no `serve --node` (issue 32): rebuild it")

    # Short: a daemon's home may have 64 bytes at most (pytest's tmp_path is longer).
    d = Path(tempfile.mkdtemp(prefix="fkr-test-", dir="/tmp")) / "cluster"
    # Node k listens on base+k: find two free ports in a row.
    while True:
        p = free_port()
        base = p - FIRST
        try:
            import socket

            socket.create_server(("127.0.0.1", p + 1)).close()
            break
        except OSError:
            continue
    t0 = time.monotonic()
    up = _forkvm_ray("up", "--nodes", "2", "--first-index", str(FIRST), "--dir", str(d), "--base-port", str(base))
    t_up = time.monotonic() - t0
    state = json.loads((d / "up.json").read_text()) if (d / "up.json").exists() else {}
    back = None
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.startswith("export FORKVM_URL=http://127.0.0.1:"), up.stdout
        cluster = json.loads((d / "cluster.json").read_text())
        assert (d / "cluster.json").stat().st_mode & 0o777 == 0o600
        assert set(cluster) >= {"url", "token", "cluster_token", "ray_address"}
        assert cluster["ray_address"].startswith("127.0.0.1:")

        # Both daemons answer with the cluster token and report capacity.
        status = _forkvm_ray("status", "--json", "--dir", str(d), timeout=60)
        assert status.returncode == 0, status.stderr
        nodes = {n["name"]: n for n in json.loads(status.stdout)["nodes"]}
        assert sorted(nodes) == ["n20", "n21"]
        for name, n in nodes.items():
            assert n["alive"] and n["capacity"]["memory_commit_mib"] > 0, n
            assert n["url"] == f"http://127.0.0.1:{base + int(name[1:])}"
            with Client(n["url"], cluster["cluster_token"]) as c:
                assert c.info().capacity is not None
            with pytest.raises(forkvm.Unauthorized):
                with Client(n["url"], "wrong") as c:
                    c.info()
        # Every Ray and forkvm server of the cluster listens on loopback only.
        pids = _tree(n["pid"] for n in state["ray_nodes"])
        pids.update({n["pid"]: 0 for n in nodes.values()})
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
        ours = [line for line in listening if any(f"pid={pid}," in line for pid in pids)]
        assert ours, "found none of the cluster's listening sockets"
        loopback = ("127.0.0.1", "[::ffff:127.0.0.1]")
        assert [line for line in ours if line.split()[3].rsplit(":", 1)[0] not in loopback] == []

        # n20's daemon exits: its node service starts it again.
        old = nodes["n20"]["pid"]
        os.kill(old, signal.SIGKILL)
        assert _procs.poll_until(lambda: _node(d, "n20").get("pid") not in (None, old), 30, 0.5), _node(d, "n20")
        n20 = _node(d, "n20")
        assert n20["restarts"] == 1 and n20["capacity"] is not None, n20
        # The node service's worker dies: Ray restarts the actor, which adopts the running daemon.
        service = n20["service_pid"]
        assert _name(service).startswith("ray::NodeServ"), _name(service)
        os.kill(service, signal.SIGKILL)
        assert _procs.wait_gone(service, None, 10)
        time.sleep(1)
        assert _procs.poll_until(lambda: _node(d, "n20").get("restarts") == 0, 60, 0.5), _node(d, "n20")
        assert _node(d, "n20")["pid"] == n20["pid"]  # the same daemon, adopted
        nodes["n20"]["pid"] = n20["pid"]

        # A sandbox through the cluster endpoint; `down` must remove it.
        with Client(cluster["url"], cluster["token"]) as c:
            sb = c.create_sandbox(network="none", memory_mib=256)
            assert sb.id.split("-")[1] in nodes
            assert c.exec(sb.id, ["echo", "hi"]).stdout == "hi\n"

        # The rollout example, small: children branched through the endpoint, scored from Ray tasks, removed.
        ex = subprocess.run(
            [sys.executable, str(REPO / "examples" / "ray_rollout.py"), "--count", "4", "--dir", str(d)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert ex.returncode == 0, ex.stdout + ex.stderr
        assert "4 rollouts scored" in ex.stdout and "removed 4 children and the parent" in ex.stdout, ex.stdout

        # Kill n21's raylet by PID: within 30 s nodes.json says it is dead, and why.
        n21 = next(n for n in state["ray_nodes"] if n["name"] == "n21")
        raylets = [pid for pid in _tree([n21["pid"]]) if _name(pid) == "raylet"]
        assert len(raylets) == 1, [_name(p) for p in _tree([n21["pid"]])]
        everything = _tree([n["pid"] for n in state["ray_nodes"]] + [n["pid"] for n in nodes.values()])
        os.kill(raylets[0], signal.SIGKILL)
        t_kill = time.monotonic()

        def dead() -> bool:
            doc = json.loads((d / "nodes.json").read_text())
            return any(n["name"] == "n21" and not n["alive"] for n in doc["nodes"])

        assert _procs.poll_until(dead, 30, 0.2), (d / "nodes.json").read_text()
        t_dead = time.monotonic() - t_kill
        doc = {n["name"]: n for n in json.loads((d / "nodes.json").read_text())["nodes"]}
        assert doc["n21"]["reason"].startswith("ray declared the node dead"), doc
        assert doc["n20"]["alive"] and doc["n20"]["reason"] is None

        # n21 comes back as a new Ray node of the same name: the supervisor replaces the dead node
        # service, and the new one adopts n21's daemon, which kept running.
        back = subprocess.Popen(
            [sys.executable, "-m", "forkvm.ray._raynode", "--name", "n21", "--address", cluster["ray_address"],
             "--temp-dir", str(d.parent / "ray-back")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        everything[back.pid] = _procs.start_time(back.pid) or 0
        t_back = time.monotonic()
        assert _procs.poll_until(lambda: _node(d, "n21").get("alive") and _node(d, "n21").get("pid"), 90, 1)
        t_back = time.monotonic() - t_back
        assert _node(d, "n21")["pid"] == nodes["n21"]["pid"], "the daemon that kept running was not adopted"
        everything.update(_tree([back.pid]))
    finally:
        t1 = time.monotonic()
        down = _forkvm_ray("down", "--dir", str(d))
        t_down = time.monotonic() - t1
        if back is not None:
            _procs.stop(back.pid, None, grace=20)
            _procs.stop_group(back.pid)
        home_left = d.exists()
        shutil.rmtree(d.parent, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert "removed 1 sandboxes" in down.stderr, down.stderr

    # Nothing left: no process of the cluster's trees (Ray, daemons, their QEMUs), no home, no Ray temp dir.
    left = {pid: _name(pid) for pid, started in everything.items() if _procs.is_running(pid, started or None)}
    assert not left, left
    assert not home_left
    assert state.get("ray_tmp") and not Path(state["ray_tmp"]).exists()
    print(
        f"up {t_up:.1f} s, death seen {t_dead:.1f} s after the raylet was killed, "
        f"back and adopted in {t_back:.1f} s, down {t_down:.1f} s"
    )
