"""The supervisor: the detached actor ``forkvm-gateway`` on the head node.

Once a second it
* writes ``DIR/nodes.json`` from ``ray.nodes()`` (atomically; only when it
  changes), with ``alive: false`` and Ray's reason for a node Ray declared dead;
* makes sure every alive Ray node has its node service
  (``forkvm-node-<NAME>``, pinned to that node, ``num_cpus=0``), replacing
  one left over from an earlier incarnation of the node;
* keeps ``forkvm cluster gateway`` running as its child. The child is
  started from the supervisor's own long-lived thread with
  ``PR_SET_PDEATHSIG``, so it dies with the actor, and Ray's restart of the
  actor (``max_restarts=-1``) starts a new one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

from . import _procs
from ._node_service import NodeService
from ._plan import NAMESPACE, NodePlan, node_index, node_name, nodes_document, service_name, write_atomic

log = logging.getLogger("forkvm.ray")


@dataclass(frozen=True)
class Settings:
    """What the supervisor and node services are started with (from ``up``/``start``)."""

    dir: str
    token: str
    cluster_token: str
    gateway_listen: str
    base_port: int
    binary: str
    artifacts: str
    gateway: bool = True
    with_node: bool = True
    #: Options every node's `forkvm serve` gets (``up``/``start --serve-arg``).
    serve_args: tuple = ()
    #: A registry snapshots travel through between nodes (``--registry``), with its credentials.
    registry: Optional[str] = None
    registry_insecure: bool = False
    registry_user: Optional[str] = None
    registry_password: Optional[str] = None

    @property
    def url(self) -> str:
        return f"http://{self.gateway_listen}"


class Supervisor:
    """Body of the ``forkvm-gateway`` actor."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.services: Dict[str, Any] = {}  # name -> (ray node id, actor handle)
        self.errors: Dict[str, str] = {}
        self.gateway: Optional[subprocess.Popen] = None
        self.gateway_starts = 0
        self.stopping = False
        os.makedirs(os.path.join(settings.dir, "gateway"), exist_ok=True)
        self.thread = threading.Thread(target=self._loop, name="forkvm-supervisor", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        next_gateway = 0.0
        while not self.stopping:
            try:
                import ray

                nodes = ray.nodes()
                write_atomic(
                    os.path.join(self.s.dir, "nodes.json"), nodes_document(nodes, self.s.base_port, self.s.dir)
                )
                for node in nodes:
                    if node.get("Alive"):
                        self._ensure_service(node)
            except Exception as e:
                log.warning("supervisor round: %s", e)
            if self.s.gateway and not self.stopping and time.monotonic() >= next_gateway:
                if self.gateway is None or self.gateway.poll() is not None:
                    self._start_gateway()
                    next_gateway = time.monotonic() + min(30.0, 2.0 ** min(self.gateway_starts, 5))
            time.sleep(1.0)

    def _ensure_service(self, node: Dict[str, Any]) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        labels = node.get("Labels") or {}
        try:
            name = node_name(labels, node.get("NodeManagerHostname") or "")
            index = node_index(name, labels)
        except ValueError as e:
            self.errors[node["NodeID"]] = str(e)
            return
        node_id = node["NodeID"]
        known = self.services.get(name)
        if known is not None and known[0] == node_id:
            return
        actor_name = service_name(name)
        try:
            old = ray.get_actor(actor_name, namespace=NAMESPACE)
        except ValueError:
            old = None
        if old is not None:
            try:
                # A new service may still be starting its daemon: give it time.
                if ray.get(old.ray_node_id.remote(), timeout=30) == node_id:
                    self.services[name] = (node_id, old)
                    return
            except Exception:
                pass
            # Left from an earlier incarnation of the node (or hung): replace it.
            ray.kill(old, no_restart=True)
        plan = NodePlan(name, index, node.get("NodeManagerAddress") or "127.0.0.1", self.s.base_port, self.s.dir)
        actor = (
            ray.remote(NodeService)
            .options(
                name=actor_name,
                namespace=NAMESPACE,
                lifetime="detached",
                max_restarts=-1,
                max_task_retries=0,
                num_cpus=0,
                max_concurrency=4,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(plan, self.s.cluster_token, self.s.binary, self.s.artifacts, self.s.with_node, self.s.serve_args)
        )
        self.services[name] = (node_id, actor)
        log.info("supervisor: node service for %s on %s", name, node_id[:8])

    def _start_gateway(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORKVM_")}
        env["FORKVM_TOKEN"] = self.s.token
        env["FORKVM_CLUSTER_TOKEN"] = self.s.cluster_token
        argv = [self.s.binary, "cluster", "gateway", "--listen", self.s.gateway_listen, "--state-dir", self.s.dir]
        if self.s.registry:
            argv += ["--registry", self.s.registry] + (["--registry-insecure"] if self.s.registry_insecure else [])
            for var, value in (("FORKVM_REGISTRY_USER", self.s.registry_user),
                               ("FORKVM_REGISTRY_PASSWORD", self.s.registry_password)):
                if value:
                    env[var] = value
        log_path = os.path.join(self.s.dir, "gateway.log")
        try:
            with open(log_path, "ab") as out:
                self.gateway = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=_procs.die_with_parent,
                    close_fds=True,
                )
            self.gateway_starts += 1
        except OSError as e:
            log.warning("supervisor: cannot start %s: %s", argv[0], e)
            self.gateway = None
            self.gateway_starts += 1

    # -- the actor's methods ----------------------------------------------

    def endpoint(self) -> Dict[str, str]:
        """The cluster endpoint: ``{"url", "token"}``."""
        return {"url": self.s.url, "token": self.s.token}

    def node_services(self) -> Dict[str, Any]:
        """Node name -> its node service's actor handle."""
        return {name: handle for name, (_, handle) in self.services.items()}

    def state(self) -> Dict[str, Any]:
        """The supervisor's view: gateway pid and starts, nodes with a service, label errors."""
        running = self.gateway is not None and self.gateway.poll() is None
        return {
            "gateway_pid": self.gateway.pid if running and self.gateway else None,
            "gateway_starts": self.gateway_starts,
            "services": sorted(self.services),
            "errors": dict(self.errors),
        }

    def stop(self) -> None:
        """Stop the loop and the gateway (before ``ray.kill``, so nothing is restarted meanwhile)."""
        self.stopping = True
        self.thread.join(timeout=10)
        if self.gateway is not None and self.gateway.poll() is None:
            _procs.stop(self.gateway.pid, None, grace=10.0)
