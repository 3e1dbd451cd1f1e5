#!/usr/bin/env python3
"""forkvm network benchmark: a forked child's resume to its first egress, and throughput.

Run through bench/network/run.sh (which builds the release binary first).

Everything is measured in one run against one private daemon, with an
"internet" this bench makes itself: a network namespace joined to the host by
a veth pair (10.249.X.2/24 inside, 10.249.X.1 on the host), holding a Python
HTTP server that logs `time.time()` for every request it receives, and an
`iperf3 -s`.

1. egress     -- per iteration a fresh source sandbox (default image and
                 template, 512 MiB) runs a guest loop that remembers its
                 hostname and checks `socket.gethostname()` every 2 ms; once it
                 differs (the daemon gives each child its id as hostname in the
                 identity step) it GETs `/first/<hostname>/<n>` from the server
                 (0.2 s timeout, retried at once) until one succeeds. The
                 source never sends. Per series, `POST /v1/sandboxes/{id}/branch
                 {"mode": diff|live, "count": 1[, "wait_for_network": false]}`;
                 the figure is the server's receipt time of the child's first
                 request minus the child's `timings.resumed_unix_ms` (both the
                 host's CLOCK_REALTIME). The child and the branch snapshot are
                 deleted after each, the source after the iteration.
2. naive      -- the baseline, interleaved with the series above: a second,
                 cold-booted sandbox runs the same loop. Each naive fork saves it
                 the plain way (`stop`, `migrate` of all RAM and device state to
                 a `file:`, disk copy, `cont`), builds a fresh namespace with
                 forkvm's topology (tap0 172.16.0.1/30 with the same MAC, a veth
                 uplink from 10.248.X.0/24, the same nft ruleset, masquerade on
                 the host in a bench-owned nft table), starts a plain QEMU with
                 the source's command line (own sockets, RAM file and disk copy)
                 inside it with `-incoming defer`, `migrate-incoming` from the
                 file, `cont`, and at once sends the guest agent the same
                 identity message (new hostname) and clock the daemon sends a
                 child. Same figure: receipt minus the host time right after
                 `cont` returned.
3. throughput -- iperf3 under the accelerator in use, 3 runs each: guest ->
                 internet namespace (the guest's client, through tap, the
                 sandbox's NAT and the host's NAT); host -> guest and guest ->
                 host (`-R`) through the daemon's port relay on 127.0.0.1
                 (guest port 5201 published with host port 0); and the
                 ceiling: host <-> internet namespace directly, no VM.

Outputs (in --out): network.csv, RESULTS.md, network.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))

import forkvm_bench as fb  # noqa: E402
import naive as nv  # noqa: E402
import report as rp  # noqa: E402

MIN_FORKS = 10
MAX_FORKS = 63           # the naive series uses one /30 of 10.248.X.0/24 per iteration
NOISY_CORES = 0.25       # a measurement during which other processes used more than this is flagged
HTTP_PORT = 8080
IPERF_PORT = 5201
SERIES = {
    # name: (branch mode, wait_for_network)
    "diff": ("diff", True),
    "diff_nowait": ("diff", False),
    "live": ("live", True),
    "live_nowait": ("live", False),
}
NAIVE = "naive"

# forkvm's guest link (crates/forkvm-net/src/lib.rs)
GUEST_ADDR = "172.16.0.2"
GATEWAY_ADDR = "172.16.0.1"
TAP_MAC = "02:fc:00:00:00:01"

FIELDS = [
    "kind", "series", "run", "child", "mode", "wait_for_network", "source",
    "source_branches_before",
    # egress: the figure, and the same receipt against other reference points
    "resume_to_egress_ms", "request_to_egress_ms", "response_ms", "egress_after_response_ms",
    "egress_after_identity_ms", "attempt",
    # the loop's own account (guest monotonic clock) and what follows from it
    "resume_to_hostname_ms", "guest_detect_to_attempt_ms", "guest_connect_ms",
    "guest_send_ms", "guest_response_ms", "guest_connect2_ms", "guest_source_port", "last_error",
    "resumed_unix_ms", "receipt_unix_ms",
    # the child's timings (forkvm: the daemon's; naive: the bench's, same meaning)
    "restore_ms", "identity_ms", "network_ms", "network_ready_ms", "prepare_ms",
    "qemu_start_ms", "load_ms", "disk_copy_ms", "server_total_ms", "from_pool",
    # the branch
    "pause_ms", "snapshot_ms", "spawn_ms", "snapshot_kind", "snapshot_depth",
    "snapshot_copy_memory_ms", "snapshot_publish_ms", "memory_diff_bytes",
    "memory_allocated_bytes",
    # the naive fork's save of the running baseline source
    "naive_save_ms", "save_disk_copy_ms", "state_bytes",
    # throughput
    "direction", "mbit_s", "retransmits", "seconds", "bytes",
    "other_cpu_cores",
]

# The guest loop. The source runs it from the start; a child (or a naive
# restore) inherits it mid-poll.
LOOP = r'''
import http.client, os, socket, sys, time
SRV = sys.argv[1]
PORT = @PORT@
start = socket.gethostname()
# Warm Python's lazy one-time work in the source, without sending anything on
# the network: getaddrinfo (and the idna codec import it triggers) and one
# HTTP round trip over loopback through the same client code.
socket.getaddrinfo(SRV, PORT, 0, socket.SOCK_STREAM)
lsn = socket.socket()
lsn.bind(("127.0.0.1", 0))
lsn.listen(1)
c = http.client.HTTPConnection("127.0.0.1", lsn.getsockname()[1], timeout=5)
c.connect()
a, _ = lsn.accept()
c.request("GET", "/warm")
a.recv(4096)
a.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
c.getresponse().read()
for x in (c, a, lsn):
    x.close()
with open("/tmp/loop.state", "w") as f:
    f.write("waiting %s\n" % start)
while socket.gethostname() == start:
    time.sleep(0.002)
me = socket.gethostname()
t_detect = time.monotonic()
n = 0
last = ""
while True:
    n += 1
    t_a = time.monotonic()
    try:
        c = http.client.HTTPConnection(SRV, PORT, timeout=0.2)
        c.connect()
        t_c = time.monotonic()
        sport = c.sock.getsockname()[1]
        c.request("GET", "/first/%s/%d" % (me, n))
        t_s = time.monotonic()
        r = c.getresponse()
        r.read()
        t_r = time.monotonic()
        c.close()
        if r.status == 200:
            break
        last = "HTTP%d" % r.status
    except Exception as e:
        last = type(e).__name__
ms = lambda a, b: "%.3f" % ((b - a) * 1000)
# A second request right after (not timed by the server side): how long a
# connect takes once the guest has done one.
conn2 = "nan"
try:
    t2 = time.monotonic()
    c = http.client.HTTPConnection(SRV, PORT, timeout=2)
    c.connect()
    conn2 = ms(t2, time.monotonic())
    c.request("GET", "/second/%s/1" % me)
    c.getresponse().read()
    c.close()
except Exception:
    pass
with open("/tmp/loop.state.tmp", "w") as f:
    f.write("done %s %d %s %s %s %s %s %s %d\n" % (me, n, last or "-", ms(t_detect, t_a),
            ms(t_a, t_c), ms(t_c, t_s), ms(t_s, t_r), conn2, sport))
os.rename("/tmp/loop.state.tmp", "/tmp/loop.state")
'''.replace("@PORT@", str(HTTP_PORT))

# The internet's HTTP server: logs accept time, request time and path.
SERVER = r'''
import http.server, sys, time
log = open(sys.argv[2], "a", buffering=1)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def setup(self):
        self.t_accept = time.time()
        super().setup()
    def do_GET(self):
        t = time.time()
        log.write("%.6f %.6f %s\n" % (self.t_accept, t, self.path))
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
S((sys.argv[1], @PORT@), H).serve_forever()
'''.replace("@PORT@", str(HTTP_PORT))

# crates/forkvm-net/src/rules.rs sandbox_script() with no forwarded ports and
# no allow-list: what the daemon loads into every sandbox namespace.
SANDBOX_NFT = """add table inet forkvm
delete table inet forkvm
table inet forkvm {
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "uplink" masquerade
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "tap0" meta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn reject with tcp reset
    ct state invalid drop
    iifname "uplink" oifname "tap0" ct status dnat accept
    iifname "tap0" oifname "uplink" accept
  }
}
"""


# --------------------------------------------------------------------------
# Host plumbing
# --------------------------------------------------------------------------


def sh(argv: list[str], input: str | None = None, timeout: float = 60.0,
       check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise fb.BenchError(f"{' '.join(argv)}: exit {r.returncode}: "
                            f"{(r.stderr or r.stdout).strip()}"
                            + (f"\n-- input --\n{input}" if input else ""))
    return r


def in_ns(ns: str) -> list[str]:
    """Prefix that runs a program in a named network namespace (nsenter
    execs it, so the pid is the program's own)."""
    return ["nsenter", f"--net=/run/netns/{ns}", "--"]


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def ns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def wait_tcp(addr: str, port: int, timeout: float, what: str, errfile: str | None = None):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                extra = ""
                if errfile:
                    extra = "\n" + fb.tail(errfile)
                raise fb.BenchError(f"{what} on {addr}:{port} did not start{extra}")
            time.sleep(0.05)


class Internet:
    """A namespace standing in for the outside world, with the HTTP logger and
    an iperf3 server in it, plus the bench's host nft table (masquerade of the
    naive baseline's uplinks)."""

    def __init__(self, tag: int, x: int, workdir: str):
        self.tag = tag
        self.ns = f"fvb-inet-{tag}"
        self.host_if = f"fvbi{tag}"
        self.addr = f"10.249.{x}.2"
        self.host_addr = f"10.249.{x}.1"
        self.naive_net = f"10.248.{x}.0/24"
        self.x = x
        self.table = f"fvbench-{tag}"
        self.dir = workdir
        self.procs: list[subprocess.Popen] = []
        self._errs = []
        self.log_path = os.path.join(workdir, "http.log")
        self.created_ns = False
        self.created_table = False

    def create(self) -> None:
        for ns, link in ((self.ns, self.host_if),):
            if ns_exists(ns) or link_exists(link):
                raise fb.BenchError(f"{ns} or {link} exists already (a previous run that was "
                                    "killed hard?): remove them with `ip netns del` / "
                                    "`ip link del`")
        sh(["ip", "netns", "add", self.ns])
        self.created_ns = True
        sh(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0",
            "netns", self.ns])
        sh(["ip", "addr", "add", f"{self.host_addr}/24", "dev", self.host_if])
        sh(["ip", "link", "set", self.host_if, "up"])
        sh(["ip", "-n", self.ns, "-batch", "-"],
           input=f"addr add {self.addr}/24 dev eth0\nlink set eth0 up\nlink set lo up\n")
        # The baseline's uplinks (10.248.X.0/24) leave through the host with
        # the host's address, as forkvm's host table does for its sandboxes.
        sh(["nft", "-f", "-"], input=(
            f"add table inet {self.table}\ndelete table inet {self.table}\n"
            f"table inet {self.table} {{\n"
            "  chain postrouting {\n"
            "    type nat hook postrouting priority srcnat; policy accept;\n"
            f"    ip saddr {self.naive_net} oifname \"{self.host_if}\" masquerade\n"
            "  }\n}\n"))
        self.created_table = True
        srv = os.path.join(self.dir, "inet_http.py")
        with open(srv, "w") as f:
            f.write(SERVER)
        self._start(["python3", srv, self.addr, self.log_path], "http")
        self._start(["iperf3", "-s", "-B", self.addr, "-p", str(IPERF_PORT)], "iperf3")
        wait_tcp(self.addr, HTTP_PORT, 20, "the internet's HTTP server",
                 os.path.join(self.dir, "http.err"))
        wait_tcp(self.addr, IPERF_PORT, 20, "the internet's iperf3 server",
                 os.path.join(self.dir, "iperf3.err"))

    def _start(self, argv: list[str], name: str) -> None:
        err = open(os.path.join(self.dir, f"{name}.err"), "wb")
        self._errs.append(err)
        self.procs.append(subprocess.Popen(in_ns(self.ns) + argv, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=err,
                                           start_new_session=True))

    def close(self) -> list[str]:
        errors = []
        for p in self.procs:
            try:
                fb.kill_and_reap(p)
            except Exception as e:  # noqa: BLE001
                errors.append(f"pid {p.pid}: {e}")
        self.procs.clear()
        for f in self._errs:
            f.close()
        self._errs.clear()
        if self.created_table:
            r = sh(["nft", "delete", "table", "inet", self.table], check=False)
            if r.returncode != 0:
                errors.append(f"nft delete table {self.table}: {r.stderr.strip()}")
            self.created_table = False
        if self.created_ns:
            r = sh(["ip", "netns", "del", self.ns], check=False)
            if r.returncode != 0:
                errors.append(f"ip netns del {self.ns}: {r.stderr.strip()}")
            self.created_ns = False
        if link_exists(self.host_if):
            sh(["ip", "link", "del", self.host_if], check=False)
        return errors


class EgressLog:
    """Tails the internet server's log: the first request of each hostname."""

    def __init__(self, path: str):
        self.path = path
        self.pos = 0
        self.buf = b""
        self.first: dict[str, dict] = {}
        self.count: dict[str, int] = {}

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return
        self.pos += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            parts = line.decode(errors="replace").split()
            if len(parts) != 3 or not parts[2].startswith("/first/"):
                continue
            seg = parts[2].split("/")
            if len(seg) != 4:
                continue
            host, n = seg[2], int(seg[3])
            self.count[host] = self.count.get(host, 0) + 1
            if host not in self.first:
                self.first[host] = {"accept": float(parts[0]), "request": float(parts[1]), "n": n}

    def wait(self, host: str, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if host in self.first:
                return self.first[host]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)


# --------------------------------------------------------------------------
# Guest helpers
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# forkvm children
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# The naive baseline
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------


def iperf_figures(out: str, what: str) -> dict:
    try:
        v = json.loads(out)
    except ValueError:
        raise fb.BenchError(f"{what}: iperf3 gave no JSON: {out[-2000:]}") from None
    if v.get("error"):
        raise fb.BenchError(f"{what}: iperf3: {v['error']}")
    end = v.get("end") or {}
    rec = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    if not rec.get("bits_per_second"):
        raise fb.BenchError(f"{what}: no sum_received in the iperf3 result")
    return {"mbit_s": rec["bits_per_second"] / 1e6, "bytes": rec.get("bytes"),
            "seconds": rec.get("seconds"), "retransmits": sent.get("retransmits")}


def iperf_host(argv: list[str], secs: int, what: str, tries: int = 3) -> dict:
    last = ""
    for _ in range(tries):
        r = subprocess.run(["iperf3", *argv, "-t", str(secs), "-J"], capture_output=True,
                           text=True, timeout=secs + 90)
        try:
            return iperf_figures(r.stdout, what)
        except fb.BenchError as e:
            last = str(e)
            time.sleep(1)
    raise fb.BenchError(last)


def iperf_guest(d: fb.Daemon, sid: str, addr: str, secs: int) -> dict:
    r = d.api.exec(sid, ["iperf3", "-c", addr, "-p", str(IPERF_PORT), "-t", str(secs), "-J"],
                   timeout_ms=(secs + 90) * 1000)
    if r.get("exit_code") != 0 and not r.get("stdout"):
        raise fb.BenchError(f"iperf3 in the guest exited {r.get('exit_code')}: {r.get('stderr')}")
    return iperf_figures(r.get("stdout", ""), "guest iperf3 client")


IPERF_CASES = [
    # series, direction, description
    ("vm_to_inet", "guest → internet netns",
     "guest `iperf3 -c <internet> -t T -J` (exec); path: virtio-net, tap0, the sandbox "
     "namespace's masquerade, veth, the host's masquerade, the internet veth"),
    ("host_to_vm_relay", "host → guest via port relay",
     "host `iperf3 -c 127.0.0.1 -p <published port> -t T -J`, `iperf3 -s` in the guest; path: "
     "the daemon's TCP relay on 127.0.0.1, the uplink, DNAT in the sandbox namespace, tap0"),
    ("vm_to_host_relay", "guest → host via port relay (-R)",
     "the same with `-R` (the guest sends)"),
    ("ceiling_host_to_inet", "host → internet netns (no VM)",
     "host `iperf3 -c <internet> -t T -J` against the internet namespace's server"),
    ("ceiling_inet_to_host", "internet netns → host (no VM, -R)",
     "the same with `-R`"),
]


def run_iperf(d: fb.Daemon, inet: Internet, args, rows: list[dict], meter) -> None:
    secs = args.iperf_time
    sb = d.create(memory_mib=args.memory, cpus=1, ports=[{"guest": IPERF_PORT, "host": 0}])
    sid = sb["id"]
    ports = ((sb.get("network") or {}).get("ports")) or []
    hp = next((p["host"] for p in ports if p["guest"] == IPERF_PORT), None)
    if not hp:
        raise fb.BenchError(f"the iperf3 sandbox has no published port 5201: {sb}")
    print(f"[iperf3] sandbox {sid}, guest port {IPERF_PORT} on 127.0.0.1:{hp}; "
          f"{args.iperf_runs} × {secs} s per direction", flush=True)
    guest_sh(d, sid, "setsid iperf3 -s -p 5201 >/dev/null 2>&1 </dev/null &")
    time.sleep(1)
    try:
        for run in range(1, args.iperf_runs + 1):
            for series, direction, _ in IPERF_CASES:
                meter.start()
                if series == "vm_to_inet":
                    f = iperf_guest(d, sid, inet.addr, secs)
                elif series == "host_to_vm_relay":
                    f = iperf_host(["-c", "127.0.0.1", "-p", str(hp)], secs, series)
                elif series == "vm_to_host_relay":
                    f = iperf_host(["-c", "127.0.0.1", "-p", str(hp), "-R"], secs, series)
                elif series == "ceiling_host_to_inet":
                    f = iperf_host(["-c", inet.addr, "-p", str(IPERF_PORT)], secs, series)
                else:
                    f = iperf_host(["-c", inet.addr, "-p", str(IPERF_PORT), "-R"], secs, series)
                row = {"kind": "iperf", "series": series, "run": run, "direction": direction,
                       "child": sid if not series.startswith("ceiling") else "",
                       **f, "other_cpu_cores": meter.other_cores()}
                rows.append(row)
                print(f"[iperf3 {run}/{args.iperf_runs}] {direction:38s} "
                      f"{f['mbit_s']:9,.1f} Mbit/s  (retransmits {f.get('retransmits')}, "
                      f"others {row['other_cpu_cores']:.2f} cores)", flush=True)
    finally:
        d.delete(sid)


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


def vals(rows, series, key, kind="egress"):
    return [r[key] for r in rows if r.get("kind") == kind and r.get("series") == series
            and r.get(key) is not None]


def p(rows, series, key, q, kind="egress"):
    v = vals(rows, series, key, kind)
    return rp.percentile(v, q) if v else math.nan


LABELS = {
    "diff": "forkvm diff\n(wait net)",
    "diff_nowait": "forkvm diff\nno wait net",
    "live": "forkvm live\n(wait net)",
    "live_nowait": "forkvm live\nno wait net",
    NAIVE: "naive QEMU\nsave/restore",
}


def write_plot(path: Path, rows, series_list, title: str) -> None:
    plt = rp.pyplot()

    order = [s for s in series_list + [NAIVE] if vals(rows, s, "resume_to_egress_ms")]
    fig, (ax, axr, ax2) = plt.subplots(1, 3, figsize=(19, 6.4),
                                       gridspec_kw={"width_ratios": [1.3, 1.3, 1]})
    for a, key, ylabel, ttl in (
            (ax, "resume_to_egress_ms", "child resume → first request at the server (ms)",
             "resume → first successful egress (the metric)"),
            (axr, "request_to_egress_ms", "request → first request at the server (ms)",
             "from the fork request (forkvm: POST branch; naive: stop + save + restore)")):
        data = [vals(rows, s, key) for s in order]
        if not data:
            continue
        a.boxplot(data, widths=0.5, showfliers=False,
                  medianprops={"color": "tab:red", "linewidth": 2})
        for i, (s, ys) in enumerate(zip(order, data), start=1):
            rs = [r for r in rows if r.get("kind") == "egress" and r.get("series") == s
                  and r.get(key) is not None]
            xs = [i + (j - (len(ys) - 1) / 2) * (0.35 / max(len(ys), 1)) for j in range(len(ys))]
            a.scatter(xs, ys, s=14, alpha=0.8, zorder=3,
                      color=["tab:orange" if (r.get("other_cpu_cores") or 0) > NOISY_CORES
                             else ("tab:gray" if s == NAIVE else "tab:blue") for r in rs])
            m50, m90 = rp.percentile(ys, 50), rp.percentile(ys, 90)
            a.annotate(f"p50 {m50:,.0f}\np90 {m90:,.0f}", (i + 0.28, m50), fontsize=7,
                       color="tab:red", va="center")
        a.set_xticks(range(1, len(order) + 1), [LABELS.get(s, s) for s in order], fontsize=8)
        a.set_ylim(0, max(max(x) for x in data) * 1.12)
        a.set_ylabel(ylabel)
        a.set_title(f"{ttl}\n(orange dots: other processes > {NOISY_CORES} cores)", fontsize=9)
        a.grid(axis="y", alpha=0.3)

    cases = [c for c in IPERF_CASES if vals(rows, c[0], "mbit_s", "iperf")]
    for i, (series, direction, _) in enumerate(cases):
        ys = vals(rows, series, "mbit_s", "iperf")
        m = sum(ys) / len(ys)
        col = "tab:gray" if series.startswith("ceiling") else "tab:green"
        ax2.barh(i, m, color=col, alpha=0.6)
        ax2.scatter(ys, [i] * len(ys), color="black", s=12, zorder=3)
        ax2.annotate(f" {m:,.0f}", (max(ys), i), va="center", fontsize=8)
    ax2.set_yticks(range(len(cases)), [c[1] for c in cases], fontsize=8)
    ax2.invert_yaxis()
    ax2.set_xlabel("iperf3 TCP throughput (Mbit/s; bar = mean, dots = runs)")
    ax2.set_title("throughput (gray: no VM, the ceiling)", fontsize=9)
    ax2.grid(axis="x", alpha=0.3)
    rp.save_figure(fig, path, dpi=120, title=title)


def f0(v) -> str:
    return rp.fmt(v, 0)


def branch_point_table(rows, series_list, pp) -> list[str]:
    """The branch point's own cost per series (p50 / p90): a clone's branch
    point holds every page the clone changed since its spawn, and publishing
    writes and fsyncs them, so `snapshot_ms` follows the diff's size."""
    have = [s for s in series_list if vals(rows, s, "snapshot_publish_ms")]
    if not have:
        return []
    L = ["", "Branch point (p50 / p90):", "",
         "| series | snapshot_ms | copy_memory_ms | publish_ms | memory.diff (MiB) |",
         "|---|---|---|---|---|"]
    for s in have:
        mib = [v / 2**20 for v in vals(rows, s, "memory_diff_bytes")]
        size = (f"{rp.fmt(rp.percentile(mib, 50), 1)} / {rp.fmt(rp.percentile(mib, 90), 1)}"
                if mib else "–")
        L.append(f"| {s} | {pp(s, 'snapshot_ms')} | {pp(s, 'snapshot_copy_memory_ms')} | "
                 f"{pp(s, 'snapshot_publish_ms')} | {size} |")
    L.append("")
    return L


def write_results(path: Path, rows, ctx, args, series_list) -> None:
    m = ctx["machine"]
    info = ctx["info"]
    smoke = " (SMOKE — not a valid result)" if args.smoke else ""
    naive50 = p(rows, NAIVE, "resume_to_egress_ms", 50)
    naive_req50 = p(rows, NAIVE, "request_to_egress_ms", 50)
    cores = [r.get("other_cpu_cores") or 0 for r in rows]
    noisy = sum(1 for c in cores if c > NOISY_CORES)
    L = []
    L.append("# Network benchmark: resume → first egress of a forked child, and throughput"
             + smoke)
    L.append("")
    L.append(rp.date_line(ctx["started"], ctx["elapsed"], minutes=True))
    L.append(rp.forkvm_line(info, ctx["git"], " (when the bench started)"))
    L.append(f"- Machine: {rp.machine_text(m)}; kernel Linux {m['kernel']}; load average at "
             "start " + rp.loadavg_text(m))
    L.append(rp.accel_line(info))
    L.append(f"- QEMU: {rp.qemu_text(info)}")
    L.append("- Jail: **off** (`FORKVM_NO_JAIL=1`) for every sandbox of this bench: the naive "
             "baseline replays a sandbox QEMU's command line and saves it into the bench's "
             "files, which a jailed QEMU cannot do (bench/jail measures the jail's cost).")
    L.append(f"- Guests: {args.memory} MiB RAM, 1 vCPU, image `default`; network `nat` "
             "(the default)")
    L.append(f"- Runs: {args.forks} forks per series ({', '.join(series_list)}) and "
             f"{args.forks} naive forks, interleaved (one of each per iteration, the order "
             "rotated every iteration; one warm-up of each kind first, not counted); iperf3 "
             f"{args.iperf_runs} × {args.iperf_time} s per direction")
    L.append(f"- Host noise — cores kept busy by processes other than this bench's and its "
             f"daemon's during each measurement (`other_cpu_cores`): p50 "
             f"{rp.percentile(cores, 50):.2f}, max {max(cores, default=0):.2f}; {noisy} of "
             f"{len(rows)} measurements above {NOISY_CORES} (orange in the plot)")
    others = ctx.get("others") or {}
    L.append("- Other QEMU processes (not this bench's) seen during the run: "
             + (f"{len(others)} (integration tests running in parallel; they compete for the "
                "2 cores)" if others else "none"))
    L.append("")
    L += summary_lines(rows, series_list)
    L.append("## Resume → first successful egress")
    L.append("")
    L.append("| series | n | p50 (ms) | p90 (ms) | min | max | ratio to naive p50 | "
             "request → egress p50 | p90 |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in series_list + [NAIVE]:
        v = vals(rows, s, "resume_to_egress_ms")
        if not v:
            continue
        st = rp.summarize(v)
        ratio = st["p50"] / naive50 if naive50 and not math.isnan(naive50) else math.nan
        L.append(f"| {'**' + s + '**' if s != NAIVE else 'naive (baseline)'} | {st['n']} | "
                 f"**{f0(st['p50'])}** | **{f0(st['p90'])}** | {f0(st['min'])} | "
                 f"{f0(st['max'])} | {rp.fmt(ratio, 2)}× | "
                 f"{f0(p(rows, s, 'request_to_egress_ms', 50))} | "
                 f"{f0(p(rows, s, 'request_to_egress_ms', 90))} |")
    L.append("")
    L.append("*Ratio* = the series' resume → egress p50 divided by the naive baseline's p50 "
             "(below 1: forkvm's child reaches the network sooner after its resume). "
             "*request → egress* starts earlier: for forkvm when the bench sent "
             "`POST .../branch` "
             "(so it includes the source's pause, the snapshot, the child's QEMU start, network "
             "setup and restore); for naive when the bench stopped the running baseline source "
             "to save it (so it includes the full save, the disk copies, the namespace setup, "
             "the QEMU start and loading the whole state file).")
    L.append("")
    if not math.isnan(naive_req50):
        parts = []
        for s in series_list:
            v = p(rows, s, "request_to_egress_ms", 50)
            if not math.isnan(v):
                parts.append(f"{s} {f0(v)} ms ({naive_req50 / v:.2f}×)")
        L.append(f"From the request, naive p50 ÷ forkvm p50 (naive {f0(naive_req50)} ms): "
                 + "; ".join(parts) + ".")
        L.append("")
    L.append("### Where the time goes (p50 / p90, ms)")
    L.append("")
    L.append("| series | restore | identity | network setup (before resume) | network_ready | "
             "resume → hostname seen (est.) | first connect (guest) | second connect (guest) | "
             "QEMU start | load (naive) | source pause | snapshot kind |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def pp(s, k):
        v = vals(rows, s, k)
        if not v:
            return "–"
        return f"{rp.fmt(rp.percentile(v, 50), 1)} / {rp.fmt(rp.percentile(v, 90), 1)}"

    for s in series_list + [NAIVE]:
        if not vals(rows, s, "resume_to_egress_ms"):
            continue
        kinds = sorted({f"{r.get('snapshot_kind')} (depth {r.get('snapshot_depth')})"
                        for r in rows if r.get("series") == s and r.get("snapshot_kind")})
        L.append(f"| {s} | {pp(s, 'restore_ms')} | {pp(s, 'identity_ms')} | "
                 f"{pp(s, 'network_ms')} | {pp(s, 'network_ready_ms')} | "
                 f"{pp(s, 'resume_to_hostname_ms')} | {pp(s, 'guest_connect_ms')} | "
                 f"{pp(s, 'guest_connect2_ms')} | {pp(s, 'qemu_start_ms')} | "
                 f"{pp(s, 'load_ms')} | {pp(s, 'pause_ms')} | {', '.join(kinds) or '–'} |")
    L.append("")
    L += branch_point_table(rows, series_list, pp)
    L.append("- *source pause*: how long the running source was stopped — forkvm the branch's "
             "`pause_ms`; naive `stop` → full migration to the file → disk copy → `cont` "
             "(p50 of its parts: migration "
             f"{rp.fmt(p(rows, NAIVE, 'naive_save_ms', 50), 1)} ms, disk copy "
             f"{rp.fmt(p(rows, NAIVE, 'save_disk_copy_ms', 50), 1)} ms; state file "
             f"{rp.fmt(p(rows, NAIVE, 'state_bytes', 50) / 2**20, 0)} MiB).")
    L.append("- *restore*: forkvm `timings.restore_ms` (loading the device state and `cont`); "
             "naive: `cont` only (the state load is the *load* column, done before).")
    L.append("- *identity*: forkvm `timings.identity_ms` (the identity request — RNG reseed, "
             "clock, hostname, machine-id, instance-id — and the clock set that follows); naive: "
             "the same two agent messages sent by the bench, timed the same way.")
    L.append("- *network setup*: forkvm `timings.network_ms` (uplink, rules, host table, ports; "
             "the namespace and tap were made before QEMU started); naive: the bench's whole "
             "namespace setup (namespace, tap, forwarding, veth, routes, nft), before QEMU "
             "starts. Both are done before the guest resumes, so neither is inside "
             "resume → egress (both are inside request → egress).")
    L.append("- *network_ready*: forkvm `timings.network_ready_ms`, resume until the agent's "
             "probe of the gateway came back (only with `wait_for_network`).")
    L.append("- *resume → hostname seen (est.)*: resume → egress minus what the loop itself "
             "measured (guest monotonic clock) from seeing the new hostname until its request "
             "was written (wait + connect + send): roughly when the identity step's "
             "`sethostname` took effect and the 2 ms poll saw it.")
    L.append("- *first connect (guest)*: the loop's own time for the TCP connect of the request "
             "that arrived (`HTTPConnection.connect()`; handshake with the internet server "
             "through both NATs). *second connect*: a second request the loop makes right after "
             "the first succeeded (not part of the figure): the same connect once the guest has "
             "run that code path once in this QEMU process.")
    L.append("")
    L.append("## Throughput (iperf3, TCP, one stream)")
    L.append("")
    L.append(f"Accelerator **{info['accel']['kind']}**; {args.iperf_runs} runs × "
             f"{args.iperf_time} s each; the figure is iperf3's `end.sum_received` "
             "(what the receiver got).")
    L.append("")
    L.append("| direction | runs (Mbit/s) | mean | min | max |")
    L.append("|---|---|---:|---:|---:|")
    for series, direction, _ in IPERF_CASES:
        v = vals(rows, series, "mbit_s", "iperf")
        if not v:
            continue
        L.append(f"| {direction} | {', '.join(rp.fmt(x, 1) for x in v)} | "
                 f"**{rp.fmt(sum(v) / len(v), 1)}** | {rp.fmt(min(v), 1)} | "
                 f"{rp.fmt(max(v), 1)} |")
    L.append("")
    for series, direction, how in IPERF_CASES:
        L.append(f"- *{direction}*: {how}.")
    L.append("")
    if ctx.get("notes"):
        L.append("## Observations")
        L.append("")
        for n in ctx["notes"]:
            L.append(f"- {n}")
        L.append("")
    L.append("## How it was measured")
    L.append("")
    L.append(ctx["method"])
    L.append("")
    L.append("## Reproduce")
    L.append("")
    L.append("```sh")
    L.append(f"bash bench/network/run.sh{ctx['cmd']}")
    L.append("```")
    L.append("")
    L.append("Raw rows: `network.csv` (one per measurement: `kind` egress or iperf). "
             "Plot: `network.png`.")
    L.append("")
    path.write_text("\n".join(L))


def summary_lines(rows, series_list) -> list[str]:
    """'In short': the figures that answer the questions, from this run."""
    out = ["## In short", ""]
    naive50 = p(rows, NAIVE, "resume_to_egress_ms", 50)
    fk = [s for s in series_list if vals(rows, s, "resume_to_egress_ms")]
    if fk and not math.isnan(naive50):
        r50 = {s: p(rows, s, "resume_to_egress_ms", 50) for s in fk}
        ratios = [r50[s] / naive50 for s in fk]
        fk_rows = [r for r in rows if r.get("kind") == "egress" and r.get("series") in fk]
        host = rp.percentile([r["resume_to_hostname_ms"] for r in fk_rows
                              if r.get("resume_to_hostname_ms") is not None], 50)
        c1 = rp.percentile([r["guest_connect_ms"] for r in fk_rows
                            if r.get("guest_connect_ms") is not None], 50)
        c2 = rp.percentile([r["guest_connect2_ms"] for r in fk_rows
                            if r.get("guest_connect2_ms") is not None], 50)
        retried = sum(1 for r in rows if r.get("kind") == "egress" and (r.get("attempt") or 1) > 1)
        if 0.8 <= min(ratios) and max(ratios) <= 1.25:
            head = "about the same for a forkvm child and a naive copy"
        elif max(ratios) < 1:
            head = "shorter for a forkvm child than for a naive copy"
        elif min(ratios) > 1:
            head = "longer for a forkvm child than for a naive copy"
        else:
            head = "mixed between forkvm's series and a naive copy"
        out.append(
            f"- **Resume → first egress is {head}**: p50 "
            + ", ".join(f"{s} {f0(r50[s])} ms" for s in fk)
            + f" against naive {f0(naive50)} ms ({min(ratios):.2f}–{max(ratios):.2f}× the "
            "naive p50). Both resume with a working network (their namespace, tap, uplink and "
            "NAT exist before `cont`; "
            + ("no first request was retried" if not retried else
               f"{retried} first requests were retried")
            + "), so what is left is inside the guest, under TCG: in forkvm's children the new "
            f"hostname is seen about {f0(host)} ms after the resume (identity step), and the "
            f"first TCP connect takes {f0(c1)} ms where a second one takes {f0(c2)} ms (code "
            "the new QEMU process runs for the first time is translated first).")
    req_naive = p(rows, NAIVE, "request_to_egress_ms", 50)
    if not math.isnan(req_naive):
        parts = []
        for s in fk:
            v = p(rows, s, "request_to_egress_ms", 50)
            if v < req_naive:
                parts.append(f"{s} {f0(v)} ms ({req_naive / v:.2f}× sooner)")
            else:
                parts.append(f"{s} {f0(v)} ms ({v / req_naive:.2f}× later)")
        out.append(
            "- **From the fork request** to the child's first egress (p50), against naive's "
            f"stop + full save + restore {f0(req_naive)} ms: " + "; ".join(parts) + ". A live "
            "branch copies the source's RAM while it runs before the child can start "
            "(`snapshot_ms` p50 "
            f"{f0(p(rows, 'live', 'snapshot_ms', 50))} ms), but pauses the source only "
            f"{rp.fmt(p(rows, 'live', 'pause_ms', 50), 1)} ms (naive "
            f"{f0(p(rows, NAIVE, 'pause_ms', 50))} ms).")
    pairs = [(a, b) for a, b in (("diff", "diff_nowait"), ("live", "live_nowait"))
             if a in fk and b in fk]
    if pairs:
        out.append(
            "- `wait_for_network: false` vs the default (resume → egress p50): "
            + "; ".join(f"{b} {f0(p(rows, b, 'resume_to_egress_ms', 50))} vs {a} "
                        f"{f0(p(rows, a, 'resume_to_egress_ms', 50))} ms" for a, b in pairs)
            + ". With the default the agent's own probe of the gateway runs in the guest at "
            "the same time as the program's first connect; the child's response then comes "
            f"after `network_ready_ms` (p50 {f0(p(rows, pairs[0][0], 'network_ready_ms', 50))} "
            f"ms for {pairs[0][0]}).")
    thr = {c[0]: vals(rows, c[0], "mbit_s", "iperf") for c in IPERF_CASES}
    if all(thr.values()):
        m = {k: sum(v) / len(v) for k, v in thr.items()}
        ceil = max(m["ceiling_host_to_inet"], m["ceiling_inet_to_host"])
        out.append(
            f"- **Throughput under TCG** (one TCP stream): guest → outside "
            f"{rp.fmt(m['vm_to_inet'], 0)} Mbit/s, host → guest through the port relay "
            f"{rp.fmt(m['host_to_vm_relay'], 0)}, guest → host through it "
            f"{rp.fmt(m['vm_to_host_relay'], 0)}; the same path without a VM carries "
            f"{rp.fmt(m['ceiling_inet_to_host'], 0)}–{rp.fmt(m['ceiling_host_to_inet'], 0)} "
            f"Mbit/s, so the VM side (virtio-net and the guest's TCP stack under TCG) is what "
            "limits it, at "
            f"{100 * max(m['vm_to_inet'], m['host_to_vm_relay'], m['vm_to_host_relay']) / ceil:.0f}"
            "% of it at most.")
    out.append("")
    return out


def method_text(args, inet: Internet) -> str:
    return "\n".join([
        f"**The internet.** A network namespace `{inet.ns}` joined to the host by a veth pair "
        f"(`{inet.addr}/24` inside, `{inet.host_addr}` on the host's `{inet.host_if}`), holding "
        "a Python `ThreadingHTTPServer` on port 8080 that writes `time.time()` when a "
        "request's handler thread starts and at the start of `do_GET` (the receipt time used "
        "below), plus the path, for every request, and an "
        "`iperf3 -s` on port 5201. Its interface name does not start with `fvh`, so forkvm's "
        "host table treats it as the outside world and masquerades sandbox egress to "
        f"`{inet.host_addr}`.",
        "",
        "**The guest loop** (`/root/loop.py`, started detached with "
        "`sh -c 'setsid python3 /root/loop.py <server> >/root/loop.log 2>&1 </dev/null &'` after "
        "writing the file through an exec's stdin): it imports `http.client`, records "
        "`socket.gethostname()`, and first does Python's lazy one-time work without sending "
        "anything on the network: `getaddrinfo` of the server address (which imports the "
        "`idna` codec on first use) and one HTTP round trip over loopback to a socket of its "
        "own, through the same `http.client` code (a smoke run without this warm-up spent "
        "~300 ms more in the child's first `connect()`, mostly importing that codec from "
        "disk; a long-running agent would have paid it long before the fork). Then it checks "
        "the hostname every 2 ms (`time.sleep(0.002)`). Once it differs, it sends "
        "`GET /first/<hostname>/<n>` (`http.client`, timeout 0.2 s) and retries at once on "
        "any failure until one answers 200, then makes one more request (`/second/...`, "
        "not timed by the bench) and writes its own timings (guest monotonic clock: detect → "
        "attempt, connect, send, response, the second connect, the source port) to "
        "`/tmp/loop.state`, which the bench reads back (exec for forkvm, the agent's "
        "`read_file` for naive). The source itself never sends on the network.",
        "",
        "**forkvm series.** Each iteration spawns a fresh source with `POST /v1/sandboxes "
        f"{{\"memory_mib\": {args.memory}}}` (default image, from its boot template, network "
        f"`nat`); it starts the loop and rests {args.settle:.0f} s. Then, in that iteration's "
        "order, one `POST /v1/sandboxes/{id}/branch` per series with "
        "`{\"mode\": \"diff\"|\"live\", \"count\": 1}`, plus "
        "`\"wait_for_network\": false` for the `_nowait` series (the naive fork takes its "
        "turn in the same order; diff and live series alternate, and the order rotates by "
        "one every iteration); the "
        "source is deleted at the end of the iteration. A first source makes one branch of "
        "each mode that is not counted (warm-up). The daemon gives the child its id as "
        "hostname in the identity step right after `cont`, which fires the child's copy of "
        "the loop. "
        "**resume → egress** = the server's `do_GET` time of the first request whose path "
        "names the child minus the child's `timings.resumed_unix_ms` (the daemon reads the "
        "host clock right after QEMU's `cont` returned). **Both times come from the same "
        "host clock** (CLOCK_REALTIME, read by the daemon and by the server process; a network "
        "namespace does not have a clock of its own). Then the child is deleted "
        "(`DELETE /v1/sandboxes/{child}`) and then the branch snapshot "
        "(`DELETE /v1/snapshots/{id}`).",
        "",
        "**Why a fresh source per iteration.** Every branch leaves one more qcow2 layer under "
        "the source's disk, also after its snapshot and child are deleted (a sandbox spawned "
        "from the template starts with a 3-deep chain; in a separate check, after 30 branches "
        "it was 33 deep). An earlier full run of this bench that branched one source 82 "
        "times saw the children "
        "get slower as the chain grew, from the first five to the last five iterations "
        "(medians): diff prepare 32 → 127 ms, QEMU start 113 → 242 ms, restore 25 → 119 ms, "
        "snapshot 178 → 432 ms, request → egress 924 → 1,462 ms, resume → egress "
        "393 → 518 ms; "
        "live pause 17 → 117 ms; the naive baseline stayed flat. A source branched at most "
        f"{len(SERIES) - 1} times keeps this out of the figures.",
        "",
        "**Why diff and live alternate.** In the same earlier runs, a live branch that "
        "directly followed another live branch of the same source was about twice as fast as "
        "one that followed a diff branch or came first (this bench's second full run, which "
        "ran the two live series back to back: `snapshot_ms` median 878 ms, 814–976, over 16 "
        "such branches against 2,001 ms, 1,756–2,498, over 24 others; request → egress 1,536 "
        "against 2,751 ms). Run back to back, the second live series would look faster "
        "because of its place in the order; alternating puts a diff branch between them, so "
        "every live branch here is of the slower kind.",
        "",
        "**The figure includes the identity step.** The loop can only tell it is in a child "
        "once the hostname has changed, and the daemon changes it inside the identity request "
        "it sends right after the resume (the `identity_ms` column); so resume → egress is "
        "*resume → hostname set → the loop's next 2 ms poll → TCP connect → request "
        "received*. "
        "A program that does not wait for its identity could send earlier: the child's "
        "network (namespace, tap, uplink, NAT rules) is complete before `cont`.",
        "",
        "**naive baseline.** A second sandbox is cold-booted (`use_template: false`, so it "
        "owns its RAM as a plain `share=on` file, like any QEMU VM), runs the same loop, rests, "
        "and is checked and saved once with `bench/common`'s `naive_save` (every migration "
        "capability off), then resumed; it keeps running next to the forkvm source. Each "
        "naive fork (interleaved with the forkvm series) is what forking a running VM with "
        "plain QEMU takes: `stop` the source, `migrate` to `file:` (all RAM and device state), "
        "copy its disk overlay (flushed by the migration, so it matches), `cont` the source; "
        "the state file is on /dev/shm (tmpfs), the naive baseline's best case. "
        "Then copy that disk for the copy (and fsync it, so the guest's first flush — "
        "the identity step fsyncs `/etc/machine-id` — does not have to write the fresh "
        "copy back), make a fresh namespace with forkvm's topology "
        "(`tap0` 172.16.0.1/30 with MAC 02:fc:00:00:00:01, forwarding on, a veth `uplink` "
        f"with its own /30 from `{inet.naive_net}`, default route, forkvm's own sandbox nft "
        "ruleset; the host side is masqueraded by a bench-owned nft table "
        f"`inet {inet.table}`), and start a plain `qemu-system-x86_64` with the source's "
        "command line (its own QMP, agent, console, disk and RAM file; `-incoming defer`) in "
        "it with `nsenter --net`. The bench connects to the agent socket, `migrate-incoming` "
        "loads the file, `cont`, the host clock is read (**the reference point, as the "
        "daemon's `resumed_unix_ms`**), and the bench at once sends the guest agent the "
        "daemon's identity message (`{\"type\": \"identity\", hostname, unix_time_ns, "
        "machine_id, instance_id}` + 64 random bytes) and then `set_clock`, as the daemon "
        "does for a child. The new hostname fires the loop, so both paths include the same "
        "identity step. Then the QEMU is killed (by its pid) and the namespace deleted.",
        "",
        "**Throughput.** A sandbox spawned with `\"ports\": [{\"guest\": 5201, \"host\": 0}]` "
        "runs `iperf3 -s` (started detached through exec). Each direction in the table is "
        "run in turn, then the next round. The guest's client is run with "
        "`POST /v1/sandboxes/{id}/exec`; the host's clients with the host's iperf3. The "
        "ceiling rows run the same iperf3 between the host and the internet namespace, with "
        "no VM on the path.",
        "",
        "**Cleanup.** Every sandbox and snapshot is deleted, the daemon stopped and its temp "
        "home removed; the internet namespace, its veth and servers, every baseline namespace "
        "and veth, and the bench's nft table are removed in `finally` blocks, also after a "
        "failure or Ctrl-C. Only processes this bench started are killed, by pid.",
    ])


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forks", type=int, default=20,
                    help=f"forks per series and naive restores (>= {MIN_FORKS}, <= {MAX_FORKS})")
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --forks < {MIN_FORKS}; results are marked SMOKE")
    ap.add_argument("--series", default=",".join(SERIES),
                    help="forkvm series, comma-separated, from " + ", ".join(SERIES))
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    ap.add_argument("--settle", type=float, default=3.0, metavar="SECONDS",
                    help="rest after the loop has started in a source")
    ap.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                    help="longest wait for a child's first request")
    ap.add_argument("--iperf-time", type=int, default=10, metavar="SECONDS",
                    help="iperf3 -t (default 10)")
    ap.add_argument("--iperf-runs", type=int, default=3, help="iperf3 runs per direction "
                    "(0: skip the throughput part)")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    series_list = [s.strip() for s in args.series.split(",") if s.strip()]
    bad = [s for s in series_list if s not in SERIES]
    if bad:
        ap.error(f"unknown series {bad}; choose from {', '.join(SERIES)}")
    if args.forks < 1 or args.forks > MAX_FORKS:
        ap.error(f"--forks must be between 1 and {MAX_FORKS}")
    if args.forks < MIN_FORKS and not args.smoke:
        ap.error(f"--forks {args.forks} is below the minimum of {MIN_FORKS} for a valid result; "
                 "add --smoke for a quick smoke test")
    if os.geteuid() != 0:
        ap.error("network namespaces and nft need root")
    for tool in ("ip", "nft", "nsenter", "iperf3", "sysctl", "qemu-img"):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not installed")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fb.wait_for_quiet_host(args.wait_quiet)
    started = dt.datetime.now().astimezone()
    t_start = time.monotonic()
    ctx: dict = {"machine": rp.machine_info(), "started": started, "git": rp.git_revision(),
                 "notes": []}
    cmd = []
    if args.forks != 20:
        cmd.append(f"--forks {args.forks}")
    if args.smoke:
        cmd.append("--smoke")
    if series_list != list(SERIES):
        cmd.append(f"--series {','.join(series_list)}")
    for flag, val, default in (("--memory", args.memory, 512),
                               ("--iperf-time", args.iperf_time, 10),
                               ("--iperf-runs", args.iperf_runs, 3)):
        if val != default:
            cmd.append(f"{flag} {val}")
    ctx["cmd"] = (" " + " ".join(cmd)) if cmd else ""
    rows: list[dict] = []
    tag = os.getpid() % 100_000
    x = os.getpid() % 200 + 20
    workdir = tempfile.mkdtemp(prefix="fvb-net-", dir="/tmp")
    shm = tempfile.mkdtemp(prefix="fvb-net-", dir="/dev/shm")
    inet = Internet(tag, x, workdir)
    others: dict[int, str] = {}
    home = None
    try:
        if open("/proc/sys/net/ipv4/ip_forward").read().strip() != "1":
            print("note: IPv4 forwarding is off on the host; the daemon turns it on at start",
                  flush=True)
        # Unjailed: the naive baseline replays a sandbox QEMU's command line
        # and saves it into the bench's own files, which a jailed QEMU (own
        # mount namespace, inherited tap fd) cannot do. RESULTS.md says so.
        with fb.Daemon(binary=args.binary, env={"FORKVM_NO_JAIL": "1"}) as d:
            home = d.home
            info = d.api.info()
            ctx["info"] = info
            print(f"forkvm {info.get('version')} | accel {info['accel']['kind']} | QEMU "
                  f"{info['qemu'].get('version')} | home {d.home}", flush=True)
            if not (info.get("network") or {}).get("available"):
                raise fb.BenchError(f"the daemon has no networking: {info.get('network')}")
            inet.create()
            print(f"[internet] namespace {inet.ns}: http://{inet.addr}:{HTTP_PORT}, "
                  f"iperf3 {inet.addr}:{IPERF_PORT}; host side {inet.host_if} {inet.host_addr}",
                  flush=True)
            log = EgressLog(inet.log_path)
            meter = fb.CpuMeter(roots=[d.proc.pid])

            def check_others():
                now = fb.other_qemu_processes(exclude_substrings=(home, shm, workdir))
                new = {q: c for q, c in now.items() if q not in others}
                if new:
                    print(f"    note: {len(new)} QEMU process(es) not started by this bench "
                          "are running (they compete for CPU)", flush=True)
                others.update(now)

            # The naive baseline's source: cold-booted, loop running. `naive_save`
            # checks it is a plain VM, turns migration capabilities off and saves
            # it once (a check that the plain save works); it is then resumed and
            # kept running: every naive fork saves it afresh.
            nsrc = d.create_cold(memory_mib=args.memory, cpus=1)
            nid = nsrc["id"]
            if (nsrc.get("network") or {}).get("mode") != "nat":
                raise fb.BenchError(f"the baseline source has no nat network: {nsrc}")
            start_loop(d, nid, inet.addr)
            time.sleep(args.settle)
            nwork = os.path.join(d.home, "naive")
            os.mkdir(nwork)
            saved = nv.naive_save(d, nid, nsrc["pid"], args.memory, nwork)
            with fb.Qmp(os.path.join(saved.sbdir, "qmp.sock"), timeout=60) as qmp:
                qmp.execute("cont")
            ntop = naive_disk_top(saved)
            # Every later save writes its state to tmpfs (the naive baseline's best case:
            # no disk writeback competes with the next restore's read).
            os.unlink(saved.state)
            saved.state = os.path.join(shm, "state.bin")
            ctx["first_save_ms"] = saved.save_ms
            print(f"[naive source] {nid} cold-booted, loop running; a plain full save takes "
                  f"{saved.save_ms:.0f} ms ({saved.state_bytes / 2**20:.0f} MiB state file; "
                  f"capabilities turned off: {', '.join(saved.caps_reset) or 'none'}); resumed",
                  flush=True)

            # forkvm sources. Every branch of a source adds a layer to its disk
            # chain (see the notes in RESULTS.md), so each iteration gets a fresh
            # source: every child comes from a source branched at most
            # len(series) - 1 times before, as in a steady state.
            source_ids: list[str] = []

            def new_source(label: str) -> str:
                src = d.create(memory_mib=args.memory, cpus=1)
                x = src["id"]
                source_ids.append(x)
                start_loop(d, x, inet.addr)
                print(f"[source {label}] {x} spawned ({src['timings']['total_ms']:.0f} ms, "
                      f"snapshot {src.get('snapshot')}), loop running; resting "
                      f"{args.settle:.0f} s", flush=True)
                time.sleep(args.settle)
                return x

            def retire_source(x: str) -> None:
                st = loop_state(d, x)
                if not st.startswith(f"waiting {x}"):
                    ctx["notes"].append(f"source {x}'s loop ended up {st!r}: it should still "
                                        "be waiting (a source must never send)")
                d.delete(x)

            # Warm-up (not counted): one fork of each kind.
            sid = new_source("warm-up")
            for s in dict.fromkeys(SERIES[n][0] for n in series_list):
                name = next(n for n in series_list if SERIES[n][0] == s)
                w = fork_forkvm(d, sid, name, 0, log, args.timeout)
                print(f"[warm-up {s}] resume→egress {w['resume_to_egress_ms']:.0f} ms (not "
                      "counted)", flush=True)
            retire_source(sid)
            w = fork_naive(saved, ntop, nwork, shm, inet, 0, 63, log, args.timeout)
            print(f"[warm-up naive] resume→egress {w['resume_to_egress_ms']:.0f} ms (not "
                  "counted)", flush=True)

            # diff and live series alternate: a live branch that directly follows
            # another live branch of the same source is about twice as fast as
            # one that follows a diff branch (see RESULTS.md), which would make
            # the two live series differ by their position, not their settings.
            diffs = [x for x in series_list if SERIES[x][0] == "diff"]
            lives = [x for x in series_list if SERIES[x][0] == "live"]
            order = [x for pair in itertools.zip_longest(diffs, lives) for x in pair
                     if x is not None] + [NAIVE]
            for i in range(1, args.forks + 1):
                sid = new_source(f"{i}/{args.forks}")
                # Rotate the order each iteration, so no series always follows another.
                k = (i - 1) % len(order)
                branches = 0
                for s in order[k:] + order[:k]:
                    check_others()
                    meter.start()
                    if s == NAIVE:
                        r = fork_naive(saved, ntop, nwork, shm, inet, i, i - 1, log,
                                       args.timeout)
                    else:
                        r = fork_forkvm(d, sid, s, i, log, args.timeout)
                        r["source"] = sid
                        r["source_branches_before"] = branches
                        branches += 1
                    r["other_cpu_cores"] = meter.other_cores()
                    rows.append(r)
                    extra = (f"restore {rp.fmt(r.get('restore_ms'), 0)}, identity "
                             f"{rp.fmt(r.get('identity_ms'), 0)}, network "
                             f"{rp.fmt(r.get('network_ms'), 0)}, ready "
                             f"{rp.fmt(r.get('network_ready_ms'), 0)}")
                    if s == NAIVE:
                        extra += f", load {rp.fmt(r.get('load_ms'), 0)}"
                    print(f"[{s} {i}/{args.forks}] {r['child']}: resume→egress "
                          f"{r['resume_to_egress_ms']:6.0f} ms, request→egress "
                          f"{r['request_to_egress_ms']:6.0f} ms (attempt {r['attempt']}; "
                          f"{extra}; others {r['other_cpu_cores']:.2f} cores)", flush=True)
                retire_source(sid)
            log.poll()
            st = loop_state(d, nid)
            if not st.startswith(f"waiting {nid}"):
                ctx["notes"].append(f"the baseline source's loop ended up {st!r}: it should "
                                    "still be waiting (a source must never send)")
            sent = {x: log.count[x] for x in source_ids + [nid] if log.count.get(x)}
            if sent:
                ctx["notes"].append(f"sources sent requests (they must not): {sent}")
            d.delete(nid)

            if args.iperf_runs > 0:
                run_iperf(d, inet, args, rows, meter)
            ctx["method"] = method_text(args, inet)
    finally:
        for e in inet.close():
            print(f"cleanup: {e}", flush=True)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
        left = [n for n in os.listdir("/run/netns") if n.startswith(f"fvb-nv-{tag}-")
                or n == inet.ns] if os.path.isdir("/run/netns") else []
        left += [n for n in os.listdir("/sys/class/net")
                 if n.startswith(f"fvbn{tag}-") or n == inet.host_if]
        if left:
            print(f"cleanup: still present: {left}", flush=True)
        if home:
            q = fb.qemu_pids_mentioning(home) + fb.qemu_pids_mentioning(shm)
            if q:
                print(f"cleanup: QEMU processes still name our files: {q}", flush=True)
    ctx["elapsed"] = time.monotonic() - t_start
    ctx["others"] = others
    multi = {s: sum(1 for r in rows if r.get("series") == s and (r.get("attempt") or 1) > 1)
             for s in series_list + [NAIVE]}
    if any(multi.values()):
        ctx["notes"].append("children whose first request to arrive was not their first attempt "
                            "(an earlier one failed or timed out after 0.2 s): "
                            + ", ".join(f"{s} {n}" for s, n in multi.items() if n))

    for s_ in series_list + [NAIVE]:
        ports = [r.get("guest_source_port") for r in rows
                 if r.get("series") == s_ and r.get("guest_source_port")]
        if len(ports) > 3 and len(set(ports)) <= len(ports) // 2:
            ctx["notes"].append(
                f"{s_}: the first connections of {len(ports)} children used only "
                f"{len(set(ports))} distinct guest source ports (e.g. {ports[0]}): children "
                "inherit the guest kernel's ephemeral-port state and hash secrets from the "
                "snapshot, which the identity step's RNG reseed does not change, so siblings "
                "pick the same port (and the naive copies, all restored from the same kind of "
                "state, do too). Their traffic still leaves under distinct uplink addresses, "
                "and the host's NAT remaps ports that collide.")
    c1 = [r["guest_connect_ms"] for r in rows if r.get("guest_connect_ms") is not None]
    c2 = [r["guest_connect2_ms"] for r in rows if r.get("guest_connect2_ms") is not None]
    if c1 and c2:
        ctx["notes"].append(
            f"The child's first TCP connect takes p50 {rp.percentile(c1, 50):,.0f} ms (all "
            f"series, naive included) and the second, right after, p50 "
            f"{rp.percentile(c2, 50):,.0f} ms: the first time a new QEMU process runs a code "
            "path, TCG translates it (the translation cache is per process and starts empty "
            "after every restore, forkvm's or naive), which dominates resume → egress here "
            "together with the identity step."
            + (" The network path itself was ready: no child's first request had to be "
               "retried." if not any(multi.values()) else ""))
    rp.write_csv(out / "network.csv", rows, FIELDS)
    m = ctx["machine"]
    title = (f"forkvm network bench — {ctx['info']['accel']['kind']}, {args.memory} MiB, "
             f"{args.forks} forks per series{' (SMOKE)' if args.smoke else ''}, "
             f"{m['cpu_model']}, {m['cores']} cores, {started:%Y-%m-%d}")
    write_plot(out / "network.png", rows, series_list, title)
    write_results(out / "RESULTS.md", rows, ctx, args, series_list)
    print()
    naive50 = p(rows, NAIVE, "resume_to_egress_ms", 50)
    for s in series_list + [NAIVE]:
        v = vals(rows, s, "resume_to_egress_ms")
        if v:
            st = rp.summarize(v)
            print(f"{s:12s} resume→egress p50 {st['p50']:7.0f} ms  p90 {st['p90']:7.0f} ms  "
                  f"({st['p50'] / naive50:.2f}× naive p50)  request→egress p50 "
                  f"{p(rows, s, 'request_to_egress_ms', 50):7.0f} ms")
    for series, direction, _ in IPERF_CASES:
        v = vals(rows, series, "mbit_s", "iperf")
        if v:
            print(f"{direction:40s} {sum(v) / len(v):9,.1f} Mbit/s (mean of {len(v)})")
    print(f"\nwrote {out / 'network.csv'}, {out / 'RESULTS.md'}, {out / 'network.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_network", main)
