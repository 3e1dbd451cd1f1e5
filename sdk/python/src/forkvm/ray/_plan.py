"""The pure part of Ray supervision: names, per-node ranges, the daemon's
command line and nodes.json. No Ray and no processes here, so all of it is
unit-tested (tests/test_ray_units.py).

A node has a name (``n1``, ``gpu3``: 1-16 of ``[a-z0-9]``, starting with a
letter; the daemon refuses anything else) and an index ``k`` (1, 2, ...).
The index keeps daemons that share a host apart: node ``k`` listens on
``base_port + k`` and gets the net pool ``10.<231+k>.0.0/16`` and the jail
uids ``3000000+k*100000`` to ``+99999``. It starts at 1, so no node takes the
pool (10.231/16) or the uids (2000000-2999999) of a plain ``forkvm serve``
on the same host.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

#: The Ray node label that names a node's forkvm node (``ray start --labels forkvm.dev/node=n1``).
NAME_LABEL = "forkvm.dev/node"
#: The Ray node label that gives its index when the name does not (``forkvm.dev/index=3``).
INDEX_LABEL = "forkvm.dev/index"
#: Namespace of the named actors.
NAMESPACE = "forkvm"
#: The supervisor's actor name.
SUPERVISOR = "forkvm-gateway"
#: Where node daemons listen by default: ``DEFAULT_BASE_PORT + k``.
DEFAULT_BASE_PORT = 7100
#: Indices fit the net pools 10.232/16 .. 10.254/16.
MAX_INDEX = 23

_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")


def service_name(node: str) -> str:
    """The node service actor's name: ``forkvm-node-<NAME>``."""
    return f"forkvm-node-{node}"


def check_name(name: str) -> str:
    """``name`` if it is a valid node name, else ValueError saying what is allowed."""
    if not _NAME.match(name):
        raise ValueError(
            f"node name {name!r} is not valid: use 1-16 characters of a-z and 0-9, starting with a letter "
            f"(set it with `ray start --labels {NAME_LABEL}=NAME`)"
        )
    return name


def name_from_host(hostname: str) -> str:
    """A node name made from a host name: its first label, lower case, only ``[a-z0-9]``, 16 at most.

    A name that would not start with a letter gets an ``h`` in front.
    """
    first = hostname.split(".", 1)[0].lower()
    kept = "".join(c for c in first if c.isascii() and c.isalnum())
    if not kept or not kept[0].isalpha():
        kept = "h" + kept
    return check_name(kept[:16])


def node_name(labels: Mapping[str, str], hostname: str) -> str:
    """A Ray node's forkvm name: its ``forkvm.dev/node`` label, else from its host name."""
    label = labels.get(NAME_LABEL)
    if label:
        return check_name(label)
    return name_from_host(hostname)


def node_index(name: str, labels: Mapping[str, str]) -> int:
    """The node's index ``k``: the ``forkvm.dev/index`` label, else the digits of a name ``n<k>``, else 1.

    Two nodes on one host need different indices; nodes on different hosts
    may share one (their ports, pools and uids are per host).
    """
    raw = labels.get(INDEX_LABEL)
    if raw is None:
        m = re.match(r"^n([0-9]+)$", name)
        raw = m.group(1) if m else "1"
    try:
        k = int(raw)
    except ValueError:
        raise ValueError(f"node {name}: label {INDEX_LABEL}={raw!r} is not a number") from None
    if not 1 <= k <= MAX_INDEX:
        raise ValueError(f"node {name}: index {k} is out of range 1-{MAX_INDEX} (net pools 10.232-10.254)")
    return k


@dataclass(frozen=True)
class NodePlan:
    """Everything about one node's daemon that follows from its name, index and the cluster's settings."""

    name: str
    index: int
    ip: str
    base_port: int
    dir: str

    @property
    def port(self) -> int:
        return self.base_port + self.index

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"

    @property
    def net_pool(self) -> str:
        return f"10.{231 + self.index}.0.0/16"

    @property
    def jail_uids(self) -> str:
        first = 3000000 + self.index * 100000
        return f"{first}-{first + 99999}"

    @property
    def node_dir(self) -> str:
        return os.path.join(self.dir, "nodes", self.name)

    @property
    def home(self) -> str:
        return os.path.join(self.node_dir, "home")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.node_dir, "serve.pid")

    @property
    def log_file(self) -> str:
        return os.path.join(self.node_dir, "serve.log")

    def serve_argv(self, binary: str, with_node: bool = True) -> List[str]:
        """``forkvm serve`` for this node (``with_node=False`` leaves out ``--node``, for daemons without it)."""
        argv = [binary, "serve", "--home", self.home]
        if with_node:
            argv += ["--node", self.name]
        argv += [
            "--listen",
            f"{self.ip}:{self.port}",
            "--net-pool",
            self.net_pool,
            "--jail-uids",
            self.jail_uids,
        ]
        return argv


def link_artifacts(home: str, artifacts: str) -> None:
    """Give a daemon home ``guest/`` and ``images/<each>`` as links into ``artifacts`` (idempotent).

    Images are linked one by one, so the node's own imports and builds stay in its home.
    """
    guest = os.path.join(artifacts, "guest")
    if not os.path.isdir(guest):
        raise FileNotFoundError(
            f"no guest artefacts in {artifacts} (set FORKVM_ARTIFACTS, or run scripts/setup.sh there)"
        )
    os.makedirs(os.path.join(home, "images"), exist_ok=True)
    _link(guest, os.path.join(home, "guest"))
    images = os.path.join(artifacts, "images")
    for entry in sorted(os.listdir(images)) if os.path.isdir(images) else []:
        src = os.path.join(images, entry)
        if os.path.isdir(src):
            _link(src, os.path.join(home, "images", entry))


def _link(src: str, dst: str) -> None:
    if os.path.islink(dst) and os.readlink(dst) == src:
        return
    if os.path.lexists(dst):
        if not os.path.islink(dst):
            return  # the node's own: leave it
        os.unlink(dst)
    os.symlink(src, dst)


def nodes_document(ray_nodes: Sequence[Mapping[str, Any]], base_port: int, dir: str) -> Dict[str, Any]:
    """nodes.json's content from ``ray.nodes()``.

    Every Ray node with a valid name appears once: an alive entry wins over
    dead ones of the same name (a node that came back has a new Ray id);
    a node only seen dead gets ``alive: false`` and Ray's death reason.
    Nodes whose name cannot be made valid are left out.
    """
    entries: Dict[str, Dict[str, Any]] = {}
    for node in ray_nodes:
        labels = node.get("Labels") or {}
        try:
            name = node_name(labels, node.get("NodeManagerHostname") or "")
            index = node_index(name, labels)
        except ValueError:
            continue
        plan = NodePlan(name, index, node.get("NodeManagerAddress") or "127.0.0.1", base_port, dir)
        alive = bool(node.get("Alive"))
        entry = {"name": name, "url": plan.url, "alive": alive, "reason": None if alive else death_reason(node)}
        if name not in entries or (alive and not entries[name]["alive"]):
            entries[name] = entry
    return {"nodes": [entries[n] for n in sorted(entries)]}


def death_reason(node: Mapping[str, Any]) -> str:
    """Why Ray declared ``node`` dead, in words."""
    message = (node.get("DeathReasonMessage") or "").strip()
    return f"ray declared the node dead: {message}" if message else "ray declared the node dead"


def write_atomic(path: str, data: Any, mode: int = 0o644) -> bool:
    """Write ``data`` as JSON to ``path`` by a temp file in the same directory and a rename.

    Readers see the old file or the new one, never a part. Returns False
    (and writes nothing) when the file already holds exactly this content,
    so a reader watching the file sees a change only when there is one.
    """
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def read_json(path: str) -> Optional[Dict[str, Any]]:
    """The JSON object in ``path``, or None when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data
