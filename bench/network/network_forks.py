"""The network benchmark's forks: the guest helpers, one forkvm child
(branch or spawn) timed to its first egress, and the naive baseline (a QEMU
save/restore with its own namespace, tap and nft rules).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import socket
import struct
import subprocess
import time

import forkvm_bench as fb
import naive as nv
from network_host import (
    EgressLog, GATEWAY_ADDR, Internet, LOOP, NAIVE, SANDBOX_NFT, SERIES, TAP_MAC, in_ns,
    link_exists, ns_exists, sh,
)


def guest_sh(d: fb.Daemon, sid: str, script: str, stdin: str | None = None,
             timeout_ms: int = 60_000) -> str:
    extra = {"timeout_ms": timeout_ms}
    if stdin is not None:
        extra["stdin"] = stdin
    r = d.api.exec(sid, ["sh", "-c", script], **extra)
    if r.get("exit_code") != 0:
        raise fb.BenchError(f"guest {sid}: `{script}` exited {r.get('exit_code')} "
                            f"(signal {r.get('signal')}): {r.get('stderr', '').strip()}")
    return r.get("stdout", "")


def start_loop(d: fb.Daemon, sid: str, server: str) -> None:
    """Write the loop into the guest, start it detached, wait until it polls."""
    guest_sh(d, sid, "cat > /root/loop.py && rm -f /tmp/loop.state", stdin=LOOP)
    guest_sh(d, sid, f"setsid python3 /root/loop.py {server} >/root/loop.log 2>&1 </dev/null &")
    deadline = time.monotonic() + 60
    while True:
        st = guest_sh(d, sid, "cat /tmp/loop.state 2>/dev/null || true").strip()
        if st == f"waiting {sid}":
            return
        if st:
            raise fb.BenchError(f"the loop in {sid} says {st!r}, expected 'waiting {sid}'")
        if time.monotonic() > deadline:
            log = guest_sh(d, sid, "cat /root/loop.log 2>/dev/null || true")
            raise fb.BenchError(f"the loop in {sid} did not start: {log}")
        time.sleep(0.2)


def loop_state(d: fb.Daemon, sid: str) -> str:
    try:
        return guest_sh(d, sid, "cat /tmp/loop.state /root/loop.log 2>&1 || true",
                        timeout_ms=10_000).strip()
    except Exception as e:  # noqa: BLE001 - diagnostics only
        return f"(cannot read: {e})"


def parse_loop_done(text: str, resume_to_egress: float) -> dict:
    """The loop's own account of its successful request (guest monotonic
    clock): `done <host> <attempts> <last error> <detect->attempt>
    <connect> <send> <response> <second connect>` in ms, then the
    successful connection's source port."""
    parts = text.split()
    if len(parts) < 8 or parts[0] != "done":
        return {}
    wait, conn, send, resp = (float(x) for x in parts[4:8])
    conn2 = float(parts[8]) if len(parts) > 8 else math.nan
    sport = int(parts[9]) if len(parts) > 9 else None
    return {
        "guest_source_port": sport,
        "guest_detect_to_attempt_ms": wait, "guest_connect_ms": conn,
        "guest_connect2_ms": None if math.isnan(conn2) else conn2,
        "guest_send_ms": send, "guest_response_ms": resp,
        # the request left the guest about (wait + conn + send) after the
        # loop saw the new hostname; the server logged it right after that
        "resume_to_hostname_ms": resume_to_egress - (wait + conn + send),
        "last_error": parts[3],
    }


def child_loop_done(d: fb.Daemon, cid: str, resume_to_egress: float) -> dict:
    deadline = time.monotonic() + 20
    while True:
        st = guest_sh(d, cid, "cat /tmp/loop.state 2>/dev/null || true", timeout_ms=10_000)
        if st.startswith("done") or time.monotonic() > deadline:
            return parse_loop_done(st, resume_to_egress)
        time.sleep(0.1)


def delete_snapshot(d: fb.Daemon, snap_id: str) -> None:
    """DELETE the branch snapshot once its child is gone; a snapshot something
    still depends on answers 409, which is retried briefly then forced."""
    deadline = time.monotonic() + 10
    while True:
        try:
            d.api.request("DELETE", f"/v1/snapshots/{snap_id}", expect=(204, 404))
            return
        except fb.ApiError as e:
            if e.status != 409:
                raise
            if time.monotonic() > deadline:
                print(f"    note: snapshot {snap_id} still in use ({e}); forcing", flush=True)
                d.api.request("DELETE", f"/v1/snapshots/{snap_id}?force=true",
                              expect=(204, 404))
                return
            time.sleep(0.1)


def fork_forkvm(d: fb.Daemon, src: str, series: str, run: int, log: EgressLog,
                timeout: float) -> dict:
    mode, wait_net = SERIES[series]
    body = {"mode": mode, "count": 1}
    if not wait_net:
        body["wait_for_network"] = False
    t_req = time.time()
    r = d.api.request("POST", f"/v1/sandboxes/{src}/branch", body)
    t_resp = time.time()
    snap = r.get("snapshot") or {}
    st = snap.get("timings") or {}
    sz = snap.get("sizes") or {}
    kids = r.get("children") or []
    if len(kids) != 1:
        if snap.get("id"):
            d.api.request("DELETE", f"/v1/snapshots/{snap['id']}?force=true", expect=(204, 404))
        raise fb.BenchError(f"branch gave {len(kids)} children: {r}")
    child = kids[0]
    cid = child["id"]
    d.sandboxes.add(cid)
    try:
        t = child.get("timings") or {}
        resumed = t.get("resumed_unix_ms")
        if resumed is None:
            raise fb.BenchError(f"child {cid} has no timings.resumed_unix_ms: {child}")
        first = log.wait(cid, timeout)
        if first is None:
            raise fb.BenchError(f"no request from child {cid} reached the internet within "
                                f"{timeout:.0f} s; its loop: {loop_state(d, cid)}")
        receipt = first["request"] * 1000.0
        row = {
            "kind": "egress", "series": series, "run": run, "child": cid, "mode": mode,
            "wait_for_network": wait_net,
            "resume_to_egress_ms": receipt - resumed,
            "request_to_egress_ms": receipt - t_req * 1000.0,
            "response_ms": (t_resp - t_req) * 1000.0,
            "egress_after_response_ms": receipt - t_resp * 1000.0,
            "egress_after_identity_ms": receipt - resumed - (t.get("identity_ms") or 0.0),
            "attempt": first["n"],
            "resumed_unix_ms": resumed, "receipt_unix_ms": receipt,
            "restore_ms": t.get("restore_ms"), "identity_ms": t.get("identity_ms"),
            "network_ms": t.get("network_ms"), "network_ready_ms": t.get("network_ready_ms"),
            "prepare_ms": t.get("prepare_ms"), "qemu_start_ms": t.get("qemu_start_ms"),
            "server_total_ms": t.get("total_ms"), "from_pool": t.get("from_pool"),
            "pause_ms": r.get("pause_ms"), "snapshot_ms": r.get("snapshot_ms"),
            "spawn_ms": r.get("spawn_ms"), "snapshot_kind": snap.get("kind"),
            "snapshot_depth": snap.get("depth"),
            # Where the branch point's time went, and how big its diff is:
            # a clone's branch point holds every page it changed since its
            # spawn, so these follow the source's age.
            "snapshot_copy_memory_ms": st.get("copy_memory_ms"),
            "snapshot_publish_ms": st.get("publish_ms"),
            "memory_diff_bytes": sz.get("memory_diff_bytes"),
            "memory_allocated_bytes": sz.get("memory_allocated_bytes"),
        }
        row.update(child_loop_done(d, cid, row["resume_to_egress_ms"]))
        return row
    finally:
        d.delete(cid)
        if snap.get("id"):
            delete_snapshot(d, snap["id"])


class NaiveNet:
    """One namespace with forkvm's topology for one naive restore."""

    def __init__(self, inet: Internet, k: int):
        if not 0 <= k < 64:
            raise fb.BenchError("the naive series has room for 64 uplinks")
        self.ns = f"fvb-nv-{inet.tag}-{k}"
        self.host_if = f"fvbn{inet.tag}-{k}"
        self.host = f"10.248.{inet.x}.{4 * k + 1}"
        self.inner = f"10.248.{inet.x}.{4 * k + 2}"
        self.created = False

    @property
    def path(self) -> str:
        return f"/run/netns/{self.ns}"

    def create(self) -> None:
        """What the daemon's create_ns + setup do (crates/forkvm-net/src/ns.rs),
        with the same tools: ip -batch, a sysctl in the namespace, nft -f."""
        if ns_exists(self.ns) or link_exists(self.host_if):
            raise fb.BenchError(f"{self.ns} or {self.host_if} exists already")
        sh(["ip", "netns", "add", self.ns])
        self.created = True
        sh(["ip", "-n", self.ns, "-batch", "-"], input=(
            "link set lo up\n"
            "tuntap add dev tap0 mode tap\n"
            f"link set tap0 address {TAP_MAC}\n"
            f"addr add {GATEWAY_ADDR}/30 dev tap0\n"
            "link set tap0 up\n"))
        sh(in_ns(self.ns) + ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        sh(["ip", "-batch", "-"], input=(
            f"link add {self.host_if} type veth peer name uplink netns {self.ns}\n"
            f"addr add {self.host}/30 dev {self.host_if}\n"
            f"link set {self.host_if} up\n"))
        sh(["ip", "-n", self.ns, "-batch", "-"], input=(
            f"addr add {self.inner}/30 dev uplink\n"
            "link set uplink up\n"
            f"route add default via {self.host}\n"))
        sh(in_ns(self.ns) + ["nft", "-f", "-"], input=SANDBOX_NFT)

    def delete(self) -> list[str]:
        errors = []
        if self.created and ns_exists(self.ns):
            r = sh(["ip", "netns", "del", self.ns], check=False)
            if r.returncode != 0:
                errors.append(f"ip netns del {self.ns}: {r.stderr.strip()}")
        self.created = False
        if link_exists(self.host_if):
            r = sh(["ip", "link", "del", self.host_if], check=False)
            if r.returncode != 0 and link_exists(self.host_if):
                errors.append(f"ip link del {self.host_if}: {r.stderr.strip()}")
        return errors


def agent_call(s: socket.socket, header: dict, payload: bytes, want: str,
               timeout: float) -> tuple[dict, bytes]:
    """Send one agent request and wait for its reply of type `want`; frames
    for other ids (replies queued before the save) are skipped."""
    s.sendall(fb.agent_frame(header, payload))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise fb.BenchError(f"the agent did not answer {header['type']} within {timeout}s")
        s.settimeout(left)
        prefix = fb._recv_exact(s, 12)
        if prefix[:4] != fb.AGENT_MAGIC:
            raise fb.BenchError(f"bad agent frame magic {prefix[:4]!r}")
        hlen, plen = struct.unpack("<II", prefix[4:])
        h = json.loads(fb._recv_exact(s, hlen))
        body = fb._recv_exact(s, plen) if plen else b""
        if h.get("id") != header["id"]:
            continue
        if h.get("type") == want:
            return h, body
        raise fb.BenchError(f"agent answered {header['type']} with {h}")


def naive_disk_top(saved: nv.SavedVm) -> str:
    """The baseline source's writable disk file (a cold-booted sandbox has one
    overlay on the read-only image; `naive_save` copied no other layer)."""
    if saved.copied_layers:
        raise fb.BenchError(f"the baseline source has a disk chain: {saved.copied_layers}")
    top = os.path.join(saved.sbdir, "disk.qcow2")
    if not os.path.exists(top):
        raise fb.BenchError(f"{top} is missing")
    return top


def naive_save_running(saved: nv.SavedVm, top: str) -> dict:
    """The naive way to fork a running VM, source side: `stop`, a plain full
    migration of RAM and device state to `saved.state`, a copy of its disk
    (now flushed, matching the state) to `saved.disk`, `cont`. `naive_save`
    turned every migration capability off already; checked again here."""
    try:
        os.unlink(saved.state)
    except FileNotFoundError:
        pass
    with fb.Qmp(os.path.join(saved.sbdir, "qmp.sock"), timeout=60) as qmp:
        on = [c["capability"] for c in qmp.execute("query-migrate-capabilities") if c["state"]]
        if on:
            raise fb.BenchError(f"migration capabilities are on on the baseline source: {on}")
        t0 = time.perf_counter()
        qmp.execute("stop")
        try:
            t1 = time.perf_counter()
            qmp.execute("migrate", {"uri": f"file:{saved.state}"})
            fb.wait_migration(qmp, timeout=600, poll=0.001)
            save_ms = fb.ms_since(t1)
            t2 = time.perf_counter()
            shutil.copyfile(top, saved.disk)
            copy_ms = fb.ms_since(t2)
        finally:
            qmp.execute("cont")
            pause_ms = fb.ms_since(t0)
        if qmp.execute("query-status")["status"] != "running":
            raise fb.BenchError("the baseline source is not running after cont")
    return {"pause_ms": pause_ms, "naive_save_ms": save_ms, "save_disk_copy_ms": copy_ms,
            "state_bytes": os.path.getsize(saved.state)}


def fork_naive(saved: nv.SavedVm, top: str, work: str, shm: str, inet: Internet, run: int,
               k: int, log: EgressLog, timeout: float) -> dict:
    """One naive fork of the running baseline source (save, then restore with
    its own network), timed like a forkvm child."""
    rdir = os.path.join(work, f"restore-{run}")
    mem = os.path.join(shm, f"naive-{run}.ram")
    name = f"fvb-naive-{inet.tag}-{run}"
    hostname = f"naive-{inet.tag}-{run}"
    os.mkdir(rdir)
    argv, paths = nv.restore_argv(saved, rdir, mem, name)
    net = NaiveNet(inet, k)
    proc = None
    qmp = None
    agent = None
    qlog = None
    try:
        t_start = time.time()
        sv = naive_save_running(saved, top)
        t = time.perf_counter()
        shutil.copyfile(saved.disk, paths["disk"])  # the disk must match the memory
        # Written back now: otherwise the guest's first flush (the identity step
        # fsyncs /etc/machine-id) would have to write the whole fresh copy.
        fd = os.open(paths["disk"], os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        disk_copy_ms = fb.ms_since(t)
        t = time.perf_counter()
        net.create()
        network_ms = fb.ms_since(t)
        qlog = open(paths["log"], "wb")
        t0 = time.perf_counter()
        proc = subprocess.Popen(in_ns(net.ns) + argv, stdin=subprocess.DEVNULL, stdout=qlog,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            qmp = fb.Qmp(paths["qmp"], timeout=60, proc=proc)
        except fb.QmpError as e:
            raise fb.BenchError(f"{e}; QEMU log:\n{fb.tail(paths['log'])}") from None
        qemu_start_ms = fb.ms_since(t0)
        # As the daemon does: connect to the agent before the guest runs.
        agent = fb._connect_unix(paths["agent"], time.monotonic() + 30)
        t1 = time.perf_counter()
        qmp.execute("migrate-incoming", {"uri": f"file:{saved.state}"})
        deadline = time.monotonic() + 600
        while qmp.execute("query-status")["status"] == "inmigrate":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise fb.BenchError(f"restore stuck in inmigrate; QEMU log:\n"
                                    f"{fb.tail(paths['log'])}")
            time.sleep(0.005)
        mig = qmp.execute("query-migrate")
        if mig.get("status") != "completed":
            raise fb.BenchError(f"incoming migration ended as {mig}")
        load_ms = fb.ms_since(t1)
        t2 = time.perf_counter()
        qmp.execute("cont")
        resumed = time.time() * 1000.0
        restore_ms = fb.ms_since(t2)
        # The identity the daemon gives a child (same message, same payload
        # size), then its clock: the hostname change is what fires the loop.
        t3 = time.perf_counter()
        # Request ids far from any the daemon used with the source (a reply
        # queued before the save would otherwise be taken for ours).
        base = 7_000_000_000 + run * 1000
        _, _ = agent_call(agent, {
            "type": "identity", "id": base + 1, "hostname": hostname,
            "unix_time_ns": time.time_ns(), "machine_id": secrets.token_hex(16),
            "instance_id": f"{hostname}-{secrets.token_hex(4)}",
        }, os.urandom(64), "identity_ack", 60)
        agent_call(agent, {"type": "set_clock", "id": base + 2, "unix_time_ns": time.time_ns()},
                   b"", "clock_set", 30)
        identity_ms = fb.ms_since(t3)
        t_done = time.time()
        first = log.wait(hostname, timeout)
        if first is None:
            raise fb.BenchError(f"no request from the naive restore {hostname} reached the "
                                f"internet within {timeout:.0f} s; QEMU log:\n"
                                f"{fb.tail(paths['log'])}")
        receipt = first["request"] * 1000.0
        done = {}
        deadline = time.monotonic() + 20
        req_id = base + 3
        while time.monotonic() < deadline:
            _, body = agent_call(agent, {"type": "read_file", "id": req_id,
                                         "path": "/tmp/loop.state", "max_bytes": 4096},
                                 b"", "file_data", 10)
            req_id += 1
            if body.startswith(b"done"):
                done = parse_loop_done(body.decode(errors="replace"),
                                       receipt - resumed)
                break
            time.sleep(0.1)
        return {
            **done, **sv,
            "kind": "egress", "series": NAIVE, "run": run, "child": hostname, "mode": "naive",
            "wait_for_network": False,
            "resume_to_egress_ms": receipt - resumed,
            "request_to_egress_ms": receipt - t_start * 1000.0,
            "response_ms": (t_done - t_start) * 1000.0,
            "egress_after_response_ms": receipt - t_done * 1000.0,
            "egress_after_identity_ms": receipt - resumed - identity_ms,
            "attempt": first["n"],
            "resumed_unix_ms": resumed, "receipt_unix_ms": receipt,
            "restore_ms": restore_ms, "identity_ms": identity_ms, "network_ms": network_ms,
            "qemu_start_ms": qemu_start_ms, "load_ms": load_ms, "disk_copy_ms": disk_copy_ms,
        }
    finally:
        for c in (agent, qmp):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        if proc is not None:
            fb.kill_and_reap(proc)
        if qlog is not None:
            qlog.close()
        for e in net.delete():
            print(f"    cleanup: {e}", flush=True)
        shutil.rmtree(rdir, ignore_errors=True)
        try:
            os.unlink(mem)
        except FileNotFoundError:
            pass
