"""The node service: a Ray actor pinned to its node that runs that node's
``forkvm serve``.

It starts the daemon, or adopts the one already running on the node's home
(after the actor itself was restarted), restarts it when it exits, and
reports its capacity from ``GET /v1/info``. The daemon is started in a
session of its own and is not the actor's child (a Ray worker kills its
children when it exits, e.g. when its raylet dies), so it and its sandboxes
outlive the actor and its node's Ray processes; ``forkvm.ray down``
(through :meth:`NodeService.shutdown`) removes its sandboxes and stops it
by PID.
The daemon stays the only thing that touches QEMU.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional

from . import _procs
from ._plan import NodePlan, link_artifacts

log = logging.getLogger("forkvm.ray")

#: Seconds a new daemon has to answer /v1/health.
START_TIMEOUT = 60.0


class NodeService:
    """Body of the ``forkvm-node-<NAME>`` actor (wrapped with ``ray.remote`` by the supervisor)."""

    def __init__(
        self,
        plan: NodePlan,
        cluster_token: str,
        binary: str,
        artifacts: str,
        with_node: bool = True,
        serve_args: tuple = (),
    ) -> None:
        self.plan = plan
        self.token = cluster_token
        self.binary = binary
        self.artifacts = artifacts
        self.with_node = with_node
        self.serve_args = list(serve_args)
        self.rec: Optional[Dict[str, Any]] = None
        self.adopted = False
        self.restarts = 0
        self.last_exit: Optional[str] = None
        self.stopping = False
        self.lock = threading.Lock()
        os.makedirs(plan.home, exist_ok=True)
        link_artifacts(plan.home, artifacts)
        self._start_or_adopt()
        self.watcher = threading.Thread(target=self._watch, name="forkvm-node-watch", daemon=True)
        self.watcher.start()

    # -- the daemon --------------------------------------------------------

    def _client(self):
        from ..client import Client

        return Client(self.plan.url, self.token, timeout=10.0)

    def _healthy(self) -> bool:
        try:
            with self._client() as c:
                c.health()
            return True
        except Exception:
            return False

    def _start_or_adopt(self) -> None:
        rec = _procs.read_record(self.plan.pid_file)
        if rec and _procs.is_running(rec["pid"], rec.get("started")):
            if _procs.poll_until(self._healthy, 15.0):
                self.rec, self.adopted = rec, True
                log.info("node %s: adopted forkvm serve pid %d", self.plan.name, rec["pid"])
                return
            # Ours (its home) but not answering: replace it.
            _procs.stop(rec["pid"], rec.get("started"))
        self._start()

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORKVM_")}
        env["FORKVM_TOKEN"] = self.token
        argv = self.plan.serve_argv(self.binary, with_node=self.with_node) + self.serve_args
        with open(self.plan.log_file, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {' '.join(argv)}\n".encode())
        pid = _procs.spawn_detached(argv, env, self.plan.log_file)
        self.rec, self.adopted = _procs.record(pid), False
        _procs.write_record(self.plan.pid_file, self.rec)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not _procs.is_running(pid, self.rec.get("started")):
                raise RuntimeError(
                    f"node {self.plan.name}: forkvm serve exited at start; see {self.plan.log_file}: {self._log_tail()}"
                )
            if self._healthy():
                return
            time.sleep(0.2)
        raise RuntimeError(f"node {self.plan.name}: forkvm serve did not answer within {START_TIMEOUT:.0f} s")

    def _log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.plan.log_file, encoding="utf-8", errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return ""

    def _running(self) -> bool:
        return self.rec is not None and _procs.is_running(self.rec["pid"], self.rec.get("started"))

    def _watch(self) -> None:
        backoff = 1.0
        while True:
            time.sleep(1.0)
            with self.lock:
                if self.stopping:
                    return
                if self._running():
                    backoff = 1.0
                    continue
                self.last_exit = f"forkvm serve (pid {self.rec['pid'] if self.rec else '?'}) exited"
                log.warning("node %s: %s; restarting it", self.plan.name, self.last_exit)
                try:
                    self._start()
                    self.restarts += 1
                except Exception as e:  # keep watching: the next round tries again
                    self.last_exit = f"{self.last_exit}; restart failed: {e}"
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)

    # -- the actor's methods ----------------------------------------------

    def describe(self) -> Dict[str, Any]:
        """The node as ``status`` shows it: name, url, daemon pid, restarts, capacity and sandbox count."""
        out: Dict[str, Any] = {
            "name": self.plan.name,
            "index": self.plan.index,
            "url": self.plan.url,
            "home": self.plan.home,
            "pid": self.rec["pid"] if self.rec else None,
            "service_pid": os.getpid(),
            "adopted": self.adopted,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "running": self._running(),
            "sandboxes": None,
            "capacity": None,
            "error": None,
        }
        try:
            with self._client() as c:
                info = c.info()
            out["sandboxes"] = info.sandboxes
            out["capacity"] = info.capacity.to_dict() if info.capacity is not None else None
        except Exception as e:
            out["error"] = str(e)
        return out

    def ray_node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def shutdown(self) -> List[str]:
        """Remove every sandbox through the daemon's API, then stop the daemon by PID. Returns the ids removed."""
        with self.lock:
            self.stopping = True
        removed: List[str] = []
        if self._running():
            try:
                with self._client() as c:
                    c._http.timeout = 120.0  # type: ignore[attr-defined]
                    for sb in c.list_sandboxes().sandboxes:
                        try:
                            c.delete_sandbox(sb.id)
                            removed.append(sb.id)
                        except Exception as e:
                            log.warning("node %s: rm %s: %s", self.plan.name, sb.id, e)
            except Exception as e:
                log.warning("node %s: listing sandboxes: %s", self.plan.name, e)
        if self.rec is not None:
            _procs.stop(self.rec["pid"], self.rec.get("started"), grace=20.0)
        try:
            os.unlink(self.plan.pid_file)
        except FileNotFoundError:
            pass
        return removed
