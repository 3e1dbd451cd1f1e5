"""The network benchmark's fixed parts and host side: the CSV columns and
series, the guest loop and the internet's HTTP server (Python sources run in
the guest and on the host), the sandbox nft rules the naive baseline copies,
and the host plumbing (commands in namespaces, the `Internet` namespace with
its HTTP server, the egress log).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import forkvm_bench as fb


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
