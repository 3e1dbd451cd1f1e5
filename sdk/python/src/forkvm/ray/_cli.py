"""The commands behind ``forkvm cluster up|start|down`` (docs/cluster.md).

* ``up --nodes N [--dir DIR]``: a local trial. N Ray nodes on 127.0.0.1
  (``forkvm.ray._raynode``, dashboard off, temp dirs of their own), then
  ``start`` on them. Their PIDs go to ``DIR/up.json``.
* ``start [--address A] [--dir DIR]``: on a running Ray cluster (``ray start``
  on every host first): the supervisor actor, which starts a node service
  per node; waits until every node's daemon answers; writes
  ``DIR/cluster.json`` (mode 0600: url, token, cluster_token, ray_address).
* ``down [--dir DIR]``: every sandbox removed through its node's API, the
  daemons stopped by PID, the actors killed; after ``up`` also the Ray
  nodes (by PID) and the directories ``up`` made.
* ``status [--dir DIR]``: nodes, their daemons and capacity.

Progress goes to stderr, one line per step.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from . import _procs
from ._plan import DEFAULT_BASE_PORT, NAMESPACE, SUPERVISOR, free_port, read_json, write_atomic

DEFAULT_DIR = "/var/lib/forkvm-cluster"


def _say(msg: str) -> None:
    print(f"forkvm.ray: {msg}", file=sys.stderr, flush=True)


def _loopback(address: Optional[str]) -> bool:
    return bool(address) and address.split(":", 1)[0] in ("127.0.0.1", "localhost")


def _ray_connect(address: Optional[str]):
    # A loopback cluster (from `up`) is only reachable with Ray's single-host
    # setting, which must be in place before Ray is imported (see _raynode).
    if _loopback(address):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
    return ray


# -- up ----------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    d = os.path.abspath(args.dir)
    if not _dir_fits(d):
        return 2
    state_path = os.path.join(d, "up.json")
    old = read_json(state_path)
    if old and any(_procs.is_running(n["pid"], n.get("started")) for n in old.get("ray_nodes", [])):
        _say(f"a cluster from `up` already runs in {d}; stop it with `python -m forkvm.ray down --dir {d}`")
        return 1
    if args.nodes < 1 or not 1 <= args.first_index <= args.first_index + args.nodes - 1 <= 23:
        _say("--nodes N and --first-index K must keep the node indices K..K+N-1 within 1-23")
        return 2
    created = not os.path.exists(d)
    os.makedirs(d, mode=0o700, exist_ok=True)
    # Short: Ray's unix socket paths under it must stay within 107 bytes.
    ray_tmp = tempfile.mkdtemp(prefix="forkvm-ray-", dir="/tmp")
    port = free_port()
    state: Dict[str, Any] = {
        "created_dir": created,
        "ray_tmp": ray_tmp,
        "ray_address": f"127.0.0.1:{port}",
        "ray_nodes": [],
    }
    write_atomic(state_path, state, mode=0o600)
    t0 = time.monotonic()
    try:
        for k in range(args.first_index, args.first_index + args.nodes):
            name = f"n{k}"
            argv = [
                sys.executable,
                "-m",
                "forkvm.ray._raynode",
                "--name",
                name,
                "--temp-dir",
                os.path.join(ray_tmp, name),
                "--num-cpus",
                str(args.cpus_per_node),
            ]
            argv += ["--head", "--port", str(port)] if k == args.first_index else ["--address", f"127.0.0.1:{port}"]
            with open(os.path.join(d, f"ray-{name}.log"), "ab") as out:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            state["ray_nodes"].append({"name": name, **_procs.record(proc.pid)})
            write_atomic(state_path, state, mode=0o600)
            _say(f"ray node {name} starting (pid {proc.pid})")
            if k == args.first_index and not _procs.poll_until(
                lambda p=proc: _port_open(port) or p.poll() is not None, 60
            ):
                raise RuntimeError(f"the Ray head did not open port {port}; see {d}/ray-{name}.log")
            if proc.poll() is not None:
                raise RuntimeError(f"ray node {name} exited with {proc.returncode}; see {d}/ray-{name}.log")
        ray = _ray_connect(state["ray_address"])
        if not _procs.poll_until(lambda: sum(1 for n in ray.nodes() if n["Alive"]) >= args.nodes, 120, 0.5):
            raise RuntimeError(f"not all {args.nodes} Ray nodes joined within 120 s; see {d}/ray-*.log")
        _say(f"{args.nodes} Ray nodes on 127.0.0.1 in {time.monotonic() - t0:.1f} s (address {state['ray_address']})")
        args.address = state["ray_address"]
        code = cmd_start(args)
        if code != 0:
            raise RuntimeError("the forkvm part did not start")
        return code
    except BaseException as e:
        _say(f"up failed: {e}; stopping what it started")
        cmd_down(argparse.Namespace(dir=d, quiet=True))
        if isinstance(e, Exception):
            return 1
        raise


def _dir_fits(d: str) -> bool:
    # A daemon refuses a home over 64 bytes (its sandboxes' unix sockets must fit 107).
    longest = os.path.join(d, "nodes", "n" * 16, "home")
    if len(longest.encode()) > 64:
        _say(
            f"--dir {d} is too long: node homes under it ({longest}) would pass the 64 bytes a forkvm home "
            f"may have; use a directory of at most {64 - len(longest.encode()) + len(d.encode())} bytes"
        )
        return False
    return True


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# -- start -------------------------------------------------------------------


def cmd_start(args: argparse.Namespace) -> int:
    from ._supervisor import Settings, Supervisor

    d = os.path.abspath(args.dir)
    if not _dir_fits(d):
        return 2
    os.makedirs(d, mode=0o700, exist_ok=True)
    ray = _ray_connect(args.address)
    try:
        ray.get_actor(SUPERVISOR, namespace=NAMESPACE)
        _say(f"a forkvm supervisor already runs in this Ray cluster; `down --dir {d}` first")
        return 1
    except ValueError:
        pass
    head_ip = next(
        (n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]),
        "127.0.0.1",
    )
    listen = args.gateway_listen or f"{head_ip}:{args.gateway_port or free_port()}"
    settings = Settings(
        dir=d,
        token=secrets.token_hex(24),
        cluster_token=secrets.token_hex(24),
        gateway_listen=listen,
        base_port=args.base_port,
        binary=os.environ.get("FORKVM_BIN") or shutil.which("forkvm") or "forkvm",
        artifacts=os.environ.get("FORKVM_ARTIFACTS") or "/var/lib/forkvm",
        serve_args=tuple(args.serve_arg),
        registry=args.registry,
        registry_insecure=args.registry_insecure,
        registry_user=os.environ.get("FORKVM_REGISTRY_USER"),
        registry_password=os.environ.get("FORKVM_REGISTRY_PASSWORD"),
    )
    address = args.address or ray.get_runtime_context().gcs_address
    cluster = {
        "url": settings.url,
        "token": settings.token,
        "cluster_token": settings.cluster_token,
        "ray_address": address,
        "namespace": NAMESPACE,
        "dir": d,
    }
    write_atomic(os.path.join(d, "cluster.json"), cluster, mode=0o600)
    ray.remote(Supervisor).options(
        name=SUPERVISOR,
        namespace=NAMESPACE,
        lifetime="detached",
        max_restarts=-1,
        num_cpus=0,
        max_concurrency=4,
        resources={"node:__internal_head__": 0.001},
    ).remote(settings)
    _say(f"supervisor {SUPERVISOR} started; waiting for the node daemons")
    want = sum(1 for n in ray.nodes() if n["Alive"])
    t0 = time.monotonic()
    seen: Dict[str, Dict[str, Any]] = {}
    errors: set = set()
    while time.monotonic() - t0 < args.timeout:
        for name, desc in _describe_all(ray, timeout=5).items():
            if desc.get("error") and desc["error"] not in errors:
                errors.add(desc["error"])
                _say(f"node {name}: {desc['error'][-500:]}")
            if name not in seen and desc.get("capacity") is not None:
                seen[name] = desc
                _say(
                    f"node {name}: forkvm serve pid {desc['pid']} at {desc['url']} "
                    f"({desc['capacity']['memory_left_mib']} MiB free)"
                )
        if len(seen) >= want:
            break
        time.sleep(0.5)
    else:
        _say(f"only {len(seen)} of {want} node daemons answered within {args.timeout} s; see {d}/nodes/*/serve.log")
        return 1
    _say(f"cluster endpoint {settings.url} with {len(seen)} nodes (credentials in {d}/cluster.json)")
    # On stdout, for `eval "$(python -m forkvm.ray up --nodes 3)"`: the CLI and SDKs then use the endpoint.
    print(f"export FORKVM_URL={shlex.quote(settings.url)} FORKVM_TOKEN={shlex.quote(settings.token)}")
    return 0


def _describe_all(ray, timeout: float) -> Dict[str, Dict[str, Any]]:
    try:
        sup = ray.get_actor(SUPERVISOR, namespace=NAMESPACE)
        services = ray.get(sup.node_services.remote(), timeout=timeout)
    except Exception:
        return {}
    refs = {name: h.describe.remote() for name, h in services.items()}
    out = {}
    for name, ref in refs.items():
        try:
            out[name] = ray.get(ref, timeout=timeout)
        except Exception as e:
            out[name] = {"name": name, "error": str(e), "capacity": None}
    return out


# -- down --------------------------------------------------------------------


def cmd_down(args: argparse.Namespace) -> int:
    d = os.path.abspath(args.dir)
    cluster = read_json(os.path.join(d, "cluster.json")) or {}
    up = read_json(os.path.join(d, "up.json")) or {}
    address = cluster.get("ray_address") or up.get("ray_address")
    ray_nodes: List[Dict[str, Any]] = up.get("ray_nodes", [])
    ray_alive = any(_procs.is_running(n["pid"], n.get("started")) for n in ray_nodes) or (address and not up)
    if address and ray_alive:
        try:
            _down_actors(_ray_connect(address))
        except Exception as e:
            _say(f"cannot reach Ray at {address} ({e}); stopping the daemons directly")
    # Daemons whose service could not do it (or was gone): by their pid files.
    nodes_dir = os.path.join(d, "nodes")
    for name in sorted(os.listdir(nodes_dir)) if os.path.isdir(nodes_dir) else []:
        rec = _procs.read_record(os.path.join(nodes_dir, name, "serve.pid"))
        if rec and _procs.is_running(rec["pid"], rec.get("started")):
            _remove_sandboxes_direct(d, name, cluster.get("cluster_token"))
            _procs.stop(rec["pid"], rec.get("started"), grace=20.0)
            _say(f"node {name}: forkvm serve pid {rec['pid']} stopped")
        else:
            _sweep_orphaned_home(d, name)
        # A daemon no record names (its record replaced or removed while it
        # ran) still holds its home's lock: stop it by that.
        for pid in _procs.lock_holders(os.path.join(nodes_dir, name, "home", "daemon.lock")):
            _procs.stop(pid, None, grace=20.0)
            _say(f"node {name}: forkvm serve pid {pid}, which no record named, still held its home; stopped")
    if "ray" in sys.modules:
        sys.modules["ray"].shutdown()
    for n in reversed(ray_nodes):
        if _procs.stop(n["pid"], n.get("started"), grace=30.0):
            _say(f"ray node {n['name']} (pid {n['pid']}) stopped")
    for n in ray_nodes:
        # Each node runs in a process group of its own (start_new_session): whatever Ray
        # left of it (an agent its raylet did not take down) goes too.
        left = _procs.stop_group(n["pid"])
        if left:
            _say(f"ray node {n['name']}: stopped {len(left)} leftover processes {left}")
    if up:
        shutil.rmtree(up.get("ray_tmp") or "/nonexistent", ignore_errors=True)
        if up.get("created_dir"):
            shutil.rmtree(d, ignore_errors=True)
        else:
            shutil.rmtree(nodes_dir, ignore_errors=True)
            for f in ("up.json", "cluster.json", "nodes.json"):
                _unlink(os.path.join(d, f))
    else:
        _unlink(os.path.join(d, "cluster.json"))
    if not getattr(args, "quiet", False):
        _say("down")
    return 0


def _down_actors(ray) -> None:
    try:
        sup = ray.get_actor(SUPERVISOR, namespace=NAMESPACE)
    except ValueError:
        return
    try:
        services = ray.get(sup.node_services.remote(), timeout=30)
        ray.get(sup.stop.remote(), timeout=30)
    except Exception as e:
        _say(f"supervisor did not answer: {e}")
        services = {}
    ray.kill(sup, no_restart=True)
    refs = {name: h.shutdown.remote() for name, h in services.items()}
    for name, ref in refs.items():
        try:
            removed = ray.get(ref, timeout=300)
            _say(f"node {name}: removed {len(removed)} sandboxes, stopped forkvm serve")
        except Exception as e:
            _say(f"node {name}: shutdown failed: {e}")
        ray.kill(services[name], no_restart=True)


def _last_serve_argv(log: str) -> Optional[List[str]]:
    """The node's last ``forkvm serve`` command line, as its service logged it (``--- TIME ARGV``)."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith("--- ")]
    except OSError:
        return None
    return shlex.split(lines[-1].split(" ", 2)[2]) if lines else None


def _sweep_orphaned_home(d: str, name: str) -> None:
    """A node whose daemon died (killed with its Ray node) leaves its QEMUs
    running: a daemon keeps its sandboxes across its own death so the next one
    adopts them. Start it again on that home, on its unix socket only, remove
    what it adopted, and stop it, so nothing of the node is left running."""
    from ..client import Client

    node_dir = os.path.join(d, "nodes", name)
    home = os.path.join(node_dir, "home")
    sandboxes = os.path.join(home, "sandboxes")
    if not os.path.isdir(sandboxes) or not os.listdir(sandboxes):
        return
    argv = _last_serve_argv(os.path.join(node_dir, "serve.log"))
    if not argv:
        _say(f"node {name}: its daemon is gone and left sandboxes in {home}, but no command line to restart it")
        return
    if "--listen" in argv:
        i = argv.index("--listen")
        del argv[i : i + 2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKVM_")}
    with open(os.path.join(node_dir, "serve.log"), "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True)
    removed = 0
    try:
        url = "unix://" + os.path.join(home, "forkvm.sock")
        with Client(url, None, timeout=120.0) as c:
            if not _procs.poll_until(lambda: _answers(c), 60, 0.5):
                _say(f"node {name}: the daemon restarted to clean up did not answer; see {node_dir}/serve.log")
                return
            for sb in c.list_sandboxes().sandboxes:
                c.delete_sandbox(sb.id)
                removed += 1
    except Exception as e:
        _say(f"node {name}: cleaning up after its dead daemon: {e}")
    finally:
        _procs.stop(proc.pid, None, grace=20.0)
    _say(f"node {name}: its daemon had died; {removed} sandbox(es) it left were removed")


def _answers(c) -> bool:
    try:
        c.health()
        return True
    except Exception:
        return False


def _remove_sandboxes_direct(d: str, name: str, token: Optional[str]) -> None:
    from ..client import Client

    doc = read_json(os.path.join(d, "nodes.json")) or {"nodes": []}
    url = next((n["url"] for n in doc["nodes"] if n["name"] == name), None)
    if not url or not token:
        return
    try:
        with Client(url, token, timeout=120.0) as c:
            for sb in c.list_sandboxes().sandboxes:
                c.delete_sandbox(sb.id)
    except Exception as e:
        _say(f"node {name}: removing sandboxes through {url}: {e}")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- status ------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    d = os.path.abspath(args.dir)
    cluster = read_json(os.path.join(d, "cluster.json"))
    if cluster is None:
        _say(f"no cluster in {d} (no cluster.json)")
        return 1
    ray = _ray_connect(cluster["ray_address"])
    descs = _describe_all(ray, timeout=10)
    doc = read_json(os.path.join(d, "nodes.json")) or {"nodes": []}
    out = {"url": cluster["url"], "nodes": []}
    for n in doc["nodes"]:
        desc = descs.get(n["name"], {})
        out["nodes"].append(
            {**n, **{k: desc.get(k) for k in ("pid", "service_pid", "restarts", "sandboxes", "capacity", "error")}}
        )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"endpoint {out['url']}")
    print(f"{'NODE':<8} {'STATE':<6} {'URL':<24} {'PID':>8} {'SANDBOXES':>9} {'MEM LEFT':>9}  REASON")
    for n in out["nodes"]:
        cap = n.get("capacity") or {}
        print(
            f"{n['name']:<8} {'alive' if n['alive'] else 'dead':<6} {n['url']:<24} {n.get('pid') or '-':>8} "
            f"{n.get('sandboxes') if n.get('sandboxes') is not None else '-':>9} "
            f"{str(cap.get('memory_left_mib', '-')) + ' MiB':>9}  {n.get('reason') or n.get('error') or ''}"
        )
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m forkvm.ray", description="forkvm cluster on Ray (docs/cluster.md)")
    sub = p.add_subparsers(dest="cmd", required=True)
    default_dir = os.environ.get("FORKVM_CLUSTER_DIR") or DEFAULT_DIR

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--dir", default=default_dir, help=f"cluster directory (default: $FORKVM_CLUSTER_DIR or {DEFAULT_DIR})"
        )

    def starting(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT, help="node k's daemon listens on BASE+k")
        sp.add_argument("--gateway-port", type=int, help="the endpoint's port (default: a free one)")
        sp.add_argument("--gateway-listen", help="the endpoint's ADDR:PORT (default: the head's address)")
        sp.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the node daemons")
        sp.add_argument(
            "--serve-arg",
            action="append",
            default=[],
            metavar="ARG",
            help="an option for every node's `forkvm serve`, e.g. --serve-arg=--max-sandboxes=50 (repeatable)",
        )
        sp.add_argument(
            "--registry",
            metavar="HOST[:PORT]/REPO",
            help="move snapshots between nodes through this registry (credentials from FORKVM_REGISTRY_USER "
            "and FORKVM_REGISTRY_PASSWORD) instead of the nodes' own /v2 endpoints",
        )
        sp.add_argument("--registry-insecure", action="store_true", help="the registry speaks plain HTTP")

    sp = sub.add_parser("up", help="a local trial cluster: N Ray nodes on 127.0.0.1 with a daemon each")
    sp.add_argument("--nodes", type=int, required=True)
    sp.add_argument("--cpus-per-node", type=int, default=2)
    sp.add_argument(
        "--first-index",
        type=int,
        default=1,
        help="name the nodes nK, nK+1, ... (another trial cluster on the same host needs other indices)",
    )
    common(sp)
    starting(sp)
    sp = sub.add_parser("start", help="forkvm on a running Ray cluster (after `ray start` on every host)")
    sp.add_argument("--address", help="the Ray cluster (default: auto)")
    common(sp)
    starting(sp)
    sp = sub.add_parser("down", help="remove every sandbox, stop the daemons and what `up` started")
    common(sp)
    sp = sub.add_parser("status", help="nodes, daemons and capacity")
    sp.add_argument("--json", action="store_true")
    common(sp)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return {"up": cmd_up, "start": cmd_start, "down": cmd_down, "status": cmd_status}[args.cmd](args)
