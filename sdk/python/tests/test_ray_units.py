"""The pure parts of forkvm.ray (no Ray, no daemon): node names and labels,
per-node ranges and the daemon's command line, artefact links, nodes.json
from ``ray.nodes()`` and its atomic writing, PID records, and pickling of
sandbox handles."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

import forkvm
from forkvm import AsyncClient, AsyncSandbox, Client, Sandbox, models
from forkvm.ray import _plan, _procs
from forkvm.ray._plan import NodePlan


def test_node_names_from_labels_and_hosts():
    assert _plan.node_name({"forkvm.dev/node": "n1"}, "whatever") == "n1"
    assert _plan.node_name({}, "Worker-07.example.com") == "worker07"
    assert _plan.node_name({}, "7host") == "h7host"
    assert _plan.node_name({}, "a-very-long-host-name-indeed") == "averylonghostnam"
    assert _plan.node_name({"ray.io/node-id": "abc"}, "gpu3") == "gpu3"
    for bad in ("N1", "1n", "n-1", "", "n" * 17, "nö"):
        with pytest.raises(ValueError, match="1-16 characters"):
            _plan.node_name({"forkvm.dev/node": bad} if bad else {"forkvm.dev/node": "-"}, "h")
    assert _plan.service_name("n2") == "forkvm-node-n2"


def test_node_index():
    assert _plan.node_index("n1", {}) == 1
    assert _plan.node_index("n17", {}) == 17
    assert _plan.node_index("gpu3", {}) == 1  # not n<k>: nodes on other hosts may share an index
    assert _plan.node_index("gpu3", {"forkvm.dev/index": "4"}) == 4
    with pytest.raises(ValueError, match="out of range"):
        _plan.node_index("n0", {})
    with pytest.raises(ValueError, match="out of range"):
        _plan.node_index("n24", {})
    with pytest.raises(ValueError, match="not a number"):
        _plan.node_index("x", {"forkvm.dev/index": "two"})


def test_ranges_and_serve_argv():
    p = NodePlan("n3", 3, "127.0.0.1", 7100, "/c")
    assert (p.port, p.url) == (7103, "http://127.0.0.1:7103")
    assert p.net_pool == "10.234.0.0/16"
    assert p.jail_uids == "3300000-3399999"
    assert p.home == "/c/nodes/n3/home"
    assert p.serve_argv("/bin/forkvm") == [
        "/bin/forkvm", "serve", "--home", "/c/nodes/n3/home", "--node", "n3",
        "--listen", "127.0.0.1:7103", "--net-pool", "10.234.0.0/16", "--jail-uids", "3300000-3399999",
    ]  # fmt: skip
    assert "--node" not in p.serve_argv("forkvm", with_node=False)
    # Every index keeps off the plain daemon's pool (10.231/16) and uids (2000000-2999999), and off each other.
    plans = [NodePlan(f"n{k}", k, "127.0.0.1", 7100, "/c") for k in range(1, _plan.MAX_INDEX + 1)]
    pools = {p.net_pool for p in plans}
    assert len(pools) == len(plans) and "10.231.0.0/16" not in pools
    assert all(int(p.net_pool.split(".")[1]) <= 254 for p in plans)
    uids = sorted(tuple(map(int, p.jail_uids.split("-"))) for p in plans)
    assert uids[0][0] > 2999999
    assert all(a[1] < b[0] for a, b in zip(uids, uids[1:]))


def test_link_artifacts(tmp_path):
    art = tmp_path / "art"
    (art / "guest").mkdir(parents=True)
    (art / "images" / "default").mkdir(parents=True)
    (art / "images" / "py").mkdir()
    home = tmp_path / "home"
    _plan.link_artifacts(str(home), str(art))
    _plan.link_artifacts(str(home), str(art))  # idempotent
    assert os.readlink(home / "guest") == str(art / "guest")
    assert sorted(os.listdir(home / "images")) == ["default", "py"]
    assert os.readlink(home / "images" / "py") == str(art / "images" / "py")
    (home / "images" / "mine").mkdir()  # the node's own image stays
    _plan.link_artifacts(str(home), str(art))
    assert (home / "images" / "mine").is_dir() and not (home / "images" / "mine").is_symlink()
    with pytest.raises(FileNotFoundError, match="FORKVM_ARTIFACTS"):
        _plan.link_artifacts(str(home), str(tmp_path / "none"))


def _ray_node(name, alive, ip="127.0.0.1", reason="", node_id="x"):
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": ip,
        "NodeManagerHostname": "host",
        "DeathReasonMessage": reason,
        "Labels": {"forkvm.dev/node": name} if name else {},
    }


def test_nodes_document():
    doc = _plan.nodes_document(
        [
            _ray_node("n2", True),
            _ray_node("n1", False, reason="health check failed"),
            _ray_node("n3", False, reason="", node_id="old"),
            _ray_node("n3", True, node_id="new"),  # came back: the alive entry wins
            _ray_node("N-bad", True),  # left out
            _ray_node("n4", False, reason=""),
        ],
        base_port=7100,
        dir="/c",
    )
    assert doc == {
        "nodes": [
            {"name": "n1", "url": "http://127.0.0.1:7101", "alive": False,
             "reason": "ray declared the node dead: health check failed"},
            {"name": "n2", "url": "http://127.0.0.1:7102", "alive": True, "reason": None},
            {"name": "n3", "url": "http://127.0.0.1:7103", "alive": True, "reason": None},
            {"name": "n4", "url": "http://127.0.0.1:7104", "alive": False, "reason": "ray declared the node dead"},
        ]
    }  # fmt: skip
    # A host-named node on another host.
    doc = _plan.nodes_document([_ray_node(None, True, ip="10.0.0.5")], 7100, "/c")
    assert doc["nodes"] == [{"name": "host", "url": "http://10.0.0.5:7101", "alive": True, "reason": None}]


def test_write_atomic(tmp_path):
    path = str(tmp_path / "nodes.json")
    assert _plan.write_atomic(path, {"nodes": []}, mode=0o600)
    assert json.load(open(path)) == {"nodes": []}
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert not _plan.write_atomic(path, {"nodes": []})  # unchanged: not rewritten
    assert os.listdir(tmp_path) == ["nodes.json"]  # no temp file left

    # A reader never sees a partial file while a writer keeps replacing it.
    big = {"nodes": [{"name": f"n{i}", "url": "http://127.0.0.1:1", "alive": True, "reason": "x" * 500}
                     for i in range(200)]}  # fmt: skip
    stop = threading.Event()
    seen = []

    def reader():
        while not stop.is_set():
            with open(path) as f:
                seen.append(len(json.load(f)["nodes"]))  # raises on a torn file

    t = threading.Thread(target=reader)
    t.start()
    for i in range(300):
        _plan.write_atomic(path, big if i % 2 else {"nodes": []})
    stop.set()
    t.join()
    assert set(seen) <= {0, 200} and len(seen) > 0
    assert os.listdir(tmp_path) == ["nodes.json"]


def test_pid_records(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rec = _procs.record(child.pid)
        assert rec["started"] and _procs.is_running(child.pid, rec["started"])
        assert not _procs.is_running(child.pid, rec["started"] + 1)  # another process with that pid
        path = str(tmp_path / "serve.pid")
        _procs.write_record(path, rec)
        assert _procs.read_record(path) == rec
        assert _procs.stop(child.pid, rec["started"], grace=5)
        assert not _procs.is_running(child.pid, rec["started"])
        assert not _procs.stop(child.pid, rec["started"])  # already gone
    finally:
        if child.poll() is None:
            child.kill()
    assert _procs.read_record(str(tmp_path / "none")) is None


def test_die_with_parent():
    # A child started with die_with_parent dies when its parent does.
    code = (
        "import subprocess, sys, time\n"
        "from forkvm.ray import _procs\n"
        "argv = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        "p = subprocess.Popen(argv, preexec_fn=_procs.die_with_parent)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(parent.stdout.readline())
    started = _procs.start_time(grandchild)
    parent.kill()
    parent.wait()
    assert _procs.wait_gone(grandchild, started, 10), "the child outlived its parent"


_INFO = {
    "id": "sb-n1-0123456789ab",
    "state": "running",
    "image": "default",
    "memory_mib": 256,
    "cpus": 1,
    "accel": "tcg",
    "created_at": "2026-01-01T00:00:00Z",
}


def test_sandbox_pickles_as_url_token_id():
    client = Client("http://127.0.0.1:9", "tok")
    sb = Sandbox._wrap(client, models.Sandbox.from_dict(_INFO))
    data = pickle.dumps(sb)
    assert b"tok" in data and b"http://127.0.0.1:9" in data and b"sb-n1-0123456789ab" in data
    copy = pickle.loads(data)
    assert isinstance(copy, Sandbox) and copy == sb and copy.state == "running"
    assert copy.client.endpoint.base_url == "http://127.0.0.1:9" and copy.client.endpoint.token == "tok"
    # Unpickled twice in one process: one client for the endpoint.
    assert pickle.loads(data).client is copy.client
    # Pickled again without being used: the same endpoint.
    again = pickle.loads(pickle.dumps(pickle.loads(data)))
    assert again.client.endpoint.base_url == "http://127.0.0.1:9"
    # A unix socket endpoint keeps its path.
    sock = Sandbox._wrap(Client("unix:///run/x.sock"), models.Sandbox.from_dict(_INFO))
    assert pickle.loads(pickle.dumps(sock)).client.endpoint.uds == "/run/x.sock"
    client.close()


def test_async_sandbox_pickles_and_connects_in_its_loop():
    async def make():
        client = AsyncClient("http://127.0.0.1:9", "tok")
        sb = AsyncSandbox._wrap(client, models.Sandbox.from_dict(_INFO))
        data = pickle.dumps(sb)
        await client.aclose()
        return data

    data = asyncio.run(make())
    copy = pickle.loads(data)  # no running loop needed to unpickle

    async def use():
        assert copy.client.endpoint.token == "tok"
        with pytest.raises(forkvm.DaemonUnreachable):
            await copy.refresh()  # a real request to the (closed) port

    asyncio.run(use())
    assert copy.id == "sb-n1-0123456789ab"


def test_cli_refuses_bad_input(tmp_path):
    from forkvm.ray._cli import main

    assert main(["up", "--nodes", "3", "--first-index", "22", "--dir", str(tmp_path / "c")]) == 2
    assert main(["status", "--dir", str(tmp_path / "none")]) == 1
    t = time.monotonic()
    assert main(["down", "--dir", str(tmp_path / "none")]) == 0  # nothing to stop
    assert time.monotonic() - t < 5


def test_lock_holders_names_the_process_holding_a_home(tmp_path):
    lock = tmp_path / "daemon.lock"
    lock.touch()
    assert _procs.lock_holders(str(lock)) == []
    # A process that holds the lock the way a daemon holds its home's.
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl,sys,time; f=open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(lock)],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"held"
        assert _procs.lock_holders(str(lock)) == [holder.pid]
        assert _procs.lock_holders(str(tmp_path / "other")) == []
    finally:
        holder.kill()
        holder.wait()
    assert _procs.lock_holders(str(lock)) == []
