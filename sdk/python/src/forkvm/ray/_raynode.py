"""One Ray node of a local trial cluster, bound to 127.0.0.1, in the foreground.

``python -m forkvm.ray._raynode --name n1 --head --port P --temp-dir T``
(or ``--address 127.0.0.1:P`` for the others) is what ``forkvm.ray up``
runs once per node. It is ``ray start --block`` with one difference that
``ray start`` cannot give: every node on loopback. Ray 2.60 turns an
explicit ``--node-ip-address 127.0.0.1`` into the host's routable address
and binds its servers to every interface unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and with that setting
``ray start`` refuses to start a non-head node. So this starts the node the
way ``ray.cluster_utils.Cluster.add_node`` does (``ray._private.node.Node``,
pinned by the ``ray`` 2.60.x requirement).

Ray's processes for the node (GCS on the head, raylet, agents, workers)
share fate with this process (Ray's reaper and ``PR_SET_PDEATHSIG``):
SIGTERM to this PID stops the node; if one of them dies, this exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

# Before Ray is imported: Ray reads it once (see the module doc).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def main(argv=None) -> int:
    from ._plan import NAME_LABEL, check_name

    p = argparse.ArgumentParser(prog="python -m forkvm.ray._raynode")
    p.add_argument("--name", required=True, type=check_name)
    p.add_argument("--head", action="store_true")
    p.add_argument("--port", type=int, help="the head's GCS port")
    p.add_argument("--address", help="the head's GCS address (not for --head)")
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--object-store-mib", type=int, default=200)
    args = p.parse_args(argv)
    if args.head == bool(args.address) or (args.head and not args.port):
        p.error("give --head --port P, or --address HOST:PORT")

    import ray._private.node
    import ray._private.parameter

    params = ray._private.parameter.RayParams(
        node_ip_address="127.0.0.1",
        temp_dir=args.temp_dir,
        num_cpus=args.num_cpus,
        num_gpus=0,
        labels={NAME_LABEL: args.name},
        include_dashboard=False,
        object_store_memory=args.object_store_mib << 20,
        min_worker_port=0,
        max_worker_port=0,
    )
    if args.head:
        params.gcs_server_port = args.port
    else:
        params.gcs_address = args.address
        params.include_log_monitor = False
        params.node_manager_port = 0
    node = ray._private.node.Node(params, head=args.head, shutdown_at_exit=True, spawn_reaper=True)

    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"ray node {args.name} up (pid {os.getpid()})", flush=True)
    code = 0
    while not stopping:
        time.sleep(0.5)
        dead = node.dead_processes()
        if dead:
            print(f"ray node {args.name}: {[kind for kind, _ in dead]} exited; stopping the node", flush=True)
            code = 1
            break
    node.kill_all_processes(check_alive=False, allow_graceful=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
